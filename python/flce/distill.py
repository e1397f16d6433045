"""distill.py — flce.linear_distillation: a student's output layer and its divergence from a
teacher's next-token distribution (forward KL, reverse KL or JSD(beta), plus an optional
cross-entropy term), fused as one library call (flce_distill_loss_and_grad, include/flce.h),
without the two tokens x vocab logit tensors in memory.

The library call is the torch.library custom op flce::distill (a fake kernel for shapes and an
autograd formula), so torch.compile(fullgraph=True), AOTAutograd and FakeTensor trace through it
as through the cross-entropy ops of _ops.py. Gradients go to the student's hidden states and weight
only; the teacher's are read, never differentiated (they are detached).

Conventions (testing/ref.c ref_distill, the fp64 reference): q = softmax(zs / T) of the student,
p = softmax(zt / T) of the teacher, per token
  forward_kl  D = KL(p || q);  reverse_kl  D = KL(q || p);
  jsd         D = beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q, for
              0 < beta < 1; beta = 0 is forward KL and beta = 1 reverse KL (Liger's convention);
  loss_i = D_i + ce_weight CE_i, CE at temperature 1 from the student's raw logits;
no T^2 factor. Tokens whose label is ignore_index are masked entirely: no divergence, no CE, no
gradient, not counted in the mean. A label outside [0, V) is masked the same way and raises the
library's device flag: the next flce call raises FlceError FLCE_ERR_BAD_LABEL (as the CE path).
"""
from __future__ import annotations

import math
import operator
from typing import Any, List, Literal, NamedTuple, Optional, Tuple, Union, overload

import torch
from torch import Tensor

from . import _compat, _distill_lib, _lib
from ._ops import _traced  # flce/__init__.py has loaded _ops first

__all__ = ["linear_distillation", "linear_distillation_topk", "vocab_parallel_distillation",
           "vocab_parallel_distillation_topk", "LinearDistillation", "LinearDistillationOutput"]

Divergence = Literal["forward_kl", "reverse_kl", "jsd"]
Reduction = Literal["mean", "sum", "none"]

_DTYPES = {torch.float32: _lib.FLCE_DTYPE_F32, torch.float16: _lib.FLCE_DTYPE_F16,
           torch.bfloat16: _lib.FLCE_DTYPE_BF16}
_LABEL_BITS = {torch.int32: 32, torch.int64: 64}
GRAD_HIDDEN, GRAD_WEIGHT = 1, 2

class LinearDistillationOutput(NamedTuple):
    """What linear_distillation returns with return_per_token=True.

    loss        as without the option (a scalar for mean/sum, labels' shape for none)
    divergence  each token's D_i (fp32, the student's leading shape; 0 for ignored tokens), without
                the CE term and before the reduction; not differentiable (the loss is)
    """
    loss: Tensor
    divergence: Tensor


class _DistillOptions(NamedTuple):
    divergence: str
    beta: float
    temperature: float
    ce_weight: float
    ignore_index: int
    reduction: str
    memory_budget: int
    teacher_topk: int = 0  # > 0: the teacher comes as top-k (ht = its ids, wt = their log-probs)
    tp: Tuple[int, ...] = ()  # tensor parallelism: (rank, size, vocab_offset, vocab_total, ncclComm_t address)


# ---- argument checks -------------------------------------------------------------------------

def _kind(x):
    return type(x).__name__


def _is_number(x):
    return not isinstance(x, bool) and (isinstance(x, (int, float)) or _kind(x) in ("SymInt", "SymFloat"))


def _require_cuda(t: Tensor, name: str) -> None:
    if not t.is_cuda:
        raise ValueError(f"{name}: must be on a CUDA device, is on {t.device}")


def _check_inputs(named, labels):
    """What both calls check first: each named tensor (student_hidden first) and labels are tensors,
    on one CUDA device, student_hidden in a supported dtype."""
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {_kind(t)}")
    if labels is not None and not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels: expected a torch.Tensor or None, got {_kind(labels)}")
    hs = named[0][1]
    _require_cuda(hs, "student_hidden")
    for name, t in named[1:] + (("labels", labels),):
        if t is not None and t.device != hs.device:
            raise ValueError(f"{name}: on {t.device}, student_hidden is on {hs.device} (must be the same device)")
    if hs.dtype not in _DTYPES:
        raise ValueError(f"student_hidden: dtype {hs.dtype} is not supported (float32, float16 or bfloat16)")


def _check_tensors(hs, ws, ht, wt, labels):
    _check_inputs((("student_hidden", hs), ("student_weight", ws), ("teacher_hidden", ht), ("teacher_weight", wt)),
                  labels)
    for name, t in (("student_weight", ws), ("teacher_hidden", ht), ("teacher_weight", wt)):
        if t.dtype != hs.dtype:
            raise ValueError(f"{name}: dtype {t.dtype}, student_hidden is {hs.dtype} (must be the same)")
    if labels is not None and labels.dtype not in _LABEL_BITS:
        raise ValueError(f"labels: dtype {labels.dtype} is not supported (int32 or int64)")
    for name, t in (("student_hidden", hs), ("teacher_hidden", ht)):
        if t.dim() < 1:
            raise ValueError(f"{name}: must have shape (N, D) or (..., D), got a scalar")
    for name, t in (("student_weight", ws), ("teacher_weight", wt)):
        if t.dim() != 2:
            raise ValueError(f"{name}: must have shape (V, D), got {tuple(t.shape)}")
    if ws.shape[1] != hs.shape[-1]:
        raise ValueError(f"student_weight: shape {tuple(ws.shape)} does not match student_hidden "
                         f"{tuple(hs.shape)} (need student_weight.shape[1] == student_hidden.shape[-1])")
    if wt.shape[1] != ht.shape[-1]:
        raise ValueError(f"teacher_weight: shape {tuple(wt.shape)} does not match teacher_hidden "
                         f"{tuple(ht.shape)} (need teacher_weight.shape[1] == teacher_hidden.shape[-1])")
    if tuple(ht.shape[:-1]) != tuple(hs.shape[:-1]):
        raise ValueError(f"teacher_hidden: leading shape {tuple(ht.shape[:-1])} differs from student_hidden's "
                         f"{tuple(hs.shape[:-1])} (one teacher row per student token)")
    if ws.shape[0] < 1:
        raise ValueError("student_weight: V = 0 rows; need at least one vocab row")
    if wt.shape[0] != ws.shape[0]:
        raise ValueError(f"teacher_weight: V = {wt.shape[0]} rows, student_weight has {ws.shape[0]} "
                         f"(the two vocabularies must be the same)")
    for name, t in (("student_hidden", hs), ("teacher_hidden", ht)):
        d = t.shape[-1]
        if d < 8 or d % 8:
            raise ValueError(f"{name}: D = {d} must be a positive multiple of 8")
    if labels is not None and tuple(labels.shape) != tuple(hs.shape[:-1]):
        raise ValueError(f"labels: shape {tuple(labels.shape)} must be student_hidden's leading shape "
                         f"{tuple(hs.shape[:-1])}")
    for name, t in (("student_hidden", hs), ("student_weight", ws), ("teacher_hidden", ht),
                    ("teacher_weight", wt), ("labels", labels)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")


def _check_options(labels, divergence, beta, temperature, ce_weight, ignore_index, reduction,
                   return_per_token, memory_budget):
    if not isinstance(divergence, str) or divergence not in _distill_lib.DIVERGENCES:
        raise ValueError(f"divergence: {divergence!r}; expected 'forward_kl', 'reverse_kl' or 'jsd'")
    if not isinstance(reduction, str) or reduction not in _lib.REDUCTIONS:
        raise ValueError(f"reduction: {reduction!r}; expected 'mean', 'sum' or 'none'")
    for name, x in (("beta", beta), ("temperature", temperature), ("ce_weight", ce_weight)):
        if not _is_number(x):
            raise TypeError(f"{name}: expected a number, got {_kind(x)} {x!r}")
    if not (isinstance(ignore_index, int) and not isinstance(ignore_index, bool)) and _kind(ignore_index) != "SymInt":
        raise TypeError(f"ignore_index: expected an int, got {_kind(ignore_index)} {ignore_index!r}")
    if not isinstance(return_per_token, bool) and return_per_token not in (0, 1):
        raise TypeError(f"return_per_token: expected a bool, got {_kind(return_per_token)} {return_per_token!r}")
    # range checks on plain numbers (under torch.compile a symbolic float is checked by the library)
    if isinstance(beta, (int, float)) and not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta: {beta!r}; must be in [0, 1] (the teacher's weight in JSD's mixture)")
    if isinstance(temperature, (int, float)) and not 0 < temperature < math.inf:
        raise ValueError(f"temperature: {temperature!r}; must be a finite number > 0")
    if isinstance(ce_weight, (int, float)):
        if not 0 <= ce_weight < math.inf:  # (NaN fails both)
            raise ValueError(f"ce_weight: {ce_weight!r}; must be a finite number >= 0")
        if ce_weight != 0 and labels is None:
            raise ValueError(f"ce_weight: {ce_weight!r} needs labels (the CE term's targets); labels is None")
        if ce_weight != 0 and isinstance(temperature, (int, float)) and temperature != 1:
            raise ValueError(f"ce_weight: {ce_weight!r} with temperature={temperature!r}: the CE term is supported "
                             f"only at temperature 1 (v1 of the library call)")
    if memory_budget is not None:
        try:
            ok = not isinstance(memory_budget, bool) and operator.index(memory_budget) > 0
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"memory_budget: {memory_budget!r}; expected a positive number of bytes or None")


def _autocast(*tensors):
    """All four in torch.autocast's dtype where it is enabled for their device type (as F.linear
    would run); float64 and non-floating tensors are left alone."""
    dtype = _compat.autocast_dtype(tensors[0].device.type)
    if dtype is None:
        return tensors
    return tuple(t.to(dtype) if t.is_floating_point() and t.dtype not in (dtype, torch.float64) else t
                 for t in tensors)


# ---- the library call ------------------------------------------------------------------------

def _ptr(t, name, align):
    p = t.data_ptr()
    if p % align:
        raise ValueError(f"{name}: data_ptr() {p:#x} is not {align}-byte aligned (a view with a storage "
                         f"offset?); pass a fresh tensor, e.g. {name}.clone()")
    return p


class _DistillCall:
    """One flce_distill_loss_and_grad call on the current stream of the tensors' device."""

    def __init__(self, hs, ws, ht, wt, labels, opts: _DistillOptions):
        self.device = hs.device
        self.hs, self.ws, self.ht, self.wt, self.labels, self.opts = hs, ws, ht, wt, labels, opts
        self.problem = _distill_lib.new_problem(
            tokens=hs.shape[0], hidden_student=hs.shape[1], hidden_teacher=0 if opts.teacher_topk else ht.shape[1],
            vocab=ws.shape[0], teacher_topk=int(opts.teacher_topk),
            dtype=_DTYPES[hs.dtype], label_bits=_LABEL_BITS[labels.dtype] if labels is not None else 64,
            divergence=_distill_lib.DIVERGENCES[opts.divergence], beta=float(opts.beta),
            temperature=float(opts.temperature), ce_weight=float(opts.ce_weight),
            ignore_index=int(opts.ignore_index), reduction=_lib.REDUCTIONS[opts.reduction],
            memory_budget=int(opts.memory_budget or 0))
        self.comm = None
        if opts.tp:
            rank, size, offset, total, self.comm = opts.tp
            self.problem.tp_rank, self.problem.tp_size = rank, size
            self.problem.vocab_offset, self.problem.vocab_total = offset, total

    def __call__(self, loss, divergence, grad_hidden=None, grad_weight=None, grad_output=None):
        """Fills loss (1 or N fp32), divergence (N fp32) and, when given, the student's gradients of
        Σ g_i loss_i (grad_output: None = 1, else 1 value or N, fp32)."""
        _distill_lib._fn(_distill_lib.LOSS_AND_GRAD)  # FlceError naming it on a library without it
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        ctx = _lib.context(index)
        nbytes = _distill_lib.workspace_size(ctx, self.problem)
        workspace = torch.empty(max(nbytes, 256), dtype=torch.uint8, device=self.device)

        def p(t, name, align):
            return None if t is None else _ptr(t, name, align)
        topk = bool(self.opts.teacher_topk)
        t = _distill_lib.new_tensors(
            student_hidden=p(self.hs, "student_hidden", 16), student_weight=p(self.ws, "student_weight", 16),
            teacher_hidden=None if topk else p(self.ht, "teacher_hidden", 16),
            teacher_weight=None if topk else p(self.wt, "teacher_weight", 16),
            teacher_topk_indices=p(self.ht, "teacher_topk_indices", 8) if topk else None,
            teacher_topk_logprobs=p(self.wt, "teacher_topk_logprobs", 4) if topk else None,
            labels=p(self.labels, "labels", self.labels.element_size() if self.labels is not None else 1),
            grad_output=p(grad_output, "grad_output", 4), loss=p(loss, "loss", 4),
            divergence=p(divergence, "divergence", 4), grad_student_hidden=p(grad_hidden, "grad_hidden", 16),
            grad_student_weight=p(grad_weight, "grad_weight", 16), workspace=p(workspace, "workspace", 256),
            workspace_bytes=workspace.numel(), comm=self.comm)
        _distill_lib.loss_and_grad(ctx, self.problem, t, torch.cuda.current_stream(self.device).cuda_stream)


def _dense(t, align=16):  # (ids: 8-byte, log-probs: 4-byte aligned would do; 16 is what a fresh tensor has)
    """t when contiguous and aligned, else a contiguous copy (a compiled graph may hand the op a
    layout eager mode would not have)."""
    if t is None or (t.is_contiguous() and t.data_ptr() % align == 0):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _outputs(hs, ws, reduction, grads):
    n, dev, f32 = hs.shape[0], hs.device, torch.float32
    return (torch.empty((n,) if reduction == "none" else (), dtype=f32, device=dev),
            torch.empty((n,), dtype=f32, device=dev),
            torch.empty(hs.shape if grads & GRAD_HIDDEN else (0,), dtype=hs.dtype, device=dev),
            torch.empty(ws.shape if grads & GRAD_WEIGHT else (0,), dtype=ws.dtype, device=dev))


def _distill_impl(student_hidden: Tensor, student_weight: Tensor, teacher_hidden: Tensor, teacher_weight: Tensor,
                  labels: Optional[Tensor], grad_output: Optional[Tensor], divergence: str, beta: float,
                  temperature: float, ce_weight: float, ignore_index: int, reduction: str, memory_budget: int,
                  grads: int, teacher_topk: int, tp: List[int]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, divergence, dhs, dws): loss () or (N,) for 'none', the per-token divergence (N,), and
    the student's gradients of Σ g_i loss_i (grad_output g: None = 1, one fp32 value for mean/sum, N
    for none) when `grads` asks for them (GRAD_HIDDEN, GRAD_WEIGHT), else empty (0,) tensors.
    teacher_topk = k > 0: teacher_hidden is the teacher's (N, k) int64 ids and teacher_weight their
    (N, k) fp32 log-probabilities (forward KL over those ids). tp: [] or [rank, size, vocab_offset,
    vocab_total, ncclComm_t address] (vocab_parallel_distillation: the weights are the shards, dws this
    rank's, dhs summed over the ranks)."""
    hs, ws, ht, wt = (_dense(t) for t in (student_hidden, student_weight, teacher_hidden, teacher_weight))
    labels = None if labels is None else _dense(labels, labels.element_size())
    go = None if grad_output is None else _dense(grad_output.to(torch.float32), 4)
    opts = _DistillOptions(divergence, beta, temperature, ce_weight, ignore_index, reduction, memory_budget,
                           teacher_topk, tuple(tp))
    loss, div, dh, dw = _outputs(hs, ws, reduction, grads)
    _DistillCall(hs, ws, ht, wt, labels, opts)(loss, div, dh if grads & GRAD_HIDDEN else None,
                                               dw if grads & GRAD_WEIGHT else None, go)
    return loss, div, dh, dw


distill_op = torch.library.custom_op("flce::distill", mutates_args=())(_distill_impl)


@distill_op.register_fake
def _distill_fake(student_hidden, student_weight, teacher_hidden, teacher_weight, labels, grad_output, divergence,
                  beta, temperature, ce_weight, ignore_index, reduction, memory_budget, grads, teacher_topk, tp):
    return _outputs(student_hidden, student_weight, reduction, grads)


_OPTION_NAMES = ("divergence", "beta", "temperature", "ce_weight", "ignore_index", "reduction", "memory_budget",
                 "grads", "teacher_topk", "tp")


def _setup(ctx, inputs, output):
    hs, ws, ht, wt, labels, _ = inputs[:6]
    ctx.o = dict(zip(_OPTION_NAMES, inputs[6:]))
    loss, div, dh, dw = output
    ctx.mark_non_differentiable(div, dh, dw)
    ctx.set_materialize_grads(False)
    ctx.shape = (hs.shape[0], hs.shape[1], ws.shape[0], hs.dtype)
    if ctx.o["grads"]:
        ctx.save_for_backward(dh, dw)
    else:
        ctx.save_for_backward(hs, ws, ht, wt, labels)


def _backward(ctx, g_loss, g_div, g_dh, g_dw):
    none = (None,) * 16
    need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if g_loss is None or not (need_dh or need_dw):
        return none
    o = ctx.o
    if o["grads"]:
        # mean/sum: forward computed the gradients of 1·loss; times the upstream scalar
        dh, dw = ctx.saved_tensors
        dh = dh if o["grads"] & GRAD_HIDDEN and need_dh else None
        dw = dw if o["grads"] & GRAD_WEIGHT and need_dw else None
        g = g_loss.to(torch.float32).reshape(())
        present = [t for t in (dh, dw) if t is not None]
        if not present:
            return none
        # eager: flce_scale_gradients in place (no pass when g is exactly 1, as after
        # loss.backward()); traced: a product the compiler can fuse
        if not _traced(g) and not any(_traced(t) for t in present) and _lib.has("flce_scale_gradients"):
            _scale_in_place(dh, dw, g.contiguous(), ctx.shape, o["memory_budget"], getattr(ctx, "eager", False))
        else:
            dh, dw = (None if t is None else t * g for t in (dh, dw))
        return (dh, dw) + none[2:]
    # 'none' (or gradients not computed in forward): one more library call with the upstream gradients
    hs, ws, ht, wt, labels = ctx.saved_tensors
    n = hs.shape[0]
    g = g_loss.to(torch.float32).reshape(n if o["reduction"] == "none" else ()).contiguous()
    grads = GRAD_HIDDEN * bool(need_dh) | GRAD_WEIGHT * bool(need_dw)
    call = _distill_impl if getattr(ctx, "eager", False) else distill_op
    _, _, dh, dw = call(hs, ws, ht, wt, labels, g, o["divergence"], o["beta"], o["temperature"],
                        o["ce_weight"], o["ignore_index"], o["reduction"], o["memory_budget"], grads,
                        o["teacher_topk"], o["tp"])
    return (dh if need_dh else None, dw if need_dw else None) + none[2:]


distill_op.register_autograd(_backward, setup_context=_setup)


def _scale_in_place(dh, dw, g, shape, memory_budget, eager=False):
    """dh, dw *= g in place through flce_scale_gradients (the CE path's flce::scale_gradients_ on a
    problem of the student's shape: it only scales; no pass when g is exactly 1). eager: its
    implementation without the dispatcher, the version counters moved as the op's declaration would."""
    from . import _ops
    n, d, v, dtype = shape
    scale = _ops._scale_impl if eager else _ops.scale_gradients_
    scale(dh, dw, None, g, n, d, v, dtype, torch.int64, "mean", -100, 0.0, 0.0, 0.0, 1.0, int(memory_budget or 0),
          False, False, 0, 1, 0, v, 0)
    if eager:
        _ops._bump(dh, dw)


class _EagerDistill(torch.autograd.Function):
    """flce::distill's implementation and autograd formula without the dispatcher, for eager calls on
    plain tensors (the CE path's _EagerForward: the custom op's schema handling costs host time on
    every step). Same call, same outputs, same gradients; torch.compile and tracing keep the op."""

    @staticmethod
    def forward(ctx, *args):
        out = _distill_impl(*args)
        _setup(ctx, args, out)
        ctx.eager = True
        return out

    @staticmethod
    def backward(ctx, *grads):
        return _backward(ctx, *grads)


def _distill(*args):
    tensors = [a for a in args[:6] if isinstance(a, Tensor)]
    if torch.compiler.is_compiling() or any(_traced(t) for t in tensors):
        return distill_op(*args)
    return _EagerDistill.apply(*args)


def _student_call(hs, ws, t_a, t_b, labels, divergence, beta, temperature, ce_weight, ignore_index, reduction,
                  return_per_token, memory_budget, teacher_topk, tp=()):
    """The checked call of linear_distillation (t_a, t_b: the teacher's rows and weight) and of
    linear_distillation_topk (its ids and log-probabilities, teacher_topk = k): the student's rows
    flattened, no tokens handled without a call, the gradients asked for in forward unless
    reduction is 'none', the outputs in the student's leading shape."""
    lead = hs.shape[:-1]
    h2 = hs.reshape(-1, hs.shape[-1])
    y1 = None if labels is None else labels.reshape(-1)
    grad_on = torch.is_grad_enabled()
    need_dh, need_dw = grad_on and hs.requires_grad, grad_on and ws.requires_grad
    if h2.shape[0] == 0:
        zero = h2.float().sum() * 0 + ws.float().sum() * 0
        per = torch.zeros(lead, dtype=torch.float32, device=hs.device)
        loss = per + zero if reduction == "none" else zero
        return LinearDistillationOutput(loss, per) if return_per_token else loss
    grads = 0
    if reduction != "none":
        grads = GRAD_HIDDEN * bool(need_dh) | GRAD_WEIGHT * bool(need_dw)
    loss, div, _, _ = _distill(h2, ws, t_a, t_b, y1, None, divergence, float(beta), float(temperature),
                               float(ce_weight), int(ignore_index), reduction, int(memory_budget or 0), grads,
                               int(teacher_topk), list(tp))
    if reduction == "none":
        loss = loss.reshape(lead)
    if return_per_token:
        return LinearDistillationOutput(loss, div.reshape(lead))
    return loss


# ---- the public function ---------------------------------------------------------------------

@overload
def linear_distillation(student_hidden: Tensor, student_weight: Tensor, teacher_hidden: Tensor,
                        teacher_weight: Tensor, labels: Optional[Tensor] = ..., *, divergence: Divergence = ...,
                        beta: float = ..., temperature: float = ..., ce_weight: float = ..., ignore_index: int = ...,
                        reduction: Reduction = ..., return_per_token: Literal[False] = ...,
                        memory_budget: Optional[int] = ...) -> Tensor: ...
@overload
def linear_distillation(student_hidden: Tensor, student_weight: Tensor, teacher_hidden: Tensor,
                        teacher_weight: Tensor, labels: Optional[Tensor] = ..., *, divergence: Divergence = ...,
                        beta: float = ..., temperature: float = ..., ce_weight: float = ..., ignore_index: int = ...,
                        reduction: Reduction = ..., return_per_token: Literal[True],
                        memory_budget: Optional[int] = ...) -> LinearDistillationOutput: ...
@overload
def linear_distillation(student_hidden: Tensor, student_weight: Tensor, teacher_hidden: Tensor,
                        teacher_weight: Tensor, labels: Optional[Tensor] = ..., *, divergence: Divergence = ...,
                        beta: float = ..., temperature: float = ..., ce_weight: float = ..., ignore_index: int = ...,
                        reduction: Reduction = ..., return_per_token: bool = ...,
                        memory_budget: Optional[int] = ...) -> Union[Tensor, LinearDistillationOutput]: ...


def linear_distillation(student_hidden: Tensor, student_weight: Tensor, teacher_hidden: Tensor,
                        teacher_weight: Tensor, labels: Optional[Tensor] = None, *,
                        divergence: Divergence = "forward_kl", beta: float = 0.5, temperature: float = 1.0,
                        ce_weight: float = 0.0, ignore_index: int = -100, reduction: Reduction = "mean",
                        return_per_token: bool = False,
                        memory_budget: Optional[int] = None) -> Union[Tensor, LinearDistillationOutput]:
    """The divergence of a student's next-token distribution from a teacher's, both computed from
    hidden states and LM-head weights, without materializing either tokens x vocab logit tensor.

    student_hidden: (N, Ds) or (..., Ds), float32 / float16 / bfloat16, contiguous, on a CUDA device.
    student_weight: (V, Ds), same dtype and device (the student's lm_head.weight).
    teacher_hidden: (N, Dt) or (..., Dt) with the student's leading shape; teacher_weight: (V, Dt),
        the same V. Same dtype. Read only: detached, they get no gradient.
    labels: None (every token counts, no CE term) or the leading shape, int32/int64: tokens whose
        label is ignore_index are masked entirely (a label outside [0, V): masked too, and the
        next call raises FLCE_ERR_BAD_LABEL); the CE term's targets.
    divergence: 'forward_kl' KL(p_teacher || q_student), 'reverse_kl' KL(q || p), or 'jsd':
        beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q; beta in [0, 1] weights
        the teacher, beta = 0 and 1 are forward and reverse KL (Liger's convention).
    temperature: T > 0 of both softmaxes of the divergence (no T^2 factor: scale the loss yourself
        for the usual T^2 KL).
    ce_weight: adds ce_weight * cross_entropy(student logits, labels) at temperature 1 (needs labels;
        v1 supports it only with temperature=1).
    reduction: 'mean' over the unmasked tokens (0 when there are none), 'sum', or 'none' (labels'
        shape, 0 for masked tokens).
    return_per_token: also return each token's divergence D_i (see LinearDistillationOutput).
    memory_budget: the most bytes of workspace the library may use, all of it (None: 4 GiB of token
        chunks' logits plus a dW buffer; the README's "Memory" says more). A budget that holds no
        dW buffer adds each token chunk's dW into the 16-bit gradient (rounded once per chunk).

    Returns the loss in float32. Differentiable in student_hidden and student_weight: for mean/sum
    the gradients are computed in the forward call and scaled by the upstream gradient in backward;
    for 'none' the backward makes a second library call with the per-token upstream gradients. Works
    under torch.compile(fullgraph=True). Under torch.autocast the four tensors are cast to its dtype.
    """
    _check_tensors(student_hidden, student_weight, teacher_hidden, teacher_weight, labels)
    _check_options(labels, divergence, beta, temperature, ce_weight, ignore_index, reduction, return_per_token,
                   memory_budget)
    hs, ws, ht, wt = _autocast(student_hidden, student_weight, teacher_hidden.detach(), teacher_weight.detach())
    return _student_call(hs, ws, ht.reshape(-1, ht.shape[-1]), wt, labels, divergence, beta, temperature, ce_weight,
                         ignore_index, reduction, return_per_token, memory_budget, 0)


def _check_topk_tensors(hs, ws, idx, lp, labels):
    _check_inputs((("student_hidden", hs), ("student_weight", ws), ("teacher_topk_indices", idx),
                   ("teacher_topk_logprobs", lp)), labels)
    if ws.dtype != hs.dtype:
        raise ValueError(f"student_weight: dtype {ws.dtype}, student_hidden is {hs.dtype} (must be the same)")
    if idx.dtype != torch.int64:
        raise ValueError(f"teacher_topk_indices: dtype {idx.dtype}; expected int64 (torch.topk's indices)")
    if lp.dtype != torch.float32:
        raise ValueError(f"teacher_topk_logprobs: dtype {lp.dtype}; expected float32 log-probabilities")
    if labels is not None and labels.dtype not in _LABEL_BITS:
        raise ValueError(f"labels: dtype {labels.dtype} is not supported (int32 or int64)")
    if hs.dim() < 1 or ws.dim() != 2 or ws.shape[1] != hs.shape[-1]:
        raise ValueError(f"student_weight: shape {tuple(ws.shape)} does not match student_hidden {tuple(hs.shape)} "
                         f"(need (V, D) with D = student_hidden.shape[-1])")
    if ws.shape[0] < 1:
        raise ValueError("student_weight: V = 0 rows; need at least one vocab row")
    if hs.shape[-1] < 8 or hs.shape[-1] % 8:
        raise ValueError(f"student_hidden: D = {hs.shape[-1]} must be a positive multiple of 8")
    lead = tuple(hs.shape[:-1])
    if idx.dim() < 1 or tuple(idx.shape[:-1]) != lead:
        raise ValueError(f"teacher_topk_indices: shape {tuple(idx.shape)} must be student_hidden's leading shape "
                         f"{lead} plus (k,)")
    if tuple(lp.shape) != tuple(idx.shape):
        raise ValueError(f"teacher_topk_logprobs: shape {tuple(lp.shape)} differs from teacher_topk_indices' "
                         f"{tuple(idx.shape)}")
    k = idx.shape[-1]
    if not 1 <= k <= min(64, ws.shape[0]):
        raise ValueError(f"teacher_topk_indices: k = {k} ids per token; must be in [1, min(64, V = {ws.shape[0]})]")
    if labels is not None and tuple(labels.shape) != lead:
        raise ValueError(f"labels: shape {tuple(labels.shape)} must be student_hidden's leading shape {lead}")
    for name, t in (("student_hidden", hs), ("student_weight", ws), ("teacher_topk_indices", idx),
                    ("teacher_topk_logprobs", lp), ("labels", labels)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")


def linear_distillation_topk(student_hidden: Tensor, student_weight: Tensor, teacher_topk_indices: Tensor,
                             teacher_topk_logprobs: Tensor, labels: Optional[Tensor] = None, *,
                             temperature: float = 1.0, ce_weight: float = 0.0, ignore_index: int = -100,
                             reduction: Reduction = "mean", return_per_token: bool = False,
                             memory_budget: Optional[int] = None) -> Union[Tensor, LinearDistillationOutput]:
    """Forward KL from a teacher given as each token's top-k (e.g. flce.topk_logprobs of the teacher,
    or a serving engine's prompt log-probs): D_i = sum over the k ids j of p_j (log p_j - log q_j),
    p_j = exp(teacher_topk_logprobs) as given (their temperature and normalization are the
    teacher's), q = softmax(student logits / temperature) over the whole vocabulary, without the
    student's tokens x vocab logits in memory and with no teacher GEMM.

    teacher_topk_indices: (..., k) int64 distinct ids in [0, V), the student's leading shape, k <= 64;
    teacher_topk_logprobs: (..., k) float32. A token whose ids repeat or fall outside [0, V) gets a NaN
    divergence and gradient row (never a silently wrong one). The other arguments are
    linear_distillation's; gradients reach student_hidden and student_weight."""
    _check_topk_tensors(student_hidden, student_weight, teacher_topk_indices, teacher_topk_logprobs, labels)
    _check_options(labels, "forward_kl", 0.5, temperature, ce_weight, ignore_index, reduction, return_per_token,
                   memory_budget)
    hs, ws = _autocast(student_hidden, student_weight)
    k = teacher_topk_indices.shape[-1]
    return _student_call(hs, ws, teacher_topk_indices.reshape(-1, k), teacher_topk_logprobs.detach().reshape(-1, k),
                         labels, "forward_kl", 0.0, temperature, ce_weight, ignore_index, reduction, return_per_token,
                         memory_budget, int(k))


def _tp_args(student_weight, vocab_offset, vocab_total, comm, group):
    """The checked TP arguments of the vocab-parallel forms (parallel.py's checks, a communicator
    required): (rank, size, offset, total, comm address), or None for a group of one rank (which
    must hold the whole vocab)."""
    from .parallel import NcclComm, _check_one_rank, _check_shard, _group_rank
    if not isinstance(comm, NcclComm):
        raise TypeError(f"comm: expected a flce.NcclComm, got {_kind(comm)}")
    shard = student_weight.shape[0]
    offset, total = _check_shard(vocab_offset, vocab_total, shard)
    rank, size = _group_rank(group, comm, "vocab_parallel_distillation")
    if size == 1:
        _check_one_rank(offset, total, shard)
        return None
    return (rank, size, offset, total, int(comm.ptr.value))


def vocab_parallel_distillation(student_hidden: Tensor, student_weight: Tensor, teacher_hidden: Tensor,
                                teacher_weight: Tensor, labels: Optional[Tensor] = None, *, vocab_offset: int,
                                vocab_total: int, comm: Any, group: Any = None, divergence: Divergence = "forward_kl",
                                beta: float = 0.0, temperature: float = 1.0, ce_weight: float = 0.0,
                                ignore_index: int = -100, reduction: Reduction = "mean", return_per_token: bool = False,
                                memory_budget: Optional[int] = None) -> Union[Tensor, LinearDistillationOutput]:
    """linear_distillation with both LM heads sharded by vocab rows over the ranks of `group` (tensor
    parallelism): this rank holds student_weight = Ws[vocab_offset : vocab_offset + V_r] and
    teacher_weight = Wt[the same rows]; the shards tile [0, vocab_total) in rank order. Every rank
    calls it with the same hidden states, labels (global ids) and options (collectively).

    comm: a flce.NcclComm(group): flce issues per token chunk one all-gather of 16 bytes per token
        and one all-reduce of 8, and sums the student's hidden-state gradient over the ranks.
    Every divergence and dtype runs; reverse KL, JSD with beta > 0 and float32 inputs read each
    shard's logits twice (the row sums before the gradient), forward KL on 16-bit inputs once.

    Returns the loss (or a LinearDistillationOutput), the same on every rank. Gradients: the student
    hidden states' is summed over the ranks, the student weight's is this rank's shard; the upstream
    gradient of the loss must be the same on every rank. A group of one rank runs
    linear_distillation (vocab_offset 0, vocab_total V_r)."""
    _check_tensors(student_hidden, student_weight, teacher_hidden, teacher_weight, labels)
    _check_options(labels, divergence, beta, temperature, ce_weight, ignore_index, reduction, return_per_token,
                   memory_budget)
    tp = _tp_args(student_weight, vocab_offset, vocab_total, comm, group)
    if tp is None:
        return linear_distillation(student_hidden, student_weight, teacher_hidden, teacher_weight, labels,
                                   divergence=divergence, beta=beta, temperature=temperature,
                                   ce_weight=ce_weight, ignore_index=ignore_index, reduction=reduction,
                                   return_per_token=return_per_token, memory_budget=memory_budget)
    hs, ws, ht, wt = _autocast(student_hidden, student_weight, teacher_hidden.detach(), teacher_weight.detach())
    return _student_call(hs, ws, ht.reshape(-1, ht.shape[-1]), wt, labels, divergence, beta, temperature, ce_weight,
                         ignore_index, reduction, return_per_token, memory_budget, 0, tp)


def vocab_parallel_distillation_topk(student_hidden: Tensor, student_weight: Tensor, teacher_topk_indices: Tensor,
                                     teacher_topk_logprobs: Tensor, labels: Optional[Tensor] = None, *,
                                     vocab_offset: int, vocab_total: int, comm: Any, group: Any = None,
                                     temperature: float = 1.0, ce_weight: float = 0.0, ignore_index: int = -100,
                                     reduction: Reduction = "mean", return_per_token: bool = False,
                                     memory_budget: Optional[int] = None) -> Union[Tensor, LinearDistillationOutput]:
    """linear_distillation_topk with the student's LM head sharded by vocab rows over the ranks of
    `group`, as vocab_parallel_distillation: the teacher's ids are global ids in [0, vocab_total);
    one all-gather of 16 bytes per token per chunk on float16 or bfloat16 inputs; float32 inputs add an
    fp32 all-reduce of 8 bytes per token and read the shard's logits twice."""
    _check_topk_tensors(student_hidden, student_weight, teacher_topk_indices, teacher_topk_logprobs, labels)
    _check_options(labels, "forward_kl", 0.5, temperature, ce_weight, ignore_index, reduction, return_per_token,
                   memory_budget)
    tp = _tp_args(student_weight, vocab_offset, vocab_total, comm, group)
    if tp is None:
        return linear_distillation_topk(student_hidden, student_weight, teacher_topk_indices, teacher_topk_logprobs,
                                        labels, temperature=temperature, ce_weight=ce_weight,
                                        ignore_index=ignore_index, reduction=reduction,
                                        return_per_token=return_per_token, memory_budget=memory_budget)
    hs, ws = _autocast(student_hidden, student_weight)
    k = teacher_topk_indices.shape[-1]
    return _student_call(hs, ws, teacher_topk_indices.reshape(-1, k), teacher_topk_logprobs.detach().reshape(-1, k),
                         labels, "forward_kl", 0.0, temperature, ce_weight, ignore_index, reduction, return_per_token,
                         memory_budget, int(k), tp)


class LinearDistillation(torch.nn.Module):
    """Module form: LinearDistillation(**options)(student_hidden, student_weight, teacher_hidden,
    teacher_weight, labels) == linear_distillation(..., **options). The weights are arguments (the
    models' lm_head.weight), not parameters of this module."""

    def __init__(self, **options: Any) -> None:
        super().__init__()
        defaults = linear_distillation.__kwdefaults__ or {}
        unknown = set(options) - set(defaults)
        if unknown:
            raise TypeError(f"LinearDistillation: unknown options {sorted(unknown)}")
        self.options = dict(defaults, **options)

    def forward(self, student_hidden: Tensor, student_weight: Tensor, teacher_hidden: Tensor,
                teacher_weight: Tensor, labels: Optional[Tensor] = None
                ) -> Union[Tensor, LinearDistillationOutput]:
        return linear_distillation(student_hidden, student_weight, teacher_hidden, teacher_weight, labels,
                                   **self.options)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items() if v is not None)


def prepare_linear_distillation(tokens: int, hidden_student: int, hidden_teacher: int, vocab: int, *,
                                dtype: torch.dtype = torch.bfloat16, device=None,
                                label_dtype: torch.dtype = torch.int64, divergence: str = "forward_kl",
                                beta: float = 0.5, temperature: float = 1.0, ce_weight: float = 0.0,
                                ignore_index: int = -100, reduction: str = "mean",
                                memory_budget: Optional[int] = None, teacher_topk: int = 0) -> None:
    """Compiles (or loads from flce's disk cache) the kernels linear_distillation calls of this shape
    and these options will run on `device` (None: the current CUDA device), with and without labels
    and for every gradient, before the first step (synchronous). label_dtype: of the labels the calls
    pass (int64 or int32); the other options are linear_distillation's. teacher_topk = k > 0: the
    kernels of linear_distillation_topk with k ids per token instead (hidden_teacher then 0)."""
    from .topk import _cuda_device
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: {dtype} not supported (bfloat16, float16 or float32)")
    if label_dtype not in _LABEL_BITS:
        raise ValueError(f"label_dtype: {label_dtype}; expected torch.int64 or torch.int32")
    if isinstance(teacher_topk, bool) or not isinstance(teacher_topk, int) or not 0 <= teacher_topk <= 64:
        raise ValueError(f"teacher_topk: {teacher_topk!r}; expected 0 (the teacher's weights) or k in [1, 64]")
    for name, v in (("tokens", tokens), ("hidden_student", hidden_student), ("hidden_teacher", hidden_teacher),
                    ("vocab", vocab)):
        if name == "hidden_teacher" and teacher_topk:
            if v != 0:
                raise ValueError(f"hidden_teacher: {v!r}; must be 0 with teacher_topk={teacher_topk} (no teacher GEMM)")
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: {v!r}; expected a positive int")
    if not isinstance(divergence, str) or divergence not in _distill_lib.DIVERGENCES:
        raise ValueError(f"divergence: {divergence!r}; expected one of {sorted(_distill_lib.DIVERGENCES)}")
    if reduction not in _lib.REDUCTIONS:
        raise ValueError(f"reduction: {reduction!r}; expected 'mean', 'sum' or 'none'")
    dev = _cuda_device(device)
    problem = _distill_lib.new_problem(
        tokens=tokens, hidden_student=hidden_student, hidden_teacher=hidden_teacher, vocab=vocab,
        dtype=_DTYPES[dtype], label_bits=_LABEL_BITS[label_dtype],
        divergence=_distill_lib.DIVERGENCES[divergence], beta=float(beta), temperature=float(temperature),
        ce_weight=float(ce_weight), ignore_index=int(ignore_index), reduction=_lib.REDUCTIONS[reduction],
        memory_budget=int(memory_budget or 0), teacher_topk=int(teacher_topk))
    _distill_lib.validate(problem)
    _distill_lib.distill_prepare(_lib.context(dev.index if dev.index is not None else torch.cuda.current_device()),
                                 problem)
