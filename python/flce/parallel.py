"""parallel.py — vocab-parallel (tensor-parallel) fused linear cross-entropy for torch.distributed.

Each rank of a process group holds the weight rows [vocab_offset, vocab_offset + V_r) of a vocab of
vocab_total ids and all N tokens; every rank gets the same loss. Two ways to run the collectives:

  comm=None (default)  split phase through torch.distributed: flce_forward_stats, then ONE
                       all_gather_into_tensor of a few floats per token, then flce_forward_finish;
                       backward recomputes the logits (8NVD) and all-reduces dH in fp32.
  comm=NcclComm(group) flce issues the NCCL collectives itself on its own communicator (one
                       all-gather per token chunk, dH summed in fp32 and rounded once) and
                       computes loss and gradients in one call (6NVD), as the C API does.
"""
from __future__ import annotations  # dist.ProcessGroup: only for type checkers (not every build has it)

import ctypes
from typing import Optional

import torch
import torch.distributed as dist

from . import _lib
from . import _Call, _Options, _apply, _check_args, _grad_out, _loss_tensor, _registered_comms


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


class _SplitPhase(torch.autograd.Function):
    """comm=None: the forward in two halves around torch.distributed's all-gather; backward from
    the saved lse with dH accumulated in fp32 and all-reduced before it is rounded."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, opts, need_dh, need_dw, tp, group):
        call = _Call(hidden, weight, labels, opts, tp)
        n, size = hidden.shape[0], tp[1]
        stats = torch.empty(_lib.tp_stats_bytes(call.problem), dtype=torch.uint8, device=hidden.device)
        gathered = torch.empty(stats.numel() * size, dtype=torch.uint8, device=hidden.device)
        loss = _loss_tensor(n, opts.reduction, hidden.device)
        lse = torch.empty((n,), dtype=torch.float32, device=hidden.device)
        call(_lib.FLCE_OP_FORWARD, "auto", half="flce_forward_stats", buffer=stats)
        dist.all_gather_into_tensor(gathered, stats, group=group)
        call(_lib.FLCE_OP_FORWARD, "auto", half="flce_forward_finish", buffer=gathered, loss=loss, lse=lse)
        ctx.save_for_backward(hidden, weight, labels, lse)
        ctx.opts, ctx.need, ctx.tp, ctx.group = opts, (need_dh, need_dw), tp, group
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        hidden, weight, labels, lse = ctx.saved_tensors
        opts, (need_dh, need_dw) = ctx.opts, ctx.need
        g = _grad_out(grad_loss, hidden.shape[0], opts.reduction)
        dh32 = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_dh else None
        dw = torch.empty_like(weight) if need_dw else None
        if need_dh or need_dw:
            call = _Call(hidden, weight, labels, opts, ctx.tp)
            call.problem.accumulate_grad_hidden = 1
            call(_lib.FLCE_OP_BACKWARD, opts.strategy, grad_output=g, lse=lse, grad_hidden=dh32, grad_weight=dw)
        dh = None
        if need_dh:
            dist.all_reduce(dh32, group=ctx.group)
            dh = dh32.to(hidden.dtype)
        return dh, dw, None, None, None, None, None, None


def vocab_parallel_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                                 vocab_offset: int, vocab_total: int, group: Optional[dist.ProcessGroup] = None,
                                 comm: Optional[NcclComm] = None, ignore_index: int = -100, reduction: str = "mean",
                                 memory_budget: Optional[int] = None, strategy: str = "auto",
                                 label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float = 0.0,
                                 temperature: float = 1.0) -> torch.Tensor:
    """cross_entropy(hidden @ W.T, labels) where this rank holds W's rows [vocab_offset,
    vocab_offset + weight.shape[0]) of vocab_total, every rank of `group` holds the same hidden
    (N, D) and labels (N,) (global ids), and the shards tile [0, vocab_total) in rank order.
    Returns the same loss on every rank; grads: hidden's is the full dH (summed over ranks),
    weight's is this rank's shard. Options as linear_cross_entropy. comm: see the module doc."""
    _check_args(hidden, weight, labels, reduction, strategy, memory_budget)
    if not dist.is_initialized():
        raise RuntimeError("vocab_parallel_cross_entropy: torch.distributed is not initialized")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if comm is not None and (comm.rank != rank or comm.size != size):
        raise ValueError(f"comm: rank {comm.rank} of {comm.size}, but the group has rank {rank} of {size}")
    opts = _Options(ignore_index, reduction, strategy, memory_budget, label_smoothing, z_loss, softcap,
                    temperature, False)
    tp = (rank, size, int(vocab_offset), int(vocab_total), comm.ptr.value if comm is not None else None)
    lead = labels.shape
    h2, y1 = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    need_dh = torch.is_grad_enabled() and hidden.requires_grad
    need_dw = torch.is_grad_enabled() and weight.requires_grad
    if comm is None:
        loss = _SplitPhase.apply(h2, weight, y1, opts, need_dh, need_dw, tp, group)
        return loss.reshape(lead) if reduction == "none" else loss
    # flce's own collectives: the same custom ops as linear_cross_entropy, with the TP fields
    return _apply(hidden, weight, labels, opts, tp, None, None, None, None, {})
