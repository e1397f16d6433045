"""standin.py — for the Python tests on a machine without a GPU: replaces the library's kernels with
flce.h's math in float64 PyTorch (flce/_reference.py), at the one place the binding calls them
(_Call.__call__ and _Call.scale), so that everything above — argument checks, the custom ops,
their fake kernels and autograd formulas, torch.compile, the Hugging Face patch — runs on the CPU
exactly as on a GPU. libflce.so is still loaded (the problems are built and validated by it).

    import standin; standin.install()
"""
import torch

import flce
from flce import _lib
from flce._reference import reference

installed = False


def _fields(p):
    return {f: getattr(p, f) for f, _ in _lib.Problem._fields_}


def _run(self, op, strategy, half=None, buffer=None, **outs):
    assert half is None, "the stand-in has no split-phase TP forward"
    p = self.problem
    p.strategy = _lib.STRATEGIES[strategy]
    _lib.validate(p)
    if op == _lib.FLCE_OP_FORWARD and strategy not in ("auto", "forward", "saved"):
        raise flce.FlceError(1, "FLCE_ERR_INVALID_ARGUMENT", "a forward call uses FORWARD (or AUTO)", "stand-in")
    if op != _lib.FLCE_OP_FORWARD and strategy == "forward":
        raise flce.FlceError(1, "FLCE_ERR_INVALID_ARGUMENT", "strategy FORWARD computes no gradients", "stand-in")
    reduction = {v: k for k, v in _lib.REDUCTIONS.items()}[p.reduction]
    r = reference(self.hidden, self.weight, self.labels, bias=self.bias, class_weights=self.class_weights,
                  ignore_index=p.ignore_index, reduction=reduction, label_smoothing=p.label_smoothing,
                  z_loss=p.z_loss, softcap=p.softcap, temperature=p.temperature)
    if op == _lib.FLCE_OP_BACKWARD:
        assert outs.get("lse") is not None, "backward needs lse"
        assert torch.allclose(outs["lse"].double(), r["lse"].reshape(-1), rtol=1e-5, atol=1e-5), \
            "backward got a wrong lse"
    else:
        for name, key in (("loss", "loss"), ("lse", "lse"), ("target_logprob", "logprobs"), ("entropy", "entropy"),
                          ("argmax", "argmax"), ("z_loss_out", "z_loss"), ("loss_per_token", "loss_per_token")):
            if outs.get(name) is not None:
                outs[name].copy_(r[key].reshape(outs[name].shape))
    if op == _lib.FLCE_OP_FORWARD:
        return
    dz, h, w = _dz(self, p, reduction, outs.get("grad_output"), outs)
    for name, val in (("grad_hidden", lambda: dz @ w), ("grad_weight", lambda: dz.T @ h),
                      ("grad_bias", lambda: dz.sum(0))):
        dst = outs.get(name)
        if dst is None:
            continue
        acc = (name == "grad_hidden" and p.accumulate_grad_hidden) or \
              (name == "grad_weight" and p.accumulate_grad_weight)
        if acc:
            assert dst.dtype == torch.float32
            dst.add_(val().to(torch.float32).reshape(dst.shape))
        else:
            dst.copy_(val().reshape(dst.shape))


def _dz(self, p, reduction, grad_output, outs=None):
    """flce.h's dZ in float64 (written out, not autograd: the stand-in runs below the autograd key),
    with the per-token outputs' upstream gradients of problem.grad_outputs (RL-AND-DISTILL §2)."""
    h, w = self.hidden.double(), self.weight.double()
    y = self.labels.long()
    z = h @ w.T
    if self.bias is not None:
        z = z + self.bias.double()
    z = z / p.temperature
    c = p.softcap
    if c:
        z = c * torch.tanh(z / c)
    v = z.shape[1]
    valid = (y != p.ignore_index) & (y >= 0) & (y < v)
    yc = torch.where(valid, y, torch.zeros_like(y))
    cw = torch.ones(v, dtype=torch.float64) if self.class_weights is None else self.class_weights.double()
    wy = cw[yc] * valid
    lse = torch.logsumexp(z, 1)
    prob = torch.softmax(z, 1)
    eps, lam = p.label_smoothing, p.z_loss
    a = (1 - eps) * wy + (eps / v) * cw.sum() * valid + 2 * lam * wy * lse
    dz = a[:, None] * prob - (eps / v) * cw[None, :] * valid[:, None].double()
    dz[torch.arange(z.shape[0]), yc] -= (1 - eps) * wy
    g = torch.ones((), dtype=torch.float64) if grad_output is None else grad_output.double()
    if reduction == "mean":
        den = wy.sum()
        g = g / den if den != 0 else g * 0
    gi = (g.reshape(-1) if reduction == "none" else g.expand(z.shape[0])) * valid
    outs = outs or {}

    def given(name, bit):
        t = outs.get(name)
        return t.double().reshape(-1) if t is not None and p.grad_outputs & bit else None
    g_rows = given("grad_loss_per_token", _lib.FLCE_GRAD_LOSS_PER_TOKEN)
    if g_rows is not None:
        gi = gi + g_rows * valid
    dz = dz * gi[:, None]
    g_lp, g_lse = given("grad_logprob", _lib.FLCE_GRAD_LOGPROB), given("grad_lse", _lib.FLCE_GRAD_LSE)
    g_h = given("grad_entropy", _lib.FLCE_GRAD_ENTROPY)
    if g_lp is not None:
        onehot = torch.zeros_like(prob)
        onehot[torch.arange(z.shape[0]), yc] = 1.0
        dz = dz + (g_lp * valid)[:, None] * (onehot - prob)
    if g_lse is not None:
        dz = dz + g_lse[:, None] * prob
    if g_h is not None:
        logp = z - lse[:, None]
        ent = lse - (prob * z).sum(1)
        dz = dz - g_h[:, None] * prob * (logp + ent[:, None])
    dz = dz / p.temperature
    if c:
        dz = dz * (1 - (z / c) ** 2)
    return dz, h, w


def _scale(self, grad_output, grad_hidden=None, grad_weight=None, grad_bias=None):
    _lib.validate(self.problem)
    assert self.problem.reduction != _lib.FLCE_REDUCTION_NONE
    g = grad_output.to(torch.float32)
    for t in (grad_hidden, grad_weight, grad_bias):
        if t is not None:
            t.copy_((t.to(torch.float32) * g).to(t.dtype))
    _scale.calls += 1


_scale.calls = 0


def _choice(device_index, n, d, v, dtype, label_dtype, opts, tp, has_bias, has_class_weights):
    """AUTO's choice without a device: recompute when the chunk budget is small, as the planner does.
    opts: _Options or a plain tuple of its fields (flce._auto_choice's argument)."""
    opts = flce._Options(*opts)
    return "recompute" if opts.memory_budget and opts.memory_budget < (1 << 21) else "chunked"


def install():
    """Routes the binding's kernel calls to the float64 stand-in (idempotent)."""
    global installed
    if installed:
        return
    flce._Call.__call__ = _run
    flce._Call.scale = _scale
    # the saved logits' workspace: a token amount (nothing is kept on the CPU), none where a small
    # budget says all tokens' would not fit (the library's rule, roughly: 2 bytes per logit)
    flce._Call.saved_bytes = lambda self: 0 if self.problem.memory_budget and \
        self.problem.memory_budget < 2 * self.problem.tokens * self.problem.vocab_shard else 256
    flce._Call.strategy_of = lambda self, op, strategy: _choice(
        None, self.problem.tokens, 0, 0, None, None, flce._Options(-100, "mean", strategy, self.problem.memory_budget,
                                                                    0, 0, 0, 1, False), None, False, False)
    choice = torch.compiler.assume_constant_result(lambda *a: _choice(*a))
    flce._auto_choice = choice
    flce._require_cuda = lambda hidden: None
    installed = True
