"""distill_fp16_weights_sim.py — how much the compact distillation path's divergence moves when the
teacher's probabilities are weights rounded to fp16 (templates/distill.cu flce_distill_row_compact),
in float64 on the CPU: random student/teacher logits like python/test_distill.py's (std 2 by
default), the teacher's p̃ = fp16(exp(z − m)·2^15) per column group, and the relative L2 error over
tokens of three ways to form D from those weights: plain (Σ p̂ log p̂ − Σ p̂ zs + lse_s·Σ p̂), minus
the weights' excess (Σ p̂ − 1), and normalized ((… − (Σ p̂ − 1))/Σ p̂). bench/NOTES.md, session 25.

    python3 bench/distill_fp16_weights_sim.py
"""
import torch


def sim(n=64, v=300, std=2.0, temperature=1.0, group=256, seed=1):
    g = torch.Generator().manual_seed(seed)
    zs = torch.randn(n, v, dtype=torch.float64, generator=g) * std / temperature
    zt = torch.randn(n, v, dtype=torch.float64, generator=g) * std / temperature
    lp, lq = zt.log_softmax(-1), zs.log_softmax(-1)
    d = (lp.exp() * (lp - lq)).sum(-1)
    lse_t = torch.logsumexp(zt, -1, keepdim=True)
    ph = torch.empty_like(zt)
    for g0 in range(0, v, group):
        z = zt[:, g0:g0 + group]
        m = z.max(-1, keepdim=True).values
        ph[:, g0:g0 + group] = (torch.exp(z - m) * 2**15).to(torch.float16).double() * 2**-15 * torch.exp(m - lse_t)
    w = ph.sum(-1)
    a = (ph * torch.where(ph > 0, ph.log(), torch.zeros_like(ph))).sum(-1)
    x = (ph * zs).sum(-1)
    lse_s = torch.logsumexp(zs, -1)
    rel = lambda e: ((e - d).norm() / d.norm()).item()
    return rel(a - x + lse_s * w), rel(a - x + lse_s * w - (w - 1)), rel((a - x - (w - 1)) / w + lse_s)


if __name__ == "__main__":
    print("V, std, T, group: relative L2 error of D (plain, minus excess, normalized)")
    for v, std, t, grp in ((300, 2, 1, 256), (300, 2, 1, 64), (300, 2, 2, 256), (300, 6, 1, 256), (1000, 2, 1, 256),
                           (32000, 2, 1, 256), (32000, 6, 1, 256)):
        print(f"{v:6d} {std} {t} {grp:3d}: " + "  ".join(f"{e:.2e}" for e in sim(v=v, std=std, temperature=t, group=grp)))
