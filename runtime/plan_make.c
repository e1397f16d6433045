/* plan_make.c — a call's plan with the process's settings: config_get's values and the tiles the
 * autotune table (a file, tune.c) or the tuner picks, wrapped around plan.c's pure planner. Kept out
 * of plan.c so that plan.c reads no environment and no file (issue 42: plan.c is inputs in, plan
 * out; the tune table is looked up here, above it). */
#include "config.h"
#include "plan.h"
#include "tune.h"

flce_status plan_make_dev(const flce_problem *p, flce_op op, const char *device, int sm, int num_sms,
                          uint64_t mem_bytes, const flce_tensors *t, plan *pl)
{
    return plan_make_cfg(p, op, device, sm, num_sms, mem_bytes, config_get(), t, pl);
}

flce_status plan_make_cfg(const flce_problem *p, flce_op op, const char *device, int sm, int num_sms,
                          uint64_t mem_bytes, const struct flce_config *cfg, const flce_tensors *t, plan *pl)
{
    plan_start(p, op, sm, cfg, t, pl);
    pl->mem_cap = mem_bytes / 16;
    tune_apply(p, device, sm, pl); /* the autotune table, when it has this class */
    return plan_finish(p, op, num_sms, cfg, t, pl);
}

flce_status plan_make_on(const flce_problem *p, flce_op op, const char *device, int sm, int num_sms,
                         const flce_tensors *t, plan *pl)
{
    return plan_make_dev(p, op, device, sm, num_sms, 0, t, pl);
}

flce_status plan_make(const flce_problem *p, flce_op op, int sm, int num_sms, const flce_tensors *t,
                      plan *pl)
{
    return plan_make_on(p, op, NULL, sm, num_sms, t, pl);
}
