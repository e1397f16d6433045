"""flce — PyTorch binding of the flce library (fused linear layer + cross-entropy on NVIDIA GPUs).

A thin ctypes binding over libflce.so (no compiled extension): `linear_cross_entropy(hidden,
weight, labels)` computes cross_entropy(hidden @ weight.T, labels) without materializing the
tokens x vocab logits, as a torch.autograd.Function. See python/README.md.
"""
import operator
from typing import NamedTuple, Optional

import torch

from . import _lib
from ._lib import FlceError, FlceLibraryNotFound  # noqa: F401  (public)

__all__ = ["linear_cross_entropy", "LinearCrossEntropy", "FlceError", "FlceLibraryNotFound",
           "check", "version", "library_path", "vocab_parallel_cross_entropy", "NcclComm"]

_DTYPES = {torch.float32: _lib.FLCE_DTYPE_F32, torch.float16: _lib.FLCE_DTYPE_F16,
           torch.bfloat16: _lib.FLCE_DTYPE_BF16}
_LABEL_BITS = {torch.int32: 32, torch.int64: 64}


def version():
    """The library's version string (flce_version())."""
    return _lib.version()


def library_path():
    """The path libflce.so was loaded from."""
    return _lib.library_path()


def _stream(device):
    return torch.cuda.current_stream(device).cuda_stream


def check(device=None):
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
    if reduction not in _lib.REDUCTIONS:
        raise ValueError(f"reduction: {reduction!r}; expected 'mean', 'sum' or 'none'")
    if strategy not in ("auto", "chunked", "recompute"):
        raise ValueError(f"strategy: {strategy!r}; expected 'auto', 'chunked' or 'recompute'")
    if memory_budget is not None:
        try:
            ok = operator.index(memory_budget) > 0
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"memory_budget: {memory_budget!r}; expected a positive number of bytes or None")


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


class _Call:
    """The problem of hidden (N, D), weight (V, D), labels (N,) and the options; calls ops on the
    current stream of the tensors' device."""

    def __init__(self, hidden, weight, labels, opts, tp=None):
        """tp: None, or (rank, size, vocab_offset, vocab_total, comm pointer or None) for a
        vocab-parallel call (python/flce/parallel.py)."""
        self.device = hidden.device
        rank, size, offset, total, self.comm = tp or (0, 1, 0, weight.shape[0], None)
        self.problem = _lib.new_problem(
            tokens=hidden.shape[0], hidden=hidden.shape[1], vocab_shard=weight.shape[0],
            vocab_offset=offset, vocab_total=total, tp_rank=rank, tp_size=size, dtype=_DTYPES[hidden.dtype],
            label_bits=_LABEL_BITS[labels.dtype], reduction=_lib.REDUCTIONS[opts.reduction],
            ignore_index=int(opts.ignore_index), memory_budget=operator.index(opts.memory_budget or 0),
            label_smoothing=float(opts.label_smoothing), z_loss=float(opts.z_loss),
            softcap=float(opts.softcap), temperature=float(opts.temperature))
        self.hidden, self.weight, self.labels = hidden, weight, labels

    def strategy_of(self, op, strategy):
        """What the library runs `op` with for `strategy` ('chunked' or 'recompute' for AUTO)."""
        self.problem.strategy = _lib.STRATEGIES[strategy]
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return _lib.strategy_of(_lib.context(index), self.problem, op)

    def validate(self, strategy):
        self.problem.strategy = _lib.STRATEGIES[strategy]
        _lib.validate(self.problem)

    def __call__(self, op, strategy, half=None, buffer=None, **outs):
        """Runs `op` with problem.strategy = `strategy`; `outs` are flce_tensors fields given as
        tensors (or None). The workspace is a torch uint8 tensor, so PyTorch's caching allocator
        owns it and frees it in stream order."""
        self.problem.strategy = _lib.STRATEGIES[strategy]
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        ctx = _lib.context(index)
        ws_bytes = _lib.workspace_size(ctx, self.problem, op)
        workspace = torch.empty(max(ws_bytes, 256), dtype=torch.uint8, device=self.device)
        fields = {name: None if t is None else _ptr(t, name, _ALIGN[name]) for name, t in outs.items()}
        t = _lib.new_tensors(
            hidden=_ptr(self.hidden, "hidden", 16), weight=_ptr(self.weight, "weight", 16),
            labels=_ptr(self.labels, "labels", self.labels.element_size()),
            workspace=_ptr(workspace, "workspace", 256), workspace_bytes=workspace.numel(),
            comm=self.comm if half is None else None, **fields)
        if half is None:
            _lib.run(op, ctx, self.problem, t, _stream(self.device))
        else:  # one half of the split-phase TP forward; buffer: this rank's stats or all ranks'
            _lib.forward_half(half, ctx, self.problem, t, _ptr(buffer, "stats", 16), _stream(self.device))
        # `workspace` goes back to the caching allocator here; later work on this stream is ordered
        # after the kernels just enqueued, so reusing the memory is safe.


# Alignment flce.h asks of each output (or extra input) buffer.
_ALIGN = {"loss": 4, "lse": 4, "grad_output": 4, "grad_hidden": 16, "grad_weight": 16}



def _loss_tensor(n, reduction, device):
    shape = (n,) if reduction == "none" else ()
    return torch.empty(shape, dtype=torch.float32, device=device)


def _grad_out(grad, n, reduction):
    """Upstream gradient as the library reads it: fp32, contiguous, 1 or N values."""
    g = grad.to(torch.float32).contiguous()
    return g.reshape(n) if reduction == "none" else g.reshape(())


class _EagerGrads(torch.autograd.Function):
    """mean / sum: one flce_loss_and_grad call in forward computes the loss and the gradients of
    (1 · loss); backward scales them by the upstream scalar."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, opts, need_dh, need_dw, tp=None):
        call = _Call(hidden, weight, labels, opts, tp)
        loss = _loss_tensor(hidden.shape[0], opts.reduction, hidden.device)
        dh = torch.empty_like(hidden) if need_dh else None
        dw = torch.empty_like(weight) if need_dw else None
        call(_lib.FLCE_OP_LOSS_AND_GRAD, opts.strategy, loss=loss, grad_hidden=dh, grad_weight=dw)
        ctx.save_for_backward(dh, dw)
        ctx.used = False
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        if ctx.used:
            raise RuntimeError("flce.linear_cross_entropy computed its gradients in forward and scales "
                               "them in place: backward can run only once per forward (retain_graph "
                               "is not supported; use strategy='recompute' for that)")
        ctx.used = True
        dh, dw = ctx.saved_tensors
        g = grad_loss.to(torch.float32)
        # In place: these buffers belong to this graph node only. Multiplying by an exact 1
        # (loss.backward()) leaves them bit-identical.
        if dh is not None:
            dh.mul_(g)
        if dw is not None:
            dw.mul_(g)
        return dh, dw, None, None, None, None, None


class _DeferredGrads(torch.autograd.Function):
    """reduction 'none' (the gradient depends on a per-token upstream gradient) or strategy
    'recompute': flce_forward in forward saves lse; flce_backward in backward recomputes the logits
    and takes the upstream gradient as grad_output."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, opts, need_dh, need_dw, tp=None):
        call = _Call(hidden, weight, labels, opts, tp)
        # Fail now, not in the middle of backward, if the library refuses the backward request.
        call.validate(opts.strategy)
        n = hidden.shape[0]
        loss = _loss_tensor(n, opts.reduction, hidden.device)
        lse = torch.empty((n,), dtype=torch.float32, device=hidden.device)
        call(_lib.FLCE_OP_FORWARD, "auto", loss=loss, lse=lse)
        ctx.save_for_backward(hidden, weight, labels, lse)
        ctx.opts, ctx.need, ctx.tp = opts, (need_dh, need_dw), tp
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        hidden, weight, labels, lse = ctx.saved_tensors
        opts, (need_dh, need_dw) = ctx.opts, ctx.need
        g = _grad_out(grad_loss, hidden.shape[0], opts.reduction)
        dh = torch.empty_like(hidden) if need_dh else None
        dw = torch.empty_like(weight) if need_dw else None
        if dh is not None or dw is not None:
            _Call(hidden, weight, labels, opts, ctx.tp)(_lib.FLCE_OP_BACKWARD, opts.strategy, grad_output=g,
                                                        lse=lse, grad_hidden=dh, grad_weight=dw)
        return dh, dw, None, None, None, None, None


def _no_grad_loss(hidden, weight, labels, opts, tp=None):
    loss = _loss_tensor(hidden.shape[0], opts.reduction, hidden.device)
    _Call(hidden, weight, labels, opts, tp)(_lib.FLCE_OP_FORWARD, "auto", loss=loss)
    return loss


# Up to this many tokens AUTO's gradients go to backward (flce_backward, an extra logits pass of
# 2·N·V·D) instead of being computed in forward and scaled in place by the upstream gradient in
# backward (a pass over dW, V·D, whatever N is). Measured through this binding on an H100
# (bench/results/compare-…-2026-11-23-7ab2a98): 512×4096×128256 eager 5.66 ms vs deferred 4.27;
# 4096×2048×32000 eager 2.90 vs 3.13; 8192×4096×128256 eager 46.2 vs 51.3.
_DEFER_TOKENS = 1024


def linear_cross_entropy(hidden, weight, labels, *, ignore_index=-100, reduction="mean",
                         memory_budget=None, strategy="auto", label_smoothing=0.0, z_loss=0.0,
                         softcap=0.0, temperature=1.0):
    """cross_entropy(hidden @ weight.T, labels) without materializing the logits.

    hidden:  (N, D) or (..., D), float32 / float16 / bfloat16, contiguous, on a CUDA device.
    weight:  (V, D), same dtype and device, contiguous.
    labels:  hidden's leading shape, int32 or int64; labels == ignore_index contribute nothing.
    reduction: 'mean' (over non-ignored tokens; 0 when there are none), 'sum' or 'none'.
    memory_budget: bytes of workspace the chunked strategy may use (None: the library's 512 MiB).
    strategy: 'auto'; 'chunked' (loss and grads in one pass, 6NVD); 'recompute' (forward now,
        backward recomputes the logits from the saved lse, 8NVD, no workspace that grows with V).
    label_smoothing (PyTorch's), z_loss (adds z_loss * lse^2), softcap (logits -> c*tanh(z/c)),
        temperature (logits / T): see include/flce.h; the library checks their ranges.

    Returns the loss in float32: a scalar, or labels.shape for 'none'. Differentiable in hidden
    and weight. With 'mean'/'sum' and strategy chunked (or auto when the library picks chunked)
    the gradients are computed in the forward call, so backward is cheap but can run only once;
    when auto picks recompute (many tokens x vocab for the memory budget), forward saves lse and
    backward recomputes the logits. Needs a GPU of sm_80 or newer.
    """
    _check_args(hidden, weight, labels, reduction, strategy, memory_budget)
    opts = _Options(ignore_index, reduction, strategy, memory_budget, label_smoothing, z_loss, softcap,
                    temperature)
    lead = labels.shape
    h2 = hidden.reshape(-1, hidden.shape[-1])
    y1 = labels.reshape(-1)
    need_dh = torch.is_grad_enabled() and hidden.requires_grad
    need_dw = torch.is_grad_enabled() and weight.requires_grad

    if h2.shape[0] == 0:  # no tokens: loss 0 (the library's convention for a mean over none)
        zero = h2.float().sum(-1) * 0 if reduction == "none" else (h2.float().sum() + weight.float().sum()) * 0
        return zero.reshape(lead) if reduction == "none" else zero

    if not (need_dh or need_dw):
        loss = _no_grad_loss(h2, weight, y1, opts)
    elif reduction == "none" or strategy == "recompute":
        loss = _DeferredGrads.apply(h2, weight, y1, opts, need_dh, need_dw)
    elif strategy == "auto" and (h2.shape[0] <= _DEFER_TOKENS or _Call(h2, weight, y1, opts).strategy_of(
            _lib.FLCE_OP_LOSS_AND_GRAD, "auto") == "recompute"):
        # AUTO recomputes the logits for the gradients anyway: forward now and flce_backward in
        # backward do the same work as one loss-and-grad call, without scaling dW and dH by the
        # upstream gradient afterwards and without holding them from forward to backward. With
        # few tokens that scaling pass over dW costs more than recomputing the logits does.
        loss = _DeferredGrads.apply(h2, weight, y1, opts._replace(strategy="recompute"), need_dh, need_dw)
    else:
        loss = _EagerGrads.apply(h2, weight, y1, opts, need_dh, need_dw)
    return loss.reshape(lead) if reduction == "none" else loss


class LinearCrossEntropy(torch.nn.Module):
    """Module form: LinearCrossEntropy(**options)(hidden, weight, labels) ==
    linear_cross_entropy(hidden, weight, labels, **options). The weight is an argument (usually the
    model's lm_head.weight), not a parameter of this module."""

    def __init__(self, **options):
        super().__init__()
        unknown = set(options) - set(linear_cross_entropy.__kwdefaults__)
        if unknown:
            raise TypeError(f"LinearCrossEntropy: unknown options {sorted(unknown)}")
        self.options = dict(linear_cross_entropy.__kwdefaults__, **options)

    def forward(self, hidden, weight, labels):
        return linear_cross_entropy(hidden, weight, labels, **self.options)

    def extra_repr(self):
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


from .parallel import NcclComm, vocab_parallel_cross_entropy  # noqa: E402  (needs the names above)
