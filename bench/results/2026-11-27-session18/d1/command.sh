#!/bin/bash
# session 18 d1 (4 GPUs): test_tp CTests (incl. the new test_tp_allreduce) at tp 2 and 4; tp_compare
# tp 2 and 4 (megatron, flce-nccl, flce-split, flce-local, --timeline) with the new default dH
# reduce-scatter + 16-bit all-gather; variants: ar (the fp32 all-reduce), mb384, noq (tp 4)
cd "$(dirname "$0")"
export FLCE_CACHE_DIR=/tmp/flce-cache
TP2_VARIANTS="ar mb384" TP4_VARIANTS="ar noq mb384" OUT=$OUT/d1 bash bench/device_session.sh tp --budget 520
ls -la $OUT/d1
