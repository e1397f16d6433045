/* config.c — the FLCE_* settings read once per process, their parsers and their log line (config.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "log.h"
#include "plan.h"

void config_defaults(flce_config *c)
{
    memset(c, 0, sizeof *c);
    c->tiles.tma = 1;
    c->tiles.enable_sm100 = 0;
    c->compact = 1;
    /* row-scaled compact logits where a chunk holds at least PLAN_QROWS_MIN_LOGITS logits (plan.c) */
    c->qrows = -1;
    c->qdh = 1;
    c->fused_dz = 1;
    c->raster_rows = PLAN_RASTER_ROWS;
    c->prefetch = 1;
    c->tiered = 1;
    c->full_tiles = 1;
    c->dh_k_slice = PLAN_DH_K_SLICE;
    /* fp32 accumulators updated by L2 reductions: 2.8 ms faster at 32768x4096x128256 (3 token
     * chunks), 1.2 ms for dW into a caller's fp32 main_grad (H100, bench/NOTES.md, session 7) */
    c->red_acc = 1;
    c->grad_streams = 1;
    c->bulk_red = 1;
    c->dh_splits = -1;
    c->cluster = -1;
    c->logits_cluster = -1;
    c->logits_persist = 1;
    /* TP: dH's all-reduce beside dW, which leaves NCCL 32 SMs (it launched 24 CTAs on 2 and 4
     * NVLink H100s/H200s) until the reduction ends: −0.2 to −0.5 ms at tp = 2 and 4 (4 × H200 and
     * 4 × H100, 8192×4096×128256; bench/NOTES.md TP v4) */
    c->tp_overlap = 1;
    c->tp_overlap_sms = 32;
    /* TP: dH's fp32 all-reduce as a reduce-scatter in fp32 then an all-gather of the rounded
     * slices (3/4 of the bytes; the same sums, rounded once as before) */
    c->tp_dh_gather16 = 1;
}

/* 1 and *out set when s is one of the on/off words, else 0. */
static int bool_word(const char *s, int *out)
{
    static const char *const on[] = {"1", "on", "true", "yes"}, *const off[] = {"0", "off", "false", "no"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, on[i])) return *out = 1, 1;
        if (!strcasecmp(s, off[i])) return *out = 0, 1;
    }
    return 0;
}

int config_parse_bool(const char *name, const char *value, int def)
{
    int v;
    if (!value || !*value) return def;
    if (bool_word(value, &v)) return v;
    log_msg(LOG_WARN, "%s=%s: not 1/0, on/off, true/false or yes/no; the default (%s) is used", name, value,
            def ? "on" : "off");
    return def;
}

int config_parse_int(const char *name, const char *value, int lo, int hi, int def)
{
    if (!value || !*value) return def;
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (end != value && !*end && !errno && v >= lo && v <= hi) return (int)v;
    log_msg(LOG_WARN, "%s=%s: not an integer in %d..%d; the default (%d) is used", name, value, lo, hi, def);
    return def;
}

/* FLCE_NVRTC_FAST: an on/off word (on: mid) or one of the levels min, mid, max. */
static config_nvrtc_fast parse_nvrtc_fast(const char *value)
{
    int on;
    if (!value || !*value) return CONFIG_NVRTC_FAST_OFF;
    if (bool_word(value, &on)) return on ? CONFIG_NVRTC_FAST_MID : CONFIG_NVRTC_FAST_OFF;
    if (!strcasecmp(value, "min")) return CONFIG_NVRTC_FAST_MIN;
    if (!strcasecmp(value, "mid")) return CONFIG_NVRTC_FAST_MID;
    if (!strcasecmp(value, "max")) return CONFIG_NVRTC_FAST_MAX;
    log_msg(LOG_WARN, "FLCE_NVRTC_FAST=%s: not an on/off word, min, mid or max; the default (off) is used", value);
    return CONFIG_NVRTC_FAST_OFF;
}

void config_from_env(flce_config *c)
{
    config_defaults(c);
    c->portable = config_parse_bool("FLCE_PORTABLE", getenv("FLCE_PORTABLE"), c->portable);
    c->tiles.tma = config_parse_bool("FLCE_TMA", getenv("FLCE_TMA"), c->tiles.tma);
    c->tiles.enable_sm100 = config_parse_bool("FLCE_ENABLE_SM100", getenv("FLCE_ENABLE_SM100"), c->tiles.enable_sm100);
    c->compact = config_parse_bool("FLCE_COMPACT", getenv("FLCE_COMPACT"), c->compact);
    c->qrows = config_parse_int("FLCE_QROWS", getenv("FLCE_QROWS"), 0, 1, c->qrows);
    c->qdh = config_parse_bool("FLCE_QDH", getenv("FLCE_QDH"), c->qdh);
    c->fused_dz = config_parse_bool("FLCE_FUSED_DZ", getenv("FLCE_FUSED_DZ"), c->fused_dz);
    c->red_acc = config_parse_bool("FLCE_RED_ACC", getenv("FLCE_RED_ACC"), c->red_acc);
    /* a 1-CTA cluster is no cluster: 0 and 1 both leave it off; -1 (unset): plan.c's rule */
    int cl = config_parse_int("FLCE_CLUSTER", getenv("FLCE_CLUSTER"), -1, 2, c->cluster);
    c->cluster = cl == 2 ? 2 : cl < 0 ? -1 : 0;
    c->raster_rows = config_parse_int("FLCE_RASTER", getenv("FLCE_RASTER"), 0, 4096, c->raster_rows);
    c->tune = config_parse_bool("FLCE_TUNE", getenv("FLCE_TUNE"), c->tune);
    c->prefetch = config_parse_bool("FLCE_PREFETCH", getenv("FLCE_PREFETCH"), c->prefetch);
    c->tiered = config_parse_bool("FLCE_TIERED", getenv("FLCE_TIERED"), c->tiered);
    c->unlocked_compile = config_parse_bool("FLCE_UNLOCKED_COMPILE", getenv("FLCE_UNLOCKED_COMPILE"), c->unlocked_compile);
    c->full_tiles = config_parse_bool("FLCE_FULL_TILES", getenv("FLCE_FULL_TILES"), c->full_tiles);
    /* a multiple of 256 keeps each slice's dZ 16-byte aligned for TMA (launch.c run_dh) */
    c->dh_k_slice = config_parse_int("FLCE_DH_K_SLICE", getenv("FLCE_DH_K_SLICE"), 0, 1 << 30, c->dh_k_slice) / 256 * 256;
    c->tp_dh_16bit = config_parse_bool("FLCE_TP_DH_16BIT", getenv("FLCE_TP_DH_16BIT"), c->tp_dh_16bit);
    c->tp_dh_gather16 = config_parse_bool("FLCE_TP_DH_GATHER16", getenv("FLCE_TP_DH_GATHER16"), c->tp_dh_gather16);
    c->tp_overlap = config_parse_bool("FLCE_TP_OVERLAP", getenv("FLCE_TP_OVERLAP"), c->tp_overlap);
    c->tp_overlap_sms = config_parse_int("FLCE_TP_OVERLAP_SMS", getenv("FLCE_TP_OVERLAP_SMS"), 0, 1024, c->tp_overlap_sms);
    c->dh_bn = config_parse_int("FLCE_DH_BN", getenv("FLCE_DH_BN"), 0, 256, c->dh_bn) / 64 * 64;
    c->grad_streams = config_parse_bool("FLCE_GRAD_STREAMS", getenv("FLCE_GRAD_STREAMS"), c->grad_streams);
    c->dh_splits = config_parse_int("FLCE_DH_SPLITS", getenv("FLCE_DH_SPLITS"), -1, PLAN_DH_SPLITS_MAX, c->dh_splits);
    c->bulk_red = config_parse_bool("FLCE_BULK_RED", getenv("FLCE_BULK_RED"), c->bulk_red);
    c->logits_cluster = config_parse_int("FLCE_LOGITS_CLUSTER", getenv("FLCE_LOGITS_CLUSTER"), -1, 1, c->logits_cluster);
    c->logits_persist = config_parse_bool("FLCE_LOGITS_PERSIST", getenv("FLCE_LOGITS_PERSIST"), c->logits_persist);
    c->logits_splits = config_parse_int("FLCE_LOGITS_SPLITS", getenv("FLCE_LOGITS_SPLITS"), 0, 64, c->logits_splits);
    c->logits_group = config_parse_int("FLCE_LOGITS_GROUP", getenv("FLCE_LOGITS_GROUP"), 0, 4096, c->logits_group);
    c->nvrtc_fast = parse_nvrtc_fast(getenv("FLCE_NVRTC_FAST"));
}

static const char *on_off(int v) { return v ? "on" : "off"; }

void config_log(const flce_config *c)
{
    static const char *const fast[] = {"off", "min", "mid", "max"};
    flce_config d;
    config_defaults(&d);
    if (!log_enabled(LOG_INFO)) return;
#define CONFIG_LOG_ONE(NAME, FMT, VAL, DEF) \
    log_msg(LOG_INFO, "config: " NAME "=" FMT "%s", VAL, (DEF) ? " (default)" : "")
    CONFIG_LOG_ONE("FLCE_PORTABLE", "%s", on_off(c->portable), c->portable == d.portable);
    CONFIG_LOG_ONE("FLCE_TMA", "%s", on_off(c->tiles.tma), c->tiles.tma == d.tiles.tma);
    CONFIG_LOG_ONE("FLCE_ENABLE_SM100", "%s", on_off(c->tiles.enable_sm100),
                   c->tiles.enable_sm100 == d.tiles.enable_sm100);
    CONFIG_LOG_ONE("FLCE_COMPACT", "%s", on_off(c->compact), c->compact == d.compact);
    CONFIG_LOG_ONE("FLCE_QROWS", "%s", c->qrows < 0 ? "auto" : on_off(c->qrows), c->qrows == d.qrows);
    CONFIG_LOG_ONE("FLCE_QDH", "%s", on_off(c->qdh), c->qdh == d.qdh);
    CONFIG_LOG_ONE("FLCE_FUSED_DZ", "%s", on_off(c->fused_dz), c->fused_dz == d.fused_dz);
    CONFIG_LOG_ONE("FLCE_RED_ACC", "%s", on_off(c->red_acc), c->red_acc == d.red_acc);
    CONFIG_LOG_ONE("FLCE_CLUSTER", "%d", c->cluster, c->cluster == d.cluster);
    CONFIG_LOG_ONE("FLCE_RASTER", "%d", c->raster_rows, c->raster_rows == d.raster_rows);
    CONFIG_LOG_ONE("FLCE_TUNE", "%s", on_off(c->tune), c->tune == d.tune);
    CONFIG_LOG_ONE("FLCE_PREFETCH", "%s", on_off(c->prefetch), c->prefetch == d.prefetch);
    CONFIG_LOG_ONE("FLCE_TIERED", "%s", on_off(c->tiered), c->tiered == d.tiered);
    CONFIG_LOG_ONE("FLCE_UNLOCKED_COMPILE", "%s", on_off(c->unlocked_compile), c->unlocked_compile == d.unlocked_compile);
    CONFIG_LOG_ONE("FLCE_FULL_TILES", "%s", on_off(c->full_tiles), c->full_tiles == d.full_tiles);
    CONFIG_LOG_ONE("FLCE_DH_K_SLICE", "%d", c->dh_k_slice, c->dh_k_slice == d.dh_k_slice);
    CONFIG_LOG_ONE("FLCE_TP_DH_16BIT", "%s", on_off(c->tp_dh_16bit), c->tp_dh_16bit == d.tp_dh_16bit);
    CONFIG_LOG_ONE("FLCE_TP_DH_GATHER16", "%s", on_off(c->tp_dh_gather16), c->tp_dh_gather16 == d.tp_dh_gather16);
    CONFIG_LOG_ONE("FLCE_TP_OVERLAP", "%s", on_off(c->tp_overlap), c->tp_overlap == d.tp_overlap);
    CONFIG_LOG_ONE("FLCE_TP_OVERLAP_SMS", "%d", c->tp_overlap_sms, c->tp_overlap_sms == d.tp_overlap_sms);
    CONFIG_LOG_ONE("FLCE_DH_BN", "%d", c->dh_bn, c->dh_bn == d.dh_bn);
    CONFIG_LOG_ONE("FLCE_GRAD_STREAMS", "%s", on_off(c->grad_streams), c->grad_streams == d.grad_streams);
    CONFIG_LOG_ONE("FLCE_DH_SPLITS", "%d", c->dh_splits, c->dh_splits == d.dh_splits);
    CONFIG_LOG_ONE("FLCE_BULK_RED", "%s", on_off(c->bulk_red), c->bulk_red == d.bulk_red);
    CONFIG_LOG_ONE("FLCE_LOGITS_CLUSTER", "%d", c->logits_cluster, c->logits_cluster == d.logits_cluster);
    CONFIG_LOG_ONE("FLCE_LOGITS_PERSIST", "%s", on_off(c->logits_persist), c->logits_persist == d.logits_persist);
    CONFIG_LOG_ONE("FLCE_LOGITS_SPLITS", "%d", c->logits_splits, c->logits_splits == d.logits_splits);
    CONFIG_LOG_ONE("FLCE_LOGITS_GROUP", "%d", c->logits_group, c->logits_group == d.logits_group);
    CONFIG_LOG_ONE("FLCE_NVRTC_FAST", "%s", fast[c->nvrtc_fast], c->nvrtc_fast == d.nvrtc_fast);
#undef CONFIG_LOG_ONE
}

static flce_config config_current;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static void config_init(void)
{
    config_from_env(&config_current);
    config_log(&config_current);
}

const flce_config *config_get(void)
{
    pthread_once(&config_once, config_init);
    return &config_current;
}

void config_reload(void)
{
    pthread_once(&config_once, config_init);
    config_from_env(&config_current);
}

spec_tile spec_default_tile(int sm, flce_dtype dtype, spec_role role)
{
    return spec_tile_pick(sm, dtype, role, config_get()->tiles);
}
