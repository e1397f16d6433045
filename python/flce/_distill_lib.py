"""_distill_lib.py — the ctypes layer of flce's distillation call (issue 44): flce_distill_problem,
flce_distill_tensors, flce_distill_workspace_size and flce_distill_loss_and_grad of include/flce.h.
Like _lib.py it imports no torch. A library built before these entry points still loads (they are
looked up on first use); a call then raises FlceError naming the missing function.
"""
import ctypes

from . import _lib
from ._lib import FlceError

# flce_divergence
FLCE_DIVERGENCE_FORWARD_KL = 0
FLCE_DIVERGENCE_REVERSE_KL = 1
FLCE_DIVERGENCE_JSD = 2
DIVERGENCES = {"forward_kl": FLCE_DIVERGENCE_FORWARD_KL, "reverse_kl": FLCE_DIVERGENCE_REVERSE_KL,
               "jsd": FLCE_DIVERGENCE_JSD}

_enum = ctypes.c_int


class DistillProblem(ctypes.Structure):
    """flce_distill_problem."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("api_version", ctypes.c_uint32),
        ("tokens", ctypes.c_int64),
        ("hidden_student", ctypes.c_int64),
        ("hidden_teacher", ctypes.c_int64),
        ("vocab", ctypes.c_int64),
        ("dtype", _enum),
        ("label_bits", ctypes.c_int32),
        ("divergence", _enum),
        ("beta", ctypes.c_float),
        ("temperature", ctypes.c_float),
        ("ce_weight", ctypes.c_float),
        ("ignore_index", ctypes.c_int64),
        ("reduction", _enum),
        ("memory_budget", ctypes.c_uint64),
        ("teacher_topk", ctypes.c_int32),
        ("vocab_offset", ctypes.c_int64),
        ("vocab_total", ctypes.c_int64),
        ("tp_rank", ctypes.c_int32),
        ("tp_size", ctypes.c_int32),
    ]


class DistillTensors(ctypes.Structure):
    """flce_distill_tensors. Device addresses as c_void_p (None is NULL)."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("student_hidden", ctypes.c_void_p),
        ("student_weight", ctypes.c_void_p),
        ("teacher_hidden", ctypes.c_void_p),
        ("teacher_weight", ctypes.c_void_p),
        ("labels", ctypes.c_void_p),
        ("grad_output", ctypes.c_void_p),
        ("loss", ctypes.c_void_p),
        ("divergence", ctypes.c_void_p),
        ("grad_student_hidden", ctypes.c_void_p),
        ("grad_student_weight", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_uint64),
        ("teacher_topk_indices", ctypes.c_void_p),
        ("teacher_topk_logprobs", ctypes.c_void_p),
        ("comm", ctypes.c_void_p),
    ]


LOSS_AND_GRAD = "flce_distill_loss_and_grad"
WORKSPACE_SIZE = "flce_distill_workspace_size"
VALIDATE = "flce_distill_problem_validate"
PROBLEM_INIT = "flce_distill_problem_init"
TENSORS_INIT = "flce_distill_tensors_init"
_declared = {}


def _fn(name):
    """The library's `name` with its signature, or FlceError(FLCE_ERR_UNSUPPORTED) naming it when the
    loaded library predates the distillation API."""
    fn = _declared.get(name)
    if fn is not None:
        return fn
    handle = _lib.lib()
    fn = getattr(handle, name, None)
    if fn is None:
        raise FlceError(_lib.FLCE_ERR_UNSUPPORTED, "FLCE_ERR_UNSUPPORTED",
                        f"the loaded library ({_lib.library_path()}) has no {name} (it predates the "
                        f"distillation API of issue 44): rebuild libflce", name)
    vp, st = ctypes.c_void_p, ctypes.c_int
    P, T = ctypes.POINTER(DistillProblem), ctypes.POINTER(DistillTensors)
    sig = {LOSS_AND_GRAD: (st, [vp, P, T, vp]),
           WORKSPACE_SIZE: (st, [vp, P, ctypes.POINTER(ctypes.c_uint64)]),
           VALIDATE: (st, [P]),
           PROBLEM_INIT: (None, [P]),
           TENSORS_INIT: (None, [T])}[name]
    fn.restype, fn.argtypes = sig
    _declared[name] = fn
    return fn


def available():
    """Whether the loaded library has the distillation entry points."""
    try:
        _fn(LOSS_AND_GRAD)
        _fn(WORKSPACE_SIZE)
    except FlceError:
        return False
    return True


def new_problem(**fields):
    """flce_distill_problem from flce_distill_problem_init (the library's defaults; without the
    entry point, the same defaults here), then the given fields. The library refuses a struct_size
    other than its own (a status naming it), so no newer/older-layout dance as in _lib."""
    p = DistillProblem()
    try:
        _fn(PROBLEM_INIT)(ctypes.byref(p))
    except FlceError:
        p.struct_size = ctypes.sizeof(DistillProblem)
        p.api_version = _lib.FLCE_API_VERSION
        p.dtype, p.label_bits, p.divergence = _lib.FLCE_DTYPE_BF16, 32, FLCE_DIVERGENCE_FORWARD_KL
        p.beta, p.temperature, p.ignore_index, p.reduction = 0.5, 1.0, -100, _lib.FLCE_REDUCTION_MEAN
        p.tp_size = 1
    p.struct_size = ctypes.sizeof(DistillProblem)  # what the binding sends (the library checks it)
    for k, v in fields.items():
        if not hasattr(DistillProblem, k):
            raise AttributeError(f"DistillProblem has no field {k!r}")
        setattr(p, k, v)
    return p


def new_tensors(**fields):
    t = DistillTensors()  # (flce_distill_tensors_init: zeros and the struct size, as here)
    t.struct_size = ctypes.sizeof(DistillTensors)
    for k, v in fields.items():
        if not hasattr(DistillTensors, k):
            raise AttributeError(f"DistillTensors has no field {k!r}")
        setattr(t, k, v)
    return t


def validate(problem):
    """flce_distill_problem_validate: FlceError naming the argument, no GPU needed."""
    _lib.check_status(_fn(VALIDATE)(ctypes.byref(problem)), VALIDATE)


def workspace_size(ctx, problem):
    n = ctypes.c_uint64()
    _lib.check_status(_fn(WORKSPACE_SIZE)(ctx, ctypes.byref(problem), ctypes.byref(n)), WORKSPACE_SIZE)
    return n.value


def loss_and_grad(ctx, problem, tensors, stream):
    """Enqueues flce_distill_loss_and_grad on `stream` (an int handle, 0 = legacy stream)."""
    fn = _fn(LOSS_AND_GRAD)
    _lib.check_status(fn(ctx, ctypes.byref(problem), ctypes.byref(tensors), ctypes.c_void_p(stream or None)),
                      LOSS_AND_GRAD)


# ---- top-k log-probabilities (issue 44 item 2): flce_topk_problem, flce_topk_tensors ----------------
class TopkProblem(ctypes.Structure):
    """flce_topk_problem."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("api_version", ctypes.c_uint32),
        ("tokens", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("vocab", ctypes.c_int64),
        ("dtype", _enum),
        ("k", ctypes.c_int32),
        ("temperature", ctypes.c_float),
        ("memory_budget", ctypes.c_uint64),
        # API version 4: tensor (vocab) parallelism
        ("vocab_offset", ctypes.c_int64),
        ("vocab_total", ctypes.c_int64),
        ("tp_rank", ctypes.c_int32),
        ("tp_size", ctypes.c_int32),
    ]


class TopkTensors(ctypes.Structure):
    """flce_topk_tensors. Device addresses as c_void_p (None is NULL)."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("hidden", ctypes.c_void_p),
        ("weight", ctypes.c_void_p),
        ("indices", ctypes.c_void_p),
        ("logprobs", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_uint64),
        ("comm", ctypes.c_void_p),  # API version 4
    ]


TOPK = "flce_topk_logprobs"
TOPK_WORKSPACE_SIZE = "flce_topk_workspace_size"
TOPK_VALIDATE = "flce_topk_problem_validate"
TOPK_PREPARE = "flce_topk_prepare"
TOPK_STATS_BYTES = "flce_topk_stats_bytes"
TOPK_STATS = "flce_topk_stats"
TOPK_FINISH = "flce_topk_finish"
DISTILL_PREPARE = "flce_distill_prepare"
_topk_declared = {}


def _topk_fn(name):
    """The library's top-k entry point `name`, or FlceError(FLCE_ERR_UNSUPPORTED) naming it."""
    fn = _topk_declared.get(name)
    if fn is not None:
        return fn
    fn = getattr(_lib.lib(), name, None)
    if fn is None:
        raise FlceError(_lib.FLCE_ERR_UNSUPPORTED, "FLCE_ERR_UNSUPPORTED",
                        f"the loaded library ({_lib.library_path()}) has no {name} (it predates the top-k "
                        f"API of issue 44): rebuild libflce", name)
    vp, st = ctypes.c_void_p, ctypes.c_int
    P, T = ctypes.POINTER(TopkProblem), ctypes.POINTER(TopkTensors)
    fn.restype, fn.argtypes = {TOPK: (st, [vp, P, T, vp]),
                               TOPK_WORKSPACE_SIZE: (st, [vp, P, ctypes.POINTER(ctypes.c_uint64)]),
                               TOPK_VALIDATE: (st, [P]), TOPK_PREPARE: (st, [vp, P]),
                               TOPK_STATS_BYTES: (st, [P, ctypes.POINTER(ctypes.c_uint64)]),
                               TOPK_STATS: (st, [vp, P, T, vp, vp]), TOPK_FINISH: (st, [vp, P, T, vp, vp]),
                               DISTILL_PREPARE: (st, [vp, ctypes.POINTER(DistillProblem),
                                                      ctypes.POINTER(DistillTensors)])}[name]
    _topk_declared[name] = fn
    return fn


def new_topk_problem(**fields):
    p = TopkProblem()  # (flce_topk_problem_init's defaults, set here: the fields below are all given)
    p.struct_size, p.api_version = ctypes.sizeof(TopkProblem), _lib.FLCE_API_VERSION
    p.dtype, p.k, p.temperature, p.tp_size = _lib.FLCE_DTYPE_BF16, 1, 1.0, 1
    for k, v in fields.items():
        if not hasattr(TopkProblem, k):
            raise AttributeError(f"TopkProblem has no field {k!r}")
        setattr(p, k, v)
    return p


def new_topk_tensors(**fields):
    t = TopkTensors()
    t.struct_size = ctypes.sizeof(TopkTensors)
    for k, v in fields.items():
        if not hasattr(TopkTensors, k):
            raise AttributeError(f"TopkTensors has no field {k!r}")
        setattr(t, k, v)
    return t


def topk_validate(problem):
    """flce_topk_problem_validate: FlceError naming the argument, no GPU needed."""
    _lib.check_status(_topk_fn(TOPK_VALIDATE)(ctypes.byref(problem)), TOPK_VALIDATE)


def topk_workspace_size(ctx, problem):
    n = ctypes.c_uint64()
    _lib.check_status(_topk_fn(TOPK_WORKSPACE_SIZE)(ctx, ctypes.byref(problem), ctypes.byref(n)), TOPK_WORKSPACE_SIZE)
    return n.value


def topk(ctx, problem, tensors, stream):
    """Enqueues flce_topk_logprobs on `stream` (an int handle, 0 = legacy stream)."""
    _lib.check_status(_topk_fn(TOPK)(ctx, ctypes.byref(problem), ctypes.byref(tensors), ctypes.c_void_p(stream or None)),
                      TOPK)


def topk_stats_bytes(problem):
    """flce_topk_stats_bytes: bytes of one rank's block, 4·(8 + tokens·(2 + 2k))."""
    n = ctypes.c_uint64()
    _lib.check_status(_topk_fn(TOPK_STATS_BYTES)(ctypes.byref(problem), ctypes.byref(n)), TOPK_STATS_BYTES)
    return n.value


def topk_stats(ctx, problem, tensors, block, stream):
    """Enqueues flce_topk_stats: this rank's block (a device address) from tensors.hidden and .weight."""
    _lib.check_status(_topk_fn(TOPK_STATS)(ctx, ctypes.byref(problem), ctypes.byref(tensors), ctypes.c_void_p(block),
                                           ctypes.c_void_p(stream or None)), TOPK_STATS)


def topk_finish(ctx, problem, tensors, gathered, stream):
    """Enqueues flce_topk_finish: the outputs from the tp_size gathered blocks (a device address)."""
    _lib.check_status(_topk_fn(TOPK_FINISH)(ctx, ctypes.byref(problem), ctypes.byref(tensors),
                                            ctypes.c_void_p(gathered), ctypes.c_void_p(stream or None)), TOPK_FINISH)


def topk_prepare(ctx, problem):
    """flce_topk_prepare: compiles (or loads) the call's kernels now."""
    _lib.check_status(_topk_fn(TOPK_PREPARE)(ctx, ctypes.byref(problem)), TOPK_PREPARE)


def distill_prepare(ctx, problem):
    """flce_distill_prepare with NULL tensors: every output, with and without labels."""
    _lib.check_status(_topk_fn(DISTILL_PREPARE)(ctx, ctypes.byref(problem), None), DISTILL_PREPARE)
