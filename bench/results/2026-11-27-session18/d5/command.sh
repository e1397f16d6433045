#!/bin/bash
# session 18 d5 (4 GPUs): the C TP timing (FLCE_TEST_TP_TIME, with and without SP, tp 2 and 4) per
# setting: default, FLCE_TP_DH_GATHER16=0 (the fp32 all-reduce), twice each alternating, then
# FLCE_TP_OVERLAP_SMS 24 / 16 / 48 and the default again
cd "$(dirname "$0")"
export FLCE_CACHE_DIR=/tmp/flce-cache
TPTIME_VARIANTS="- FLCE_TP_DH_GATHER16=0 - FLCE_TP_DH_GATHER16=0 FLCE_TP_OVERLAP_SMS=24 FLCE_TP_OVERLAP_SMS=16 FLCE_TP_OVERLAP_SMS=48 -" \
  OUT=$OUT/d5 bash bench/device_session.sh tptime --budget 330
