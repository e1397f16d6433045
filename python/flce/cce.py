"""flce.cce — flce under the argument names of Apple's Cut Cross-Entropy (cut_cross_entropy):

    linear_cross_entropy(e, c, targets, bias=None, ignore_index=-100, softcap=None,
                         reduction='mean', shift=0, return_lse=False, ...)

e: embeddings (..., D); c: classifier (V, D); targets: e's leading shape; shift (int or bool):
e[..., t, :] is scored against targets[..., t + shift] (causal LM: shift=1), with no copy of e;
for reduction 'none' the per-token loss is placed at the target's position (the first `shift`
are 0), as CCE does. return_lse=True returns (loss, lse), lse aligned the same way and
differentiable (CCE's z-loss recipe `loss + λ·(lse**2).mean()` works as written).
CCE's accuracy and speed knobs (filter_eps, accum_e_fp32, accum_c_fp32, filter_e_grad,
filter_c_grad, impl) are accepted and ignored: flce filters nothing and accumulates in fp32.
vocab_parallel_options: use flce.vocab_parallel_cross_entropy.
"""
from typing import Optional, Tuple, Union, cast

import torch
from torch import Tensor

from . import LinearCrossEntropyOutput, _compat
from . import linear_cross_entropy as _flce_lce

__all__ = ["linear_cross_entropy", "LinearCrossEntropy"]


def _is_dtensor(t):
    # DTensor's class as _compat took it when PyTorch imported it (none before: then t is not one).
    # Not imported here: under torch.compile a failed import inside the trace is an error
    # (PyTorch 2.4's torch.distributed.tensor has no DTensor yet).
    return _compat.DTensor is not None and isinstance(t, _compat.DTensor)


def linear_cross_entropy(e: Tensor, c: Tensor, targets: Tensor, bias: Optional[Tensor] = None, ignore_index: int = -100,
                         softcap: Optional[float] = None, reduction: str = "mean", shift: Union[int, bool] = 0,
                         return_lse: bool = False, filter_eps: object = "auto", accum_e_fp32: bool = False,
                         accum_c_fp32: bool = False, filter_e_grad: bool = True, filter_c_grad: bool = True,
                         impl: str = "cce", vocab_parallel_options: object = None
                         ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """CCE's linear_cross_entropy computed by flce. Returns the loss (float32), or (loss, lse)."""
    for name, t in (("e", e), ("c", c), ("targets", targets), ("bias", bias)):
        if t is not None and _is_dtensor(t):
            raise ValueError(f"{name}: a DTensor (FSDP2/TP sharded); flce needs the full tensor: pass "
                             f"{name}.full_tensor(), or shard the vocab with flce.vocab_parallel_cross_entropy")
    if vocab_parallel_options is not None:
        raise NotImplementedError("vocab_parallel_options: use flce.vocab_parallel_cross_entropy(hidden, "
                                  "weight_shard, labels, vocab_offset=, vocab_total=, group=)")
    out = _flce_lce(e.contiguous(), c.contiguous(), targets.contiguous(),
                    bias=None if bias is None else bias.contiguous(), ignore_index=ignore_index,
                    softcap=softcap, reduction=reduction, shift=int(shift), return_lse=return_lse)
    if return_lse:
        r = cast(LinearCrossEntropyOutput, out)
        return r.loss, cast(Tensor, r.lse)
    return cast(Tensor, out)


class LinearCrossEntropy(torch.nn.Module):
    """CCE's module form: LinearCrossEntropy(ignore_index, softcap, reduction, shift, ...)(e, c, targets, bias)."""

    def __init__(self, ignore_index=-100, softcap=None, reduction="mean", shift=0, filter_eps="auto",
                 accum_e_fp32=False, accum_c_fp32=False, filter_e_grad=True, filter_c_grad=True, impl="cce"):
        super().__init__()
        self.ignore_index, self.softcap, self.reduction, self.shift = ignore_index, softcap, reduction, shift

    def forward(self, e, c, targets, bias=None):
        return linear_cross_entropy(e, c, targets, bias=bias, ignore_index=self.ignore_index,
                                    softcap=self.softcap, reduction=self.reduction, shift=self.shift)
