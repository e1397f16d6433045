/* context.c — flce_context: device binding, kernel loading, workspace, error flag (context.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "config.h"
#include "context.h"
#include "emit.h"
#include "fault.h"
#include "jit.h"
#include "log.h"
#include "params.h"

flce_status ctx_enter(flce_context *ctx, CUcontext *prev)
{
    *prev = NULL;
    DRV_TRY(drv.CtxGetCurrent(prev));
    if (*prev != ctx->primary) DRV_TRY(drv.CtxSetCurrent(ctx->primary));
    return FLCE_OK;
}

void ctx_leave(CUcontext prev)
{
    CUcontext cur = NULL;
    if (drv.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != prev) drv.CtxSetCurrent(prev);
}

static flce_status ctx_create_failed(flce_context *ctx, flce_status st);

/* The device's compute capability, SM count and name; a failing query is an error naming it (a
 * zero left in num_sms would size grids of no CTA). */
static flce_status ctx_device_facts(flce_context *ctx, int *major, int *minor)
{
    CUresult r = drv.DeviceGetAttribute(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ctx->dev);
    if (r != CUDA_SUCCESS) return drv_error(r, "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
    r = drv.DeviceGetAttribute(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ctx->dev);
    if (r != CUDA_SUCCESS) return drv_error(r, "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)");
    r = drv.DeviceGetAttribute(&ctx->num_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ctx->dev);
    if (r != CUDA_SUCCESS) return drv_error(r, "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)");
    size_t mem = 0;
    r = drv.DeviceTotalMem(&mem, ctx->dev);
    if (r != CUDA_SUCCESS) return drv_error(r, "cuDeviceTotalMem");
    ctx->mem_bytes = mem;
    r = drv.DeviceGetName(ctx->name, sizeof ctx->name, ctx->dev);
    if (r != CUDA_SUCCESS) return drv_error(r, "cuDeviceGetName");
    return FLCE_OK;
}

_Static_assert((int)FLCE_LOG_OFF == (int)LOG_OFF && (int)FLCE_LOG_WARN == (int)LOG_WARN &&
                   (int)FLCE_LOG_INFO == (int)LOG_INFO && (int)FLCE_LOG_DEBUG == (int)LOG_DEBUG,
               "flce_options.log_level is a log_level");

void flce_options_init(flce_options *o)
{
    if (!o) return;
    const flce_config *c = config_get();
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->log_level = config_log_level();
    o->compile_threads = c->compile_threads;
    o->background_compile = c->prefetch;
    o->compile_in_call = c->compile_in_call;
}

/* A string option copied into out[cap]; too long is an error naming the field. */
static flce_status ctx_copy_path(const char *field, const char *value, char *out, size_t cap)
{
    size_t n = strlen(value);
    if (n >= cap)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "options.%s: %zu bytes, at most %zu", field, n, cap - 1);
    memcpy(out, value, n + 1);
    return FLCE_OK;
}

flce_status ctx_settings_from(const flce_options *options, ctx_settings *out)
{
    memset(out, 0, sizeof *out);
    out->log = LOG_SINK_PROCESS;
    out->background = -1;
    out->compile_in_call = config_get()->compile_in_call;
    if (!options) return FLCE_OK;
    flce_options o;
    flce_options_init(&o);
    /* The first layout ends at compile_in_call; fields added later default for older callers. */
    size_t first = offsetof(flce_options, compile_in_call) + sizeof o.compile_in_call;
    if (options->struct_size < first)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "options.struct_size=%u: smaller than any flce_options (%zu); initialize with flce_options_init",
                       options->struct_size, first);
    if (options->struct_size > sizeof o)
        return err_set(FLCE_ERR_UNSUPPORTED,
                       "options.struct_size=%u: the caller was built against a newer flce.h than this library (%s, %zu bytes)",
                       options->struct_size, FLCE_VERSION_STRING, sizeof o);
    memcpy(&o, options, options->struct_size);
    if (o.log_level < FLCE_LOG_FROM_ENV || o.log_level > FLCE_LOG_DEBUG)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "options.log_level=%d: must be FLCE_LOG_FROM_ENV (-1) or 0..3",
                       o.log_level);
    if (o.compile_threads < 1 || o.compile_threads > 8)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "options.compile_threads=%d: must be 1..8", o.compile_threads);
    if (o.background_compile != 0 && o.background_compile != 1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "options.background_compile=%d: must be 0 or 1", o.background_compile);
    if (o.compile_in_call != 0 && o.compile_in_call != 1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "options.compile_in_call=%d: must be 0 or 1", o.compile_in_call);
    if (o.cache_dir) TRY(ctx_copy_path("cache_dir", o.cache_dir, out->cache_dir, sizeof out->cache_dir));
    if (o.cache_ro) TRY(ctx_copy_path("cache_ro", o.cache_ro, out->cache_ro, sizeof out->cache_ro));
    out->cache_ro_given = o.cache_ro != NULL;
    out->compile_threads = o.compile_threads;
    out->background = o.background_compile;
    out->compile_in_call = o.compile_in_call;
    out->log = (log_sink){o.log, o.log_user, o.log_level};
    return FLCE_OK;
}

jit_settings ctx_jit(const ctx_settings *s)
{
    jit_settings js = {s->cache_dir[0] ? s->cache_dir : NULL, s->cache_ro_given ? s->cache_ro : NULL,
                       s->compile_threads, s->background};
    return js;
}

int ctx_background(const flce_context *ctx)
{
    return ctx->settings.background >= 0 ? ctx->settings.background : config_get()->prefetch;
}

log_sink ctx_log_enter(const flce_context *ctx) { return ctx ? log_sink_set(ctx->settings.log) : log_sink_get(); }

void ctx_log_leave(log_sink *saved) { log_sink_set(*saved); }

static flce_status ctx_create(int device, const ctx_settings *settings, flce_context **out);

flce_status flce_context_create(int device, flce_context **out) { return flce_context_create_ex(device, NULL, out); }

flce_status flce_context_create_ex(int device, const flce_options *options, flce_context **out)
{
    err_clear();
    if (!out) return err_set(FLCE_ERR_INVALID_ARGUMENT, "out: NULL (expected a place for the context)");
    *out = NULL;
    ctx_settings *settings = malloc(sizeof *settings);
    if (!settings) return err_set(FLCE_ERR_OUT_OF_MEMORY, "flce_context_create: out of host memory");
    flce_status st = ctx_settings_from(options, settings);
    if (st == FLCE_OK) {
        log_sink saved = log_sink_set(settings->log); /* its creation logs as its calls will */
        st = ctx_create(device, settings, out);
        log_sink_set(saved);
    }
    free(settings);
    return st;
}

static flce_status ctx_create(int device, const ctx_settings *settings, flce_context **out)
{
    TRY(drv_load());
    int count = 0;
    DRV_TRY(drv.DeviceGetCount(&count));
    if (device < 0 || device >= count)
        return err_set(FLCE_ERR_NO_DEVICE, "device=%d: this machine has %d CUDA device(s)", device,
                       count);
    flce_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return err_set(FLCE_ERR_OUT_OF_MEMORY, "flce_context_create: out of host memory");
    ctx->settings = *settings;
    ctx->ordinal = device;
    pthread_mutex_init(&ctx->lock, NULL);
    flce_status st = FLCE_OK;
    CUresult r = drv.DeviceGet(&ctx->dev, device);
    if (r == CUDA_SUCCESS) r = drv.DevicePrimaryCtxRetain(&ctx->primary, ctx->dev);
    if (r != CUDA_SUCCESS) {
        st = drv_error(r, "retaining the device's primary context");
        free(ctx);
        return st;
    }
    int major = 0, minor = 0;
    st = ctx_device_facts(ctx, &major, &minor);
    if (st != FLCE_OK) return ctx_create_failed(ctx, st);
    ctx->sm = major * 10 + minor;
    if (ctx->sm < 80) {
        st = err_set(FLCE_ERR_UNSUPPORTED, "device %d (%s) is sm_%d: flce needs sm_80 or newer",
                     device, ctx->name, ctx->sm);
        return ctx_create_failed(ctx, st);
    }
    CUcontext prev;
    st = ctx_enter(ctx, &prev);
    if (st == FLCE_OK) {
        void *host = NULL;
        r = fault_fire(FAULT_DEVICE_RESOURCE)
                ? CUDA_ERROR_OUT_OF_MEMORY
                : drv.MemHostAlloc(&host, 2 * sizeof(int), CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
        if (r == CUDA_SUCCESS) {
            ctx->flag_host = host;
            ctx->flag_host[0] = ctx->flag_host[1] = 0;
            r = drv.MemHostGetDevicePointer(&ctx->flag_dev, host, 0);
        }
        if (r != CUDA_SUCCESS) st = drv_error(r, "allocating the host-mapped error flag");
        ctx_leave(prev);
    }
    if (st != FLCE_OK) return ctx_create_failed(ctx, st);
    log_msg(LOG_INFO, "context on device %d: %s, sm_%d, %d SMs", device, ctx->name, ctx->sm,
            ctx->num_sms);
    *out = ctx;
    return FLCE_OK;
}

/* Releases everything ctx holds, whatever fails; the first failure is the status (each is logged). */
static flce_status ctx_free(flce_context *ctx)
{
    CUcontext prev = NULL;
    int entered = ctx->primary && ctx_enter(ctx, &prev) == FLCE_OK;
    flce_status st = FLCE_OK, s;
    for (size_t i = 0; i < ctx->n_modules; i++) {
        s = drv_release(drv.ModuleUnload(ctx->modules[i].module), "cuModuleUnload");
        if (st == FLCE_OK) st = s;
    }
    free(ctx->modules);
    free(ctx->aliases);
    s = ctx->workspace ? drv_release(drv.MemFree(ctx->workspace), "cuMemFree (workspace)") : FLCE_OK;
    if (st == FLCE_OK) st = s;
    s = ctx->flag_host ? drv_release(drv.MemFreeHost((void *)ctx->flag_host), "cuMemFreeHost (error flag)")
                       : FLCE_OK;
    if (st == FLCE_OK) st = s;
    s = ctx->fork ? drv_release(drv.EventDestroy(ctx->fork), "cuEventDestroy (side stream fork)") : FLCE_OK;
    if (st == FLCE_OK) st = s;
    s = ctx->join ? drv_release(drv.EventDestroy(ctx->join), "cuEventDestroy (side stream join)") : FLCE_OK;
    if (s == FLCE_OK && ctx->workspace_done)
        s = drv_release(drv.EventDestroy(ctx->workspace_done), "cuEventDestroy (workspace done)");
    if (st == FLCE_OK) st = s;
    s = ctx->side ? drv_release(drv.StreamDestroy(ctx->side), "cuStreamDestroy (side stream)") : FLCE_OK;
    if (st == FLCE_OK) st = s;
    s = ctx->fill ? drv_release(drv.StreamDestroy(ctx->fill), "cuStreamDestroy (fill stream)") : FLCE_OK;
    if (st == FLCE_OK) st = s;
    if (entered) ctx_leave(prev);
    s = ctx->primary ? drv_release(drv.DevicePrimaryCtxRelease(ctx->dev), "cuDevicePrimaryCtxRelease")
                     : FLCE_OK;
    if (st == FLCE_OK) st = s;
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
    return st;
}

flce_status flce_context_destroy(flce_context *ctx)
{
    err_clear();
    if (!ctx) return FLCE_OK;
    log_sink saved = log_sink_set(ctx->settings.log); /* not CTX_LOG_SCOPE: ctx is freed before the end */
    flce_status st = ctx_free(ctx);
    log_sink_set(saved);
    if (st == FLCE_OK) err_clear(); /* the message of an enter that failed: nothing was left undone */
    return st;
}

/* flce_context_create's way out after the primary context is retained: frees ctx and returns st
 * with the message that explains it (not one of the release's). */
static flce_status ctx_create_failed(flce_context *ctx, flce_status st)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", err_message());
    ctx_free(ctx);
    return err_set(st, "%s", msg);
}

flce_status flce_context_arch(const flce_context *ctx, int *sm)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL");
    if (!sm) return err_set(FLCE_ERR_INVALID_ARGUMENT, "sm: NULL");
    *sm = ctx->sm;
    return FLCE_OK;
}

/* Loads the cubin built for spec s (and frees it) into m. */
static flce_status ctx_load_module(const kernel_spec *s, jit_result *jr, ctx_module *m)
{
    CUresult r = fault_fire(FAULT_MODULE_LOAD) ? CUDA_ERROR_INVALID_IMAGE
                                               : drv.ModuleLoadData(&m->module, jr->cubin);
    free(jr->cubin);
    jr->cubin = NULL;
    if (r != CUDA_SUCCESS) return drv_error(r, "loading a compiled kernel module");
    const char *const *names = emit_kernel_names(s->role);
    size_t smem = spec_smem_bytes(s);
    for (int i = 0; names[i]; i++) {
        r = drv.ModuleGetFunction(&m->fn[i], m->module, names[i]);
        if (r == CUDA_SUCCESS && smem > 48 * 1024)
            r = drv.FuncSetAttribute(m->fn[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     (int)smem);
        if (r != CUDA_SUCCESS) {
            drv_release(drv.ModuleUnload(m->module), "cuModuleUnload"); /* logged if it fails too */
            return drv_error(r, names[i]);
        }
    }
    return FLCE_OK;
}

/* Remembers that spec s is served by module m (a failed allocation only costs a later hash). */
static void ctx_add_alias(flce_context *ctx, const kernel_spec *s, size_t m)
{
    if (ctx->n_aliases >= CTX_MAX_ALIASES) return;
    if (!ctx->aliases) {
        ctx->aliases = calloc(CTX_MAX_ALIASES, sizeof *ctx->aliases);
        if (!ctx->aliases) return;
    }
    ctx->aliases[ctx->n_aliases].spec = *s, ctx->aliases[ctx->n_aliases].module = m, ctx->n_aliases++;
}

/* The index of the loaded module of spec s, or -1. The bytes of the spec it was loaded for, or of
 * one that found it before (an alias), are the fast path every call takes; other specs are looked
 * up by the hash of their source (what the disk cache names the entry by): a spec whose source is
 * already loaded (another shape's) finds that module and becomes an alias. *hash receives s's
 * hash when it was computed (*hashed = 1). */
static flce_status ctx_find(flce_context *ctx, const kernel_spec *s, long *index, uint64_t hash[2], int *hashed)
{
    *index = -1, *hashed = 0;
    for (size_t i = 0; i < ctx->n_modules; i++)
        if (!memcmp(&ctx->modules[i].spec, s, sizeof *s)) {
            *index = (long)i;
            return FLCE_OK;
        }
    for (size_t i = 0; i < ctx->n_aliases; i++)
        if (!memcmp(&ctx->aliases[i].spec, s, sizeof *s)) {
            *index = (long)ctx->aliases[i].module;
            return FLCE_OK;
        }
    TRY(jit_key_hash(s, hash));
    *hashed = 1;
    for (size_t i = 0; i < ctx->n_modules; i++)
        if (!memcmp(ctx->modules[i].hash, hash, 2 * sizeof hash[0])) {
            *index = (long)i;
            ctx_add_alias(ctx, s, i);
            return FLCE_OK;
        }
    return FLCE_OK;
}

/* Registers the cubin jr built for spec s (hash h) as a new module; its index in *at. */
static flce_status ctx_register(flce_context *ctx, const kernel_spec *s, const uint64_t h[2], jit_result *jr, size_t *at)
{
    if (ctx->n_modules == ctx->cap_modules) {
        size_t cap = ctx->cap_modules ? 2 * ctx->cap_modules : 16;
        ctx_module *t = realloc(ctx->modules, cap * sizeof *t);
        if (!t) {
            free(jr->cubin), jr->cubin = NULL; /* as a failed load does */
            return err_set(FLCE_ERR_OUT_OF_MEMORY, "kernel table: out of host memory");
        }
        ctx->modules = t, ctx->cap_modules = cap;
    }
    ctx_module *mod = &ctx->modules[ctx->n_modules];
    memset(mod, 0, sizeof *mod);
    mod->spec = *s;
    memcpy(mod->hash, h, sizeof mod->hash);
    TRY(ctx_load_module(s, jr, mod));
    *at = ctx->n_modules++;
    for (size_t i = 0; i < ctx->n_standins;) /* s itself is loaded now (flce_prepare): no stand-in */
        if (!memcmp(&ctx->standins[i].spec, s, sizeof *s)) ctx->standins[i] = ctx->standins[--ctx->n_standins];
        else i++;
    return FLCE_OK;
}

/* Tiered kernels (issue 16 item 3). The only kernel specialized beyond what every shape of a
 * problem class shares is the compact logits pass for a vocabulary of whole tiles (full_tiles:
 * no partial-tile code, 0.35 ms faster at 8192x4096x128256). Its generic twin (full_tiles 0)
 * computes the same thing the same way for any vocabulary, with a mask it never takes here. When
 * spec s (full_tiles) is neither loaded nor on disk but its twin is one or the other, the call runs
 * on the twin now and s compiles in the background; calls keep the twin while that compile is
 * queued (ctx_stand_in_serving, looked up before s's source is hashed: every call until then
 * takes it), and the first call after it loads s from disk. ctx_stand_in installs one: *index is
 * the module serving s, or -1: build s the usual way (no twin available, a prefetch not possible,
 * or tiering off). */
static long ctx_stand_in_serving(flce_context *ctx, const kernel_spec *s)
{
    jit_settings js = ctx_jit(&ctx->settings);
    for (size_t i = 0; i < ctx->n_standins; i++) {
        if (memcmp(&ctx->standins[i].spec, s, sizeof *s)) continue;
        if (jit_prefetch_state_with(&js, s) == JIT_PREFETCH_QUEUED) return (long)ctx->standins[i].module;
        ctx->standins[i] = ctx->standins[--ctx->n_standins]; /* compiled (or failed): build s now */
        log_msg(LOG_INFO, "tiered: the specialized kernel's background compile has finished; loading it");
        return -1;
    }
    return -1;
}

static flce_status ctx_stand_in(flce_context *ctx, const kernel_spec *s, long *index)
{
    *index = -1;
    if (!s->full_tiles || !config_get()->tiered || !ctx_background(ctx) || ctx->preparing) return FLCE_OK;
    jit_settings js = ctx_jit(&ctx->settings);
    if (ctx->n_standins == CTX_MAX_STANDINS || jit_prefetch_state_with(&js, s) != JIT_PREFETCH_NONE) return FLCE_OK;
    jit_result own;
    TRY(jit_lookup_with(&js, s, &own));
    if (own.cubin) { /* on disk: the usual way loads it */
        free(own.cubin);
        return FLCE_OK;
    }
    kernel_spec twin = *s;
    twin.full_tiles = 0;
    long at = -1;
    uint64_t h[2];
    int hashed = 0;
    TRY(ctx_find(ctx, &twin, &at, h, &hashed));
    if (at < 0) {
        jit_result jr;
        TRY(jit_lookup_with(&js, &twin, &jr));
        if (!jr.cubin) return FLCE_OK; /* neither is built: compile s (its twin follows, ctx_kernels_many) */
        size_t m = 0;
        TRY(ctx_register(ctx, &twin, jr.key_hash, &jr, &m));
        at = (long)m;
    }
    const kernel_spec *one = s;
    if (jit_prefetch_with(&js, &one, 1) != 1) return FLCE_OK; /* nothing would compile s: build it now */
    ctx->standins[ctx->n_standins].spec = *s, ctx->standins[ctx->n_standins].module = (size_t)at;
    ctx->n_standins++;
    char summary[256];
    spec_summary(s, summary, sizeof summary);
    log_msg(LOG_INFO, "tiered: kernel %s is not cached; its generic twin (any vocabulary) runs while it compiles in the background",
            summary);
    *index = at;
    return FLCE_OK;
}

void ctx_prebuild(flce_context *ctx, const kernel_spec *const *specs, int n, int all)
{
    enum { MAX_SPECS = 8 };
    if (!config_get()->unlocked_compile || n <= 0 || n > MAX_SPECS) return;
    if (!all && !ctx->settings.compile_in_call) return; /* ctx_kernels_many says FLCE_ERR_NOT_READY */
    const kernel_spec *missing[MAX_SPECS];
    int m = 0;
    pthread_mutex_lock(&ctx->lock);
    for (int i = 0; i < n; i++) {
        long index = -1;
        uint64_t h[2];
        int hashed = 0;
        if (ctx_find(ctx, specs[i], &index, h, &hashed) != FLCE_OK) break; /* the locked path says why */
        int stand_in_may_serve = specs[i]->full_tiles && config_get()->tiered && ctx_background(ctx) && !all;
        if (index < 0 && !stand_in_may_serve) missing[m++] = specs[i];
    }
    pthread_mutex_unlock(&ctx->lock);
    char dir[CACHE_PATH_MAX];
    int memory_only = !ctx->settings.cache_dir[0] && cache_dir_writable(dir, sizeof dir) != FLCE_OK;
    if (m == 0 || memory_only) { /* memory only: build under the lock */
        err_clear();
        return;
    }
    jit_settings js = ctx_jit(&ctx->settings);
    jit_result built[MAX_SPECS];
    if (jit_build_many_with(&js, missing, m, built) == FLCE_OK)
        for (int k = 0; k < m; k++) free(built[k].cubin);
    err_clear(); /* a failure is reported by the locked path, which builds again */
}

/* compile_in_call = 0 (flce_options): the missing kernels from the disk cache alone. One that is not
 * there makes the call FLCE_ERR_NOT_READY, having loaded nothing; with background compiles on, the
 * absent ones compile in the background meanwhile, so that a later call finds them. */
static flce_status ctx_cached_only(flce_context *ctx, const kernel_spec *const *missing, int m, jit_result *built)
{
    jit_settings js = ctx_jit(&ctx->settings);
    const kernel_spec *absent[8];
    int a = 0;
    flce_status st = FLCE_OK;
    memset(built, 0, (size_t)m * sizeof *built);
    for (int k = 0; k < m && st == FLCE_OK; k++) {
        st = jit_lookup_with(&js, missing[k], &built[k]);
        if (st == FLCE_OK && !built[k].cubin && a < 8) absent[a++] = missing[k];
    }
    if (st == FLCE_OK && a == 0) return FLCE_OK;
    for (int k = 0; k < m; k++) free(built[k].cubin), built[k].cubin = NULL;
    if (st != FLCE_OK) return st;
    char summary[256], more[32] = "";
    spec_summary(absent[0], summary, sizeof summary);
    if (a > 1) snprintf(more, sizeof more, " (and %d more)", a - 1);
    int compiling = jit_prefetch_with(&js, absent, a) > 0 || jit_prefetch_state_with(&js, absent[0]) == JIT_PREFETCH_QUEUED;
    return err_set(FLCE_ERR_NOT_READY,
                   "kernel %s%s is not compiled yet and this context does not compile in a call "
                   "(flce_options.compile_in_call = 0): call flce_prepare with this problem first%s",
                   summary, more, compiling ? "; it is compiling in the background now" : "");
}

flce_status ctx_kernels_many(flce_context *ctx, const kernel_spec *const *specs, int n, CUfunction (*fns)[CTX_MAX_KERNELS])
{
    enum { MAX_SPECS = 8 };
    if (n > MAX_SPECS) return err_set(FLCE_ERR_INTERNAL, "ctx_kernels_many: %d specs, at most %d", n, MAX_SPECS);
    const kernel_spec *missing[MAX_SPECS];
    uint64_t missing_hash[MAX_SPECS][2];
    long index[MAX_SPECS]; /* loaded module, or -1 - k for missing[k] */
    int m = 0;
    for (int i = 0; i < n; i++) {
        uint64_t h[2];
        int hashed = 0;
        index[i] = ctx->n_standins && !ctx->preparing ? ctx_stand_in_serving(ctx, specs[i]) : -1;
        if (index[i] >= 0) continue;
        TRY(ctx_find(ctx, specs[i], &index[i], h, &hashed));
        if (index[i] >= 0) continue;
        TRY(ctx_stand_in(ctx, specs[i], &index[i]));
        if (index[i] >= 0) continue;
        int k = 0; /* the same source twice in one request compiles once */
        while (k < m && memcmp(missing_hash[k], h, sizeof h)) k++;
        if (k == m) missing[m] = specs[i], memcpy(missing_hash[m], h, sizeof h), m++;
        index[i] = -1 - k;
    }
    size_t first_new = ctx->n_modules; /* missing[k] becomes module first_new + k */
    if (m > 0) {
        /* NVRTC for all the missing kernels at once: a first call waits for its slowest kernel, not
         * for the sum (issue 16: 5.7 s of one-after-another compiles at 8192×4096×128256). */
        jit_settings js = ctx_jit(&ctx->settings);
        jit_result built[MAX_SPECS];
        if (ctx->settings.compile_in_call || ctx->preparing) TRY(jit_build_many_with(&js, missing, m, built));
        else TRY(ctx_cached_only(ctx, missing, m, built));
        for (int k = 0; k < m; k++) {
            size_t at;
            flce_status st = ctx_register(ctx, missing[k], missing_hash[k], &built[k], &at);
            if (st != FLCE_OK) { /* nothing half-done: the ones after it are freed, not loaded */
                for (int j = k + 1; j < m; j++) free(built[j].cubin);
                return st;
            }
        }
        /* A specialized kernel compiled here: its generic twin next, in the background, so that a
         * later shape whose vocabulary is not whole tiles loads it, and one whose is but whose own
         * kernel is not built yet runs on it at once (ctx_stand_in). */
        for (int k = 0; k < m && config_get()->tiered; k++) {
            if (!missing[k]->full_tiles || built[k].origin != JIT_COMPILED) continue;
            kernel_spec twin = *missing[k];
            twin.full_tiles = 0;
            const kernel_spec *one = &twin;
            jit_prefetch_with(&js, &one, 1);
        }
    }
    for (int i = 0; i < n; i++) {
        size_t at = index[i] >= 0 ? (size_t)index[i] : first_new + (size_t)(-1 - index[i]);
        memcpy(fns[i], ctx->modules[at].fn, sizeof fns[i]);
    }
    return FLCE_OK;
}

flce_status ctx_workspace(flce_context *ctx, uint64_t bytes, CUstream stream, CUdeviceptr *out)
{
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    int capturing = drv.StreamIsCapturing(stream, &cap) == CUDA_SUCCESS &&
                    cap != CU_STREAM_CAPTURE_STATUS_NONE;
    if (bytes <= ctx->workspace_bytes && ctx->workspace) {
        /* One buffer, several streams (threads sharing the context, tests/test_concurrency.c):
         * work queued on the last stream may still use it. The new stream waits, on the device,
         * for the event the last call recorded after its work (ctx_workspace_done; an event
         * outlives the stream it was recorded on), so no call synchronizes the host. Under
         * capture the caller orders the streams (capture needs a workspace set up beforehand). */
        if (stream != ctx->workspace_stream && !capturing) {
            if (ctx->workspace_done_set)
                DRV_TRY(drv.StreamWaitEvent(stream, ctx->workspace_done, 0));
            ctx->workspace_stream = stream;
        }
        *out = ctx->workspace;
        return FLCE_OK;
    }
    /* The event that orders the workspace's next user after this call (ctx_workspace_done), made
     * here, before the call queues work: a failure then leaves nothing half-run. */
    if (!ctx->workspace_done && !capturing) {
        CUresult r = fault_fire(FAULT_DEVICE_RESOURCE) ? CUDA_ERROR_OUT_OF_MEMORY
                                                       : drv.EventCreate(&ctx->workspace_done, CU_EVENT_DISABLE_TIMING);
        if (r != CUDA_SUCCESS) return drv_error(r, "cuEventCreate (the event after the workspace's last use)");
    }
    if (capturing)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "workspace: NULL while the stream is being captured into a graph; pass "
                       "flce_tensors.workspace (flce_workspace_size bytes) or run once before "
                       "capturing");
    if (ctx->workspace) {
        /* The old buffer may still be in use by queued work: the host waits for the last call
         * that used it (every earlier one is ordered before it), then frees it. Growing is the
         * one place a call without a workspace of its own synchronizes the host (flce.h). */
        if (ctx->workspace_done_set) DRV_TRY(drv.EventSynchronize(ctx->workspace_done));
        else DRV_TRY(drv.CtxSynchronize());
        flce_status st = drv_release(drv.MemFree(ctx->workspace), "cuMemFree (the smaller workspace)");
        ctx->workspace = 0, ctx->workspace_bytes = 0;
        TRY(st);
    }
    CUresult r = fault_fire(FAULT_DEVICE_ALLOC) ? CUDA_ERROR_OUT_OF_MEMORY
                                                : drv.MemAlloc(&ctx->workspace, bytes);
    if (r != CUDA_SUCCESS) {
        ctx->workspace = 0;
        return err_set(r == CUDA_ERROR_OUT_OF_MEMORY ? FLCE_ERR_OUT_OF_MEMORY : FLCE_ERR_CUDA,
                       "allocating %llu bytes of workspace on device %d failed (lower "
                       "memory_budget or pass a workspace)",
                       (unsigned long long)bytes, ctx->ordinal);
    }
    ctx->workspace_bytes = bytes;
    ctx->workspace_stream = stream;
    log_msg(LOG_INFO, "workspace grown to %.1f MiB", (double)bytes / (1 << 20));
    *out = ctx->workspace;
    return FLCE_OK;
}

flce_status ctx_workspace_done(flce_context *ctx, CUstream stream)
{
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    if (drv.StreamIsCapturing(stream, &cap) != CUDA_SUCCESS || cap != CU_STREAM_CAPTURE_STATUS_NONE)
        return FLCE_OK; /* a graph's replays are ordered by its caller */
    if (!ctx->workspace_done) DRV_TRY(drv.EventCreate(&ctx->workspace_done, CU_EVENT_DISABLE_TIMING));
    DRV_TRY(drv.EventRecord(ctx->workspace_done, stream));
    ctx->workspace_done_set = 1;
    return FLCE_OK;
}

flce_status ctx_take_flag(flce_context *ctx)
{
    if (!ctx->flag_host) return FLCE_OK;
    int tp = ctx->flag_host[1];
    if (tp) {
        ctx->flag_host[1] = 0;
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensor parallel ranks disagree:%s%s%s (seen in the statistics all-gather of "
                       "an earlier call, whose results are not valid)",
                       tp & FLCE_FLAG_TP_SHARDS ? " the ranks' [vocab_offset, vocab_offset + "
                                                  "vocab_shard) overlap or leave gaps;" : "",
                       tp & FLCE_FLAG_TP_TOTAL ? " vocab_total differs;" : "",
                       tp & FLCE_FLAG_TP_TOKENS ? " tokens differs;" : "");
    }
    if (ctx->flag_host[0]) {
        ctx->flag_host[0] = 0;
        return err_set(FLCE_ERR_BAD_LABEL,
                       "labels: an earlier call saw a label outside [0, vocab_total) that is not "
                       "ignore_index; those tokens were treated as ignored");
    }
    return FLCE_OK;
}

flce_status ctx_side_stream(flce_context *ctx)
{
    if (ctx->side && ctx->fork && ctx->join) return FLCE_OK;
    int least = 0, greatest = 0;
    CUresult r = fault_fire(FAULT_DEVICE_RESOURCE) ? CUDA_ERROR_OUT_OF_MEMORY
                                                   : drv.CtxGetStreamPriorityRange(&least, &greatest);
    if (r == CUDA_SUCCESS && !ctx->side) r = drv.StreamCreateWithPriority(&ctx->side, CU_STREAM_NON_BLOCKING, greatest);
    if (r == CUDA_SUCCESS && !ctx->fork) r = drv.EventCreate(&ctx->fork, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS && !ctx->join) r = drv.EventCreate(&ctx->join, CU_EVENT_DISABLE_TIMING);
    return r == CUDA_SUCCESS ? FLCE_OK : drv_error(r, "creating the side stream of the overlapped dH reduction");
}

flce_status ctx_fill_stream(flce_context *ctx)
{
    if (ctx->fill && ctx->fork && ctx->join) return FLCE_OK;
    int least = 0, greatest = 0;
    CUresult r = fault_fire(FAULT_DEVICE_RESOURCE) ? CUDA_ERROR_OUT_OF_MEMORY
                                                   : drv.CtxGetStreamPriorityRange(&least, &greatest);
    if (r == CUDA_SUCCESS && !ctx->fill) r = drv.StreamCreateWithPriority(&ctx->fill, CU_STREAM_NON_BLOCKING, least);
    if (r == CUDA_SUCCESS && !ctx->fork) r = drv.EventCreate(&ctx->fork, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS && !ctx->join) r = drv.EventCreate(&ctx->join, CU_EVENT_DISABLE_TIMING);
    return r == CUDA_SUCCESS ? FLCE_OK : drv_error(r, "creating the stream dW runs on beside dH");
}
