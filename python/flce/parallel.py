"""parallel.py — vocab-parallel (tensor-parallel) fused linear cross-entropy for torch.distributed.

Each rank of a process group holds the weight rows [vocab_offset, vocab_offset + V_r) of a vocab of
vocab_total ids (and the bias entries of those rows); the shards tile [0, vocab_total) in rank order.
The tokens are either all N on every rank (every rank gets the same loss and per-token outputs, bit
for bit), or, with sequence_parallel=True (Megatron's sequence parallelism), rank r holds rows
r·N_local ... of the tp·N_local tokens: its per-token outputs and its hidden's gradient are those
rows, and the loss (a mean over the valid tokens of all ranks) is the same on every rank.

Everything linear_cross_entropy offers works here too: bias, class weights, smoothing, z-loss,
softcap, temperature, fp32 accumulators, the return_* outputs (logprobs, loss_per_token, lse and
entropy differentiable: RL objectives under TP), batch_invariant. A group of one rank is
linear_cross_entropy. Two ways to run the collectives:

  comm=NcclComm(group) flce issues the NCCL collectives itself on its own communicator (one
                       all-gather of a few floats per token chunk, dH summed in fp32 and rounded
                       once; under sequence parallelism the inputs all-gathered and dH
                       reduce-scattered), through the custom ops of linear_cross_entropy
                       (python/flce/_ops.py) with the tensor-parallel fields.
  comm=None (default)  split phase through torch.distributed: flce_forward_stats, then ONE
                       all_gather_into_tensor of a few floats per token, then flce_forward_finish;
                       flce_backward writes this rank's partial dH in fp32, all-reduced (under
                       sequence parallelism reduce-scattered) before it is rounded. Sequence
                       parallelism all-gathers hidden and labels (and in backward the per-token
                       upstream gradients) first and runs the tensor-parallel problem on them.

Gradients, as on one GPU: with 16-bit inputs the forward keeps this rank's compact logits of all
tokens (strategy 'saved', 2 bytes per logit of its shard; under sequence parallelism of all ranks'
tokens) and backward forms dZ from them with every upstream gradient at once (6·N·V_r·D). Where
they do not fit memory_budget, or with fp32 inputs: with comm, the gradients of per-token outputs
come from one chunked loss-and-grad in backward (a plain mean or sum loss: computed in forward and
scaled in backward, as before); with comm=None, backward recomputes the logits from the saved lse
for the gradients of the loss, logprobs and loss_per_token, and a gradient reaching lse or entropy
raises NotImplementedError (use comm=NcclComm, or 16-bit inputs within the budget).
"""
from __future__ import annotations  # dist.ProcessGroup: only for type checkers (not every build has it)

import ctypes
import operator
from typing import NamedTuple, Optional, Union

import torch
import torch.distributed as dist

from . import _lib, _ops
from . import (LinearCrossEntropyOutput, _Call, _autocast, _check_args, _check_extra, _check_scalars, _Options,
               _apply, _registered_comms, _shift_labels, _unshift, linear_cross_entropy)
from ._ops import GRAD_BIAS, GRAD_HIDDEN, GRAD_WEIGHT


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]  # NCCL_UNIQUE_ID_BYTES


class NcclComm:
    """An NCCL communicator over the ranks of a torch.distributed group, for flce to issue its own
    collectives on. Create it on every rank of `group` (collectively), after
    torch.cuda.set_device(). It uses the libnccl that libflce and PyTorch share in this process."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None, register: bool = False) -> None:
        """register=True: flce's calls on this communicator use one workspace kept for its lifetime
        and registered with it (ncclCommRegister), so NCCL may run flce's collectives without its
        staging copies. Give every rank of the group the same value (NCCL wants all ranks' buffers
        registered or none). The workspace only grows (a device sync then, so grow it before a
        CUDA graph capture by running once) and is held until close()."""
        _lib.lib()  # libflce first: its libnccl.so.2 is the one we call
        self._nccl = ctypes.CDLL("libnccl.so.2")
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        uid = _UniqueId()
        if self.rank == 0:
            self._try(self._nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        dev = torch.device("cuda", torch.cuda.current_device())
        raw = ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))  # all 128 bytes, NULs too
        buf = torch.tensor(list(raw), dtype=torch.uint8, device=dev)
        dist.broadcast(buf, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        uid = _UniqueId.from_buffer_copy(bytes(buf.cpu().tolist()))
        self.ptr = ctypes.c_void_p()
        self._try(self._nccl.ncclCommInitRank(ctypes.byref(self.ptr), self.size, uid, self.rank),
                  "ncclCommInitRank")
        self.register = bool(register)
        self._ws, self._ws_handle, self._ws_stream = None, ctypes.c_void_p(), None
        if self.register:
            _registered_comms[self.ptr.value] = self

    def workspace(self, nbytes, device):
        """The registered workspace, at least nbytes (register=True only)."""
        stream = torch.cuda.current_stream(device)
        if self._ws is not None and stream != self._ws_stream:
            torch.cuda.synchronize(device)  # one buffer, calls on another stream: the last ones first
        self._ws_stream = stream
        if self._ws is None or self._ws.numel() < nbytes:
            self._release_workspace()
            size = max(nbytes + (64 << 20) - 1, 64 << 20) // (64 << 20) * (64 << 20)  # fewer regrowths
            self._ws = torch.empty(size, dtype=torch.uint8, device=device)
            self._try(self._nccl.ncclCommRegister(self.ptr, ctypes.c_void_p(self._ws.data_ptr()),
                                                  ctypes.c_size_t(size), ctypes.byref(self._ws_handle)),
                      "ncclCommRegister")
        return self._ws

    def _release_workspace(self):
        if self._ws is None:
            return
        # Queued collectives may still use it: NCCL's registration must outlive them.
        torch.cuda.synchronize(self._ws.device)
        if self._ws_handle.value:
            self._try(self._nccl.ncclCommDeregister(self.ptr, self._ws_handle), "ncclCommDeregister")
        self._ws, self._ws_handle = None, ctypes.c_void_p()

    def _try(self, r, what):
        if r != 0:
            self._nccl.ncclGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: {self._nccl.ncclGetErrorString(r).decode()}")

    def close(self) -> None:
        if self.ptr:
            _registered_comms.pop(self.ptr.value, None)
            self._release_workspace()
            self._nccl.ncclCommDestroy(self.ptr)
            self.ptr = ctypes.c_void_p()



# ---- comm=None: the split phase through torch.distributed --------------------------------------

def _gather_rows(x, group, size):
    """Every rank's x (the same shape on each) stacked along dim 0 in rank order."""
    x = x.contiguous()
    out = torch.empty((size * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x, group=group)
    return out


class _Split(NamedTuple):
    """What _SplitPhase takes besides the tensors autograd differentiates. The accumulators ride
    here, not as inputs: other micro-batches add into them between forward and backward, which a
    saved tensor's version check would refuse (as in python/flce/_ops.py)."""
    opts: _Options
    tp: tuple                 # _Call's (rank, size, vocab_offset, vocab_total, None, 0)
    group: object             # the torch.distributed group (None: the default one)
    sp: bool                  # sequence parallelism: hidden and labels are this rank's rows
    outputs: int              # _ops.OUT_* bits of the per-token outputs asked for
    bits: int                 # FLCE_GRAD_* bits of those that carry gradients (0 without gradients)
    need: tuple               # (need_dh, need_dw, need_db)
    gh_acc: Optional[torch.Tensor]
    gw_acc: Optional[torch.Tensor]


def _split_outputs(res, ws, saved_grads, bias):
    """flce_tensors fields of the forward halves: the same outputs in both (argmax and entropy need
    them in the stats half too), and with the saved logits the gradients' stand-ins that make the
    set of pointers the backward's (python/flce/_ops.py _saved_fields)."""
    if ws is not None:
        return _ops._saved_fields(*res[:7], ws=ws, saved_grads=saved_grads, bias=bias)
    loss, lse, lp, ent, am, zl, lpt = res[:7]
    g = _ops._given
    return dict(loss=loss, lse=lse, target_logprob=g(lp), entropy=g(ent), argmax=g(am), z_loss_out=g(zl),
                loss_per_token=g(lpt))


class _SplitPhase(torch.autograd.Function):
    """comm=None: the forward in two halves around torch.distributed's all-gather; backward from
    the saved logits (16-bit, when they fit) or from the saved lse (flce_backward recomputes the
    logits), with this rank's partial dH in fp32 summed over the ranks before it is rounded.
    Outputs: flce::forward's first seven (loss, lse, logprob, entropy, argmax, z_loss,
    loss_per_token), this rank's rows under sequence parallelism."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, class_weights, labels, cfg):
        opts, (rank, size) = cfg.opts, cfg.tp[:2]
        n_local = hidden.shape[0]
        h = _gather_rows(hidden, cfg.group, size) if cfg.sp else hidden
        y = _gather_rows(labels, cfg.group, size) if cfg.sp else labels
        call = _Call(h, weight, y, opts, cfg.tp, bias=bias, class_weights=class_weights)
        # (asked before the saved fields are set: the block depends on the token count only)
        stats = torch.empty(_lib.tp_stats_bytes(call.problem), dtype=torch.uint8, device=h.device)
        gathered = torch.empty(stats.numel() * size, dtype=torch.uint8, device=h.device)
        need_dh, need_dw, need_db = cfg.need
        ws, saved_grads = None, 0
        if any(cfg.need) and h.dtype != torch.float32 and opts.strategy in ("auto", "saved"):
            # The saved logits: all three calls take the same problem and pointers; dH is always
            # this rank's partial sum, added into an fp32 buffer of ours (accumulate_grad_hidden).
            saved_grads = GRAD_HIDDEN * (need_dh or not need_dw) | GRAD_WEIGHT * need_dw | GRAD_BIAS * need_db
            _ops._saved_problem(call, cfg.bits, True if saved_grads & GRAD_HIDDEN else None,
                                cfg.gw_acc if saved_grads & GRAD_WEIGHT else None)
            res = _ops._saved_outputs(call, h, weight, bias, opts.reduction, cfg.outputs)
            if res[10].numel():
                ws = res[10]
            else:  # all tokens' logits do not fit: a plain forward, backward from lse
                _ops._saved_problem(call, 0, None, None)
                saved_grads = 0
        else:
            res = _ops._forward_outputs(h, weight, bias, opts.reduction, cfg.outputs, 0)
        fields = _split_outputs(res, ws, saved_grads, bias)
        strategy = "saved" if ws is not None else "auto"
        call(_lib.FLCE_OP_FORWARD, strategy, half="flce_forward_stats", buffer=stats, workspace=ws, **fields)
        dist.all_gather_into_tensor(gathered, stats, group=cfg.group)
        call(_lib.FLCE_OP_FORWARD, strategy, half="flce_forward_finish", buffer=gathered, workspace=ws, **fields)
        loss, lse, lp, ent, am, zl, lpt = res[:7]

        ctx.cfg, ctx.saved_grads, ctx.n_local, ctx.dtype = cfg, saved_grads, n_local, hidden.dtype
        ctx.has_ws = ws is not None
        keep_ent = ent if ws is not None and cfg.bits & _lib.FLCE_GRAD_ENTROPY else None
        ctx.save_for_backward(h, weight, y, bias, class_weights, lse, keep_ent, ws)
        ctx.set_materialize_grads(False)
        out = [loss, lse, lp, ent, am, zl, lpt]
        if cfg.sp:  # this rank's rows of every per-token output (the scalars are every rank's)
            n, rows = h.shape[0], slice(rank * n_local, (rank + 1) * n_local)
            out = [t[rows].clone() if t.dim() == 1 and t.shape[0] == n else t for t in out]
        ctx.mark_non_differentiable(out[4])
        return tuple(out)

    @staticmethod
    def backward(ctx, g_loss, g_lse, g_lp, g_ent, g_am, g_zl, g_lpt):
        cfg = ctx.cfg
        opts, (rank, size, offset, total) = cfg.opts, cfg.tp[:4]
        none = (None,) * 6
        if g_zl is not None:
            raise NotImplementedError(
                "flce: a gradient reached the per-token output 'z_loss', which is not differentiable; use the "
                "z_loss= option (or lse: z_loss·lse² written by hand), or z_loss.detach()")
        if not ctx.has_ws and (g_lse is not None or g_ent is not None):
            raise NotImplementedError(
                "flce.vocab_parallel_cross_entropy(comm=None): the gradients of lse and entropy need the saved "
                "logits (16-bit inputs whose compact logits of all tokens fit memory_budget, strategy 'auto' or "
                "'saved'); pass comm=flce.NcclComm(group), or detach lse/entropy")
        if ctx.needs_input_grad[3]:
            raise NotImplementedError("flce: class weights are not differentiable (as in F.cross_entropy); pass them "
                                      "detached")
        h, weight, y, bias, cw, lse, ent, ws = ctx.saved_tensors
        need_dh, need_dw, need_db = ctx.needs_input_grad[:3]
        if not (need_dh or need_dw or need_db):
            return none
        n, f32, dev = h.shape[0], torch.float32, h.device
        red, outputs, bits = opts.reduction, cfg.outputs, cfg.bits

        def full(g, present):
            """A per-token upstream gradient over all n tokens, fp32 (None: zeros or absent). Under
            sequence parallelism every rank gathers every output it returned, zeros where autograd
            has no gradient, so that all ranks issue the same collectives."""
            if not present or (g is None and not cfg.sp):
                return None
            g = torch.zeros(ctx.n_local, dtype=f32, device=dev) if g is None else g.to(f32).reshape(-1)
            return _gather_rows(g, cfg.group, size) if cfg.sp else g.contiguous()

        if red == "none":
            go = full(g_loss, True)
            go = torch.zeros(n, dtype=f32, device=dev) if go is None else go
        else:  # the scalar loss is every rank's: its upstream gradient must be the same on each
            go = torch.zeros((), dtype=f32, device=dev) if g_loss is None else g_loss.to(f32).reshape(())
        glp = full(g_lp, outputs & _ops.OUT_LOGPROB)
        glpt = full(g_lpt, outputs & _ops.OUT_LOSS_PER_TOKEN)
        if red == "none" and glpt is not None:  # loss_per_token is the loss itself
            go, glpt = go + glpt, None
        eps, lam = float(opts.label_smoothing), float(opts.z_loss)
        common = (int(opts.ignore_index), eps, lam, float(opts.softcap), float(opts.temperature))
        budget = int(opts.memory_budget or 0)
        tp_args = (rank, size, offset, total, 0)
        gw_acc = cfg.gw_acc if need_dw else None

        if ctx.has_ws:
            glse = full(g_lse, bits & _lib.FLCE_GRAD_LSE)
            gent = full(g_ent, bits & _lib.FLCE_GRAD_ENTROPY)
            dh32 = torch.zeros(h.shape, dtype=f32, device=dev) if ctx.saved_grads & GRAD_HIDDEN else None
            _, dw, db = _ops._backward_saved_impl(
                h, weight, y, bias, cw, lse, ent, ws, go.contiguous(),
                glp if bits & _lib.FLCE_GRAD_LOGPROB else None, glse, gent,
                glpt if bits & _lib.FLCE_GRAD_LOSS_PER_TOKEN else None, red, *common, budget, ctx.saved_grads, bits,
                outputs, dh32, gw_acc, int(opts.batch_invariant), *tp_args, 0)
            _ops._bump(ws, gw_acc)  # the logits became dZ in place: a second backward must raise
            dw = dw if dw.numel() else None
            db = db if db.numel() else None
        else:
            # From lse (flce_backward recomputes the logits): loss_per_token is loss_i and logprob_i
            # is −loss_i of the plain problem, so their upstream gradients fold into per-token ones
            # (python/flce/_ops.py _forward_backward), with the mean's denominator over all tokens.
            terms = []  # (reduction, upstream gradient, plain problem?)
            if glp is None and glpt is None:
                terms.append((red, go, False))
            else:
                if red == "none":
                    g = go
                elif red == "sum":
                    g = go.expand(n)
                else:
                    den = _ops._valid_weight(y, cw, opts.ignore_index, total).sum()
                    g = (go * torch.where(den != 0, 1.0 / den, 0.0)).expand(n)
                if glpt is not None:
                    g = g + glpt
                if glp is not None:
                    if eps == 0 and lam == 0 and cw is None:
                        g = g - glp
                    else:
                        terms.append(("none", -glp, True))
                terms.append(("none", g, False))
            grads = GRAD_HIDDEN * bool(need_dh) | GRAD_WEIGHT * bool(need_dw) | GRAD_BIAS * bool(need_db)
            strategy = "auto" if opts.strategy == "saved" else opts.strategy
            dh32 = torch.zeros(h.shape, dtype=f32, device=dev) if need_dh else None
            # several terms: dW summed in fp32 and rounded once
            dw_acc = gw_acc if gw_acc is not None else \
                (torch.zeros(weight.shape, dtype=f32, device=dev) if need_dw and len(terms) > 1 else None)
            dw = db = None
            for reduction, g, plain in terms:
                _, dw_t, db_t = _ops._backward_impl(
                    h, weight, y, bias, None if plain else cw, lse, g.to(f32).contiguous(), reduction,
                    common[0], 0.0 if plain else eps, 0.0 if plain else lam, common[3], common[4], strategy, budget,
                    grads, *tp_args, dh32, dw_acc, 0)
                dw = dw_t if dw_t.numel() else dw
                db = db if not db_t.numel() else (db_t if db is None else db + db_t)
            if dw_acc is not None and gw_acc is None:
                dw = dw_acc.to(weight.dtype)
            _ops._bump(gw_acc)

        dh = None
        if need_dh:
            if cfg.sp:
                part = torch.empty((ctx.n_local, h.shape[1]), dtype=f32, device=dev)
                dist.reduce_scatter_tensor(part, dh32, group=cfg.group)
            else:
                dist.all_reduce(dh32, group=cfg.group)
                part = dh32
            if cfg.gh_acc is not None:
                cfg.gh_acc.view(part.shape).add_(part)
            else:
                dh = part.to(ctx.dtype)
        return (dh, dw if need_dw and cfg.gw_acc is None else None, db if need_db else None, None, None, None)


def _split_phase(hidden, weight, labels, opts, tp, bias, class_weights, gh_acc, gw_acc, want, s, group, sp):
    """comm=None: checked arguments -> _SplitPhase -> the loss or a LinearCrossEntropyOutput."""
    lead = labels.shape
    h2, y1 = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    if h2.shape[0] == 0:  # no tokens (on every rank): zeros without a collective, as on one GPU
        return _apply(hidden, weight, labels, opts, tp, bias, class_weights, gh_acc, gw_acc, want, s)
    cw = None if class_weights is None else class_weights.to(torch.float32).contiguous()
    grad_on = torch.is_grad_enabled()
    need = (grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
            grad_on and bias is not None and bias.requires_grad)
    outputs = (_ops.OUT_LOGPROB * want["logprobs"] | _ops.OUT_ENTROPY * want["entropy"] |
               _ops.OUT_ARGMAX * want["argmax"] | _ops.OUT_ZLOSS * want["z_loss"] |
               _ops.OUT_LOSS_PER_TOKEN * want["loss_per_token"])
    bits = 0
    if any(need):
        bits = (_lib.FLCE_GRAD_LOGPROB * want["logprobs"] | _lib.FLCE_GRAD_LSE * want["lse"] |
                _lib.FLCE_GRAD_ENTROPY * want["entropy"] |
                _lib.FLCE_GRAD_LOSS_PER_TOKEN * (want["loss_per_token"] and opts.reduction != "none"))
    cfg = _Split(opts, tp, group, bool(sp), outputs, bits, need, gh_acc, gw_acc)
    loss, lse, lp, ent, am, zl, lpt = _SplitPhase.apply(h2, weight, bias, cw, y1, cfg)
    if opts.reduction == "none":
        loss = _unshift(loss.reshape(lead), s)
    if not any(want.values()):
        return loss

    def per_token(x, fill=0):
        return _unshift(x.reshape(lead), s, fill)
    return LinearCrossEntropyOutput(
        loss, per_token(lse) if want["lse"] else None, per_token(lp) if want["logprobs"] else None,
        per_token(ent) if want["entropy"] else None, per_token(am, -1) if want["argmax"] else None,
        (per_token(zl) if opts.reduction == "none" else zl) if want["z_loss"] else None,
        per_token(lpt) if want["loss_per_token"] else None)


# ---- the entry point -----------------------------------------------------------------------------

def _check_shard(vocab_offset, vocab_total, shard):
    """(vocab_offset, vocab_total) as ints, with this rank's `shard` weight rows inside [0, vocab_total)
    (TypeError, ValueError naming them). Shared by the vocab-parallel calls (distill.py too)."""
    for name, x in (("vocab_offset", vocab_offset), ("vocab_total", vocab_total)):
        try:
            ok = not isinstance(x, bool) and operator.index(x) is not None
        except TypeError:
            ok = False
        if not ok:
            raise TypeError(f"{name}: expected an int, got {type(x).__name__} {x!r}")
    offset, total = operator.index(vocab_offset), operator.index(vocab_total)
    if offset < 0 or total < 1 or offset + shard > total:
        raise ValueError(f"vocab_offset={offset}, vocab_total={total}: this rank's {shard} weight rows must lie in "
                         f"[0, vocab_total) (need 0 <= vocab_offset and vocab_offset + weight.shape[0] <= vocab_total)")
    return offset, total


def _group_rank(group, comm, caller):
    """This process's (rank, size) in `group`, with comm (None or a flce.NcclComm) checked against it."""
    if comm is not None and not isinstance(comm, NcclComm):
        raise TypeError(f"comm: expected None or a flce.NcclComm, got {type(comm).__name__}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{caller}: torch.distributed is not initialized "
                           "(torch.distributed.init_process_group first)")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of it")
    if comm is not None:
        if not comm.ptr:
            raise ValueError("comm: closed (NcclComm.close() was called)")
        if comm.rank != rank or comm.size != size:
            raise ValueError(f"comm: rank {comm.rank} of {comm.size}, but the group has rank {rank} of {size}")
    return rank, size


def _check_one_rank(offset, total, shard):
    """A group of one rank holds the whole vocab."""
    if offset != 0 or total != shard:
        raise ValueError(f"vocab_offset={offset}, vocab_total={total}: a group of one rank holds the whole "
                         f"vocab (need vocab_offset=0 and vocab_total=weight.shape[0]={shard})")


def vocab_parallel_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                                 vocab_offset: int, vocab_total: int, group: Optional[dist.ProcessGroup] = None,
                                 comm: Optional[NcclComm] = None, sequence_parallel: bool = False,
                                 bias: Optional[torch.Tensor] = None, class_weights: Optional[torch.Tensor] = None,
                                 ignore_index: int = -100, reduction: str = "mean",
                                 memory_budget: Optional[int] = None, strategy: str = "auto",
                                 label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: Optional[float] = 0.0,
                                 temperature: float = 1.0, shift: int = 0,
                                 grad_weight_accumulator: Optional[torch.Tensor] = None,
                                 grad_hidden_accumulator: Optional[torch.Tensor] = None, return_lse: bool = False,
                                 return_logprobs: bool = False, return_entropy: bool = False,
                                 return_argmax: bool = False, return_z_loss: bool = False,
                                 return_loss_per_token: bool = False, batch_invariant: bool = False
                                 ) -> Union[torch.Tensor, LinearCrossEntropyOutput]:
    """cross_entropy(hidden @ W.T + b, labels) where W (vocab_total, D) is sharded by rows over the
    ranks of `group`: this rank holds weight = W[vocab_offset : vocab_offset + V_r] (and bias =
    b[vocab_offset : vocab_offset + V_r]); the shards tile [0, vocab_total) in rank order. Every
    rank of the group calls it with the same options (collectively).

    hidden, labels: the same (N, D) / (N,) (or (..., D) / (...)) on every rank; labels are global
        ids. sequence_parallel=True: this rank's rows of the tp·N_local tokens instead (rank r holds
        rows r·N_local ... of the flattened tokens; the same N_local on every rank).
    comm: None (torch.distributed's collectives, split phase) or flce.NcclComm(group) (flce's own
        NCCL calls); see this module's docstring.
    bias: this rank's shard (V_r,), differentiable (its gradient is the shard's).
    class_weights: the global (vocab_total,) weights, the same on every rank; not differentiable.
    shift: as linear_cross_entropy's; not with sequence_parallel (the last rows of a rank would
        need the next rank's labels): shift the labels before sharding them.
    grad_weight_accumulator: fp32 like weight (this rank's shard); grad_hidden_accumulator: fp32
        like hidden (under sequence parallelism this rank's rows).
    Other options and the return_* outputs: as flce.linear_cross_entropy, over the whole vocab (the
    argmax is a global id); logprobs, loss_per_token, lse and entropy are differentiable (but see
    the module docstring for lse and entropy with comm=None).

    Returns the loss (or a LinearCrossEntropyOutput), the same on every rank: 'mean' divides by the
    valid tokens of all ranks. Per-token values (reduction 'none', the return_* outputs) are every
    token's, or with sequence_parallel this rank's rows. Gradients: hidden's is summed over the
    ranks (this rank's rows under sequence parallelism), weight's and bias's are this rank's shard.
    The upstream gradient of the scalar loss must be the same on every rank (as loss.backward()
    gives), and without sequence parallelism so must the per-token outputs' ones.
    A group of one rank runs flce.linear_cross_entropy (vocab_offset 0, vocab_total V_r).
    Under torch.autocast hidden, weight and bias are cast to its dtype first, as
    linear_cross_entropy does.
    """
    hidden, weight, bias = _autocast(hidden, weight, bias)
    _check_args(hidden, weight, labels, reduction, strategy, memory_budget)
    _check_scalars(ignore_index, label_smoothing, z_loss, softcap, temperature, shift, batch_invariant)
    softcap = 0.0 if softcap is None else softcap
    shard = weight.shape[0]
    offset, total = _check_shard(vocab_offset, vocab_total, shard)
    if not isinstance(sequence_parallel, bool) and sequence_parallel not in (0, 1):
        raise TypeError(f"sequence_parallel: expected a bool, got {type(sequence_parallel).__name__} "
                        f"{sequence_parallel!r}")
    _check_extra(hidden, weight, bias, class_weights, total, grad_hidden_accumulator, grad_weight_accumulator)
    s = operator.index(shift)
    if sequence_parallel and s != 0:
        raise ValueError(f"shift: {shift!r} with sequence_parallel: the next rank's labels are needed; shift the "
                         f"labels before sharding (labels[..., s:] and s ignored positions, on the whole sequence)")
    rank, size = _group_rank(group, comm, "vocab_parallel_cross_entropy")
    want = dict(lse=return_lse, logprobs=return_logprobs, entropy=return_entropy, argmax=return_argmax,
                z_loss=return_z_loss, loss_per_token=return_loss_per_token)
    want = {k: bool(v) for k, v in want.items()}
    if size == 1:
        # One rank holds the whole vocab (and all tokens): one GPU's call, no collectives.
        _check_one_rank(offset, total, shard)
        return linear_cross_entropy(
            hidden, weight, labels, bias=bias, class_weights=class_weights, ignore_index=ignore_index,
            reduction=reduction, memory_budget=memory_budget, strategy=strategy, label_smoothing=label_smoothing,
            z_loss=z_loss, softcap=softcap, temperature=temperature, shift=s,
            grad_weight_accumulator=grad_weight_accumulator, grad_hidden_accumulator=grad_hidden_accumulator,
            batch_invariant=batch_invariant, **{f"return_{k}": v for k, v in want.items()})
    labels = _shift_labels(labels, s, ignore_index)
    opts = _Options(ignore_index, reduction, strategy, memory_budget, label_smoothing, z_loss, softcap, temperature,
                    bool(batch_invariant))
    sp = int(bool(sequence_parallel))
    if comm is not None:
        # flce's own collectives: the same custom ops as linear_cross_entropy, with the TP fields
        tp = (rank, size, offset, total, comm.ptr.value, sp)
        return _apply(hidden, weight, labels, opts, tp, bias, class_weights, grad_hidden_accumulator,
                      grad_weight_accumulator, want, s)
    # the split phase runs the plain tensor-parallel problem (on all ranks' tokens under SP)
    return _split_phase(hidden, weight, labels, opts, (rank, size, offset, total, None, 0), bias, class_weights,
                        grad_hidden_accumulator, grad_weight_accumulator, want, s, group, sp)
