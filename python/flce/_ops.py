"""_ops.py — the library calls as torch.library custom ops, so that torch.compile, AOTAutograd,
torch.export and FakeTensor see them as opaque functional operators with known output shapes:

  flce::forward            flce_forward, or flce_loss_and_grad when `grads` asks for gradients
                           in forward; every output is a new tensor (empty (0,) when not asked for)
  flce::backward           flce_backward: gradients from the saved lse and the upstream gradient;
                           mutates only the caller's fp32 accumulators (declared)
  flce::backward_saved     the gradients of the loss and of the differentiable per-token outputs
                           (log-probs, lse, entropy, per-token losses) from the compact logits
                           that a forward with strategy 'saved' kept (flce.h "Saved logits": its
                           workspace, consumed in place: declared mutated), or without them one
                           chunked flce_loss_and_grad with the same upstream gradients
  flce::scale_gradients_   flce_scale_gradients: gradients from forward times the upstream scalar,
                           in place (declared); used by the eager backward only
  flce::not_differentiable a copy whose backward raises NotImplementedError: the z-loss part, and
                           lse and entropy where forward did not prepare their gradients

Each has a fake (meta) kernel that only computes shapes and an autograd formula
(register_autograd). The kernels call the library through python/flce/__init__.py's _Call, on the
current stream of the tensors' device; they never synchronize, so CUDA-graph capture works.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _lib

# flce::forward's `outputs` bits (lse is always computed) and `grads` bits.
OUT_LOGPROB, OUT_ENTROPY, OUT_ARGMAX, OUT_ZLOSS, OUT_LOSS_PER_TOKEN = 1, 2, 4, 8, 16
GRAD_HIDDEN, GRAD_WEIGHT, GRAD_BIAS = 1, 2, 4


def _options(reduction, ignore_index, label_smoothing, z_loss, softcap, temperature, strategy, memory_budget,
             batch_invariant=0):
    from . import _Options
    return _Options(ignore_index, reduction, strategy, memory_budget or None, label_smoothing, z_loss, softcap,
                    temperature, bool(batch_invariant))


def _tp(tp_rank, tp_size, vocab_offset, vocab_total, comm, sequence_parallel=0):
    """_Call's tp tuple: None without tensor parallelism."""
    if tp_size == 1 and comm == 0:
        return None
    return (tp_rank, tp_size, vocab_offset, vocab_total, comm or None, int(sequence_parallel))


def _empty(shape, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device)


def _forward_outputs(hidden, weight, bias, reduction, outputs, grads, saved_bytes=0):
    n, dev, f32 = hidden.shape[0], hidden.device, torch.float32
    loss_shape = (n,) if reduction == "none" else ()

    def per(bit, dtype=f32):
        return _empty((n,) if outputs & bit else (0,), dtype, dev)

    return (_empty(loss_shape, f32, dev),                                   # loss
            _empty((n,), f32, dev),                                         # lse
            per(OUT_LOGPROB), per(OUT_ENTROPY), per(OUT_ARGMAX, torch.int64),
            _empty(loss_shape if outputs & OUT_ZLOSS else (0,), f32, dev),  # z_loss
            per(OUT_LOSS_PER_TOKEN),
            _empty(hidden.shape if grads & GRAD_HIDDEN else (0,), hidden.dtype, dev),
            _empty(weight.shape if grads & GRAD_WEIGHT else (0,), weight.dtype, dev),
            _empty(bias.shape if grads & GRAD_BIAS and bias is not None else (0,), hidden.dtype, dev),
            _empty((saved_bytes,), torch.uint8, dev))                      # strategy 'saved': its logits


def _dense(t, align=16):
    """t itself when it is contiguous and aligned as flce.h asks (always, from the Python wrapper,
    which checks contiguity), else a contiguous copy: a compiled graph may hand the op a padded or
    offset layout that eager mode would not have."""
    if t is None or (t.is_contiguous() and t.data_ptr() % align == 0):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _given(t):
    return t if t is not None and t.numel() > 0 else None


# ---- flce::forward -------------------------------------------------------------------------------

def _forward_impl(hidden: Tensor, weight: Tensor, labels: Tensor, bias: Optional[Tensor],
               class_weights: Optional[Tensor], grad_hidden_acc: Optional[Tensor], grad_weight_acc: Optional[Tensor],
               reduction: str, ignore_index: int, label_smoothing: float, z_loss: float, softcap: float,
               temperature: float, strategy: str, memory_budget: int, outputs: int, grads: int,
               tp_rank: int, tp_size: int, vocab_offset: int, vocab_total: int, comm: int, grad_outputs: int = 0,
               saved_grads: int = 0, batch_invariant: int = 0, sequence_parallel: int = 0
               ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns (loss, lse, logprob, entropy, argmax, z_loss, loss_per_token, dh, dw, db, saved): loss () or
    (N,) for 'none'; lse (N,); the per-token outputs (N,) when their `outputs` bit is set, else (0,);
    dh, dw, db the gradients of 1·loss when `grads` asks for them (one flce_loss_and_grad call),
    else (0,). Differentiable: loss, and logprob and loss_per_token unless `grads` is set. The accumulators are not touched here (flce::backward adds into them); they are
    inputs so that the autograd formula can hand them to flce::backward.
    strategy 'saved': `saved` is the workspace holding the compact logits for flce::backward_saved
    (else (0,)); grad_outputs (FLCE_GRAD_* bits) and saved_grads (GRAD_* bits of the gradients the
    backward will write) are the problem and tensors both calls must share.
    Tensor parallelism (tp_size > 1, flce's NCCL communicator `comm`): weight and bias are this
    rank's vocab shard, dw and db its gradients; sequence_parallel = 1: hidden, labels and every
    per-token output are this rank's rows of the tp_size·N tokens (flce.h)."""
    from . import _Call
    hidden, weight, bias, class_weights = _dense(hidden), _dense(weight), _dense(bias), _dense(class_weights, 4)
    labels = _dense(labels, labels.element_size())
    opts = _options(reduction, ignore_index, label_smoothing, z_loss, softcap, temperature, strategy, memory_budget,
                    batch_invariant)
    tp = _tp(tp_rank, tp_size, vocab_offset, vocab_total, comm, sequence_parallel)
    call = _Call(hidden, weight, labels, opts, tp, bias=bias, class_weights=class_weights)
    if strategy == "saved":
        _saved_problem(call, grad_outputs, grad_hidden_acc if saved_grads & GRAD_HIDDEN else None,
                       grad_weight_acc if saved_grads & GRAD_WEIGHT else None)
        res = _saved_outputs(call, hidden, weight, bias, reduction, outputs)
        ws = res[10]
        if ws.numel():
            call(_lib.FLCE_OP_FORWARD, "saved", workspace=ws,
                 **_saved_fields(*res[:7], ws=ws, saved_grads=saved_grads, bias=bias))
            return res
        # too large to keep: a plain forward; the backward then runs one chunked loss-and-grad
        _saved_problem(call, 0, None, None)
        strategy = "auto"
    else:
        res = _forward_outputs(hidden, weight, bias, reduction, outputs, grads)
    loss, lse, logprob, entropy, argmax, zl, lpt, dh, dw, db, _ = res
    op = _lib.FLCE_OP_LOSS_AND_GRAD if grads else _lib.FLCE_OP_FORWARD
    call(op, strategy if grads else "auto", loss=loss, lse=lse, target_logprob=_given(logprob),
         entropy=_given(entropy), argmax=_given(argmax), z_loss_out=_given(zl), loss_per_token=_given(lpt),
         **({"grad_hidden": _given(dh), "grad_weight": _given(dw), "grad_bias": _given(db)} if grads else {}))
    return res


forward_op = torch.library.custom_op("flce::forward", mutates_args=())(_forward_impl)


@forward_op.register_fake
def _forward_fake(hidden, weight, labels, bias, class_weights, grad_hidden_acc, grad_weight_acc, reduction,
                  ignore_index, label_smoothing, z_loss, softcap, temperature, strategy, memory_budget, outputs,
                  grads, tp_rank, tp_size, vocab_offset, vocab_total, comm, grad_outputs=0, saved_grads=0,
                  batch_invariant=0, sequence_parallel=0):
    # (under sequence parallelism the per-token outputs are hidden's rows too: the shapes hold)
    saved = 0
    if strategy == "saved":
        saved = _fake_saved_bytes(hidden, weight, labels, bias, class_weights, grad_hidden_acc, grad_weight_acc,
                                  reduction, ignore_index, label_smoothing, z_loss, softcap, temperature,
                                  memory_budget, grad_outputs, saved_grads, batch_invariant,
                                  _tp(tp_rank, tp_size, vocab_offset, vocab_total, comm, sequence_parallel))
    return _forward_outputs(hidden, weight, bias, reduction, outputs, grads, saved)


def _fake_saved_bytes(hidden, weight, labels, bias, class_weights, gh_acc, gw_acc, reduction, ignore_index,
                      label_smoothing, z_loss, softcap, temperature, memory_budget, grad_outputs, saved_grads,
                      batch_invariant=0, tp=None):
    """The saved logits' bytes as the real kernel will take them: the library's plan (host
    arithmetic) for static shapes and options, else a size the graph does not know. tp: _Call's
    tuple (the plan of a vocab shard, and under sequence parallelism of all ranks' tokens)."""
    from . import _Call
    static = (*hidden.shape, weight.shape[0], ignore_index, memory_budget, label_smoothing, z_loss, softcap,
              temperature)
    if all(type(x) in (int, float) for x in static):
        opts = _options(reduction, ignore_index, label_smoothing, z_loss, softcap, temperature, "saved",
                        memory_budget, batch_invariant)
        call = _Call(hidden, weight, labels, opts, tp, bias=bias, class_weights=class_weights)
        _saved_problem(call, grad_outputs, gh_acc if saved_grads & GRAD_HIDDEN else None,
                       gw_acc if saved_grads & GRAD_WEIGHT else None)
        try:
            return call.saved_bytes()
        except _lib.FlceError:
            return 0
    return torch.library.get_ctx().new_dynamic_size()


def _saved_outputs(call, hidden, weight, bias, reduction, outputs):
    """The forward's outputs with the saved logits' workspace, or with an empty one where all tokens'
    logits do not fit the budget or the memory (flce.h "Saved logits")."""
    try:
        nbytes = call.saved_bytes()
    except _lib.FlceError as e:
        if e.status not in (_lib.FLCE_ERR_INVALID_ARGUMENT, _lib.FLCE_ERR_UNSUPPORTED):
            raise
        nbytes = 0
    try:
        return _forward_outputs(hidden, weight, bias, reduction, outputs, 0, nbytes)
    except torch.cuda.OutOfMemoryError:
        if not nbytes:
            raise
        return _forward_outputs(hidden, weight, bias, reduction, outputs, 0, 0)


def _saved_problem(call, grad_outputs, gh_acc, gw_acc):
    """The problem fields both calls of the saved strategy share (the plan depends on them)."""
    call.problem.grad_outputs = grad_outputs
    call.problem.accumulate_grad_hidden = int(gh_acc is not None)
    call.problem.accumulate_grad_weight = int(gw_acc is not None)


def _saved_fields(loss, lse, logprob, entropy, argmax, zl, lpt, ws, saved_grads, bias):
    """The outputs and gradients both calls of the saved strategy name: the plan (and the layout of
    the logits kept between them) depends on which pointers are given, not on where they point, and
    each call writes only its own (flce.h "Saved logits"), so the 256-aligned workspace stands in
    for the other call's."""
    return dict(loss=loss, lse=lse, target_logprob=_given(logprob), entropy=_given(entropy),
                argmax=_given(argmax), z_loss_out=_given(zl), loss_per_token=_given(lpt),
                grad_hidden=ws if saved_grads & GRAD_HIDDEN else None,
                grad_weight=ws if saved_grads & GRAD_WEIGHT else None,
                grad_bias=ws if saved_grads & GRAD_BIAS and bias is not None else None)


_OPTION_NAMES = ("reduction", "ignore_index", "label_smoothing", "z_loss", "softcap", "temperature", "strategy",
                 "memory_budget", "outputs", "grads", "tp_rank", "tp_size", "vocab_offset", "vocab_total", "comm",
                 "grad_outputs", "saved_grads", "batch_invariant", "sequence_parallel")


def _forward_setup(ctx, inputs, output):
    hidden, weight, labels, bias, class_weights, gh_acc, gw_acc = inputs[:7]
    ctx.o = dict(zip(_OPTION_NAMES, inputs[7:]))
    ctx.o.setdefault("grad_outputs", 0)
    ctx.o.setdefault("saved_grads", 0)
    ctx.o.setdefault("batch_invariant", 0)
    ctx.o.setdefault("sequence_parallel", 0)
    bits = ctx.o["grad_outputs"]
    loss, lse, logprob, entropy, argmax, zl, lpt, dh, dw, db, saved = output
    # Gradients flow only through loss, logprob and loss_per_token, and lse and entropy where
    # grad_outputs has their bits; the others are marked so, and outputs nobody differentiates
    # arrive in backward as None (not as zeros to allocate).
    ctx.mark_non_differentiable(argmax, zl, dh, dw, db, saved)
    if not bits & _lib.FLCE_GRAD_LSE:
        ctx.mark_non_differentiable(lse)
    if not bits & _lib.FLCE_GRAD_ENTROPY:
        ctx.mark_non_differentiable(entropy)
    if ctx.o["grads"]:
        # gradients computed in forward are those of the loss alone
        ctx.mark_non_differentiable(logprob, lpt)
    ctx.set_materialize_grads(False)
    ctx.shapes = (hidden.shape, weight.shape, None if bias is None else bias.shape)
    ctx.types = (hidden.dtype, labels.dtype, bias is not None, class_weights is not None)
    # The accumulators are kept as attributes, not saved tensors: other micro-batches add into them
    # between this forward and its backward, which a saved tensor's version check would refuse.
    ctx.acc = (gh_acc, gw_acc)
    if ctx.o["grads"]:
        ctx.save_for_backward(dh, dw, db)
    elif ctx.o["strategy"] == "saved" or bits:
        ctx.save_for_backward(hidden, weight, labels, bias, class_weights, lse,
                              entropy if bits & _lib.FLCE_GRAD_ENTROPY else None,
                              saved if ctx.o["strategy"] == "saved" else None)
    else:
        ctx.save_for_backward(hidden, weight, labels, bias, class_weights, lse)


def _traced(t):
    """True while AOTAutograd / make_fx / FakeTensor trace (tensor subclasses or functional
    wrappers), False for a real tensor in eager mode."""
    from torch._subclasses.fake_tensor import is_fake
    return type(t) is not torch.Tensor or torch._is_functional_tensor(t) or is_fake(t)


def _scale(ctx, g, dh, dw, db):
    """dh, dw, db (the gradients of 1·loss from forward) times the upstream scalar g."""
    present = [t for t in (dh, dw, db) if t is not None]
    if not present:
        return dh, dw, db
    g = g.to(torch.float32).reshape(())
    if not _traced(g) and not any(_traced(t) for t in present) and _lib.has("flce_scale_gradients"):
        # Eager: in place through the library, which reads g on the device and moves nothing when
        # it is 1 (the usual loss.backward()). The saved tensors' versions move on, so a second
        # backward through this graph raises instead of scaling twice.
        o = ctx.o
        eager = getattr(ctx, "eager", False)
        scale = _scale_impl if eager else scale_gradients_
        scale(dh, dw, db, g.contiguous(), ctx.shapes[0][0], ctx.shapes[0][1], ctx.shapes[1][0],
              ctx.types[0], ctx.types[1], o["reduction"], o["ignore_index"], o["label_smoothing"],
              o["z_loss"], o["softcap"], o["temperature"], o["memory_budget"], ctx.types[2],
              ctx.types[3], o["tp_rank"], o["tp_size"], o["vocab_offset"], o["vocab_total"], o["sequence_parallel"])
        if eager:  # what the custom op's in-place declaration does: a second backward must see it
            _bump(dh, dw, db)
        return dh, dw, db
    # Traced (torch.compile) or without the library's in-place scaling: new tensors (rounded once
    # in the dtype, like the in-place product); Inductor fuses each into one pass.
    return tuple(None if t is None else t * g for t in (dh, dw, db))


def _valid_weight(labels, class_weights, ignore_index, vocab_total):
    """Per token: the mean's weight of a valid label (w_y, or 1), 0 for ignored or out-of-range ones."""
    valid = (labels != ignore_index) & (labels >= 0) & (labels < vocab_total)
    if class_weights is None:
        return valid.to(torch.float32)
    return torch.where(valid, class_weights[labels.clamp(0, vocab_total - 1).long()], 0.0)


def _forward_backward(ctx, g_loss, g_lse, g_logprob, g_entropy, g_argmax, g_zl, g_lpt, g_dh, g_dw, g_db,
                      g_saved=None):
    o = ctx.o
    if not o["outputs"] & OUT_LOGPROB:
        g_logprob = None  # the (0,) placeholder output
    if not o["outputs"] & OUT_LOSS_PER_TOKEN:
        g_lpt = None
    need = ctx.needs_input_grad
    need_dh, need_dw, need_db = need[0], need[1], len(need) > 3 and need[3]
    if len(need) > 4 and need[4]:
        raise NotImplementedError("flce: class weights (weight=) are not differentiable (as in "
                                  "F.cross_entropy); pass them detached")
    none = (None,) * len(ctx.needs_input_grad)  # one per input of flce::forward
    if o["grads"]:
        dh, dw, db = ctx.saved_tensors
        if g_loss is None:
            return none
        dh, dw, db = (t if t is not None and t.numel() else None for t in (dh, dw, db))
        dh, dw, db = _scale(ctx, g_loss, dh, dw, db)
        return (dh if need_dh else None, dw if need_dw else None, None, db if need_db else None) + none[4:]
    if o["strategy"] == "saved" or o["grad_outputs"]:
        return _outputs_backward(ctx, g_loss, g_lse, g_logprob, g_entropy, g_lpt, none)

    hidden, weight, labels, bias, class_weights, lse = ctx.saved_tensors
    gh_acc, gw_acc = ctx.acc
    n = hidden.shape[0]
    grads = GRAD_HIDDEN * bool(need_dh) | GRAD_WEIGHT * bool(need_dw) | GRAD_BIAS * bool(need_db)
    if not grads:
        return none
    plain = o["label_smoothing"] == 0 and o["z_loss"] == 0 and class_weights is None
    terms = []  # (reduction, upstream gradient, plain problem?)
    if g_logprob is None and g_lpt is None:
        if g_loss is None:
            return none
        terms.append((o["reduction"], g_loss, False))
    else:
        # d(Σ_i g_i·loss_i) is what flce_backward computes (reduction 'none'); loss_per_token is
        # loss_i, and logprob_i = z_y − lse = −(loss_i of the plain problem: no smoothing, z-loss
        # or class weights), so their upstream gradients fold into one per-token g.
        g = None
        if g_loss is not None:
            if o["reduction"] == "none":
                g = g_loss.to(torch.float32).reshape(n)
            elif o["reduction"] == "sum":
                g = g_loss.to(torch.float32).reshape(()).expand(n)
            else:
                wv = _valid_weight(labels, class_weights, o["ignore_index"], o["vocab_total"])
                den = wv.sum()
                g = (g_loss.to(torch.float32) * torch.where(den != 0, 1.0 / den, 0.0)).expand(n)
        if g_lpt is not None:
            g = g_lpt.to(torch.float32).reshape(n) if g is None else g + g_lpt.to(torch.float32).reshape(n)
        if g_logprob is not None:
            glp = g_logprob.to(torch.float32).reshape(n)
            if plain:
                g = -glp if g is None else g - glp
            else:
                terms.append(("none", -glp, True))
        if g is not None:
            terms.append(("none", g, False))
    dh = dw = db = None
    eager = getattr(ctx, "eager", False)
    for reduction, g, plain_term in terms:
        g = g.to(torch.float32).contiguous()
        r = (_backward_impl if eager else backward_op)(
                        hidden, weight, labels, bias, None if plain_term else class_weights, lse, g, reduction,
                        o["ignore_index"], 0.0 if plain_term else o["label_smoothing"],
                        0.0 if plain_term else o["z_loss"], o["softcap"], o["temperature"], o["strategy"],
                        o["memory_budget"], grads, o["tp_rank"], o["tp_size"], o["vocab_offset"], o["vocab_total"],
                        o["comm"], gh_acc if need_dh else None, gw_acc if need_dw else None,
                        o["sequence_parallel"])
        if eager:  # the accumulators it added into, as the custom op's declaration would mark them
            _bump(gh_acc if need_dh else None, gw_acc if need_dw else None)
        r = [t if t.numel() else None for t in r]
        dh = r[0] if dh is None else (dh if r[0] is None else dh + r[0])
        dw = r[1] if dw is None else (dw if r[1] is None else dw + r[1])
        db = r[2] if db is None else (db if r[2] is None else db + r[2])
    return (dh if need_dh and gh_acc is None else None, dw if need_dw and gw_acc is None else None, None,
            db if need_db else None) + none[4:]


def _outputs_backward(ctx, g_loss, g_lse, g_logprob, g_entropy, g_lpt, none):
    """The gradients of the loss and of the differentiable per-token outputs in one library call:
    from the logits the forward kept (strategy 'saved'), or one chunked loss-and-grad."""
    o = ctx.o
    bits = o["grad_outputs"]
    hidden, weight, labels, bias, class_weights, lse, entropy, ws = ctx.saved_tensors
    gh_acc, gw_acc = ctx.acc
    need = ctx.needs_input_grad
    need_dh, need_dw, need_db = need[0], need[1], len(need) > 3 and need[3]
    if all(g is None for g in (g_loss, g_lse, g_logprob, g_entropy, g_lpt)):
        return none
    n = hidden.shape[0]
    f32 = torch.float32
    none_red = o["reduction"] == "none"
    go = torch.zeros((n,) if none_red else (), dtype=f32, device=hidden.device) if g_loss is None else \
        g_loss.to(f32).reshape((n,) if none_red else ())
    if none_red and g_lpt is not None:  # loss_per_token is the loss itself
        go, g_lpt = go + g_lpt.to(f32).reshape(n), None

    def per_token(g, bit):
        if not bits & bit:
            return None
        if g is None:
            # Under TP every rank must name the same upstream gradients (the library's collectives
            # depend on them, sequence parallelism all-gathers them): zeros where autograd has none.
            return torch.zeros(n, dtype=f32, device=hidden.device) if o["tp_size"] > 1 else None
        return g.to(f32).reshape(n).contiguous()

    grads = o["saved_grads"] if o["strategy"] == "saved" else \
        (GRAD_HIDDEN * bool(need_dh) | GRAD_WEIGHT * bool(need_dw) | GRAD_BIAS * bool(need_db))
    eager = getattr(ctx, "eager", False)
    r = (_backward_saved_impl if eager else backward_saved_op)(
        hidden, weight, labels, bias, class_weights, lse, entropy, ws, go.contiguous(),
        per_token(g_logprob, _lib.FLCE_GRAD_LOGPROB), per_token(g_lse, _lib.FLCE_GRAD_LSE),
        per_token(g_entropy, _lib.FLCE_GRAD_ENTROPY), per_token(g_lpt, _lib.FLCE_GRAD_LOSS_PER_TOKEN),
        o["reduction"], o["ignore_index"], o["label_smoothing"], o["z_loss"], o["softcap"], o["temperature"],
        o["memory_budget"], grads, bits, o["outputs"], gh_acc, gw_acc, o["batch_invariant"], o["tp_rank"],
        o["tp_size"], o["vocab_offset"], o["vocab_total"], o["comm"], o["sequence_parallel"])
    if eager:  # what the custom op's mutation declaration does: a second backward must see it
        _bump(ws, gh_acc if need_dh else None, gw_acc if need_dw else None)
    dh, dw, db = (t if t.numel() else None for t in r)
    return (dh if need_dh and gh_acc is None else None, dw if need_dw and gw_acc is None else None, None,
            db if need_db else None) + none[4:]


forward_op.register_autograd(_forward_backward, setup_context=_forward_setup)


def _bump(*tensors):
    """Version counters up for tensors the library wrote in place outside the dispatcher (the eager
    path's calls of the implementations), so autograd's saved-tensor checks still see the writes."""
    for t in tensors:
        if t is not None:
            torch.autograd.graph.increment_version(t)


class _EagerForward(torch.autograd.Function):
    """flce::forward's implementation and autograd formula without the dispatcher, for eager calls
    on plain tensors: the custom op's schema handling (filling defaults, the autograd and
    ADInplaceOrView layers) cost ~0.5 ms of host time per training step on the H100 machine's CPU
    (bench/NOTES.md, session 11), paid in full wherever a step waits for its loss. Same kernels,
    same outputs, same gradients; torch.compile, export and FakeTensor keep the custom ops."""

    @staticmethod
    def forward(ctx, *args):
        out = _forward_impl(*args)
        _forward_setup(ctx, args, out)
        ctx.eager = True  # backward calls the implementations directly too
        return out

    @staticmethod
    def backward(ctx, *grads):
        return _forward_backward(ctx, *grads)


def forward(*args):
    """flce::forward's result: through _EagerForward in eager mode on plain tensors, else the
    custom op (tracing, torch.compile, tensor subclasses)."""
    tensors = [a for a in args[:7] if isinstance(a, Tensor)]
    if torch.compiler.is_compiling() or any(_traced(t) for t in tensors):
        return forward_op(*args)
    return _EagerForward.apply(*args)


# ---- flce::backward ------------------------------------------------------------------------------

def _backward_outputs(hidden, weight, bias, grads, gh_acc, gw_acc):
    dev = hidden.device
    return (_empty(hidden.shape if grads & GRAD_HIDDEN and gh_acc is None else (0,), hidden.dtype, dev),
            _empty(weight.shape if grads & GRAD_WEIGHT and gw_acc is None else (0,), weight.dtype, dev),
            _empty(bias.shape if grads & GRAD_BIAS and bias is not None else (0,), hidden.dtype, dev))


def _backward_impl(hidden: Tensor, weight: Tensor, labels: Tensor, bias: Optional[Tensor],
                class_weights: Optional[Tensor], lse: Tensor, grad_output: Tensor, reduction: str,
                ignore_index: int, label_smoothing: float, z_loss: float, softcap: float, temperature: float,
                strategy: str, memory_budget: int, grads: int, tp_rank: int, tp_size: int, vocab_offset: int,
                vocab_total: int, comm: int, grad_hidden_acc: Optional[Tensor],
                grad_weight_acc: Optional[Tensor], sequence_parallel: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """(dh, dw, db) of Σ_i g_i·loss_i from the lse of an earlier forward: grad_output is g (one fp32
    value for mean/sum, N for none). A gradient whose `grads` bit is clear, or that goes into an
    accumulator (+= in fp32), comes back as an empty (0,) tensor."""
    from . import _Call
    hidden, weight, bias, class_weights = _dense(hidden), _dense(weight), _dense(bias), _dense(class_weights, 4)
    labels, lse, grad_output = _dense(labels, labels.element_size()), _dense(lse, 4), _dense(grad_output, 4)
    for name, acc in (("grad_hidden_acc", grad_hidden_acc), ("grad_weight_acc", grad_weight_acc)):
        if acc is not None and not (acc.is_contiguous() and acc.data_ptr() % 16 == 0):
            raise ValueError(f"{name}: must be contiguous and 16-byte aligned (flce adds into it in place)")
    opts = _options(reduction, ignore_index, label_smoothing, z_loss, softcap, temperature, strategy, memory_budget)
    dh, dw, db = _backward_outputs(hidden, weight, bias, grads, grad_hidden_acc, grad_weight_acc)
    tp = _tp(tp_rank, tp_size, vocab_offset, vocab_total, comm, sequence_parallel)
    call = _Call(hidden, weight, labels, opts, tp, bias=bias, class_weights=class_weights)
    gh = grad_hidden_acc if grads & GRAD_HIDDEN and grad_hidden_acc is not None else _given(dh)
    gw = grad_weight_acc if grads & GRAD_WEIGHT and grad_weight_acc is not None else _given(dw)
    if gh is not None and grad_hidden_acc is not None and gh is grad_hidden_acc:
        call.problem.accumulate_grad_hidden = 1
    if gw is not None and grad_weight_acc is not None and gw is grad_weight_acc:
        call.problem.accumulate_grad_weight = 1
    if gh is None and gw is None:
        # flce_backward needs dH or dW; only the bias gradient was asked for: a scratch dH
        gh = torch.empty_like(hidden)
    call(_lib.FLCE_OP_BACKWARD, strategy, grad_output=grad_output, lse=lse, grad_hidden=gh, grad_weight=gw,
         grad_bias=_given(db))
    return dh, dw, db


backward_op = torch.library.custom_op("flce::backward", mutates_args=("grad_hidden_acc", "grad_weight_acc"))(
    _backward_impl)


@backward_op.register_fake
def _backward_fake(hidden, weight, labels, bias, class_weights, lse, grad_output, reduction, ignore_index,
                   label_smoothing, z_loss, softcap, temperature, strategy, memory_budget, grads, tp_rank, tp_size,
                   vocab_offset, vocab_total, comm, grad_hidden_acc, grad_weight_acc, sequence_parallel=0):
    return _backward_outputs(hidden, weight, bias, grads, grad_hidden_acc, grad_weight_acc)


# ---- flce::backward_saved ------------------------------------------------------------------------

def _backward_saved_impl(hidden: Tensor, weight: Tensor, labels: Tensor, bias: Optional[Tensor],
                         class_weights: Optional[Tensor], lse: Tensor, entropy: Optional[Tensor],
                         workspace: Optional[Tensor], grad_output: Tensor, grad_logprob: Optional[Tensor],
                         grad_lse: Optional[Tensor], grad_entropy: Optional[Tensor],
                         grad_loss_per_token: Optional[Tensor], reduction: str, ignore_index: int,
                         label_smoothing: float, z_loss: float, softcap: float, temperature: float,
                         memory_budget: int, grads: int, grad_outputs: int, outputs: int,
                         grad_hidden_acc: Optional[Tensor], grad_weight_acc: Optional[Tensor],
                         batch_invariant: int = 0, tp_rank: int = 0, tp_size: int = 1, vocab_offset: int = 0,
                         vocab_total: int = 0, comm: int = 0, sequence_parallel: int = 0
                         ) -> Tuple[Tensor, Tensor, Tensor]:
    """(dh, dw, db) of g·loss + Σ_i (g_lp,i·logprob_i + g_lse,i·lse_i + g_H,i·entropy_i + g_i·loss_i):
    grad_output is the loss's upstream gradient (one value for mean/sum, N for none), the others N
    values or None (zeros). With `workspace` (strategy 'saved') from the logits the forward kept
    there, which become dZ in place; without, one chunked flce_loss_and_grad (the logits again).
    grad_outputs: the FLCE_GRAD_* bits of the forward; outputs: its OUT_* bits. The tp fields as
    flce::forward's; without `comm` (the split-phase route of python/flce/parallel.py) dh is this
    rank's partial sum, added into grad_hidden_acc, and `workspace` is required."""
    from . import _Call
    hidden, weight, bias, class_weights = _dense(hidden), _dense(weight), _dense(bias), _dense(class_weights, 4)
    labels, lse, grad_output = _dense(labels, labels.element_size()), _dense(lse, 4), _dense(grad_output, 4)
    opts = _options(reduction, ignore_index, label_smoothing, z_loss, softcap, temperature,
                    "saved" if workspace is not None else "chunked", memory_budget, batch_invariant)
    dh, dw, db = _backward_outputs(hidden, weight, bias, grads, grad_hidden_acc, grad_weight_acc)
    tp = _tp(tp_rank, tp_size, vocab_offset, vocab_total, comm, sequence_parallel)
    call = _Call(hidden, weight, labels, opts, tp, bias=bias, class_weights=class_weights)
    _saved_problem(call, grad_outputs, grad_hidden_acc if grads & GRAD_HIDDEN else None,
                   grad_weight_acc if grads & GRAD_WEIGHT else None)
    gh = grad_hidden_acc if grads & GRAD_HIDDEN and grad_hidden_acc is not None else _given(dh)
    gw = grad_weight_acc if grads & GRAD_WEIGHT and grad_weight_acc is not None else _given(dw)
    if gh is None and gw is None:  # the bias alone: a scratch dH (the forward named one too)
        gh = torch.empty_like(hidden)
    upstream = dict(grad_output=grad_output, grad_logprob=_dense(grad_logprob, 4), grad_lse=_dense(grad_lse, 4),
                    grad_entropy=_dense(grad_entropy, 4), grad_loss_per_token=_dense(grad_loss_per_token, 4))
    if workspace is not None and workspace.numel():
        ws = workspace
        mark = {k: ws if outputs & bit else None for k, bit in (("logprob", OUT_LOGPROB), ("entropy", OUT_ENTROPY),
                ("argmax", OUT_ARGMAX), ("zl", OUT_ZLOSS), ("lpt", OUT_LOSS_PER_TOKEN))}
        if entropy is not None:
            mark["entropy"] = _dense(entropy, 4)
        fields = _saved_fields(ws, lse, ws=ws, saved_grads=grads, bias=bias, **mark)
        fields.update(grad_hidden=gh, grad_weight=gw, grad_bias=_given(db))
        call(_lib.FLCE_OP_BACKWARD, "saved", workspace=ws, **fields, **upstream)
        return dh, dw, db
    n, dev = hidden.shape[0], hidden.device
    scratch = dict(loss=torch.empty((n,) if reduction == "none" else (), dtype=torch.float32, device=dev),
                   lse=torch.empty(n, dtype=torch.float32, device=dev))
    if grad_outputs & _lib.FLCE_GRAD_ENTROPY:
        scratch["entropy"] = torch.empty(n, dtype=torch.float32, device=dev)
    call(_lib.FLCE_OP_LOSS_AND_GRAD, "chunked", grad_hidden=gh, grad_weight=gw, grad_bias=_given(db), **scratch,
         **upstream)
    return dh, dw, db


backward_saved_op = torch.library.custom_op(
    "flce::backward_saved", mutates_args=("workspace", "grad_hidden_acc", "grad_weight_acc"))(_backward_saved_impl)


@backward_saved_op.register_fake
def _backward_saved_fake(hidden, weight, labels, bias, class_weights, lse, entropy, workspace, grad_output,
                         grad_logprob, grad_lse, grad_entropy, grad_loss_per_token, reduction, ignore_index,
                         label_smoothing, z_loss, softcap, temperature, memory_budget, grads, grad_outputs, outputs,
                         grad_hidden_acc, grad_weight_acc, batch_invariant=0, tp_rank=0, tp_size=1, vocab_offset=0,
                         vocab_total=0, comm=0, sequence_parallel=0):
    return _backward_outputs(hidden, weight, bias, grads, grad_hidden_acc, grad_weight_acc)


# ---- flce::scale_gradients_ ----------------------------------------------------------------------

def _scale_impl(grad_hidden: Optional[Tensor], grad_weight: Optional[Tensor], grad_bias: Optional[Tensor],
                     grad_output: Tensor, tokens: int, hidden: int, vocab: int, dtype: torch.dtype,
                     label_dtype: torch.dtype, reduction: str, ignore_index: int, label_smoothing: float,
                     z_loss: float, softcap: float, temperature: float, memory_budget: int, has_bias: bool,
                     has_class_weights: bool, tp_rank: int, tp_size: int, vocab_offset: int,
                     vocab_total: int, sequence_parallel: int = 0) -> None:
    """The gradients an flce::forward with `grads` wrote, times the fp32 scalar grad_output, in
    place (flce_scale_gradients; the problem's fields must be the forward's)."""
    from . import _Call, _problem
    opts = _options(reduction, ignore_index, label_smoothing, z_loss, softcap, temperature, "auto", memory_budget)
    call = _Call.__new__(_Call)
    call.device = grad_output.device
    call.problem = _problem(tokens, hidden, vocab, dtype, label_dtype, opts,
                            _tp(tp_rank, tp_size, vocab_offset, vocab_total, 0, sequence_parallel), has_bias,
                            has_class_weights)
    call.comm = None
    call.scale(grad_output, grad_hidden, grad_weight, grad_bias)


scale_gradients_ = torch.library.custom_op("flce::scale_gradients_",
                                           mutates_args=("grad_hidden", "grad_weight", "grad_bias"))(_scale_impl)


@scale_gradients_.register_fake
def _scale_fake(*args):
    return None


# ---- flce::not_differentiable --------------------------------------------------------------------

@torch.library.custom_op("flce::not_differentiable", mutates_args=())
def not_differentiable(x: Tensor, anchor: Tensor, what: str) -> Tensor:
    """A copy of x that takes part in autograd (through `anchor`, an input that requires grad) so
    that a gradient reaching it raises NotImplementedError instead of silently being dropped."""
    return x.clone()


@not_differentiable.register_fake
def _not_differentiable_fake(x, anchor, what):
    return torch.empty_like(x)


def _nd_setup(ctx, inputs, output):
    ctx.what = inputs[2]


def _nd_backward(ctx, grad):
    if grad is None:
        return None, None, None
    raise NotImplementedError(
        f"flce: a gradient reached the per-token output '{ctx.what}', which is not differentiable "
        f"(libflce computes the gradients of the loss, logprobs, loss_per_token, lse and entropy). Use "
        f"{ctx.what}.detach() (under torch.compile: return it detached from the compiled function) or "
        f"compute it under torch.no_grad(); for a z-loss term use the z_loss= option.")


not_differentiable.register_autograd(_nd_backward, setup_context=_nd_setup)
