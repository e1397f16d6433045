"""flce.functional — flce under the argument names of PyTorch's own fused op (2.13+):

    torch.nn.functional.linear_cross_entropy(input, linear_weight, target, *, linear_bias=None,
        weight=None, reduction='mean', ignore_index=None, label_smoothing=0.0, options=None)

flce.functional.linear_cross_entropy takes the same arguments with the same meaning (`weight` is
the class weights, as in F.cross_entropy; ignore_index None means -100) for class-index targets,
so swapping the import is enough. Not supported: class-probability targets, K-dimensional
losses (a linear_weight of more than 2 dims); `options` (PyTorch's chunking options) is accepted
and ignored, flce plans its own chunks (memory_budget, strategy: use flce.linear_cross_entropy).
"""
from typing import Any, Optional

import torch
from torch import Tensor

from . import linear_cross_entropy as _flce_lce

__all__ = ["linear_cross_entropy"]


def linear_cross_entropy(input: Tensor, linear_weight: Tensor, target: Tensor, *,
                         linear_bias: Optional[Tensor] = None, weight: Optional[Tensor] = None,
                         reduction: str = "mean", ignore_index: Optional[int] = None, label_smoothing: float = 0.0,
                         options: Any = None) -> Tensor:
    """cross_entropy(linear(input, linear_weight, linear_bias), target, weight=weight, ...) computed
    by flce without the logits. input (N, D) or (D,), linear_weight (C, D), target (N,) or () of
    class indices. Returns float32 (PyTorch returns the input's dtype)."""
    if not isinstance(target, torch.Tensor) or target.is_floating_point():
        raise ValueError("target: flce takes class indices (an integer tensor); class probabilities are not "
                         "supported")
    if not isinstance(linear_weight, torch.Tensor) or linear_weight.dim() != 2:
        raise ValueError(f"linear_weight: flce takes a (C, D) weight; got "
                         f"{tuple(linear_weight.shape) if isinstance(linear_weight, torch.Tensor) else linear_weight!r} "
                         f"(K-dimensional losses are not supported)")
    if not isinstance(input, torch.Tensor) or input.dim() not in (1, 2):
        raise ValueError(f"input: shape {tuple(input.shape) if isinstance(input, torch.Tensor) else input!r}; "
                         f"F.linear_cross_entropy's class dimension follows the batch dimension, so flce's "
                         f"drop-in takes (N, D) or (D,): flatten the tokens first (input.flatten(0, -2), "
                         f"target.flatten()), or call flce.linear_cross_entropy, which reads (..., D) as tokens")
    unbatched = input.dim() == 1
    if unbatched:
        input, target = input.unsqueeze(0), target.reshape(1)
    loss = _flce_lce(input.contiguous(), linear_weight.contiguous(), target.contiguous(),
                     bias=None if linear_bias is None else linear_bias.contiguous(), class_weights=weight,
                     ignore_index=-100 if ignore_index is None else ignore_index, reduction=reduction,
                     label_smoothing=label_smoothing)
    return loss.reshape(()) if unbatched and reduction == "none" else loss
