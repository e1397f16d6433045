#!/usr/bin/env python3
"""example_grpo.py — one GRPO/PPO policy step on flce's per-token outputs, and the check that it
matches the same step on materialized float64 logits (python/test_binding.py runs it; run it alone
on a GPU, or without one on the CPU stand-in: `python3 python/example_grpo.py`).

The step, per response token t (mask_t = 1), with the sampler's temperature T:
    lp_t    = log softmax(h_t·Wᵀ / T)[y_t]          flce: return_logprobs (differentiable)
    H_t     = entropy of that distribution            flce: return_entropy (differentiable)
    ratio_t = exp(lp_t − lp_old_t)
    pg_t    = −min(ratio_t·A_t, clip(ratio_t, 1−ε, 1+ε)·A_t)
    kl_t    = exp(lp_ref_t − lp_t) − (lp_ref_t − lp_t) − 1      (k3 estimator, to a reference policy)
    loss    = Σ_t mask_t·(pg_t + β·kl_t − c·H_t) / Σ_t mask_t
lp_old and lp_ref come from earlier no-grad calls (the rollout policy, the reference model).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flce  # noqa: E402

EPS, BETA, C_ENT, T = 0.2, 0.04, 0.01, 0.7


def grpo_objective(lp, entropy, lp_old, lp_ref, adv, mask):
    """The step's loss from per-token log-probs and entropies (any dtype, any backend)."""
    ratio = torch.exp(lp - lp_old)
    pg = -torch.min(ratio * adv, ratio.clamp(1 - EPS, 1 + EPS) * adv)
    d = lp_ref - lp
    kl = torch.exp(d) - d - 1
    return ((pg + BETA * kl - C_ENT * entropy) * mask).sum() / mask.sum()


def grpo_step_flce(hidden, weight, tokens, lp_old, lp_ref, adv, mask):
    """The policy step as a trainer writes it on flce: no logits anywhere."""
    out = flce.linear_cross_entropy(hidden, weight, tokens, reduction="none", temperature=T,
                                    return_logprobs=True, return_entropy=True)
    return grpo_objective(out.logprobs, out.entropy, lp_old, lp_ref, adv, mask)


def grpo_step_reference(hidden, weight, tokens, lp_old, lp_ref, adv, mask):
    """The same step on materialized float64 logits."""
    logp = ((hidden.double() @ weight.double().T) / T).log_softmax(-1)
    lp = logp.gather(1, tokens.clamp(min=0)[:, None])[:, 0] * (tokens != -100)
    entropy = -(logp.exp() * logp).sum(-1)
    return grpo_objective(lp, entropy, lp_old.double(), lp_ref.double(), adv.double(), mask.double())


def check(device, dtype=torch.bfloat16, n=96, d=64, v=500, seed=5):
    """Loss and gradients of the flce step against the float64 one; returns (loss err, dH err, dW err)."""
    g = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(n, d, device=device, generator=g).to(dtype)
    weight = (torch.randn(v, d, device=device, generator=g) * 0.5).to(dtype)
    tokens = torch.randint(0, v, (n,), device=device, generator=g)
    mask = (torch.rand(n, device=device, generator=g) > 0.2).float()
    tokens[mask == 0] = -100  # prompt and padding positions
    adv = torch.randn(n, device=device, generator=g)
    with torch.no_grad():  # the rollout policy and the reference model: earlier no-grad calls
        lp_old = flce.linear_cross_entropy(hidden, weight, tokens, reduction="none", temperature=T,
                                           return_logprobs=True).logprobs
        lp_ref = lp_old + 0.05 * torch.randn(n, device=device, generator=g)
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = grpo_step_flce(h1, w1, tokens, lp_old, lp_ref, adv, mask)
    loss.backward()
    h2, w2 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    ref = grpo_step_reference(h2, w2, tokens, lp_old, lp_ref, adv, mask)
    ref.backward()

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()
    return abs(loss.item() - ref.item()) / abs(ref.item()), rel(h1.grad, h2.grad), rel(w1.grad, w2.grad)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        import standin
        standin.install()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    e_loss, e_dh, e_dw = check(dev)
    print(f"GRPO step, flce vs float64 logits: loss {e_loss:.1e}, dH {e_dh:.1e}, dW {e_dw:.1e}")
    sys.exit(0 if e_loss < 1e-3 and e_dh < 1e-2 and e_dw < 1e-2 else 1)
