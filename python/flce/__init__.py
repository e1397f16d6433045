"""flce — PyTorch binding of the flce library (fused linear layer + cross-entropy on NVIDIA GPUs).

A thin ctypes binding over libflce.so (no compiled extension): `linear_cross_entropy(hidden,
weight, labels)` computes cross_entropy(hidden @ weight.T, labels) without materializing the
tokens x vocab logits. The library calls are torch.library custom ops (flce::forward,
flce::backward, flce::scale_gradients_; python/flce/_ops.py) with fake kernels and autograd
formulas, so torch.compile(fullgraph=True) traces through them. See python/README.md.

Other argument conventions: flce.functional.linear_cross_entropy (PyTorch's
F.linear_cross_entropy names), flce.cce.linear_cross_entropy (Cut Cross-Entropy's names);
Hugging Face causal LMs: flce.patch_hf(model). Under torch.autocast the inputs are cast to its
dtype first. flce.prepare(N, D, V, ...) compiles the kernels of the matching calls ahead of time.
Needs PyTorch 2.4 or newer (an ImportError at import otherwise).
"""
from __future__ import annotations  # the annotations name typing_extensions' Unpack only for checkers

import operator
import threading
import time
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Optional, Tuple, TypedDict, Union, overload

import torch
from torch import Tensor

from . import _compat

_compat.require_torch(torch.__version__)  # an ImportError naming the supported range, not a failure later

from . import _lib  # noqa: E402
from ._lib import FlceError, FlceLibraryNotFound  # noqa: F401  (public)
from ._version import __version__  # noqa: F401  (public)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["linear_cross_entropy", "LinearCrossEntropy", "LinearCrossEntropyOutput", "FlceError",
           "FlceLibraryNotFound", "check", "version", "library_path", "vocab_parallel_cross_entropy",
           "NcclComm", "patch_hf", "unpatch_hf", "prepare", "Prepared", "linear_distillation", "topk_logprobs",
           "TopkLogprobs", "prepare_topk_logprobs", "prepare_linear_distillation", "linear_distillation_topk",
           "vocab_parallel_distillation", "vocab_parallel_distillation_topk", "LinearDistillation",
           "LinearDistillationOutput", "vocab_parallel_topk_logprobs"]

_DTYPES = {torch.float32: _lib.FLCE_DTYPE_F32, torch.float16: _lib.FLCE_DTYPE_F16,
           torch.bfloat16: _lib.FLCE_DTYPE_BF16}
_LABEL_BITS = {torch.int32: 32, torch.int64: 64}


def version() -> str:
    """The library's version string (flce_version()); flce.__version__ is the package's (the same
    for a package built with its library)."""
    return _lib.version()


def library_path() -> str:
    """The path libflce.so was loaded from."""
    return _lib.library_path()


def _stream(device):
    return torch.cuda.current_stream(device).cuda_stream


def check(device: Union[torch.device, str, int, None] = None) -> None:
    """Synchronizes the current stream of `device` and raises FlceError (FLCE_ERR_BAD_LABEL) if a
    kernel saw a label outside [0, V) that was not ignore_index (such tokens were treated as
    ignored). flce calls never synchronize on their own, so bad labels are reported here or by the
    next flce call on the device."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    _lib.check(_lib.context(index), _stream(device))


# ---- argument checks -------------------------------------------------------------------------

def _ptr(t, name, align):
    p = t.data_ptr()
    if p % align:
        raise ValueError(f"{name}: data_ptr() {p:#x} is not {align}-byte aligned (a view with a storage "
                         f"offset?); pass a fresh tensor, e.g. {name}.clone()")
    return p


def _require_cuda(hidden):
    if not hidden.is_cuda:
        raise ValueError(f"hidden: must be on a CUDA device, is on {hidden.device}")


def _check_scalars(ignore_index, label_smoothing, z_loss, softcap, temperature, shift, batch_invariant):
    """Scalar options of the right kind, named when not (torch.compile may pass SymInt/SymFloat)."""
    def kind(x):
        return type(x).__name__
    for name, x in (("ignore_index", ignore_index), ("shift", shift)):
        if not (isinstance(x, int) or kind(x) == "SymInt"):
            raise TypeError(f"{name}: expected an int, got {kind(x)} {x!r}")
    for name, x in (("label_smoothing", label_smoothing), ("z_loss", z_loss), ("temperature", temperature),
                    ("softcap", softcap)):
        if name == "softcap" and x is None:
            continue
        if isinstance(x, bool) or not (isinstance(x, (int, float)) or kind(x) in ("SymInt", "SymFloat")):
            raise TypeError(f"{name}: expected a number, got {kind(x)} {x!r}")
    if not isinstance(batch_invariant, bool) and batch_invariant not in (0, 1):
        raise TypeError(f"batch_invariant: expected a bool, got {kind(batch_invariant)} {batch_invariant!r}")


def _autocast(hidden, weight, bias):
    """hidden, weight and bias in torch.autocast's dtype where autocast is enabled for hidden's
    device type (as F.linear would run there; float64 is left alone, as autocast does), else as
    they are. An ordinary differentiable cast: fp32 leaves get fp32 gradients through it. Inside a
    trace torch.compile keeps the cast in the graph (the autocast state is a guard)."""
    if not isinstance(hidden, torch.Tensor):
        return hidden, weight, bias
    dtype = _compat.autocast_dtype(hidden.device.type)
    if dtype is None:
        return hidden, weight, bias

    def cast(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dtype and t.dtype != torch.float64:
            return t.to(dtype)
        return t
    return cast(hidden), cast(weight), cast(bias)


def _check_options(reduction, strategy, memory_budget):
    if not isinstance(reduction, str) or reduction not in _lib.REDUCTIONS:
        raise ValueError(f"reduction: {reduction!r}; expected 'mean', 'sum' or 'none'")
    if not isinstance(strategy, str) or strategy not in ("auto", "chunked", "recompute", "saved"):
        raise ValueError(f"strategy: {strategy!r}; expected 'auto', 'chunked', 'recompute' or 'saved'")
    if memory_budget is not None:
        try:
            ok = operator.index(memory_budget) > 0
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"memory_budget: {memory_budget!r}; expected a positive number of bytes or None")


def _check_args(hidden, weight, labels, reduction, strategy, memory_budget):
    for name, t in (("hidden", hidden), ("weight", weight), ("labels", labels)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    _require_cuda(hidden)
    for name, t in (("weight", weight), ("labels", labels)):
        if t.device != hidden.device:
            raise ValueError(f"{name}: on {t.device}, hidden is on {hidden.device} (must be the same device)")
    if hidden.dtype not in _DTYPES:
        raise ValueError(f"hidden: dtype {hidden.dtype} is not supported (float32, float16 or bfloat16)")
    if weight.dtype != hidden.dtype:
        raise ValueError(f"weight: dtype {weight.dtype}, hidden is {hidden.dtype} (must be the same)")
    if labels.dtype not in _LABEL_BITS:
        raise ValueError(f"labels: dtype {labels.dtype} is not supported (int32 or int64)")
    if hidden.dim() < 1:
        raise ValueError("hidden: must have shape (N, D) or (..., D), got a scalar")
    if weight.dim() != 2:
        raise ValueError(f"weight: must have shape (V, D), got {tuple(weight.shape)}")
    d = hidden.shape[-1]
    if weight.shape[1] != d:
        raise ValueError(f"weight: shape {tuple(weight.shape)} does not match hidden {tuple(hidden.shape)} "
                         f"(need weight.shape[1] == hidden.shape[-1] == D)")
    if d < 8 or d % 8:
        raise ValueError(f"hidden: D = {d} must be a positive multiple of 8")
    if weight.shape[0] < 1:
        raise ValueError("weight: V = 0 rows; need at least one vocab row")
    if tuple(labels.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"labels: shape {tuple(labels.shape)} must be hidden's leading shape "
                         f"{tuple(hidden.shape[:-1])}")
    for name, t in (("hidden", hidden), ("weight", weight), ("labels", labels)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")
    _check_options(reduction, strategy, memory_budget)


def _check_extra(hidden, weight, bias, class_weights, vocab_total, grad_hidden_acc, grad_weight_acc):
    """The optional tensors: bias (V_r,) in the dtype, class weights (vocab_total,) floating, fp32
    accumulators shaped like hidden and weight."""
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias: expected a torch.Tensor or None, got {type(bias).__name__}")
        if bias.device != hidden.device:
            raise ValueError(f"bias: on {bias.device}, hidden is on {hidden.device} (must be the same device)")
        if bias.dtype != hidden.dtype:
            raise ValueError(f"bias: dtype {bias.dtype}, hidden is {hidden.dtype} (must be the same)")
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias: shape {tuple(bias.shape)}, expected ({weight.shape[0]},) (one per weight row)")
        if not bias.is_contiguous():
            raise ValueError("bias: must be contiguous (call .contiguous() first)")
    if class_weights is not None:
        if not isinstance(class_weights, torch.Tensor):
            raise TypeError(f"weight (class weights): expected a torch.Tensor or None, got "
                            f"{type(class_weights).__name__}")
        if class_weights.device != hidden.device:
            raise ValueError(f"weight (class weights): on {class_weights.device}, hidden is on {hidden.device}")
        if not class_weights.is_floating_point():
            raise ValueError(f"weight (class weights): dtype {class_weights.dtype}; expected a floating dtype")
        if tuple(class_weights.shape) != (vocab_total,):
            raise ValueError(f"weight (class weights): shape {tuple(class_weights.shape)}, expected "
                             f"({vocab_total},) (one per class)")
    for name, acc, like in (("grad_hidden_accumulator", grad_hidden_acc, hidden),
                            ("grad_weight_accumulator", grad_weight_acc, weight)):
        if acc is None:
            continue
        if not isinstance(acc, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(acc).__name__}")
        if acc.dtype != torch.float32:
            raise ValueError(f"{name}: dtype {acc.dtype}; must be float32 (flce adds its gradient into it)")
        if acc.device != hidden.device:
            raise ValueError(f"{name}: on {acc.device}, hidden is on {hidden.device} (must be the same device)")
        if tuple(acc.shape) != tuple(like.shape):
            raise ValueError(f"{name}: shape {tuple(acc.shape)}, expected {tuple(like.shape)}")
        if not acc.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
        if not torch.compiler.is_compiling() and acc.data_ptr() % 16:  # (no storage while tracing)
            raise ValueError(f"{name}: data_ptr() {acc.data_ptr():#x} is not 16-byte aligned (a view with a "
                             f"storage offset?); flce adds into it in place, so pass a tensor of its own")


# ---- the library calls -----------------------------------------------------------------------

class _Options(NamedTuple):
    """The keyword arguments of linear_cross_entropy that go into flce_problem."""
    ignore_index: int
    reduction: str
    strategy: str
    memory_budget: Optional[int]
    label_smoothing: float
    z_loss: float
    softcap: float
    temperature: float
    batch_invariant: bool


def _problem(n, d, v, dtype, label_dtype, opts, tp=None, has_bias=False, has_class_weights=False):
    """flce_problem of n tokens (this rank's under sequence parallelism), hidden size d, v weight
    rows (this rank's), torch dtypes and the options; tp: None, or (rank, size, vocab_offset,
    vocab_total, comm pointer or None, sequence_parallel 0/1)."""
    rank, size, offset, total, _, sp = tp or (0, 1, 0, v, None, 0)
    fields = dict(
        tokens=n, hidden=d, vocab_shard=v, vocab_offset=offset, vocab_total=total, tp_rank=rank, tp_size=size,
        dtype=_DTYPES[dtype], label_bits=_LABEL_BITS[label_dtype], reduction=_lib.REDUCTIONS[opts.reduction],
        ignore_index=int(opts.ignore_index), memory_budget=operator.index(opts.memory_budget or 0),
        label_smoothing=float(opts.label_smoothing), z_loss=float(opts.z_loss),
        softcap=float(opts.softcap), temperature=float(opts.temperature))
    if has_bias:
        fields["has_bias"] = 1
    if opts.batch_invariant:
        fields["batch_invariant"] = 1
    if has_class_weights:
        fields["has_class_weights"] = 1
    if sp:
        fields["sequence_parallel"] = 1
    return _lib.new_problem(**fields)


# flce.NcclComm(register=True) objects by their ncclComm_t address: _Call takes their registered
# workspace for the calls that issue collectives on them (python/flce/parallel.py).
_registered_comms: dict = {}

# Alignment flce.h asks of each output (or extra input) buffer.
_ALIGN = {"loss": 4, "lse": 4, "grad_output": 4, "grad_hidden": 16, "grad_weight": 16, "grad_bias": 4,
          "loss_per_token": 4, "z_loss_out": 4, "target_logprob": 4, "entropy": 4, "argmax": 8,
          "grad_logprob": 4, "grad_lse": 4, "grad_entropy": 4, "grad_loss_per_token": 4}


class _Call:
    """The problem of hidden (N, D), weight (V, D), labels (N,), optional bias (V,) and fp32 class
    weights (vocab_total,), and the options; calls ops on the current stream of the tensors' device."""

    def __init__(self, hidden, weight, labels, opts, tp=None, bias=None, class_weights=None):
        """tp: None, or (rank, size, vocab_offset, vocab_total, comm pointer or None,
        sequence_parallel) for a vocab-parallel call (python/flce/parallel.py)."""
        self.device = hidden.device
        self.comm = tp[4] if tp else None
        self.problem = _problem(hidden.shape[0], hidden.shape[1], weight.shape[0], hidden.dtype, labels.dtype,
                                opts, tp, bias is not None, class_weights is not None)
        self.hidden, self.weight, self.labels = hidden, weight, labels
        self.bias, self.class_weights = bias, class_weights

    def _context(self):
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return _lib.context(index)

    def strategy_of(self, op, strategy):
        """What the library runs `op` with for `strategy` ('chunked' or 'recompute' for AUTO)."""
        self.problem.strategy = _lib.STRATEGIES[strategy]
        return _lib.strategy_of(self._context(), self.problem, op)

    def validate(self, strategy):
        self.problem.strategy = _lib.STRATEGIES[strategy]
        _lib.validate(self.problem)

    def saved_bytes(self):
        """Workspace bytes of strategy 'saved' for this problem (the logits kept from forward to
        backward); FlceError where all tokens' do not fit the budget (flce.h "Saved logits")."""
        self.problem.strategy = _lib.FLCE_STRATEGY_SAVED
        return _lib.workspace_size(self._context(), self.problem, _lib.FLCE_OP_FORWARD)

    def __call__(self, op, strategy, half=None, buffer=None, workspace=None, **outs):
        """Runs `op` with problem.strategy = `strategy`; `outs` are flce_tensors fields given as
        tensors (or None). The workspace is a torch uint8 tensor, so PyTorch's caching allocator
        owns it and frees it in stream order; `workspace` given (strategy 'saved': the logits kept
        between its two calls) is used as it is. Meta tensors (flce.prepare's dry run): the call is
        recorded, not run."""
        if self.device.type == "meta":
            return _record(self, op, strategy, half, workspace, outs)
        self.problem.strategy = _lib.STRATEGIES[strategy]
        ctx = self._context()
        ws_bytes = workspace.numel() if workspace is not None else _lib.workspace_size(ctx, self.problem, op)
        registered = _registered_comms.get(self.comm) if self.comm and half is None else None

        def new_workspace(nbytes):
            if registered is not None:  # flce.NcclComm(register=True): its one registered buffer
                return registered.workspace(max(nbytes, 256), self.device)
            return torch.empty(max(nbytes, 256), dtype=torch.uint8, device=self.device)
        try:
            workspace = new_workspace(ws_bytes) if workspace is None else workspace
        except torch.cuda.OutOfMemoryError:
            # The default budget may plan up to 1/16 of the GPU where that is faster; next to what
            # PyTorch holds it may not fit. Then the 512 MiB plan, as the library does with its own
            # workspace (runtime/launch.c launch_lean_plan). An explicit budget is the caller's.
            if self.problem.memory_budget != 0:
                raise
            self.problem.memory_budget = _LEAN_BUDGET
            ws_bytes = _lib.workspace_size(ctx, self.problem, op)
            workspace = new_workspace(ws_bytes)
        fields = {name: None if t is None else _ptr(t, name, _ALIGN[name]) for name, t in outs.items()}
        extra = {}
        if self.bias is not None:
            extra["bias"] = _ptr(self.bias, "bias", 16)
        if self.class_weights is not None:
            extra["class_weights"] = _ptr(self.class_weights, "class_weights", 4)
        t = _lib.new_tensors(
            hidden=_ptr(self.hidden, "hidden", 16), weight=_ptr(self.weight, "weight", 16),
            labels=_ptr(self.labels, "labels", self.labels.element_size()),
            workspace=_ptr(workspace, "workspace", 256), workspace_bytes=workspace.numel(),
            comm=self.comm if half is None else None, **extra, **fields)
        if half is None:
            _lib.run(op, ctx, self.problem, t, _stream(self.device))
        else:  # one half of the split-phase TP forward; buffer: this rank's stats or all ranks'
            _lib.forward_half(half, ctx, self.problem, t, _ptr(buffer, "stats", 16), _stream(self.device))
        # `workspace` goes back to the caching allocator here; later work on this stream is ordered
        # after the kernels just enqueued, so reusing the memory is safe.

    def scale(self, grad_output, grad_hidden=None, grad_weight=None, grad_bias=None):
        """flce_scale_gradients: the given gradients of an earlier loss-and-grad call on this
        problem times the fp32 scalar grad_output, in place."""
        if self.device.type == "meta":  # flce.prepare's dry run
            outs = {"grad_output": grad_output, "grad_hidden": grad_hidden, "grad_weight": grad_weight,
                    "grad_bias": grad_bias}
            return _record(self, _lib.FLCE_OP_LOSS_AND_GRAD, "auto", outs=outs, kind="scale_gradients")
        self.problem.strategy = _lib.FLCE_STRATEGY_AUTO
        outs = {"grad_output": grad_output, "grad_hidden": grad_hidden, "grad_weight": grad_weight,
                "grad_bias": grad_bias}
        t = _lib.new_tensors(**{k: None if v is None else _ptr(v, k, _ALIGN[k]) for k, v in outs.items()})
        _lib.scale_gradients(self._context(), self.problem, t, _stream(self.device))


def _loss_tensor(n, reduction, device):
    shape = (n,) if reduction == "none" else ()
    return torch.empty(shape, dtype=torch.float32, device=device)


def _grad_out(grad, n, reduction):
    """Upstream gradient as the library reads it: fp32, contiguous, 1 or N values."""
    g = grad.to(torch.float32).contiguous()
    return g.reshape(n) if reduction == "none" else g.reshape(())


def _no_grad_loss(hidden, weight, labels, opts, tp=None):
    loss = _loss_tensor(hidden.shape[0], opts.reduction, hidden.device)
    _Call(hidden, weight, labels, opts, tp)(_lib.FLCE_OP_FORWARD, "auto", loss=loss)
    return loss


# ---- how the gradients are computed ----------------------------------------------------------

# Up to this many tokens AUTO's gradients go to backward (flce_backward, an extra logits pass of
# 2·N·V·D) instead of being computed in forward and scaled by the upstream gradient in backward
# (a pass over dW, V·D·4 bytes, whatever N is, unless the library's flce_scale_gradients finds the
# upstream gradient is exactly 1, as after a plain loss.backward()). The two cost the same near
# N = 430 on an H100 (650 TFLOP/s, 3 TB/s) when g != 1, and computing in forward always wins when
# g = 1: at 512×4096×128256 on an H100 (2026-11-26, bench/results/2026-11-26-h100-session6,
# in archive/2026-11.tar.xz)
# deferring took 3.10 ms (compare.py), the loss-and-grad call 2.42 (flce bench). Until then this
# was 1024, measured before flce_scale_gradients existed.
_DEFER_TOKENS = 256

# The library's default budget without its device share (runtime/plan.h PLAN_DEFAULT_BUDGET): the
# plan a call falls back to when the larger default workspace cannot be allocated.
_LEAN_BUDGET = 512 << 20


def _auto_choice_now(device_index, n, d, v, dtype, label_dtype, opts, tp, has_bias, has_class_weights):
    problem = _problem(n, d, v, dtype, label_dtype, opts, tp, has_bias, has_class_weights)
    problem.strategy = _lib.FLCE_STRATEGY_AUTO
    return _lib.strategy_of(_lib.context(device_index), problem, _lib.FLCE_OP_LOSS_AND_GRAD)


@_compat.assume_constant_result  # torch.compiler's, taken when torch._dynamo is imported
def _auto_choice(device_index, n, d, v, dtype, label_dtype, tp, has_bias, has_class_weights, *opts):
    """The strategy ('chunked' or 'recompute') the library's AUTO picks for a loss-and-grad call
    (flce_strategy_of: host arithmetic, no GPU work). torch.compile evaluates it once while tracing
    (static shapes) and keeps the answer as a constant: it only chooses between two ways of
    computing the same values. opts: _Options's fields as separate arguments (PyTorch 2.15's Dynamo
    hands a NamedTuple built inside the trace to such a function as an empty one, and cannot convert
    a tuple built there to a constant at all under dynamic shapes)."""
    return _auto_choice_now(device_index, n, d, v, dtype, label_dtype, _Options(*opts), tp, has_bias,
                            has_class_weights)


def _static_dims(*dims):
    """The dims as ints: themselves in eager mode and for static shapes under torch.compile; for
    dynamic (symbolic) ones, the value of the call being traced (a size hint, no guard); None when
    there is none (data-dependent sizes) or this PyTorch has no way to ask (python/flce/_compat.py)."""
    has_static_value, size_hint = _compat.has_static_value, _compat.size_hint
    if has_static_value is None or size_hint is None:  # every dim is an int outside a trace
        if torch.compiler.is_compiling():
            # (PyTorch 2.4: symbolic_shapes has no has_static_value, and a symbol traces as an int)
            return None
        return dims if all(type(x) is int for x in dims) else None
    if all(has_static_value(x) for x in dims):
        return dims
    try:
        return tuple(size_hint(x) for x in dims)
    except Exception:  # noqa: BLE001  (an unbacked size has no hint before PyTorch 2.15)
        return None


def _plan_options(opts):
    """opts with constants where torch.compile(dynamic=True) made them symbols (it does so even
    for defaults like ignore_index=-100 and z_loss=0.0): what AUTO's choice depends on is kept
    (whether smoothing, z-loss and softcap are on, under a guard), the rest is a stand-in."""
    has_static_value, size_hint = _compat.has_static_value, _compat.size_hint
    if has_static_value is None or size_hint is None:
        return opts

    # Ints go through size_hint even with a static value: Dynamo 2.15 hands a static-valued symbolic
    # int to the constant function as a symbol, and refuses it (fuzz_binding.py seed 5 case 79).
    def num(x, on):
        if isinstance(x, float) or type(x).__name__ == "SymFloat":
            return x if has_static_value(x) else on if x > 0 else 0.0
        return size_hint(x)
    budget = None if opts.memory_budget is None else num(opts.memory_budget, 0)
    return _Options(num(opts.ignore_index, 0), opts.reduction, opts.strategy, budget,
                    num(opts.label_smoothing, 0.5), num(opts.z_loss, 1e-4), num(opts.softcap, 1.0),
                    num(opts.temperature, 1.0), opts.batch_invariant)


def _grads_in_forward(h2, weight, y1, opts, tp, bias, class_weights):
    """True: one loss-and-grad call in forward (gradients of 1·loss, scaled in backward); False:
    forward saves lse and backward runs flce_backward. Only asked for mean/sum without accumulators
    or differentiable per-token outputs. Both compute the same values; which is faster depends on
    the shapes (the library's AUTO, flce_strategy_of). Under torch.compile with a dynamic token
    count the library is asked about the token count of the call being traced, and the compiled
    graph keeps that choice for the other counts it runs (apart from the N <= _DEFER_TOKENS guard)."""
    if opts.strategy in ("recompute", "saved"):  # (saved: forward keeps the logits for backward)
        return False
    if opts.strategy == "chunked" or tp is not None:  # vocab-parallel with flce's NCCL: as before
        return True
    if h2.shape[0] <= _DEFER_TOKENS:
        return False
    dims = _static_dims(h2.shape[0], h2.shape[1], weight.shape[0])
    if dims is None:
        return True
    n, d, v = dims
    opts = _plan_options(opts)
    index = h2.device.index if h2.device.index is not None else \
        (torch.cuda.current_device() if h2.is_cuda else getattr(_recording, "device", -1) if h2.is_meta else -1)
    return _auto_choice(index, n, d, v, h2.dtype, y1.dtype, tp, bias is not None, class_weights is not None,
                        *opts) != "recompute"


class LinearCrossEntropyOutput(NamedTuple):
    """What linear_cross_entropy returns when a return_* option is set. Per-token fields have
    labels' shape (fp32; argmax int64) and are None unless asked for.

    loss            as without the options (scalar for mean/sum, per token for none)
    lse             log Σ_j exp(z_j) of each token (all tokens, ignored ones too); differentiable
    logprobs        z_y − lse: log-probability of the label (0 for ignored tokens); differentiable
    entropy         lse − Σ_j p_j z_j (all tokens); differentiable
    argmax          id of the largest logit (first on ties)
    z_loss          the z_loss·w_y·lse² part of the loss, reduced like the loss; not differentiable
    loss_per_token  loss_i before the reduction (0 for ignored tokens); differentiable

    From flce.vocab_parallel_cross_entropy the same, over the whole vocab (argmax a global id);
    under sequence parallelism the per-token fields are this rank's tokens. Gradients of lse and
    entropy there need the saved logits on the split-phase route (comm=None; see
    python/flce/parallel.py).
    """
    loss: torch.Tensor
    lse: Optional[torch.Tensor] = None
    logprobs: Optional[torch.Tensor] = None
    entropy: Optional[torch.Tensor] = None
    argmax: Optional[torch.Tensor] = None
    z_loss: Optional[torch.Tensor] = None
    loss_per_token: Optional[torch.Tensor] = None


def _shift_labels(labels, shift, ignore_index):
    """labels[..., s:] followed by s ignored positions: hidden position t is scored against the
    label at t + s, without slicing (and copying) hidden."""
    s = operator.index(shift)
    if s == 0:
        return labels
    if labels.dim() < 1 or not 0 < s < labels.shape[-1]:
        raise ValueError(f"shift: {shift!r}; must be in [0, {labels.shape[-1] if labels.dim() else 0}) "
                         f"(the last dim of labels)")
    if s == 0:
        return labels
    pad = torch.full(tuple(labels.shape[:-1]) + (s,), ignore_index, dtype=labels.dtype, device=labels.device)
    return torch.cat([labels[..., s:], pad], dim=-1).contiguous()


def _unshift(x, s, fill=0):
    """Per-token values of hidden positions moved to their labels' positions (t + s); the first s
    positions, which no hidden position predicts, get `fill`."""
    if s == 0:
        return x
    return torch.nn.functional.pad(x[..., :-s], (s, 0), value=fill)


class _LossOptions(TypedDict, total=False):
    """linear_cross_entropy's keyword options other than return_*, for the overloads below."""
    bias: Optional[Tensor]
    class_weights: Optional[Tensor]
    ignore_index: int
    reduction: str  # "mean", "sum" or "none"
    memory_budget: Optional[int]
    strategy: str  # "auto", "chunked", "recompute" or "saved"
    label_smoothing: float
    z_loss: float
    softcap: Optional[float]
    temperature: float
    shift: int
    grad_weight_accumulator: Optional[Tensor]
    grad_hidden_accumulator: Optional[Tensor]
    batch_invariant: bool


# The result's type for type checkers: the loss tensor with no return_* option set, a
# LinearCrossEntropyOutput with any set to True, either where they are bools known only at run time.
@overload
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, return_lse: Literal[False] = ...,
                         return_logprobs: Literal[False] = ..., return_entropy: Literal[False] = ...,
                         return_argmax: Literal[False] = ..., return_z_loss: Literal[False] = ...,
                         return_loss_per_token: Literal[False] = ..., **options: Unpack[_LossOptions]) -> Tensor: ...
@overload
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, return_lse: Literal[True],
                         return_logprobs: bool = ..., return_entropy: bool = ..., return_argmax: bool = ...,
                         return_z_loss: bool = ..., return_loss_per_token: bool = ...,
                         **options: Unpack[_LossOptions]) -> LinearCrossEntropyOutput: ...
@overload
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, return_logprobs: Literal[True],
                         return_lse: bool = ..., return_entropy: bool = ..., return_argmax: bool = ...,
                         return_z_loss: bool = ..., return_loss_per_token: bool = ...,
                         **options: Unpack[_LossOptions]) -> LinearCrossEntropyOutput: ...
@overload
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, return_entropy: Literal[True],
                         return_lse: bool = ..., return_logprobs: bool = ..., return_argmax: bool = ...,
                         return_z_loss: bool = ..., return_loss_per_token: bool = ...,
                         **options: Unpack[_LossOptions]) -> LinearCrossEntropyOutput: ...
@overload
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, return_argmax: Literal[True],
                         return_lse: bool = ..., return_logprobs: bool = ..., return_entropy: bool = ...,
                         return_z_loss: bool = ..., return_loss_per_token: bool = ...,
                         **options: Unpack[_LossOptions]) -> LinearCrossEntropyOutput: ...
@overload
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, return_z_loss: Literal[True],
                         return_lse: bool = ..., return_logprobs: bool = ..., return_entropy: bool = ...,
                         return_argmax: bool = ..., return_loss_per_token: bool = ...,
                         **options: Unpack[_LossOptions]) -> LinearCrossEntropyOutput: ...
@overload
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, return_loss_per_token: Literal[True],
                         return_lse: bool = ..., return_logprobs: bool = ..., return_entropy: bool = ...,
                         return_argmax: bool = ..., return_z_loss: bool = ...,
                         **options: Unpack[_LossOptions]) -> LinearCrossEntropyOutput: ...
@overload
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, return_lse: bool = ...,
                         return_logprobs: bool = ..., return_entropy: bool = ..., return_argmax: bool = ...,
                         return_z_loss: bool = ..., return_loss_per_token: bool = ...,
                         **options: Unpack[_LossOptions]) -> Union[Tensor, LinearCrossEntropyOutput]: ...


def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, bias: Optional[Tensor] = None,
                         class_weights: Optional[Tensor] = None, ignore_index: int = -100,
                         reduction: str = "mean", memory_budget: Optional[int] = None, strategy: str = "auto",
                         label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: Optional[float] = 0.0,
                         temperature: float = 1.0, shift: int = 0, grad_weight_accumulator: Optional[Tensor] = None,
                         grad_hidden_accumulator: Optional[Tensor] = None, return_lse: bool = False,
                         return_logprobs: bool = False, return_entropy: bool = False, return_argmax: bool = False,
                         return_z_loss: bool = False, return_loss_per_token: bool = False,
                         batch_invariant: bool = False) -> Union[Tensor, LinearCrossEntropyOutput]:
    """cross_entropy(hidden @ weight.T + bias, labels) without materializing the logits.

    hidden:  (N, D) or (..., D), float32 / float16 / bfloat16, contiguous, on a CUDA device.
    weight:  (V, D), same dtype and device, contiguous (the output layer, e.g. lm_head.weight).
    labels:  hidden's leading shape, int32 or int64; labels == ignore_index contribute nothing.
    bias:    None or (V,) in the dtype; differentiable (its gradient Σ_i dZ_i).
    class_weights: None or (V,) floating (used as fp32): F.cross_entropy's `weight=`; the mean
        divides by the sum of the valid tokens' label weights. Not differentiable.
    reduction: 'mean' (over non-ignored tokens; 0 when there are none), 'sum' or 'none'.
    memory_budget: bytes of workspace the chunked strategy may use (None: the library's default).
    strategy: 'auto'; 'chunked' (loss and grads in one pass, 6NVD); 'recompute' (forward now,
        backward recomputes the logits from the saved lse, 8NVD, no workspace that grows with V).
    label_smoothing (PyTorch's), z_loss (adds z_loss * lse^2), softcap (logits -> c*tanh(z/c); None
        or 0: off), temperature (logits / T): see include/flce.h; the library checks their ranges.
    shift: s > 0 scores hidden position t against labels[..., t + s] (causal LM: s = 1, as Cut
        Cross-Entropy's shift) without copying hidden[..., :-s, :]; per-token outputs stay aligned
        with labels (position t + s), and the first s positions are 0 (argmax: -1).
    grad_weight_accumulator / grad_hidden_accumulator: float32 tensors shaped like weight / hidden
        (Megatron's main_grad): backward adds dW / dH into them in fp32 (one rounding less than a
        16-bit .grad) and weight's / hidden's autograd gradient is then None.
    batch_invariant: a token's lse, loss, logprobs, entropy and argmax bitwise identical whatever
        else the call holds (its token count, the other tokens, chunks, strategy): train/inference
        agreement of RL log-probs (include/flce.h problem.batch_invariant).
    return_lse, return_logprobs, return_entropy, return_argmax, return_z_loss,
        return_loss_per_token: also return these per-token values (see LinearCrossEntropyOutput);
        then the result is a LinearCrossEntropyOutput instead of the loss tensor. logprobs,
        loss_per_token, lse and entropy are differentiable (RL objectives, an entropy bonus, a
        z-loss written by hand; temperature applies); z_loss is not: a gradient reaching it raises
        NotImplementedError (use the z_loss= option). With 16-bit inputs the forward keeps the
        compact logits of all tokens (2 bytes per logit, the budget rule of the chunked strategy)
        and backward forms dZ from them with every upstream gradient at once (6·N·V·D; strategy
        'saved', include/flce.h "Saved logits"); where they do not fit, backward runs one chunked
        loss-and-grad (8·N·V·D in all).

    Returns the loss in float32: a scalar, or labels.shape for 'none'. Differentiable in hidden,
    weight and bias. With 'mean'/'sum' and strategy chunked (or auto, when the library picks chunked
    for more than 1024 tokens) the gradients are computed in the forward call and backward scales
    them by the upstream gradient (in place through flce_scale_gradients, with no pass at all when
    it is 1; a second backward through the same graph then raises); otherwise forward saves lse and
    backward recomputes the logits. Works under torch.compile(fullgraph=True) and CUDA-graph
    capture. Needs a GPU of sm_80 or newer.

    Under torch.autocast(device_type, dtype=...) enabled for hidden's device type, hidden, weight
    and bias are cast to the autocast dtype first (float32 parameters run the 16-bit kernels, as
    F.linear would), with the gradients flowing back to them in their own dtype; outside autocast
    the dtypes are used as given.
    """
    hidden, weight, bias = _autocast(hidden, weight, bias)
    _check_args(hidden, weight, labels, reduction, strategy, memory_budget)
    _check_scalars(ignore_index, label_smoothing, z_loss, softcap, temperature, shift, batch_invariant)
    softcap = 0.0 if softcap is None else softcap
    vocab_total = weight.shape[0]
    _check_extra(hidden, weight, bias, class_weights, vocab_total, grad_hidden_accumulator, grad_weight_accumulator)
    s = operator.index(shift)
    labels = _shift_labels(labels, s, ignore_index)
    opts = _Options(ignore_index, reduction, strategy, memory_budget, label_smoothing, z_loss, softcap, temperature,
                    bool(batch_invariant))
    want = dict(lse=return_lse, logprobs=return_logprobs, entropy=return_entropy, argmax=return_argmax,
                z_loss=return_z_loss, loss_per_token=return_loss_per_token)
    return _apply(hidden, weight, labels, opts, None, bias, class_weights, grad_hidden_accumulator,
                  grad_weight_accumulator, want, s)


def _apply(hidden, weight, labels, opts, tp, bias, class_weights, gh_acc, gw_acc, want, s=0):
    """Checked arguments -> the custom ops (python/flce/_ops.py) -> the loss or a
    LinearCrossEntropyOutput."""
    want = {k: bool(want.get(k, False)) for k in LinearCrossEntropyOutput._fields[1:]}
    lead = labels.shape
    h2 = hidden.reshape(-1, hidden.shape[-1])
    y1 = labels.reshape(-1)
    cw = None if class_weights is None else class_weights.to(torch.float32).contiguous()
    grad_on = torch.is_grad_enabled()
    need_dh = grad_on and hidden.requires_grad
    need_dw = grad_on and weight.requires_grad
    need_db = grad_on and bias is not None and bias.requires_grad
    need_any = need_dh or need_dw or need_db
    if need_any and _compat.compile_drops_accumulated and not need_db and (gh_acc is not None or not need_dh) and \
            (gw_acc is not None or not need_dw) and torch.compiler.is_compiling():
        raise NotImplementedError(
            "flce: under torch.compile on PyTorch < 2.11 every gradient of this call goes to an accumulator "
            "(grad_*_accumulator, no input's .grad): PyTorch 2.4's AOTAutograd then drops the backward (2.5 to 2.10 "
            "are unchecked). Call it eager, or let hidden (or weight) take its gradient as .grad")
    n = h2.shape[0]

    if n == 0:  # no tokens: loss 0 (the library's convention for a mean over none), still a graph node
        zero = h2.float().sum() * 0 + weight.float().sum() * 0
        if bias is not None:
            zero = zero + bias.float().sum() * 0
        per = torch.zeros(lead, dtype=torch.float32, device=hidden.device)
        loss = per + zero if opts.reduction == "none" else zero
        if not any(want.values()):
            return loss
        return LinearCrossEntropyOutput(
            loss, per if want["lse"] else None, per + zero if want["logprobs"] else None,
            per if want["entropy"] else None,
            torch.zeros(lead, dtype=torch.int64, device=hidden.device) if want["argmax"] else None,
            torch.zeros_like(loss).detach() if want["z_loss"] else None,
            per + zero if want["loss_per_token"] else None)

    outputs = (_ops.OUT_LOGPROB * bool(want["logprobs"]) | _ops.OUT_ENTROPY * bool(want["entropy"]) |
               _ops.OUT_ARGMAX * bool(want["argmax"]) | _ops.OUT_ZLOSS * bool(want["z_loss"]) |
               _ops.OUT_LOSS_PER_TOKEN * bool(want["loss_per_token"]))
    grads = 0
    if need_any and opts.reduction != "none" and gh_acc is None and gw_acc is None and \
            not (want["logprobs"] or want["loss_per_token"] or want["lse"] or want["entropy"]) and \
            _grads_in_forward(h2, weight, y1, opts, tp, bias, cw):
        grads = (_ops.GRAD_HIDDEN * need_dh | _ops.GRAD_WEIGHT * need_dw | _ops.GRAD_BIAS * need_db)
        if not grads & (_ops.GRAD_HIDDEN | _ops.GRAD_WEIGHT):
            grads = 0  # the bias alone: flce_backward (with a scratch dH), as the C API wants dH or dW
    strategy = opts.strategy
    # Differentiable per-token outputs (problem.grad_outputs): their upstream gradients reach the
    # library in backward beside the loss's, and dZ is formed from all of them at once.
    bits = 0
    saved_grads = 0
    if need_any and not grads:
        bits = (_lib.FLCE_GRAD_LOGPROB * want["logprobs"] | _lib.FLCE_GRAD_LSE * want["lse"] |
                _lib.FLCE_GRAD_ENTROPY * want["entropy"] |
                _lib.FLCE_GRAD_LOSS_PER_TOKEN * (want["loss_per_token"] and opts.reduction != "none"))
        if strategy in ("auto", "saved") and h2.dtype != torch.float32 and \
                (_compat.compile_unbacked_outputs or not torch.compiler.is_compiling()):
            # (Dynamo before PyTorch 2.11 refuses an op whose output size only the library knows, as
            # the saved logits' is for a dynamic token count, unless capture_dynamic_output_shape_ops
            # is set: compiled there, the other routes; _compat.compile_unbacked_outputs)
            # The saved logits (flce.h): forward keeps them, backward forms dZ with whatever upstream
            # gradients arrive, 6·N·V·D (under TP this rank's shard, with flce's collectives).
            # Where all tokens' do not fit the budget, forward keeps none and backward runs one
            # chunked loss-and-grad (python/flce/_ops.py).
            strategy = "saved"
            saved_grads = (_ops.GRAD_HIDDEN * (need_dh or not need_dw) | _ops.GRAD_WEIGHT * need_dw |
                           _ops.GRAD_BIAS * need_db)
        elif bits and (tp is not None or bits & (_lib.FLCE_GRAD_LSE | _lib.FLCE_GRAD_ENTROPY)):
            # backward: one chunked loss-and-grad with the outputs' gradients. Under TP also for
            # log-probs and per-token losses: the library then divides a mean by the valid tokens of
            # every rank (sequence parallelism), which flce_backward's per-token form below cannot.
            strategy = "chunked"
        else:
            bits = 0  # log-probs and per-token losses by flce_backward, as before; lse and entropy not
    if strategy == "saved" and not saved_grads:
        # asked for, but nothing to keep for a backward (no gradients, fp32 inputs, TP): as AUTO
        strategy = "recompute" if need_any and not grads else "auto"
    if need_any and not grads and strategy == "auto":
        # AUTO recomputes the logits for the gradients anyway (or there are few tokens): forward
        # now and flce_backward later do the same work as one loss-and-grad call, without scaling
        # dW and dH by the upstream gradient afterwards and without holding them in between.
        strategy = "recompute"
    rank, size, offset, total, comm, sp = tp or (0, 1, 0, weight.shape[0], None, 0)
    res = _ops.forward(
        h2, weight, y1, bias, cw, gh_acc, gw_acc, opts.reduction, int(opts.ignore_index),
        float(opts.label_smoothing), float(opts.z_loss), float(opts.softcap), float(opts.temperature),
        strategy, int(opts.memory_budget or 0), outputs, grads, rank, size, offset, total, int(comm or 0),
        bits, saved_grads, int(opts.batch_invariant), int(sp))
    loss, lse, logprob, entropy, argmax, zl, lpt = res[:7]

    if opts.reduction == "none":
        loss = _unshift(loss.reshape(lead), s)
    if not any(want.values()):
        return loss
    anchor = (h2 if h2.requires_grad else weight if weight.requires_grad else bias) if need_any else None

    def per_token(x, name, differentiable=True, fill=0):
        x = x.reshape(lead)
        if need_any and not differentiable:
            x = _ops.not_differentiable(x, anchor, name)
        return _unshift(x, s, fill)

    return LinearCrossEntropyOutput(
        loss,
        per_token(lse, "lse", bool(bits & _lib.FLCE_GRAD_LSE)) if want["lse"] else None,
        per_token(logprob, "logprobs") if want["logprobs"] else None,
        per_token(entropy, "entropy", bool(bits & _lib.FLCE_GRAD_ENTROPY)) if want["entropy"] else None,
        _unshift(argmax.reshape(lead), s, -1) if want["argmax"] else None,
        ((per_token(zl, "z_loss", False) if opts.reduction == "none" else
          _ops.not_differentiable(zl, anchor, "z_loss") if need_any else zl)
         if want["z_loss"] else None),
        per_token(lpt, "loss_per_token") if want["loss_per_token"] else None)


# ---- flce.prepare: the kernels of the calls ahead of time --------------------------------------

class Prepared(NamedTuple):
    """What flce.prepare did.

    seconds   wall time of the call (compiling, or loading from the disk cache)
    strategy  how the gradients of the prepared calls are computed: 'saved', 'chunked' or
              'recompute' (as the library resolves AUTO for this GPU); 'forward' with training=False
    calls     the library calls prepared, as (op, strategy) pairs: op 'forward', 'loss_and_grad',
              'backward' or 'scale_gradients'
    """
    seconds: float
    strategy: str
    calls: Tuple[Tuple[str, str], ...]


# Where flce.prepare's dry run records the library calls (one list per thread while it runs).
_recording = threading.local()

# A non-NULL address for the pointers flce_prepare is told about: it reads only which pointers
# are given (they select kernels), never what they point at.
_NOT_NULL = 256

_OP_NAMES = {_lib.FLCE_OP_FORWARD: "forward", _lib.FLCE_OP_LOSS_AND_GRAD: "loss_and_grad",
             _lib.FLCE_OP_BACKWARD: "backward"}


def _record(call, op, strategy, half=None, workspace=None, outs=None, kind=None):
    """_Call.__call__ on meta tensors (flce.prepare's dry run): the call as the library would get it
    (op, the problem with its strategy, which flce_tensors pointers are given), not run."""
    calls = getattr(_recording, "calls", None)
    if calls is None:
        raise ValueError("flce: meta tensors cannot be computed on; flce.prepare uses them to plan")
    problem = _lib.Problem.from_buffer_copy(call.problem)
    problem.strategy = _lib.STRATEGIES[strategy]
    names = frozenset(k for k, v in (outs or {}).items() if v is not None)
    calls.append((kind or _OP_NAMES[op], op, problem, names))


def _flag(name, x):
    if not isinstance(x, bool) and x not in (0, 1):
        raise TypeError(f"{name}: expected a bool, got {type(x).__name__} {x!r}")
    return bool(x)


def _present(name, x):
    """bias=, class_weights= and the accumulators of flce.prepare: a bool, or the tensor itself."""
    if x is None or isinstance(x, torch.Tensor):
        return x is not None
    return _flag(name, x)


class _PrepareArgs(NamedTuple):
    n: int
    d: int
    v: int
    dtype: torch.dtype
    label_dtype: torch.dtype
    opts: _Options
    want: dict
    training: bool
    grad_weight: bool
    bias: bool
    class_weights: bool
    gh_acc: bool
    gw_acc: bool


def _prepare_args(tokens, hidden, vocab, dtype=torch.bfloat16, label_dtype=torch.int64, training=True,
                  grad_weight=True, bias=False, class_weights=False, ignore_index=-100, reduction="mean",
                  memory_budget=None, strategy="auto", label_smoothing=0.0, z_loss=0.0, softcap=0.0,
                  temperature=1.0, grad_weight_accumulator=False, grad_hidden_accumulator=False,
                  return_lse=False, return_logprobs=False, return_entropy=False, return_argmax=False,
                  return_z_loss=False, return_loss_per_token=False, batch_invariant=False):
    """flce.prepare's arguments checked (ValueError / TypeError naming the argument, FlceError from
    the library's own range checks), no GPU needed: a _PrepareArgs."""
    for name, x in (("tokens", tokens), ("hidden", hidden), ("vocab", vocab)):
        try:
            ok = not isinstance(x, bool) and operator.index(x) > 0
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"{name}: {x!r}; expected a positive int")
    n, d, v = operator.index(tokens), operator.index(hidden), operator.index(vocab)
    if d < 8 or d % 8:
        raise ValueError(f"hidden: D = {d} must be a positive multiple of 8")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not supported (torch.float32, torch.float16 or torch.bfloat16)")
    if label_dtype not in _LABEL_BITS:
        raise ValueError(f"label_dtype: {label_dtype!r} is not supported (torch.int32 or torch.int64)")
    _check_options(reduction, strategy, memory_budget)
    _check_scalars(ignore_index, label_smoothing, z_loss, softcap, temperature, 0, batch_invariant)
    want = {k: _flag(f"return_{k}", x) for k, x in (
        ("lse", return_lse), ("logprobs", return_logprobs), ("entropy", return_entropy), ("argmax", return_argmax),
        ("z_loss", return_z_loss), ("loss_per_token", return_loss_per_token))}
    softcap = 0.0 if softcap is None else softcap
    opts = _Options(ignore_index, reduction, strategy, memory_budget, label_smoothing, z_loss, softcap, temperature,
                    bool(batch_invariant))
    a = _PrepareArgs(n, d, v, dtype, label_dtype, opts, want, _flag("training", training),
                     _flag("grad_weight", grad_weight), _present("bias", bias),
                     _present("class_weights", class_weights),
                     _present("grad_hidden_accumulator", grad_hidden_accumulator),
                     _present("grad_weight_accumulator", grad_weight_accumulator))
    problem = _problem(n, d, v, dtype, label_dtype, opts, None, a.bias, a.class_weights)
    problem.strategy = _lib.STRATEGIES[strategy]
    _lib.validate(problem)  # the library's own range checks (smoothing, softcap, temperature, ...)
    return a


def _dry_run(a, device_index=-1):
    """flce.prepare's dry run: linear_cross_entropy's own code (_apply, the custom ops'
    implementations and autograd formulas) on meta tensors of the shapes, the library calls
    recorded instead of run (_record): [(kind, op, problem, pointer names)] in call order. Asks the
    library about AUTO (on CUDA device `device_index`) and the saved logits (on the current one), as
    the real call does."""
    meta, f32 = torch.device("meta"), torch.float32
    n, d, v, dtype, want = a.n, a.d, a.v, a.dtype, a.want
    calls = _recording.calls = []
    _recording.device = device_index
    try:
        with torch.inference_mode(False), torch.enable_grad() if a.training else torch.no_grad():
            h = torch.empty(n, d, dtype=dtype, device=meta, requires_grad=a.training)
            w = torch.empty(v, d, dtype=dtype, device=meta, requires_grad=a.training and a.grad_weight)
            y = torch.empty(n, dtype=a.label_dtype, device=meta)
            b = torch.empty(v, dtype=dtype, device=meta, requires_grad=a.training) if a.bias else None
            cw = torch.empty(v, dtype=f32, device=meta) if a.class_weights else None
            gh_acc = torch.empty(n, d, dtype=f32, device=meta) if a.gh_acc else None
            gw_acc = torch.empty(v, d, dtype=f32, device=meta) if a.gw_acc else None
            out = _apply(h, w, y, a.opts, None, b, cw, gh_acc, gw_acc, want)
            if a.training:
                # the backward of the loss and of every differentiable per-token output asked for
                # (their upstream gradients select the backward's kernels)
                terms = [out] if isinstance(out, torch.Tensor) else \
                    [out.loss] + [getattr(out, k) for k in ("lse", "logprobs", "entropy", "loss_per_token") if want[k]]
                sum(t.sum() for t in terms).backward()
    finally:
        _recording.calls = None
    return calls


def _prepare_calls(tokens, hidden, vocab, device_index=-1, **options):
    """The library calls linear_cross_entropy makes for flce.prepare's arguments (its dry run)."""
    return _dry_run(_prepare_args(tokens, hidden, vocab, **options), device_index)


# flce_scale_gradients plans the row kernels of a typical loss-and-grad call (loss, lse, dH, dW),
# whatever the forward named (runtime/api.c): the entropy and argmax pointers select other ones.
_TYPICAL = frozenset(("loss", "lse", "grad_hidden", "grad_weight"))
_ROW_SELECTORS = ("entropy", "argmax")


def _prepare_recorded(ctx, calls, t0):
    """flce_prepare for each distinct recorded call; a Prepared."""
    done, pairs, strategy = set(), [], None
    row_specs = {tuple(k in names for k in _ROW_SELECTORS) for kind, op, _, names in calls
                 if op == _lib.FLCE_OP_LOSS_AND_GRAD and kind != "scale_gradients"}
    for kind, op, problem, names in calls:
        if kind == "scale_gradients":
            if (False, False) in row_specs:
                continue  # its kernel is in the module of the loss-and-grad call prepared already
            names = _TYPICAL
        key = (op, bytes(problem), names)
        resolved = _lib.strategy_of(ctx, problem, op)
        if strategy is None and (op != _lib.FLCE_OP_FORWARD or resolved == "saved"):
            strategy = resolved
        if key in done:
            continue
        done.add(key)
        fields = dict(hidden=_NOT_NULL, weight=_NOT_NULL, labels=_NOT_NULL, workspace=_NOT_NULL,
                      bias=_NOT_NULL if problem.has_bias else None,
                      class_weights=_NOT_NULL if problem.has_class_weights else None)
        fields.update({k: _NOT_NULL for k in names})
        _lib.prepare(ctx, problem, op, _lib.new_tensors(**fields))
        pairs.append((kind, resolved))
    return Prepared(time.perf_counter() - t0, strategy or "forward", tuple(pairs))


def prepare(tokens: int, hidden: int, vocab: int, *, dtype: torch.dtype = torch.bfloat16,
            device: Union[torch.device, str, int, None] = None, label_dtype: torch.dtype = torch.int64,
            training: bool = True, grad_weight: bool = True, bias: Union[bool, Tensor] = False,
            class_weights: Union[bool, Tensor] = False, ignore_index: int = -100, reduction: str = "mean",
            memory_budget: Optional[int] = None, strategy: str = "auto", label_smoothing: float = 0.0,
            z_loss: float = 0.0, softcap: Optional[float] = 0.0, temperature: float = 1.0,
            grad_weight_accumulator: Union[bool, Tensor] = False,
            grad_hidden_accumulator: Union[bool, Tensor] = False, return_lse: bool = False,
            return_logprobs: bool = False, return_entropy: bool = False, return_argmax: bool = False,
            return_z_loss: bool = False, return_loss_per_token: bool = False,
            batch_invariant: bool = False) -> Prepared:
    """Compiles (or loads from flce's disk cache) every kernel that linear_cross_entropy calls of
    this shape and these options will use on `device`, and loads them, before the first step:
    synchronous, so the first training step starts at once instead of waiting for NVRTC (or
    running a generic stand-in kernel while the specialized one compiles in the background).

    tokens, hidden, vocab: N (all tokens of a call, hidden.numel() // D; shift does not change it),
        D and V (weight.shape[0]).
    dtype: of hidden and weight (under torch.autocast: the autocast dtype); label_dtype: of labels.
    device: a CUDA device (None: the current one).
    training: True: a training step, the forward and the backward of the loss (and of the
        differentiable per-token outputs asked for: lse, logprobs, entropy, loss_per_token) with
        gradients of hidden and weight (and bias); False: a forward under torch.no_grad()
        (evaluation, scoring). Prepare each kind of call a run makes.
    grad_weight: False where weight does not require grad (a frozen lm_head): no dW kernels.
    bias, class_weights, grad_weight_accumulator, grad_hidden_accumulator: whether the calls pass
        them (True, or the tensor itself).
    The other options are linear_cross_entropy's, with the same defaults; they choose the kernels
    (the reduction, smoothing, z-loss, softcap, temperature, entropy and argmax outputs, bias,
    class weights, the strategy and the budget), so pass the ones the calls will.

    The calls are planned by the binding's own code (a dry run of linear_cross_entropy on meta
    tensors, its library calls recorded), then each distinct one goes to flce_prepare (include/
    flce.h). Returns a Prepared(seconds, strategy, calls). Needs the GPU (the kernels are built for
    its architecture); without one it raises FlceError (FLCE_ERR_NO_DEVICE): `flce warmup --shapes
    NxDxV --arch sm_90a` fills the disk cache on a machine without a GPU. Not for
    vocab_parallel_cross_entropy (whose calls also depend on the communicator).
    """
    t0 = time.perf_counter()
    args = dict(dtype=dtype, label_dtype=label_dtype, training=training, grad_weight=grad_weight, bias=bias,
                class_weights=class_weights, ignore_index=ignore_index, reduction=reduction,
                memory_budget=memory_budget, strategy=strategy, label_smoothing=label_smoothing, z_loss=z_loss,
                softcap=softcap, temperature=temperature, grad_weight_accumulator=grad_weight_accumulator,
                grad_hidden_accumulator=grad_hidden_accumulator, return_lse=return_lse,
                return_logprobs=return_logprobs, return_entropy=return_entropy, return_argmax=return_argmax,
                return_z_loss=return_z_loss, return_loss_per_token=return_loss_per_token,
                batch_invariant=batch_invariant)
    if device is not None:
        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if dev.type != "cuda":
            raise ValueError(f"device: {device!r}; expected a CUDA device (flce compiles for its GPU)")
    a = _prepare_args(tokens, hidden, vocab, **args)
    if not torch.cuda.is_available():
        raise FlceError(_lib.FLCE_ERR_NO_DEVICE, "FLCE_ERR_NO_DEVICE",
                        "no CUDA device (torch.cuda.is_available() is False): flce.prepare compiles the kernels "
                        "for the GPU the calls will run on; without one, `flce warmup --shapes NxDxV --arch "
                        "sm_XX` fills the disk cache", "flce.prepare")
    index = torch.cuda.current_device() if device is None or dev.index is None else dev.index
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"device: {device!r}; this machine has {torch.cuda.device_count()} CUDA devices")
    with torch.cuda.device(index):
        return _prepare_recorded(_lib.context(index), _dry_run(a, index), t0)


class LinearCrossEntropy(torch.nn.Module):
    """Module form: LinearCrossEntropy(**options)(hidden, weight, labels) ==
    linear_cross_entropy(hidden, weight, labels, **options). The weight is an argument (usually the
    model's lm_head.weight), not a parameter of this module."""

    def __init__(self, **options: Any) -> None:
        super().__init__()
        defaults = linear_cross_entropy.__kwdefaults__ or {}
        unknown = set(options) - set(defaults)
        if unknown:
            raise TypeError(f"LinearCrossEntropy: unknown options {sorted(unknown)}")
        self.options = dict(defaults, **options)

    def forward(self, hidden: Tensor, weight: Tensor, labels: Tensor,
                bias: Optional[Tensor] = None) -> Union[Tensor, LinearCrossEntropyOutput]:
        options = self.options if bias is None else dict(self.options, bias=bias)
        return linear_cross_entropy(hidden, weight, labels, **options)

    def extra_repr(self):
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items() if v is not None)


def patch_hf(model: torch.nn.Module, **options: object) -> torch.nn.Module:
    """Routes a Hugging Face causal LM's training loss through flce (python/flce/hf.py)."""
    from .hf import patch_hf as _patch
    return _patch(model, **options)


def unpatch_hf(model: torch.nn.Module) -> torch.nn.Module:
    """Undoes patch_hf(model)."""
    from .hf import unpatch_hf as _unpatch
    return _unpatch(model)


from . import _ops  # noqa: E402  (needs the names above)
from .parallel import NcclComm, vocab_parallel_cross_entropy  # noqa: E402
from . import functional, cce  # noqa: E402,F401
from .distill import (LinearDistillation, LinearDistillationOutput, linear_distillation,  # noqa: E402,F401
                      linear_distillation_topk, prepare_linear_distillation, vocab_parallel_distillation,
                      vocab_parallel_distillation_topk)
from .topk import TopkLogprobs, prepare_topk_logprobs, topk_logprobs, vocab_parallel_topk_logprobs  # noqa: E402,F401
