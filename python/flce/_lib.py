"""_lib.py — the ctypes layer of the flce Python binding: finds and loads libflce.so, mirrors the
structs and enums of include/flce.h, turns status codes into exceptions and keeps one flce_context
per CUDA device. Nothing here imports torch, so it can be loaded (and its struct layouts checked,
see python/check_layout.py) on a machine without a GPU or PyTorch.
"""
import ctypes
import ctypes.util
import os
import threading

# ---- enums of flce.h -------------------------------------------------------------------------

FLCE_OK = 0
FLCE_ERR_INVALID_ARGUMENT = 1
FLCE_ERR_UNSUPPORTED = 2
FLCE_ERR_NO_DRIVER = 3
FLCE_ERR_NO_DEVICE = 4
FLCE_ERR_CUDA = 5
FLCE_ERR_COMPILE = 6
FLCE_ERR_OUT_OF_MEMORY = 7
FLCE_ERR_BAD_LABEL = 8
FLCE_ERR_IO = 9
FLCE_ERR_INTERNAL = 10
FLCE_ERR_NOT_READY = 11  # a context made with compile_in_call = 0 (not made by this binding)

FLCE_DTYPE_F32 = 0
FLCE_DTYPE_F16 = 1
FLCE_DTYPE_BF16 = 2

FLCE_REDUCTION_MEAN = 0
FLCE_REDUCTION_SUM = 1
FLCE_REDUCTION_NONE = 2
REDUCTIONS = {"mean": FLCE_REDUCTION_MEAN, "sum": FLCE_REDUCTION_SUM, "none": FLCE_REDUCTION_NONE}

FLCE_STRATEGY_AUTO = 0
FLCE_STRATEGY_FORWARD = 1
FLCE_STRATEGY_CHUNKED = 2
FLCE_STRATEGY_RECOMPUTE = 3
FLCE_STRATEGY_SAVED = 4
STRATEGIES = {"auto": FLCE_STRATEGY_AUTO, "forward": FLCE_STRATEGY_FORWARD,
              "chunked": FLCE_STRATEGY_CHUNKED, "recompute": FLCE_STRATEGY_RECOMPUTE,
              "saved": FLCE_STRATEGY_SAVED}

# problem.grad_outputs bits
FLCE_GRAD_LOGPROB = 1
FLCE_GRAD_LSE = 2
FLCE_GRAD_ENTROPY = 4
FLCE_GRAD_LOSS_PER_TOKEN = 8

FLCE_OP_FORWARD = 0
FLCE_OP_LOSS_AND_GRAD = 1
FLCE_OP_BACKWARD = 2

FLCE_API_VERSION = 4

# C enums are `int` on every ABI flce supports.
_enum = ctypes.c_int


# ---- structs of flce.h (field for field, same order and types) -------------------------------

class Problem(ctypes.Structure):
    """flce_problem."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("api_version", ctypes.c_uint32),
        ("tokens", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("vocab_shard", ctypes.c_int64),
        ("vocab_offset", ctypes.c_int64),
        ("vocab_total", ctypes.c_int64),
        ("dtype", _enum),
        ("label_bits", ctypes.c_int32),
        ("reduction", _enum),
        ("ignore_index", ctypes.c_int64),
        ("label_smoothing", ctypes.c_float),
        ("z_loss", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("temperature", ctypes.c_float),
        ("has_bias", ctypes.c_int32),
        ("tp_rank", ctypes.c_int32),
        ("tp_size", ctypes.c_int32),
        ("allow_tf32", ctypes.c_int32),
        ("deterministic", ctypes.c_int32),
        ("strategy", _enum),
        ("memory_budget", ctypes.c_uint64),
        # added after the first layout (a library built before them sees a shorter struct_size)
        ("has_class_weights", ctypes.c_int32),
        ("accumulate_grad_hidden", ctypes.c_int32),
        ("accumulate_grad_weight", ctypes.c_int32),
        ("sequence_parallel", ctypes.c_int32),
        ("grad_outputs", ctypes.c_int32),  # API version 3
        ("batch_invariant", ctypes.c_int32),
    ]


class Tensors(ctypes.Structure):
    """flce_tensors. Pointers are device addresses held as c_void_p (None is NULL)."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("hidden", ctypes.c_void_p),
        ("weight", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("labels", ctypes.c_void_p),
        ("grad_output", ctypes.c_void_p),
        ("loss", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("grad_hidden", ctypes.c_void_p),
        ("grad_weight", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_uint64),
        # added after the first layout
        ("class_weights", ctypes.c_void_p),
        ("grad_bias", ctypes.c_void_p),
        ("loss_per_token", ctypes.c_void_p),
        ("z_loss_out", ctypes.c_void_p),
        ("target_logprob", ctypes.c_void_p),
        ("entropy", ctypes.c_void_p),
        ("argmax", ctypes.c_void_p),
        ("comm", ctypes.c_void_p),
        # API version 3
        ("grad_logprob", ctypes.c_void_p),
        ("grad_lse", ctypes.c_void_p),
        ("grad_entropy", ctypes.c_void_p),
        ("grad_loss_per_token", ctypes.c_void_p),
        ("error_flag", ctypes.c_void_p),
    ]


# ---- errors ----------------------------------------------------------------------------------

class FlceError(RuntimeError):
    """A failed flce call: .status (int), .status_name (e.g. 'FLCE_ERR_UNSUPPORTED'), .message
    (flce_last_error(): which argument, which value, what was expected) and .call."""

    def __init__(self, status, status_name, message, call):
        self.status = status
        self.status_name = status_name
        self.message = message
        self.call = call
        super().__init__(f"{call}: {status_name}: {message}" if message else f"{call}: {status_name}")


class FlceLibraryNotFound(OSError):
    pass


# ---- loading ---------------------------------------------------------------------------------

_lib = None
_lib_path = None
_load_lock = threading.Lock()


def _candidates():
    # $FLCE_LIBRARY when set (an explicit choice wins), else the library shipped inside the
    # installed package (pyproject.toml's package data), else a build tree, else the system's.
    env = os.environ.get("FLCE_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))          # python/flce, or site-packages/flce
    paths = [
        os.path.join(here, "libflce.so.0"),                      # shipped beside the package
        os.path.join(here, "libflce.so"),
        os.path.join(here, "..", "build", "libflce.so"),         # python/build (package-relative)
        os.path.join(here, "..", "..", "build", "libflce.so"),   # repository build/ (python/flce in the tree)
    ]
    found = ctypes.util.find_library("flce")
    if found:
        paths.append(found)
    return [os.path.normpath(p) if os.sep in p else p for p in paths], False


def _declare(lib):
    P, T = ctypes.POINTER(Problem), ctypes.POINTER(Tensors)
    vp, st = ctypes.c_void_p, ctypes.c_int
    sig = {
        "flce_version": (ctypes.c_char_p, []),
        "flce_status_name": (ctypes.c_char_p, [st]),
        "flce_last_error": (ctypes.c_char_p, []),
        "flce_problem_init": (None, [ctypes.c_void_p]),   # a padded buffer, see _template()
        "flce_tensors_init": (None, [ctypes.c_void_p]),
        "flce_context_create": (st, [ctypes.c_int, ctypes.POINTER(vp)]),
        "flce_context_destroy": (st, [vp]),
        "flce_context_arch": (st, [vp, ctypes.POINTER(ctypes.c_int)]),
        "flce_problem_validate": (st, [P]),
        "flce_workspace_size": (st, [vp, P, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]),
        "flce_strategy_of": (st, [vp, P, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
        "flce_forward": (st, [vp, P, T, vp]),
        "flce_loss_and_grad": (st, [vp, P, T, vp]),
        "flce_backward": (st, [vp, P, T, vp]),
        "flce_check": (st, [vp, vp]),
        "flce_tp_stats_bytes": (st, [P, ctypes.POINTER(ctypes.c_uint64)]),
        "flce_forward_stats": (st, [vp, P, T, vp, vp]),
        "flce_forward_finish": (st, [vp, P, T, vp, vp]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    # Newer entry points: a library built before them still loads; has(name) says whether it has them.
    optional = {
        "flce_scale_gradients": (st, [vp, P, T, vp]),
        "flce_prepare": (st, [vp, P, ctypes.c_int, T]),
    }
    for name, (res, args) in optional.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = res
            fn.argtypes = args


def has(name):
    """Whether the loaded library exports `name` (entry points added after the first release)."""
    return getattr(lib(), name, None) is not None


def lib():
    """The loaded libflce (ctypes.CDLL), loading it on first use: $FLCE_LIBRARY, else
    ../build/libflce.so next to the package (or the repository's build/), else find_library."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _load_lock:
        if _lib is not None:
            return _lib
        paths, from_env = _candidates()
        errors = []
        for p in paths:
            if os.sep in p and not os.path.exists(p):
                errors.append(f"{p}: no such file")
                continue
            try:
                handle = ctypes.CDLL(p)
                _declare(handle)
            except (OSError, AttributeError) as e:
                errors.append(f"{p}: {e}")
                if from_env:
                    break
                continue
            _lib, _lib_path = handle, p
            return _lib
        where = "FLCE_LIBRARY" if from_env else "the default places"
        raise FlceLibraryNotFound(
            f"libflce.so not found in {where} (`pip install ./python` from the repository builds it "
            f"into the package; or build the CMake target `flce` and set FLCE_LIBRARY to "
            f"build/libflce.so): "
            + "; ".join(errors))


def library_path():
    lib()
    return _lib_path


def version():
    return lib().flce_version().decode()


def status_name(status):
    return lib().flce_status_name(status).decode()


def last_error():
    return lib().flce_last_error().decode(errors="replace")


def check_status(status, call):
    """Raises FlceError for a status other than FLCE_OK. Reads flce_last_error() at once: it is per
    thread and valid only until the next flce call."""
    if status != FLCE_OK:
        message = last_error()
        raise FlceError(status, status_name(status), message, call)


# ---- struct initialization -------------------------------------------------------------------

# Room for a library built against a newer flce.h whose _init writes a larger struct than ours.
_INIT_SLACK = 1024
_templates = {}  # cls -> (initialized instance, struct_size we send, struct_size the library has)


def _template(cls, init_name):
    """The library's _init applied to a padded buffer. Its struct_size tells which layout the
    library was built with; we send min(ctypes.sizeof(cls), that), so that a newer library gives
    defaults to fields we do not know and an older one is not handed fields it does not know."""
    tpl = _templates.get(cls)
    if tpl is None:
        buf = ctypes.create_string_buffer(ctypes.sizeof(cls) + _INIT_SLACK)
        getattr(lib(), init_name)(ctypes.cast(buf, ctypes.c_void_p))
        inst = cls.from_buffer_copy(buf.raw[:ctypes.sizeof(cls)])
        lib_size = inst.struct_size
        inst.struct_size = min(ctypes.sizeof(cls), lib_size)
        tpl = _templates[cls] = (inst, inst.struct_size, lib_size)
    return tpl


def library_struct_size(cls):
    """sizeof(flce_problem) or sizeof(flce_tensors) as libflce.so was compiled (cls: Problem, Tensors)."""
    return _template(cls, _INIT_FN[cls])[2]


def _new(cls, fields):
    inst, size, lib_size = _template(cls, _INIT_FN[cls])
    obj = cls.from_buffer_copy(inst)
    for k, v in fields.items():
        desc = getattr(cls, k, None)
        if not isinstance(desc, type(cls.struct_size)):
            raise AttributeError(f"{cls.__name__} has no field {k!r}")
        if desc.offset + desc.size > size and v not in (None, 0):
            raise FlceError(FLCE_ERR_UNSUPPORTED, "FLCE_ERR_UNSUPPORTED",
                            f"field {k!r} is newer than the loaded library ({_lib_path}, built with a "
                            f"{lib_size}-byte struct): rebuild libflce", "flce binding")
        setattr(obj, k, v)
    return obj


_INIT_FN = {Problem: "flce_problem_init", Tensors: "flce_tensors_init"}


def new_problem(**fields):
    """flce_problem from flce_problem_init, then the given fields."""
    return _new(Problem, fields)


def new_tensors(**fields):
    """flce_tensors from flce_tensors_init, then the given fields."""
    return _new(Tensors, fields)


def validate(problem):
    check_status(lib().flce_problem_validate(ctypes.byref(problem)), "flce_problem_validate")


# ---- contexts: one per CUDA device, created on first use, kept for the life of the process ----

_contexts = {}
_ctx_lock = threading.Lock()


def context(device_index):
    """The flce_context (a c_void_p) of CUDA device `device_index`, created on first use.
    Contexts live until the process ends (they are not destroyed at exit: the process's end frees
    them, and destroying them while the CUDA runtime tears down is not worth the risk)."""
    ctx = _contexts.get(device_index)
    if ctx is not None:
        return ctx
    with _ctx_lock:
        ctx = _contexts.get(device_index)
        if ctx is None:
            out = ctypes.c_void_p()
            check_status(lib().flce_context_create(int(device_index), ctypes.byref(out)),
                         f"flce_context_create(device={device_index})")
            ctx = _contexts[device_index] = out
    return ctx


def context_arch(device_index):
    sm = ctypes.c_int()
    check_status(lib().flce_context_arch(context(device_index), ctypes.byref(sm)), "flce_context_arch")
    return sm.value


def workspace_size(ctx, problem, op):
    n = ctypes.c_uint64()
    check_status(lib().flce_workspace_size(ctx, ctypes.byref(problem), op, ctypes.byref(n)),
                 "flce_workspace_size")
    return n.value


def strategy_of(ctx, problem, op):
    """The strategy name ('forward', 'chunked' or 'recompute') a call of op will run with."""
    k = ctypes.c_int()
    check_status(lib().flce_strategy_of(ctx, ctypes.byref(problem), op, ctypes.byref(k)), "flce_strategy_of")
    return {v: n for n, v in STRATEGIES.items()}[k.value]


_OPS = {FLCE_OP_FORWARD: "flce_forward", FLCE_OP_LOSS_AND_GRAD: "flce_loss_and_grad",
        FLCE_OP_BACKWARD: "flce_backward"}


def run(op, ctx, problem, tensors, stream):
    """Enqueues one op on `stream` (an int handle, 0 = legacy stream)."""
    name = _OPS[op]
    check_status(getattr(lib(), name)(ctx, ctypes.byref(problem), ctypes.byref(tensors),
                                      ctypes.c_void_p(stream or None)), name)


def scale_gradients(ctx, problem, tensors, stream):
    """flce_scale_gradients: tensors.grad_hidden/grad_weight/grad_bias *= the fp32 scalar at
    tensors.grad_output, in place, on `stream` (no pass when it is exactly 1)."""
    check_status(lib().flce_scale_gradients(ctx, ctypes.byref(problem), ctypes.byref(tensors),
                                            ctypes.c_void_p(stream or None)), "flce_scale_gradients")


def prepare(ctx, problem, op, tensors):
    """flce_prepare: compiles (or loads from the disk cache) and loads every kernel a call of `op`
    on `problem` naming the non-NULL pointers of `tensors` will use; synchronous."""
    if not has("flce_prepare"):
        raise FlceError(FLCE_ERR_UNSUPPORTED, "FLCE_ERR_UNSUPPORTED",
                        f"the loaded library ({_lib_path}) has no flce_prepare: rebuild libflce", "flce_prepare")
    check_status(lib().flce_prepare(ctx, ctypes.byref(problem), op, ctypes.byref(tensors)), "flce_prepare")


def tp_stats_bytes(problem):
    n = ctypes.c_uint64()
    check_status(lib().flce_tp_stats_bytes(ctypes.byref(problem), ctypes.byref(n)), "flce_tp_stats_bytes")
    return n.value


def forward_half(name, ctx, problem, tensors, buffer_ptr, stream):
    """flce_forward_stats or flce_forward_finish (the split-phase TP forward)."""
    check_status(getattr(lib(), name)(ctx, ctypes.byref(problem), ctypes.byref(tensors),
                                      ctypes.c_void_p(buffer_ptr), ctypes.c_void_p(stream or None)), name)


def check(ctx, stream):
    """flce_check: synchronizes `stream`, raises FlceError(FLCE_ERR_BAD_LABEL) for bad labels seen."""
    check_status(lib().flce_check(ctx, ctypes.c_void_p(stream or None)), "flce_check")
