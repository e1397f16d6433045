"""topk.py — flce.topk_logprobs: each token's k largest logits of hidden·weightᵀ/T with their
log-probabilities (issue 44 item 2), from one library call (flce_topk_logprobs, include/flce.h) that
never holds the tokens x vocab logits: prompt log-probs for inference and evaluation, a teacher's
top-k for distillation. Exact: the order is larger logit first and equal logits by lower index (a
NaN logit first, as torch.topk; that token's log-probs and lse are NaN). Forward only (no autograd).

The call is the torch.library custom op flce::topk_logprobs with a fake kernel, so
torch.compile(fullgraph=True) traces through it.

vocab_parallel_topk_logprobs is the same under tensor (vocab) parallelism: each rank of a
torch.distributed group holds a shard of the weight; flce_topk_stats writes this rank's block
(its shard's lse and k candidates with global ids, 4·(8 + N·(2 + 2k)) bytes), one
all_gather_into_tensor gathers the blocks, and flce_topk_finish merges them: every rank gets the
same outputs, bit for bit.
"""
from __future__ import annotations

import math
import operator
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from . import _distill_lib, _lib

_DTYPES = {torch.float32: _lib.FLCE_DTYPE_F32, torch.float16: _lib.FLCE_DTYPE_F16,
           torch.bfloat16: _lib.FLCE_DTYPE_BF16}
K_MAX = 64


class TopkLogprobs(NamedTuple):
    """topk_logprobs's result: logprobs (..., k) fp32 at the temperature, indices (..., k) int64 vocab
    ids in the same order, lse (...) fp32 (log Σ_j exp(z_j / T))."""
    logprobs: Tensor
    indices: Tensor
    lse: Tensor


def _require_cuda(t: Tensor, name: str) -> None:
    if not t.is_cuda:
        raise ValueError(f"{name}: must be on a CUDA device, is on {t.device}")


def _cuda_device(device) -> torch.device:
    """device (None: the current CUDA device) as a CUDA torch.device, or ValueError naming it."""
    if device is None:
        if not torch.cuda.is_available():
            raise ValueError("device: None and no CUDA device is available")
        return torch.device("cuda", torch.cuda.current_device())
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type != "cuda":
        raise ValueError(f"device: {device!r}; expected a CUDA device")
    return dev


def _ptr(t, name, align):
    p = t.data_ptr()
    if p % align:
        raise ValueError(f"{name}: data_ptr() {p:#x} is not {align}-byte aligned; pass a fresh tensor")
    return p


class _TopkCall:
    """One flce_topk_logprobs call on the current stream of the tensors' device."""

    def __init__(self, hidden, weight, k, temperature, memory_budget, tp=(0, 1, 0, 0)):
        """tp: (rank, size, vocab_offset, vocab_total) of the vocab-parallel group; (0, 1, 0, 0) none."""
        self.device = hidden.device
        self.hidden, self.weight = hidden, weight
        rank, size, offset, total = tp
        self.problem = _distill_lib.new_topk_problem(
            tokens=hidden.shape[0], hidden=hidden.shape[1], vocab=weight.shape[0], dtype=_DTYPES[hidden.dtype],
            k=int(k), temperature=float(temperature), memory_budget=int(memory_budget or 0), tp_rank=rank,
            tp_size=size, vocab_offset=offset, vocab_total=total)

    def _ctx(self):
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return _lib.context(index)

    def _stream(self):
        return torch.cuda.current_stream(self.device).cuda_stream

    def _tensors(self, ctx, logprobs=None, indices=None, lse=None, inputs=True):
        """flce_topk_tensors of this call: the inputs (and a workspace) unless `inputs` is False, the
        outputs given."""
        fields = {}
        if inputs:
            nbytes = _distill_lib.topk_workspace_size(ctx, self.problem)
            self.workspace = torch.empty(max(nbytes, 256), dtype=torch.uint8, device=self.device)
            fields = dict(hidden=_ptr(self.hidden, "hidden", 16), weight=_ptr(self.weight, "weight", 16),
                          workspace=_ptr(self.workspace, "workspace", 256), workspace_bytes=self.workspace.numel())
        for name, t, align in (("indices", indices, 8), ("logprobs", logprobs, 4), ("lse", lse, 4)):
            if t is not None:
                fields[name] = _ptr(t, name, align)
        return _distill_lib.new_topk_tensors(**fields)

    def __call__(self, logprobs, indices, lse):
        _distill_lib._topk_fn(_distill_lib.TOPK)  # FlceError naming it on a library without it
        ctx = self._ctx()
        _distill_lib.topk(ctx, self.problem, self._tensors(ctx, logprobs, indices, lse), self._stream())

    def block_bytes(self):
        """flce_topk_stats_bytes: one rank's block."""
        return _distill_lib.topk_stats_bytes(self.problem)

    def stats(self, block):
        """flce_topk_stats: this rank's block (a uint8 CUDA tensor of block_bytes())."""
        ctx = self._ctx()
        _distill_lib.topk_stats(ctx, self.problem, self._tensors(ctx), _ptr(block, "block", 16), self._stream())

    def finish(self, gathered, logprobs, indices, lse):
        """flce_topk_finish: the outputs from the tp_size blocks in rank order."""
        ctx = self._ctx()
        _distill_lib.topk_finish(ctx, self.problem, self._tensors(ctx, logprobs, indices, lse, inputs=False),
                                 _ptr(gathered, "gathered", 16), self._stream())


def _outputs(hidden, k):
    n, dev = hidden.shape[0], hidden.device
    return (torch.empty((n, k), dtype=torch.float32, device=dev), torch.empty((n, k), dtype=torch.int64, device=dev),
            torch.empty((n,), dtype=torch.float32, device=dev))


def _dense(t):
    return t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)


def _topk_impl(hidden: Tensor, weight: Tensor, k: int, temperature: float,
               memory_budget: int) -> Tuple[Tensor, Tensor, Tensor]:
    hidden, weight = _dense(hidden), _dense(weight)
    logprobs, indices, lse = _outputs(hidden, k)
    _TopkCall(hidden, weight, k, temperature, memory_budget)(logprobs, indices, lse)
    return logprobs, indices, lse


topk_op = torch.library.custom_op("flce::topk_logprobs", mutates_args=())(_topk_impl)


@topk_op.register_fake
def _topk_fake(hidden, weight, k, temperature, memory_budget):
    return _outputs(hidden, k)


def topk_logprobs(hidden: Tensor, weight: Tensor, k: int, *, temperature: float = 1.0,
                  memory_budget: Optional[int] = None) -> TopkLogprobs:
    """Each token's k largest logits z = hidden·weightᵀ/T, as (logprobs, indices, lse).

    hidden: (..., D) on a CUDA device, bf16/f16/fp32; weight: (V, D), the same dtype and device.
    k: 1..min(64, V). temperature: T > 0 (log-probs of softmax(z/T)). memory_budget: bytes for one
    token chunk's fp32 logits (None: the library's default, 1 GiB). Returns logprobs (..., k) fp32,
    indices (..., k) int64 (larger logit first, equal logits by lower index) and lse (...) fp32.
    No gradient flows (the outputs are not differentiable)."""
    _check_inputs(hidden, weight, k, temperature, memory_budget)
    lead = hidden.shape[:-1]
    h2 = hidden.reshape(-1, hidden.shape[-1])
    with torch.no_grad():
        logprobs, indices, lse = topk_op(h2, weight.detach(), int(k), float(temperature), int(memory_budget or 0))
    return TopkLogprobs(logprobs.reshape(*lead, int(k)), indices.reshape(*lead, int(k)), lse.reshape(lead))


def _check_inputs(hidden, weight, k, temperature, memory_budget):
    """ValueError (TypeError for a non-tensor) naming the argument, as topk_logprobs documents them."""
    for name, t in (("hidden", hidden), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        _require_cuda(t, name)
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} not supported (bfloat16, float16 or float32)")
    if hidden.dim() < 1 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)}: expected (..., D) and (V, D)")
    if hidden.dtype != weight.dtype or hidden.device != weight.device:
        raise ValueError(f"hidden ({hidden.dtype}, {hidden.device}) and weight ({weight.dtype}, {weight.device}): "
                         "must share dtype and device")
    try:
        ok = not isinstance(k, bool) and 1 <= operator.index(k) <= min(K_MAX, weight.shape[0])
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"k: {k!r}; expected an int in [1, min({K_MAX}, V={weight.shape[0]})]")
    if not isinstance(temperature, (int, float)) or not (temperature > 0 and math.isfinite(temperature)
                                                          and math.isfinite(1.0 / temperature)):
        raise ValueError(f"temperature: {temperature!r}; expected a finite number > 0")
    if memory_budget is not None and (isinstance(memory_budget, bool) or operator.index(memory_budget) <= 0):
        raise ValueError(f"memory_budget: {memory_budget!r}; expected a positive number of bytes or None")
    if hidden.shape[:-1].numel() == 0:
        raise ValueError(f"hidden {tuple(hidden.shape)}: no tokens")


def vocab_parallel_topk_logprobs(hidden: Tensor, weight_shard: Tensor, k: int, group=None, *, vocab_offset: int,
                                 vocab_total: int, temperature: float = 1.0,
                                 memory_budget: Optional[int] = None) -> TopkLogprobs:
    """topk_logprobs under tensor (vocab) parallelism: this rank of `group` (a torch.distributed
    process group; None: the default one) holds the weight rows [vocab_offset, vocab_offset + V_r)
    of a vocab of vocab_total ids, and the ranks' shards tile [0, vocab_total) in rank order.

    hidden: (..., D), the same tokens on every rank; weight_shard: (V_r, D); k: 1..min(64, V_r) on
    every rank. Runs flce_topk_stats (this rank's block of 4·(8 + N·(2 + 2k)) bytes), ONE
    torch.distributed.all_gather_into_tensor of the blocks, then flce_topk_finish. Every rank returns
    the same (logprobs, indices, lse), bit for bit, with global vocab ids (the indices of the whole
    vocab). Shards that overlap, leave gaps or disagree on vocab_total are reported by the next flce
    call on the device (or flce.check()). Forward only; not traced by torch.compile (a collective)."""
    import torch.distributed as dist
    _check_inputs(hidden, weight_shard, k, temperature, memory_budget)
    for name, v in (("vocab_offset", vocab_offset), ("vocab_total", vocab_total)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name}: {v!r}; expected an int >= 0")
    if vocab_offset + weight_shard.shape[0] > vocab_total:
        raise ValueError(f"vocab_offset + V_r = {vocab_offset} + {weight_shard.shape[0]} exceeds "
                         f"vocab_total={vocab_total}")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if size == 1:
        if vocab_offset != 0 or vocab_total != weight_shard.shape[0]:
            raise ValueError(f"vocab_offset={vocab_offset}, vocab_total={vocab_total}: a group of one rank holds "
                             f"the whole vocab (0, {weight_shard.shape[0]})")
        return topk_logprobs(hidden, weight_shard, k, temperature=temperature, memory_budget=memory_budget)
    lead = hidden.shape[:-1]
    h2, w = _dense(hidden.reshape(-1, hidden.shape[-1]).detach()), _dense(weight_shard.detach())
    with torch.no_grad():
        call = _TopkCall(h2, w, int(k), float(temperature), memory_budget, (rank, size, vocab_offset, vocab_total))
        block = torch.empty(call.block_bytes(), dtype=torch.uint8, device=h2.device)
        call.stats(block)
        gathered = torch.empty(size * block.numel(), dtype=torch.uint8, device=h2.device)
        dist.all_gather_into_tensor(gathered, block, group=group)
        logprobs, indices, lse = _outputs(h2, int(k))
        call.finish(gathered, logprobs, indices, lse)
    return TopkLogprobs(logprobs.reshape(*lead, int(k)), indices.reshape(*lead, int(k)), lse.reshape(lead))


def prepare_topk_logprobs(tokens: int, hidden: int, vocab: int, k: int, *, dtype: torch.dtype = torch.bfloat16,
                          device=None, temperature: float = 1.0, memory_budget: Optional[int] = None) -> None:
    """Compiles (or loads from flce's disk cache) the kernels topk_logprobs calls of this shape and
    these options will run on `device` (None: the current CUDA device), before the first call:
    synchronous, so a server's first request does not wait for NVRTC. tokens: N of the calls (the
    kernels do not depend on it, the chunking does); hidden, vocab: D and V; k, temperature,
    memory_budget: as topk_logprobs."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: {dtype} not supported (bfloat16, float16 or float32)")
    for name, v in (("tokens", tokens), ("hidden", hidden), ("vocab", vocab), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: {v!r}; expected a positive int")
    if not (k <= min(K_MAX, vocab)):
        raise ValueError(f"k: {k!r}; expected an int in [1, min({K_MAX}, V={vocab})]")
    dev = _cuda_device(device)
    problem = _distill_lib.new_topk_problem(tokens=tokens, hidden=hidden, vocab=vocab, dtype=_DTYPES[dtype], k=k,
                                            temperature=float(temperature), memory_budget=int(memory_budget or 0))
    _distill_lib.topk_validate(problem)
    _distill_lib.topk_prepare(_lib.context(dev.index if dev.index is not None else torch.cuda.current_device()),
                              problem)
