/*
 * flce.h — the whole public C API of flce: a language model's output layer fused with its
 * cross-entropy loss, computed on an NVIDIA GPU without materializing the tokens × vocab logits.
 *
 * Conventions
 *  - Every call returns an flce_status. On failure, flce_last_error() gives a message in words
 *    that names the argument, its value and what was expected. The message is per thread.
 *  - Device pointers are plain addresses in the device's primary context (what PyTorch's
 *    tensor.data_ptr() returns). They must be 16-byte aligned unless said otherwise.
 *  - Streams are CUstream / cudaStream_t values passed as void*; NULL is the legacy stream.
 *    Calls enqueue work and return without synchronizing the host (see flce_check).
 *  - Structs that may grow carry struct_size; initialize them with the _init functions
 *    (flce_problem_init, flce_tensors_init) so that fields added later get their defaults.
 *
 * The math (per token i, global vocab of size V; docs/DESIGN.md §1):
 *    z_ij   = (h_i · w_j + b_j) / T           logits (never stored whole); bias b, temperature T
 *    z_ij   = c · tanh(z_ij / c)              softcap c > 0
 *    lse_i  = log Σ_j exp(z_ij),  p_ij = exp(z_ij − lse_i)
 *    loss_i = (1−ε)·w_y·(lse_i − z_iy) + (ε/V)·Σ_j w_j·(lse_i − z_ij) + λ·w_y·lse_i²
 *             label smoothing ε, z-loss λ, class weights w (all 1 without them); 0 when ignored
 *    dz_ij  = g_i · [ a_i·p_ij − (1−ε)·w_y·1[j = y_i] − (ε/V)·w_j ] · (1/T) · (1 − (z_ij/c)²)
 *             a_i = (1−ε)·w_y + (ε/V)·Σ_j w_j + 2λ·w_y·lse_i
 *    dH = dZ · W,  dW = dZᵀ · H,  db = Σ_i dZ_i
 *    g_i = g / Σ_valid w_y (mean), g (sum), g_i (none), 0 for ignored tokens.
 */
#ifndef FLCE_H
#define FLCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLCE_VERSION_MAJOR 0
#define FLCE_VERSION_MINOR 1
#define FLCE_VERSION_PATCH 0
#define FLCE_VERSION_STRING "0.1.0"
/* Bumped when a struct gains a field; struct_size tells the library which fields a caller has. */
#define FLCE_API_VERSION 4

#if defined(_WIN32)
#define FLCE_API
#else
#define FLCE_API __attribute__((visibility("default")))
#endif

typedef enum flce_status {
    FLCE_OK = 0,
    FLCE_ERR_INVALID_ARGUMENT = 1, /* an argument is out of range; the message names it */
    FLCE_ERR_UNSUPPORTED = 2,      /* valid request that this build or GPU does not implement */
    FLCE_ERR_NO_DRIVER = 3,        /* libcuda.so.1 could not be loaded or is too old */
    FLCE_ERR_NO_DEVICE = 4,        /* no CUDA device, or the ordinal does not exist */
    FLCE_ERR_CUDA = 5,             /* a CUDA driver call failed; the message has the driver's words */
    FLCE_ERR_COMPILE = 6,          /* NVRTC rejected generated source; the message has its log */
    FLCE_ERR_OUT_OF_MEMORY = 7,    /* device or host allocation failed */
    FLCE_ERR_BAD_LABEL = 8,        /* an earlier call saw a label outside [0, V) */
    FLCE_ERR_IO = 9,               /* a file operation failed (tools and cache management only) */
    FLCE_ERR_INTERNAL = 10,        /* a bug in flce: please report the message */
    FLCE_ERR_NOT_READY = 11        /* a context made with compile_in_call = 0 (flce_options) was called
                                      before its kernels were compiled: call flce_prepare; nothing ran */
} flce_status;

typedef enum flce_dtype {
    FLCE_DTYPE_F32 = 0,
    FLCE_DTYPE_F16 = 1,
    FLCE_DTYPE_BF16 = 2
} flce_dtype;

typedef enum flce_reduction {
    FLCE_REDUCTION_MEAN = 0, /* Σ loss_i / count of valid tokens (with class weights Σ_valid w_y);
                                0 when there are none */
    FLCE_REDUCTION_SUM = 1,
    FLCE_REDUCTION_NONE = 2  /* loss is a per-token vector */
} flce_reduction;

typedef enum flce_strategy {
    FLCE_STRATEGY_AUTO = 0,     /* the dispatcher picks the plan its cost model says is faster
                                   among those that fit memory_budget (`flce bench --list` shows
                                   the estimates) */
    FLCE_STRATEGY_FORWARD = 1,  /* loss/lse only, O(N) memory */
    FLCE_STRATEGY_CHUNKED = 2,  /* loss and grads in one pass over token chunks, 6NVD; 16-bit
                                   training calls store the chunk's logits compactly (2 bytes) */
    FLCE_STRATEGY_RECOMPUTE = 3, /* backward that recomputes the logits, 8NVD */
    FLCE_STRATEGY_SAVED = 4      /* loss-and-grad in two calls, 6NVD: flce_forward keeps the
                                    compact logits and statistics in tensors.workspace and
                                    flce_backward forms the gradients from them, with upstream
                                    gradients known only then ("Saved logits" below) */
} flce_strategy;

/* problem.grad_outputs: the per-token outputs whose upstream gradients flce_backward (and
 * flce_loss_and_grad) receive besides the loss's grad_output (tensors.grad_logprob, grad_lse,
 * grad_entropy). Kernels are specialized on them. */
enum {
    FLCE_GRAD_LOGPROB = 1, /* d(z_y − lse): g·(1[j=y] − p_j) */
    FLCE_GRAD_LSE = 2,     /* d lse: g·p_j (z-loss written by hand, λ·lse², is g = 2λ·lse) */
    FLCE_GRAD_ENTROPY = 4, /* d(lse − Σ p z): −g·p_j·(log p_j + H); compact logits with a dz pass */
    FLCE_GRAD_LOSS_PER_TOKEN = 8 /* d loss_i (reductions mean and sum: beside the reduced loss's
                                    grad_output), added to the loss's per-token factor */
};

typedef enum flce_op {
    FLCE_OP_FORWARD = 0,
    FLCE_OP_LOSS_AND_GRAD = 1,
    FLCE_OP_BACKWARD = 2
} flce_op;

/* The problem: shapes, dtype and options. Everything the kernels are specialized on. */
typedef struct flce_problem {
    uint32_t struct_size;    /* sizeof(flce_problem) as the caller compiled it */
    uint32_t api_version;    /* FLCE_API_VERSION as the caller compiled it */
    int64_t tokens;          /* N >= 1 */
    int64_t hidden;          /* D >= 8, a multiple of 8 */
    int64_t vocab_shard;     /* V_r >= 1: rows of the weight held by this rank */
    int64_t vocab_offset;    /* global id of the shard's first row (0 without TP) */
    int64_t vocab_total;     /* V: global vocab size; 0 means vocab_offset + vocab_shard */
    flce_dtype dtype;        /* of hidden, weight, bias and the gradients */
    int32_t label_bits;      /* 32 or 64: labels are int32 or int64 */
    flce_reduction reduction;
    int64_t ignore_index;    /* labels equal to this contribute nothing; default -100 */
    float label_smoothing;   /* ε in [0, 1); 0 = off (PyTorch's label_smoothing) */
    float z_loss;            /* λ >= 0 adds λ·lse²; 0 = off */
    float softcap;           /* c > 0 caps logits as c·tanh(z/c); 0 = off */
    float temperature;       /* T > 0 divides the logits; default 1 */
    int32_t has_bias;        /* logits get + b_j (tensors.bias; tensors.grad_bias receives db) */
    int32_t tp_rank;         /* tensor-parallel rank (0..tp_size-1, the rank in tensors.comm) */
    int32_t tp_size;         /* ranks sharing the vocab (see "Tensor and sequence parallelism") */
    int32_t allow_tf32;      /* fp32 inputs may use TF32 matrix units (today's fp32 path is exact) */
    int32_t deterministic;   /* bitwise-identical results across runs (today's kernels always are) */
    flce_strategy strategy;  /* FLCE_STRATEGY_AUTO unless forcing one */
    uint64_t memory_budget;  /* bytes for one block of stored logits, which sets the chunk size;
                                0 = 512 MiB, except (chunked, 16-bit, own dW): all tokens
                                in one block when that takes no more than 512 MiB plus the dW
                                accumulator it makes unnecessary (under TP: for an even shard),
                                else (no TP) fewer, longer chunks as
                                long as the whole workspace stays within 1/16 of the device's
                                memory (5 GiB on an 80 GB GPU; if that much cannot be allocated,
                                the 512 MiB plan runs instead). Per logit: chunked 2 bytes (16-bit training: fp16
                                p̃ that becomes dZ in place, + 4 bytes per row and 256 columns),
                                else 6 (fp32 Z + dZ; fp32 inputs 4); recompute 2 (dZ; fp32 4).
                                On top: an fp32 V×D dW accumulator (chunked, several chunks,
                                16-bit dW) or N×D dH one (recompute, several vocab chunks,
                                16-bit dH; chunked: one chunk's rows when the vocab shard is
                                over 262144 columns), none when accumulating into the caller's
                                fp32 buffers; bf16 chunked without bias, smoothing, softcap,
                                z-loss or SP, chunks of 1e8 logits or more (row-scaled
                                logits, README): the chunk's hidden rows scaled, D·2 bytes
                                per row, and V + 1 ints; one dH launch whose tiles would fill
                                under half the SMs (few tokens): S ≤ 8 fp32 slabs of its
                                rows, S·N·D·4 bytes (16 MiB at 512×4096); and a few floats
                                per token. flce_workspace_size says the total (README, "Memory") */
    /* --- fields below were added after the first layout; older callers get their defaults --- */
    int32_t has_class_weights;      /* tensors.class_weights: vocab_total fp32 weights, as
                                       torch cross_entropy(weight=); mean divides by Σ_valid w_y */
    int32_t accumulate_grad_hidden; /* grad_hidden is fp32 and receives += dH (no dtype output) */
    int32_t accumulate_grad_weight; /* grad_weight is fp32 and receives += dW ("main_grad") */
    int32_t sequence_parallel;      /* with tp_size > 1: hidden, labels, per-token inputs and
                                       outputs and grad_hidden hold this rank's `tokens` rows of
                                       the tp_size·tokens global tokens (rank r: rows r·tokens ...) */
    /* --- API version 3 --- */
    int32_t grad_outputs;           /* FLCE_GRAD_* bits: per-token outputs that carry gradients
                                       (strategies CHUNKED and SAVED). With any bit
                                       set the loss's scalar grad_output (mean, sum) is folded into
                                       each token's dZ instead of the GEMM epilogues */
    int32_t batch_invariant;        /* 1: a token's lse, loss_i, target_logprob, entropy and argmax
                                       are bitwise identical whatever the number of tokens in the
                                       call, the other tokens, the chunking and the strategy (a
                                       fixed vocab split per 8192 columns, merged in order; every
                                       16-bit logits pass takes the compact pass's statistics; no
                                       row-scaled store; built-in logits tiles), for train/inference
                                       agreement of RL log-probs. Same GPU and flce version only */
} flce_problem;

/* Device buffers of one call. Unused outputs may be NULL. */
typedef struct flce_tensors {
    uint32_t struct_size;       /* sizeof(flce_tensors) as the caller compiled it */
    const void *hidden;         /* N × D, row-major, dtype */
    const void *weight;         /* V_r × D, row-major, dtype */
    const void *bias;           /* V_r, dtype (needs has_bias) */
    const void *labels;         /* N, int32 or int64 per label_bits; 4- or 8-byte aligned */
    const float *grad_output;   /* upstream gradient, fp32 on the device: 1 value (mean, sum)
                                   or N values (none); NULL means 1. Read on the device. */
    float *loss;                /* out: 1 value (mean, sum) or N values (none); 4-byte aligned */
    float *lse;                 /* out of forward/loss-and-grad, in of backward: N values */
    void *grad_hidden;          /* out: N × D, dtype */
    void *grad_weight;          /* out: V_r × D, dtype */
    void *workspace;            /* caller-owned scratch (flce_workspace_size bytes), or NULL to
                                   let the context allocate and keep one (not during graph capture).
                                   The context's one serves calls on any stream: a call on another
                                   stream than the last such call's waits for that call's work on
                                   the device (an event; no host synchronization); growing it waits
                                   on the host for the last call that used it. A workspace per
                                   stream from the caller avoids both (README, "Streams") */
    uint64_t workspace_bytes;
    /* --- fields below were added after the first layout; older callers get NULL --- */
    const float *class_weights; /* vocab_total fp32 values (needs has_class_weights) */
    void *grad_bias;            /* out: V_r, dtype: db = Σ_i dZ_i (needs has_bias) */
    float *loss_per_token;      /* out: N values of loss_i (before the reduction; 0 when ignored) */
    float *z_loss_out;          /* out: the λ·w_y·lse² part of the loss, reduced like the loss
                                   (1 value for mean/sum, N for none) */
    float *target_logprob;      /* out: N values of z_iy − lse_i (0 when ignored): log p of the label */
    float *entropy;             /* out: N values of lse_i − Σ_j p_ij z_ij */
    int64_t *argmax;            /* out: N global vocab ids of the largest z_ij (first on ties) */
    void *comm;                 /* ncclComm_t of the tensor-parallel group (tp_size > 1), whose
                                   rank tp_rank is this caller; NULL without TP. The statistics
                                   all-gather and dH's fp32 reduction run on the workspace (dH's
                                   16-bit all-gather in grad_hidden): a
                                   workspace every rank registered with comm (ncclCommRegister,
                                   all ranks or none; deregister before freeing it) lets NCCL skip
                                   its staging copies (README, "Tensor parallelism") */
    /* --- API version 3: per-token upstream gradients (N fp32 values each, read on the device by
     * flce_backward and flce_loss_and_grad; NULL means zeros), with problem.grad_outputs --- */
    const float *grad_logprob;  /* of target_logprob (0 where the label is ignored) */
    const float *grad_lse;      /* of lse (every token, ignored ones too) */
    const float *grad_entropy;  /* of entropy (every token); also needs tensors.entropy as the
                                   forward wrote it (an input here) */
    const float *grad_loss_per_token; /* of loss_per_token (0 where the label is ignored) */
    int *error_flag;            /* NULL: device-side errors of this call (a label outside [0, V) that
                                   is not ignore_index; tensor-parallel ranks that disagree) are
                                   reported by the next call on the context or flce_check. Else
                                   int[2] of device memory (4-byte aligned, zeroed by the caller)
                                   that this call's kernels set instead: [0] = 1 for a bad label,
                                   [1] bits where tensor-parallel ranks disagree (1 shards, 2
                                   vocab_total, 4 tokens); read it after the call's work (an
                                   engine serving many requests on one context learns which call
                                   had the bad label, without a synchronization of its own) */
} flce_tensors;

/* A context binds one device's primary context (the one PyTorch and the CUDA runtime use) and keeps
 * loaded kernels and scratch memory. One context may be used from several threads; calls on it are
 * serialized internally. */
typedef struct flce_context flce_context;

FLCE_API const char *flce_version(void);
FLCE_API const char *flce_status_name(flce_status status);
/* The message of the last failed call on this thread ("" if none). Owned by the library; valid
 * until the next flce call on the same thread. */
FLCE_API const char *flce_last_error(void);

FLCE_API void flce_problem_init(flce_problem *problem);
FLCE_API void flce_tensors_init(flce_tensors *tensors);

/* Retains the primary context of `device` (a CUDA ordinal). *out is freed by flce_context_destroy.
 * The context takes the process's settings from the environment (README, "Environment
 * variables"): flce_context_create_ex(device, NULL, out). */
FLCE_API flce_status flce_context_create(int device, flce_context **out);

/* Settings of one context, as data (the environment is only their default source): two contexts of
 * one process may cache their kernels in different directories, log to different callbacks, and
 * one of them may refuse to compile in a call. Initialize with flce_options_init, then change
 * fields. */
enum { FLCE_LOG_FROM_ENV = -1, FLCE_LOG_OFF = 0, FLCE_LOG_WARN = 1, FLCE_LOG_INFO = 2, FLCE_LOG_DEBUG = 3 };
typedef void (*flce_log_fn)(void *user, int level, const char *message);
typedef struct flce_options {
    uint32_t struct_size;       /* sizeof(flce_options) as the caller compiled it */
    const char *cache_dir;      /* the writable kernel cache, used as given (created when first
                                   stored to); NULL: FLCE_CACHE_DIR, else $XDG_CACHE_HOME/flce or
                                   ~/.cache/flce, looked up at each use. Copied by create_ex. The
                                   tune table stays in the process's directory */
    const char *cache_ro;       /* read-only caches searched after it, "dir1:dir2"; "" none; NULL:
                                   FLCE_CACHE_RO, at each use. Copied by create_ex */
    flce_log_fn log;            /* receives the context's log lines (message without a prefix, level
                                   FLCE_LOG_WARN..DEBUG) on the thread of the call that logs them, and
                                   on that call's compile threads: it must be thread-safe. Lines of
                                   background compiles, which may outlive the context, go to the
                                   process's log. NULL: stderr, "flce: <level>: " prefixed */
    void *log_user;             /* log's first argument */
    int32_t log_level;          /* the most verbose level logged, FLCE_LOG_OFF..DEBUG; FLCE_LOG_FROM_ENV:
                                   FLCE_LOG at each use. init: FLCE_LOG's value now */
    int32_t compile_threads;    /* 1..8: the most kernels one call compiles at once (NVRTC threads).
                                   init: FLCE_COMPILE_THREADS (8) */
    int32_t background_compile; /* 1: a forward compiles its backward's kernels in the background, and
                                   a kernel specialized for whole vocab tiles runs on its generic twin
                                   while it compiles there (FLCE_PREFETCH, FLCE_TIERED); 0: never a
                                   compile outside a call. init: FLCE_PREFETCH (1) */
    int32_t compile_in_call;    /* 1: a call compiles the kernels it lacks (seconds, once per kernel
                                   and cache). 0, a latency guarantee for servers: such a call returns
                                   FLCE_ERR_NOT_READY at once, having run nothing (the kernels start
                                   compiling in the background when background_compile is 1);
                                   flce_prepare still compiles, so prepare each problem first.
                                   init: FLCE_COMPILE_IN_CALL (1) */
} flce_options;

/* Fills *options with the defaults the environment gives now (the fields' "init" above). */
FLCE_API void flce_options_init(flce_options *options);
/* flce_context_create with the settings of *options (NULL: the environment's, each as
 * flce_context_create takes it). A field out of range is FLCE_ERR_INVALID_ARGUMENT, before any
 * device is touched. options and its strings need not outlive the call. */
FLCE_API flce_status flce_context_create_ex(int device, const flce_options *options, flce_context **out);
/* Releases everything the context holds. Accepts NULL. Waits for nothing: the caller must make sure
 * no work that uses the context's workspace is still running. */
FLCE_API flce_status flce_context_destroy(flce_context *ctx);
/* Compute capability of the context's device as major*10+minor (90 for an H100). */
FLCE_API flce_status flce_context_arch(const flce_context *ctx, int *sm);

/* What a context's device is, for tools and logs that name it (the flce tool prints these). */
typedef struct flce_context_info {
    uint32_t struct_size;  /* sizeof(flce_context_info) as the caller compiled it */
    int32_t device;        /* the CUDA ordinal the context was created on */
    int32_t sm;            /* compute capability, major*10+minor (flce_context_arch) */
    int32_t num_sms;       /* streaming multiprocessors: AUTO's cost model and the vocab splits */
    uint64_t memory_bytes; /* the device's memory: AUTO's default budget may take 1/16 of it */
    char name[256];        /* the device's name ("NVIDIA H100 80GB HBM3") */
} flce_context_info;
FLCE_API void flce_context_info_init(flce_context_info *info);
/* Fills *info (initialized with flce_context_info_init) for ctx. No device work. */
FLCE_API flce_status flce_context_info_get(const flce_context *ctx, flce_context_info *info);

/* Which run-time libraries this process found, as lines of text (`flce info` prints them). Asking
 * loads NVRTC and NCCL if they are not loaded yet; neither being absent is an error here. */
typedef struct flce_library_info {
    uint32_t struct_size; /* sizeof(flce_library_info) as the caller compiled it */
    char nvrtc[4096];     /* "NVRTC 13.0 (<file>)", "NVRTC 13.0", or why NVRTC could not be loaded */
    char nccl[4096];      /* "NCCL <version> (<file>)" or why NCCL is unavailable */
    char tune_table[4096]; /* the autotune table's path in the kernel cache directory; "" when the
                              directory cannot be named */
} flce_library_info;
FLCE_API void flce_library_info_init(flce_library_info *info);
FLCE_API flce_status flce_library_info_get(flce_library_info *info);

/* Checks a problem without touching a GPU: shapes, dtype, option ranges. */
FLCE_API flce_status flce_problem_validate(const flce_problem *problem);

/* Bytes of workspace an op needs for this problem on this context's device. */
FLCE_API flce_status flce_workspace_size(flce_context *ctx, const flce_problem *problem, flce_op op,
                                         uint64_t *bytes);

/* Compiles (or loads from the disk cache) and loads every kernel a call of `op` on `problem` will
 * use, so the first real call starts at once; the kernels of one call compile in parallel.
 * `tensors` says which outputs the calls will ask for (only which pointers are non-NULL matters:
 * entropy and argmax select other kernels); NULL means loss, lse and, for training ops, both
 * gradients. Needs the device (the context); `flce warmup` does the same with no GPU, for an arch.
 * Synchronous: returns when the kernels are ready: the ones specialized for this shape, never the
 * generic stand-in a call without flce_prepare may run while they compile (README, "The tool"). */
FLCE_API flce_status flce_prepare(flce_context *ctx, const flce_problem *problem, flce_op op,
                                  const flce_tensors *tensors);

/* The strategy a call of `op` will run with: problem->strategy when forced, else what AUTO picks on
 * this context's device (FORWARD for a forward call; CHUNKED or RECOMPUTE otherwise). A framework
 * binding can use it to defer the gradients to its backward (forward now, flce_backward later,
 * the same work) when AUTO would recompute the logits anyway. */
FLCE_API flce_status flce_strategy_of(flce_context *ctx, const flce_problem *problem, flce_op op,
                                      flce_strategy *strategy);

/* Loss and (optionally) lse. Needs hidden, weight, labels; writes loss and/or lse. */
FLCE_API flce_status flce_forward(flce_context *ctx, const flce_problem *problem,
                                  const flce_tensors *t, void *stream);
/* Loss, lse and the gradients dH and dW of (g · loss) in one call. grad_hidden and grad_weight may
 * each be NULL to skip it. */
FLCE_API flce_status flce_loss_and_grad(flce_context *ctx, const flce_problem *problem,
                                        const flce_tensors *t, void *stream);
/* Gradients from the lse that an earlier forward saved (t->lse is read, not written; the loss and
 * per-token output pointers are ignored). With
 * strategy RECOMPUTE it walks the vocab in chunks and needs no workspace that grows with V. */
FLCE_API flce_status flce_backward(flce_context *ctx, const flce_problem *problem,
                                   const flce_tensors *t, void *stream);

/* Saved logits (problem.strategy = FLCE_STRATEGY_SAVED, 16-bit inputs): a training step
 * whose upstream gradients are known only after the forward (per-token losses, log-probs, entropy,
 * lse, fp32 accumulators) in 6·N·V·D instead of recompute's 8:
 *     flce_forward(ctx, &p, &t, stream)    loss, lse, per-token outputs; keeps in t.workspace the
 *                                          compact logits of all N tokens (2 bytes per logit) and
 *                                          their statistics (4 bytes per row and 256 columns, a few
 *                                          floats per token)
 *     ... the caller computes its upstream gradients ...
 *     flce_backward(ctx, &p, &t, stream)   dH, dW (and db) from them and t.grad_output,
 *                                          t.grad_logprob, t.grad_lse, t.grad_entropy
 * Both calls take the same problem, the same workspace (caller-owned, required: bytes from
 * flce_workspace_size with this problem, for either op) and tensors with the same non-NULL
 * pointers (the plan, and so the workspace layout, depends on which outputs and gradients are
 * asked for, not on their addresses); t.lse (and t.entropy with FLCE_GRAD_ENTROPY) must still hold
 * what the forward wrote. The backward turns the stored logits into dZ in place: one backward per
 * forward. Memory: the whole workspace is held from forward to backward; a problem whose N tokens
 * do not fit memory_budget (0: the default rule of the chunked strategy, up to 1/16 of the
 * device's memory) is FLCE_ERR_INVALID_ARGUMENT, with the bytes it needs: use RECOMPUTE then.
 * Under tensor parallelism each rank keeps its shard's logits: with tensors.comm (the same in both
 * calls) as above, the backward summing dH across ranks (under sequence_parallel the upstream
 * gradients, lse and entropy are this rank's rows; the forward's gathered hidden states stay in the
 * workspace); without it, the split-phase halves flce_forward_stats and flce_forward_finish are the
 * forward (the statistics half stores the logits) and flce_backward writes this rank's part of dH,
 * every call with the same problem (accumulate_grad_hidden included) and workspace. */

/* Multiplies, in place, the gradients an earlier flce_loss_and_grad call wrote (t->grad_hidden,
 * t->grad_weight, t->grad_bias: whichever are set; same problem) by the fp32 scalar at
 * t->grad_output in device memory: the upstream gradient an autograd backward receives after the
 * gradients of 1 · loss were computed in forward. One pass over the gradients (rounded once in
 * their dtype, as x.mul_(g) would), or none when the scalar is exactly 1 (the kernel reads it:
 * no host synchronization). Reductions mean and sum only; not with accumulate_grad_*. */
FLCE_API flce_status flce_scale_gradients(flce_context *ctx, const flce_problem *problem,
                                          const flce_tensors *t, void *stream);

/* Tensor and sequence parallelism (docs/DESIGN.md §2)
 * Each of tp_size ranks holds the weight rows [vocab_offset, vocab_offset + vocab_shard) of a vocab
 * of vocab_total ids (which must be set); the shards, in rank order, must tile [0, vocab_total).
 *  - With tensors.comm (an ncclComm_t whose rank tp_rank is this caller): flce_forward and
 *    flce_loss_and_grad issue ONE all-gather of a few floats per token (per token chunk), and every
 *    rank computes the same loss, lse and per-token outputs, bit for bit. grad_weight (and
 *    grad_bias) is this rank's shard and needs no collective; grad_hidden is summed across ranks
 *    in fp32 (all-reduce) before it is rounded. All on `stream`, no host synchronization.
 *  - sequence_parallel = 1: hidden, labels, grad_output (reduction none), lse (backward input),
 *    the per-token outputs, their upstream gradients (grad_logprob, ...) and grad_hidden hold
 *    this rank's `tokens` rows; flce all-gathers the
 *    inputs, runs as above over tp_size·tokens tokens and reduce-scatters dH. The mean divides by
 *    the valid tokens of all ranks.
 *  - Ranks whose shards overlap, leave gaps, or disagree on vocab_total or tokens are detected in
 *    the all-gather: the next call (or flce_check) returns FLCE_ERR_INVALID_ARGUMENT naming it.
 *    Every rank must make the same sequence of calls with the same tokens, or NCCL waits.
 *  - Without tensors.comm, flce_backward writes this rank's partial dH for the caller to sum
 *    (use accumulate_grad_hidden with an fp32 buffer to keep it exact), and the forward runs in
 *    two halves around the caller's own all-gather (torch.distributed, JAX, ...):
 *        flce_forward_stats(..., stats)             stats: flce_tp_stats_bytes() on the device
 *        all-gather stats of every rank, rank order → gathered (tp_size blocks)
 *        flce_forward_finish(..., gathered)          writes loss, lse and per-token outputs
 *    The per-token outputs that need argmax or entropy must be requested (non-NULL) in both halves. */
/* Bytes of one rank's statistics block for the split-phase forward. */
FLCE_API flce_status flce_tp_stats_bytes(const flce_problem *problem, uint64_t *bytes);
FLCE_API flce_status flce_forward_stats(flce_context *ctx, const flce_problem *problem,
                                        const flce_tensors *t, void *stats, void *stream);
FLCE_API flce_status flce_forward_finish(flce_context *ctx, const flce_problem *problem,
                                         const flce_tensors *t, const void *gathered, void *stream);

/* Synchronizes `stream` and reports device-side errors raised since the last check: a label
 * outside [0, V) that is not ignore_index gives FLCE_ERR_BAD_LABEL (such tokens were treated as
 * ignored). Every other call also reports a flag raised by work that has already finished, so
 * with one context shared by many requests the call that returns the error need not be the one
 * that had the bad label: give that call its own tensors.error_flag to know.
 * What calls synchronize: flce_check (the stream), flce_prepare (compiles and loads), and a call
 * whose kernels are not loaded yet (NVRTC or the disk cache, then cuModuleLoadData), or that grows
 * the context's workspace (tensors.workspace). Nothing else waits for the device: a call on a new
 * stream orders itself after the last one's work with an event. */
FLCE_API flce_status flce_check(flce_context *ctx, void *stream);

/* Distillation (issue 44): a student learns a teacher's next-token distribution, both output
 * layers fused with the divergence; neither the student's nor the teacher's N × V logits are in
 * memory at once (token chunks of memory_budget). Per token i, with the student's logits
 * zs_j = hs_i·ws_j and the teacher's zt_j = ht_i·wt_j (no bias, no softcap), at temperature T:
 *    q = softmax(zs/T) (student),  p = softmax(zt/T) (teacher)
 *    forward KL  D_i = Σ_j p_j (log p_j − log q_j)                  KL(p‖q)
 *    reverse KL  D_i = Σ_j q_j (log q_j − log p_j)                  KL(q‖p)
 *    JSD(β)      D_i = β KL(p‖m) + (1−β) KL(q‖m),  m = β p + (1−β) q   (β weights the teacher);
 *                β = 0 is forward KL and β = 1 reverse KL (Liger's ends, not the formula's limit 0)
 *    loss_i = D_i + ce_weight · (lse(zs) − zs_y)    (the CE term at temperature 1)
 * No T² factor. The gradients are the student's only (dHs, dWs of Σ g_i loss_i, g_i as in the CE
 * call: mean divides by the count of valid tokens); the teacher gets none. A token whose label is
 * ignore_index or outside [0, V) is masked entirely (no divergence, no CE, no gradient, not counted
 * in the mean; its divergence output is 0). labels NULL: every token counts, no CE term.
 * A NaN in one token's row stays in that token's per-token outputs and dHs row (and in the
 * mean/sum loss and dWs, which sum over tokens). CE only at temperature 1; tensor parallelism: the
 * problem's last fields. */
typedef enum flce_divergence {
    FLCE_DIVERGENCE_FORWARD_KL = 0,
    FLCE_DIVERGENCE_REVERSE_KL = 1,
    FLCE_DIVERGENCE_JSD = 2
} flce_divergence;

typedef struct flce_distill_problem {
    uint32_t struct_size;      /* sizeof(flce_distill_problem) as the caller compiled it */
    uint32_t api_version;      /* FLCE_API_VERSION as the caller compiled it */
    int64_t tokens;            /* N >= 1 (student and teacher alike) */
    int64_t hidden_student;    /* Ds >= 8, a multiple of 8 */
    int64_t hidden_teacher;    /* Dt >= 8, a multiple of 8 */
    int64_t vocab;             /* V >= 1, the same for both */
    flce_dtype dtype;          /* of all four inputs and the gradients */
    int32_t label_bits;        /* 32 or 64: labels are int32 or int64 */
    flce_divergence divergence;
    float beta;                /* JSD's β in [0, 1]; ignored by the KLs */
    float temperature;         /* T > 0 of both softmaxes of the divergence; default 1 */
    float ce_weight;           /* >= 0, weight of the student's CE term; != 0 needs labels and T = 1 */
    int64_t ignore_index;      /* default -100 */
    flce_reduction reduction;
    uint64_t memory_budget;    /* 0 (default): 4 GiB for one token chunk's logits, which sets the
                                  chunk size (whole 128-row blocks where one fits): per logit,
                                  forward KL on 16-bit inputs both models' compact fp16 logits,
                                  4 bytes (dZ in the student's place); otherwise the teacher's and
                                  the student's fp32 logits and the student's dZ, 10 bytes (fp32
                                  inputs 8). On top, for 16-bit inputs in several chunks (C rows
                                  each): the student's dZ of the other N − C tokens (× V × 2
                                  bytes; dW then runs once) where that is no more than an fp32
                                  V × Ds dW accumulator, else that accumulator; and a few arrays
                                  per token.
                                  Given (> 0): the most bytes the whole workspace may take. The
                                  chunks shrink until it fits; where neither buffer above fits
                                  beside chunks at most one fewer, each chunk's dW is added into
                                  grad_student_weight in the dtype (rounded once per chunk).
                                  Under TP (tp_size > 1) a budget given is the chunks' logits' as
                                  for 0. Too small for one token's logits and the per-token
                                  arrays: FLCE_ERR_INVALID_ARGUMENT.
                                  flce_distill_workspace_size says the total */
    int32_t teacher_topk;      /* 0 (default): the teacher as teacher_hidden and teacher_weight.
                                  k in [1, min(64, V)]: the teacher as each token's k (index,
                                  log-probability) pairs (tensors.teacher_topk_indices, _logprobs),
                                  e.g. flce_topk_logprobs's; hidden_teacher must then be 0 and the
                                  divergence forward KL over those ids only:
                                  D_i = Σ_{j∈K_i} p_j (log p_j − log q_j), dD_i/dzs_j =
                                  (q_j·Σ_{K_i} p − p_j·1[j∈K_i])/T, p_j = exp(the given log-prob),
                                  as given (its temperature and normalization are the teacher's) */
    /* Tensor (vocab) parallelism: this rank holds rows [vocab_offset, vocab_offset + vocab) of both
     * weights, of a vocab of vocab_total (0 means vocab_offset + vocab); labels are global ids in
     * [0, vocab_total). With tp_size > 1 the call needs tensors.comm and issues per token chunk
     * one all-gather of 16 bytes per token (both models' shard log-normalizers, the student's
     * soft-target sum and the CE term's label logit) and one fp32 all-reduce of 8 per token (the
     * divergence's two sums), and sums dHs over the ranks in fp32 (as flce_loss_and_grad does);
     * dWs is this rank's shard. Every
     * rank gets the same loss and divergence. The teacher as top-k (teacher_topk, global ids) needs
     * the all-gather alone; the CE term takes its label's logit from the shard that holds it (in the
     * all-gather). Reverse KL, JSD with β > 0 and fp32 inputs (the fp32-logits path) take the same
     * two collectives but read each shard's logits twice (the row sums before dZs); so does the
     * teacher as top-k on fp32 inputs. */
    int64_t vocab_offset;
    int64_t vocab_total;
    int32_t tp_rank;           /* 0..tp_size-1: this caller's rank in tensors.comm */
    int32_t tp_size;           /* ranks sharing the vocab; 1 (default) = none */
} flce_distill_problem;

/* Device buffers of one distillation call. Unused outputs may be NULL. */
typedef struct flce_distill_tensors {
    uint32_t struct_size;          /* sizeof(flce_distill_tensors) as the caller compiled it */
    const void *student_hidden;    /* Hs: N × Ds, row-major, dtype */
    const void *student_weight;    /* Ws: V × Ds, row-major, dtype */
    const void *teacher_hidden;    /* Ht: N × Dt, row-major, dtype */
    const void *teacher_weight;    /* Wt: V × Dt, row-major, dtype */
    const void *labels;            /* N int32/int64 (label_bits), or NULL (no CE, no token ignored) */
    const float *grad_output;      /* fp32 on the device: 1 value (mean, sum) or N (none); NULL = 1 */
    float *loss;                   /* out: 1 value (mean, sum) or N (none) */
    float *divergence;             /* out: N values of D_i (0 for masked tokens) */
    void *grad_student_hidden;     /* out: dHs, N × Ds, dtype */
    void *grad_student_weight;     /* out: dWs, V × Ds, dtype */
    void *workspace;               /* caller-owned scratch of flce_distill_workspace_size bytes, or
                                      NULL to let the context allocate and keep one */
    uint64_t workspace_bytes;
    /* problem.teacher_topk = k > 0 (teacher_hidden and teacher_weight then NULL): N × k int64
     * distinct ids in [0, V) and their N × k fp32 log-probabilities. A token whose ids are out of
     * range or repeat gets a NaN divergence, loss and dZs row (never a silent wrong gradient). */
    const int64_t *teacher_topk_indices;
    const float *teacher_topk_logprobs;
    void *comm;                    /* ncclComm_t of the tensor-parallel group (problem.tp_size > 1),
                                      whose rank problem.tp_rank is this caller; NULL without TP */
} flce_distill_tensors;

FLCE_API void flce_distill_problem_init(flce_distill_problem *problem);
FLCE_API void flce_distill_tensors_init(flce_distill_tensors *tensors);
/* Checks a distillation problem without touching a GPU; the message names the argument. */
FLCE_API flce_status flce_distill_problem_validate(const flce_distill_problem *problem);
/* Bytes of workspace flce_distill_loss_and_grad needs for this problem. */
FLCE_API flce_status flce_distill_workspace_size(flce_context *ctx, const flce_distill_problem *problem,
                                                 uint64_t *bytes);
/* Compiles (or loads from the disk cache) the kernels flce_distill_loss_and_grad will run for this
 * problem, whatever the context's compile_in_call says (a server that never compiles in a call
 * prepares first). tensors: which outputs and whether labels are given; only its pointers' being
 * set matters (NULL: every output, with and without labels). */
FLCE_API flce_status flce_distill_prepare(flce_context *ctx, const flce_distill_problem *problem,
                                          const flce_distill_tensors *tensors);
/* Loss, per-token divergence and the student's gradients in one call, enqueued on `stream`. */
FLCE_API flce_status flce_distill_loss_and_grad(flce_context *ctx, const flce_distill_problem *problem,
                                                const flce_distill_tensors *t, void *stream);

/* ---- Top-k log-probabilities (issue 44 item 2; README, "Top-k log-probabilities") ----------------
 * For each token i, the k largest logits of z_i = h_i·Wᵀ/T and their log-probabilities
 * log softmax(z_i)_j = z_ij − lse_i, without a tokens × vocab tensor: per token chunk the CE path's
 * logits GEMM stores the chunk's fp32 logits with their statistics, one CTA per row selects the k
 * largest exactly (on the fp32 values) and forms those k logits again in fp64 from the inputs (the
 * lse corrected with them). Order: larger logit first, equal logits by
 * lower index (a NaN logit ranks above +inf, as torch.topk; that row's log-probs and lse are NaN).
 * For prompt log-probs in inference engines and a teacher's top-k in distillation. Forward only: no
 * gradients.
 * Under tensor (vocab) parallelism each of tp_size ranks holds the weight rows [vocab_offset,
 * vocab_offset + vocab) of a vocab of vocab_total ids; the shards, in rank order, must tile
 * [0, vocab_total), and k must be at most every shard's vocab. Each rank's k candidates and its
 * shard's lse go into a block of flce_topk_stats_bytes = 4·(8 + N·(2 + 2k)) bytes; the tp_size blocks
 * are all-gathered and every rank merges them the same way (lse = log Σ_r exp(lse_r) in fp64, the k
 * largest of the tp_size·k candidates, equal logits by lower global id), so all ranks write the same
 * outputs, bit for bit, with global ids. The candidates' logits travel in fp32 (the single-GPU call
 * subtracts the lse in fp64): a log-prob may differ from it in the last bits.
 *  - With tensors.comm (an ncclComm_t whose rank tp_rank is this caller), flce_topk_logprobs issues
 *    that one all-gather itself, on `stream`, in its workspace.
 *  - Without it, the split phase around the caller's own all-gather (torch.distributed, ...):
 *        flce_topk_stats(..., block)           block: flce_topk_stats_bytes on the device
 *        all-gather block of every rank, rank order → gathered (tp_size blocks)
 *        flce_topk_finish(..., gathered)       writes indices, logprobs and lse
 *  - Ranks whose shards overlap, leave gaps, or disagree on vocab_total or tokens are detected in the
 *    merge: the next call (or flce_check) returns FLCE_ERR_INVALID_ARGUMENT naming it, as the CE
 *    call's tensor parallelism does. */
typedef struct flce_topk_problem {
    uint32_t struct_size;   /* sizeof(flce_topk_problem) as the caller compiled it */
    uint32_t api_version;   /* FLCE_API_VERSION as the caller compiled it */
    int64_t tokens;         /* N >= 1 */
    int64_t hidden;         /* D >= 8, a multiple of 8 */
    int64_t vocab;          /* V >= 1 */
    flce_dtype dtype;       /* of hidden and weight */
    int32_t k;              /* 1 <= k <= min(64, V) */
    float temperature;      /* T > 0: log-probs of softmax(z/T); default 1 */
    uint64_t memory_budget; /* bytes for one token chunk's fp32 logits (4 per logit), which sets
                               the chunk size; 0 = 1 GiB; less than one token's row is
                               FLCE_ERR_INVALID_ARGUMENT. flce_topk_workspace_size says the total */
    /* --- API version 4: tensor (vocab) parallelism; older callers get the defaults --- */
    int64_t vocab_offset;   /* tensor parallelism: the global id of this shard's row 0 (default 0) */
    int64_t vocab_total;    /* the whole vocab; 0 = vocab_offset + vocab. With tp_size > 1 at most
                               INT32_MAX (the all-gathered blocks carry int32 ids) */
    int32_t tp_rank;        /* this rank, 0 <= tp_rank < tp_size (default 0) */
    int32_t tp_size;        /* ranks of the vocab-parallel group; 1 (default) = no TP */
} flce_topk_problem;

typedef struct flce_topk_tensors {
    uint32_t struct_size; /* sizeof(flce_topk_tensors) as the caller compiled it */
    const void *hidden;   /* N × D, row-major, dtype */
    const void *weight;   /* V × D, row-major, dtype */
    int64_t *indices;     /* out: N × k vocab ids, row-major */
    float *logprobs;      /* out: N × k log-probabilities at T, in the order of indices */
    float *lse;           /* out (may be NULL): N values of lse(z_i) at T */
    void *workspace;      /* caller-owned scratch of flce_topk_workspace_size bytes, or NULL to let
                             the context allocate and keep one */
    uint64_t workspace_bytes;
    /* --- API version 4: tensor parallelism; older callers get NULL --- */
    void *comm;           /* ncclComm_t of the tensor-parallel group (tp_size > 1) whose rank tp_rank
                             is this caller, or NULL: flce_topk_logprobs then needs tp_size 1 (use
                             the split phase, flce_topk_stats and flce_topk_finish) */
} flce_topk_tensors;

FLCE_API void flce_topk_problem_init(flce_topk_problem *problem);
FLCE_API void flce_topk_tensors_init(flce_topk_tensors *tensors);
/* Checks a top-k problem without touching a GPU; the message names the argument. */
FLCE_API flce_status flce_topk_problem_validate(const flce_topk_problem *problem);
/* Bytes of workspace flce_topk_logprobs needs for this problem (with tp_size > 1: this rank's block
 * and the gathered blocks too); flce_topk_stats needs at most this, flce_topk_finish none. */
FLCE_API flce_status flce_topk_workspace_size(flce_context *ctx, const flce_topk_problem *problem, uint64_t *bytes);
/* Compiles (or loads from the disk cache) the kernels flce_topk_logprobs will run for this problem,
 * whatever the context's compile_in_call says. */
FLCE_API flce_status flce_topk_prepare(flce_context *ctx, const flce_topk_problem *problem);
/* Each token's k largest logits' ids and log-probabilities (and lse), enqueued on `stream`; with
 * tp_size > 1 it needs tensors.comm (ids are then global: vocab_offset added). */
FLCE_API flce_status flce_topk_logprobs(flce_context *ctx, const flce_topk_problem *problem,
                                        const flce_topk_tensors *t, void *stream);
/* The split phase of the vocab-parallel top-k (see above). flce_topk_stats_bytes: bytes of one rank's
 * block, 4·(8 + tokens·(2 + 2k)), the same on every rank. flce_topk_stats: this rank's block (16-byte
 * aligned device memory the caller owns) from tensors.hidden and .weight; the outputs are not
 * touched. flce_topk_finish: tensors.indices, .logprobs (and .lse) from `gathered`, the tp_size
 * blocks in rank order (hidden and weight are not read); the same problem on every rank but
 * tp_rank, vocab_offset and vocab. Both enqueued on `stream`. */
FLCE_API flce_status flce_topk_stats_bytes(const flce_topk_problem *problem, uint64_t *bytes);
FLCE_API flce_status flce_topk_stats(flce_context *ctx, const flce_topk_problem *problem,
                                     const flce_topk_tensors *t, void *block, void *stream);
FLCE_API flce_status flce_topk_finish(flce_context *ctx, const flce_topk_problem *problem,
                                      const flce_topk_tensors *t, const void *gathered, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* FLCE_H */
