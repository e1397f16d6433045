/* api_info.c — the public entry points that describe rather than compute: a context's device
 * (flce_context_info_get) and the run-time libraries the process found (flce_library_info_get).
 * They exist so that the flce tool names the GPU, NVRTC, NCCL and the tune table through flce.h
 * instead of reading struct flce_context or calling nvrtc_/comm_/tune_ functions (issue 42). */
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "context.h"
#include "error.h"
#include "nvrtc_compile.h"
#include "tune_table.h"

void flce_context_info_init(flce_context_info *info)
{
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
}

void flce_library_info_init(flce_library_info *info)
{
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
}

/* Both structs are new in API version 3, so their first layout is the smallest one accepted; a
 * larger struct_size is a caller built against a newer flce.h (as normalize_problem says in api.c). */
static flce_status check_size(const char *what, uint32_t got, size_t have, const char *init)
{
    if (got < have)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "%s.struct_size=%u: smaller than any %s (%zu); initialize with %s", what, got, what, have,
                       init);
    if (got > have)
        return err_set(FLCE_ERR_UNSUPPORTED,
                       "%s.struct_size=%u: the caller was built against a newer flce.h than this library (%s, "
                       "%zu bytes)",
                       what, got, FLCE_VERSION_STRING, have);
    return FLCE_OK;
}

flce_status flce_context_info_get(const flce_context *ctx, flce_context_info *info)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL");
    if (!info) return err_set(FLCE_ERR_INVALID_ARGUMENT, "info: NULL");
    TRY(check_size("info", info->struct_size, sizeof *info, "flce_context_info_init"));
    info->device = ctx->ordinal;
    info->sm = ctx->sm;
    info->num_sms = ctx->num_sms;
    info->memory_bytes = ctx->mem_bytes;
    snprintf(info->name, sizeof info->name, "%s", ctx->name);
    return FLCE_OK;
}

flce_status flce_library_info_get(flce_library_info *info)
{
    err_clear();
    if (!info) return err_set(FLCE_ERR_INVALID_ARGUMENT, "info: NULL");
    TRY(check_size("info", info->struct_size, sizeof *info, "flce_library_info_init"));
    /* nvrtc_load_error loads NVRTC first, so the version and file below describe the loaded one. */
    const char *why = nvrtc_load_error(), *file = why ? NULL : nvrtc_library_file();
    if (why) snprintf(info->nvrtc, sizeof info->nvrtc, "%s", why);
    else if (file) snprintf(info->nvrtc, sizeof info->nvrtc, "NVRTC %s (%s)", nvrtc_version_text(), file);
    else snprintf(info->nvrtc, sizeof info->nvrtc, "NVRTC %s", nvrtc_version_text());
    comm_nccl_version(info->nccl, sizeof info->nccl);
    /* No cache directory (no HOME, no XDG_CACHE_HOME) leaves the path empty: the other lines still
     * describe the process, so that is not a failure of this call. */
    if (tune_table_path(info->tune_table, sizeof info->tune_table) != FLCE_OK) info->tune_table[0] = '\0';
    return FLCE_OK;
}
