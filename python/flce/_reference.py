"""_reference.py — flce.h's math in plain PyTorch (materializing the logits), for tests and for
checking flce against: every option and per-token output of the C API, differentiable through
autograd, in float64 by default.

    out = flce._reference.reference(hidden, weight, labels, bias=..., class_weights=..., ...)
    out["loss"], out["lse"], out["logprobs"], out["entropy"], out["argmax"], out["z_loss"],
    out["loss_per_token"]
"""
import torch


def reference(hidden, weight, labels, *, bias=None, class_weights=None, ignore_index=-100, reduction="mean",
              label_smoothing=0.0, z_loss=0.0, softcap=0.0, temperature=1.0, dtype=torch.float64):
    """Per include/flce.h, with N = labels.numel() tokens and V = weight.shape[0]:
        z = (h·w + b) / T, then c·tanh(z/c) with a softcap c
        loss_i = (1−ε)·w_y·(lse − z_y) + (ε/V)·Σ_j w_j·(lse − z_j) + λ·w_y·lse²  (0 when ignored)
        mean: Σ loss_i / Σ_valid w_y (0 when that is 0). Outputs have labels' shape."""
    lead = labels.shape
    d = hidden.shape[-1]
    h = hidden.reshape(-1, d).to(dtype)
    w = weight.to(dtype)
    y = labels.reshape(-1).long()
    z = h @ w.T
    if bias is not None:
        z = z + bias.to(dtype)
    z = z / temperature
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    v = z.shape[1]
    valid = (y != ignore_index) & (y >= 0) & (y < v)
    yc = torch.where(valid, y, torch.zeros_like(y))
    lse = torch.logsumexp(z, 1)
    zy = z.gather(1, yc[:, None])[:, 0]
    cw = torch.ones(v, dtype=dtype, device=z.device) if class_weights is None else class_weights.to(dtype)
    wy = cw[yc] * valid
    eps, lam = float(label_smoothing), float(z_loss)
    zl = lam * wy * lse * lse
    loss = (1 - eps) * wy * (lse - zy) + zl
    if eps:
        loss = loss + (eps / v) * (cw * (lse[:, None] - z)).sum(1) * valid
    den = wy.sum()

    def reduce(x):
        if reduction == "none":
            return x.reshape(lead)
        if reduction == "sum":
            return x.sum()
        return torch.where(den != 0, x.sum() / torch.where(den != 0, den, torch.ones_like(den)), x.sum() * 0)

    p = torch.softmax(z, 1)
    return {
        "loss": reduce(loss),
        "lse": lse.reshape(lead),
        "logprobs": ((zy - lse) * valid).reshape(lead),
        "entropy": (lse - (p * z).sum(1)).reshape(lead),
        "argmax": z.argmax(1).reshape(lead),
        "z_loss": reduce(zl),
        "loss_per_token": loss.reshape(lead),
    }
