"""standin.py — for the Python tests on a machine without a GPU: replaces the library's kernels with
flce.h's math in float64 PyTorch (flce/_reference.py), at the one place the binding calls them
(_Call.__call__ and _Call.scale), so that everything above — argument checks, the custom ops,
their fake kernels and autograd formulas, torch.compile, the Hugging Face patch — runs on the CPU
exactly as on a GPU. libflce.so is still loaded (the problems are built and validated by it).
flce.linear_distillation's library call (flce_distill_loss_and_grad) likewise: testing/ref.c
ref_distill's formulas in float64 (distill_dz, written out, not autograd); and flce.topk_logprobs's
(flce_topk_logprobs): a stable descending sort of the float64 logits; flce.vocab_parallel_topk_logprobs's
two halves (flce_topk_stats, flce_topk_finish) write and merge the library's blocks byte for byte.
Tensor parallelism (flce.vocab_parallel_cross_entropy, both routes) runs on the ranks of a gloo
world: the stand-in emulates flce's collectives with torch.distributed (_run_tp).

    import standin; standin.install()
"""
import math

import torch

import flce
from flce import _lib
from flce._reference import reference

installed = False
_real_scale = None  # flce._Call.scale before install() (it records the dry run's call)


def _fields(p):
    return {f: getattr(p, f) for f, _ in _lib.Problem._fields_}


def _run(self, op, strategy, half=None, buffer=None, workspace=None, **outs):
    if self.device.type == "meta":  # flce.prepare's dry run records the call, as _Call.__call__ does
        return flce._record(self, op, strategy, half, workspace, outs)
    p = self.problem
    p.strategy = _lib.STRATEGIES[strategy]
    _lib.validate(p)
    if op == _lib.FLCE_OP_FORWARD and strategy not in ("auto", "forward", "saved"):
        raise flce.FlceError(1, "FLCE_ERR_INVALID_ARGUMENT", "a forward call uses FORWARD (or AUTO)", "stand-in")
    if op != _lib.FLCE_OP_FORWARD and strategy == "forward":
        raise flce.FlceError(1, "FLCE_ERR_INVALID_ARGUMENT", "strategy FORWARD computes no gradients", "stand-in")
    reduction = {v: k for k, v in _lib.REDUCTIONS.items()}[p.reduction]
    if p.tp_size > 1:
        _run_tp(self, p, op, reduction, half, outs)
        return
    assert half is None, "the split-phase halves need tp_size > 1"
    outputs, dz = _compute(self, p, op, reduction, outs)
    if op != _lib.FLCE_OP_BACKWARD:
        for name, val in outputs.items():
            if outs.get(name) is not None:
                outs[name].copy_(val.reshape(outs[name].shape))
    if op == _lib.FLCE_OP_FORWARD:
        return
    h, w = self.hidden.double(), self.weight.double()
    _write_grads(p, outs, lambda: dz @ w, lambda: dz.T @ h, lambda: dz.sum(0))


_OUTPUT_KEYS = (("loss", "loss"), ("lse", "lse"), ("target_logprob", "logprobs"), ("entropy", "entropy"),
                ("argmax", "argmax"), ("z_loss_out", "z_loss"), ("loss_per_token", "loss_per_token"))


def _compute(t, p, op, reduction, inputs):
    """The float64 outputs (flce_tensors names) of problem p on t's hidden, weight, labels, bias and
    class weights, and dZ (None for a forward); inputs: grad_output, lse and the per-token upstream
    gradients as flce_tensors fields."""
    r = reference(t.hidden, t.weight, t.labels, bias=t.bias, class_weights=t.class_weights,
                  ignore_index=p.ignore_index, reduction=reduction, label_smoothing=p.label_smoothing,
                  z_loss=p.z_loss, softcap=p.softcap, temperature=p.temperature)
    if op == _lib.FLCE_OP_BACKWARD:
        assert inputs.get("lse") is not None, "backward needs lse"
        assert torch.allclose(inputs["lse"].double(), r["lse"].reshape(-1), rtol=1e-5, atol=1e-5), \
            "backward got a wrong lse"
    outputs = {name: r[key] for name, key in _OUTPUT_KEYS}
    dz = None if op == _lib.FLCE_OP_FORWARD else _dz(t, p, reduction, inputs.get("grad_output"), inputs)[0]
    return outputs, dz


def _write_grads(p, outs, dh, dw, db):
    """The gradients into the given buffers (dh, dw, db: functions computing them in float64), added
    in fp32 where the problem accumulates."""
    for name, val in (("grad_hidden", dh), ("grad_weight", dw), ("grad_bias", db)):
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


# ---- tensor parallelism: the ranks of a torch.distributed (gloo) world emulate flce's collectives --

def _gather_rows(x):
    """Every rank's x stacked along dim 0 in rank order (the row counts may differ)."""
    import torch.distributed as dist
    size = dist.get_world_size()
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(counts, torch.tensor([x.shape[0]], dtype=torch.int64))
    counts = [int(c) for c in counts]
    pad = torch.zeros((max(counts),) + tuple(x.shape[1:]), dtype=x.dtype)
    pad[:x.shape[0]] = x
    parts = [torch.empty_like(pad) for _ in range(size)]
    dist.all_gather(parts, pad)
    return torch.cat([part[:c] for part, c in zip(parts, counts)])


def _run_tp(self, p, op, reduction, half, outs):
    """flce.h's tensor-parallel contract on the CPU: each rank gathers the weight shards and
    computes the whole problem in float64; with tensors.comm the outputs are every rank's (this
    rank's rows under sequence parallelism) and dH is summed over the ranks; without it (the
    split-phase halves, flce_backward) dH is this rank's partial sum. The stats half does nothing:
    the finish half computes everything."""
    import types
    import torch.distributed as dist
    err = flce.FlceError
    if half is not None and p.sequence_parallel:
        raise err(2, "FLCE_ERR_UNSUPPORTED", "problem.sequence_parallel=1: the split-phase calls serve plain TP",
                  "stand-in")
    if half is None and self.comm is None and not (op == _lib.FLCE_OP_BACKWARD and not p.sequence_parallel):
        raise err(1, "FLCE_ERR_INVALID_ARGUMENT", f"tensors.comm: NULL with tp_size={p.tp_size}", "stand-in")
    assert half is None or op == _lib.FLCE_OP_FORWARD
    if half == "flce_forward_stats":
        return
    assert dist.get_world_size() == p.tp_size and dist.get_rank() == p.tp_rank, "the stand-in's group is the world"
    # what the library checks in its all-gather: the shards tile the vocab, the ranks agree
    info = _gather_rows(torch.tensor([[p.vocab_offset, p.vocab_shard, p.vocab_total, p.tokens]], dtype=torch.int64))
    starts = info[:, 0].tolist()
    ends = (info[:, 0] + info[:, 1]).tolist()
    if starts[0] != 0 or ends[-1] != p.vocab_total or starts[1:] != ends[:-1] or \
            len(set(info[:, 2].tolist())) != 1 or len(set(info[:, 3].tolist())) != 1:
        raise err(1, "FLCE_ERR_INVALID_ARGUMENT", f"ranks disagree or shards do not tile: {info.tolist()}",
                  "stand-in")
    sp = bool(p.sequence_parallel)
    n_local = self.hidden.shape[0]
    rows = slice(p.tp_rank * n_local, (p.tp_rank + 1) * n_local) if sp else slice(None)

    def tokens(x):  # a per-token tensor over all tokens
        return _gather_rows(x) if sp else x
    t = types.SimpleNamespace(hidden=tokens(self.hidden.double()), weight=_gather_rows(self.weight.double()),
                              labels=tokens(self.labels), class_weights=self.class_weights,
                              bias=None if self.bias is None else _gather_rows(self.bias.double()))
    inputs = {}
    if op != _lib.FLCE_OP_FORWARD:
        g = outs.get("grad_output")
        inputs["grad_output"] = tokens(g) if g is not None and reduction == "none" else g
        if op == _lib.FLCE_OP_BACKWARD:
            inputs["lse"] = tokens(outs["lse"])
        for name, bit in (("grad_logprob", _lib.FLCE_GRAD_LOGPROB), ("grad_lse", _lib.FLCE_GRAD_LSE),
                          ("grad_entropy", _lib.FLCE_GRAD_ENTROPY),
                          ("grad_loss_per_token", _lib.FLCE_GRAD_LOSS_PER_TOKEN)):
            if outs.get(name) is not None and p.grad_outputs & bit:
                inputs[name] = tokens(outs[name])
    outputs, dz = _compute(t, p, op, reduction, inputs)
    if op != _lib.FLCE_OP_BACKWARD:
        for name, val in outputs.items():
            dst = outs.get(name)
            if dst is not None:
                dst.copy_((val.reshape(-1)[rows] if val.dim() else val).reshape(dst.shape))
    if op == _lib.FLCE_OP_FORWARD:
        return
    shard = slice(p.vocab_offset, p.vocab_offset + p.vocab_shard)
    dz_r = dz[:, shard]
    if self.comm is not None:
        def dh():
            return (dz @ t.weight)[rows]
    else:
        def dh():
            return dz_r @ t.weight[shard]
    _write_grads(p, outs, dh, lambda: dz_r.T @ t.hidden, lambda: dz_r.sum(0))


def _dz(self, p, reduction, grad_output, outs=None):
    """flce.h's dZ in float64 (written out, not autograd: the stand-in runs below the autograd key),
    with the per-token outputs' upstream gradients of problem.grad_outputs (docs/DESIGN.md §1.3).
    self: anything with hidden, weight, labels, bias and class_weights (the whole vocab)."""
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
    if self.device.type == "meta":  # flce.prepare's dry run
        return _real_scale(self, grad_output, grad_hidden, grad_weight, grad_bias)
    _lib.validate(self.problem)
    assert self.problem.reduction != _lib.FLCE_REDUCTION_NONE
    g = grad_output.to(torch.float32)
    for t in (grad_hidden, grad_weight, grad_bias):
        if t is not None:
            t.copy_((t.to(torch.float32) * g).to(t.dtype))
    _scale.calls += 1


_scale.calls = 0


def _choice(device_index, n, d, v, dtype, label_dtype, tp, has_bias, has_class_weights, *opts):
    """AUTO's choice without a device: recompute when the chunk budget is small, as the planner does.
    opts: _Options's fields (flce._auto_choice's arguments)."""
    opts = flce._Options(*opts)
    return "recompute" if opts.memory_budget and opts.memory_budget < (1 << 21) else "chunked"


# ---- distillation (flce.linear_distillation): flce_distill_loss_and_grad in float64 ----------------

def distill_dz(zs, zt, labels, divergence, beta, temperature, ce_weight, ignore_index):
    """testing/ref.c ref_distill_row over all rows in float64, written out (not autograd): per-token
    loss_i, divergence D_i, validity, and dz = ∂loss_i/∂zs (rows of invalid tokens 0). zs, zt: the
    raw logits (rows x V, any device); also bench/distill_compare.py's reference."""
    if divergence == "jsd" and beta <= 0:
        divergence = "forward_kl"
    elif divergence == "jsd" and beta >= 1:
        divergence = "reverse_kl"
    lq = torch.log_softmax(zs / temperature, 1)
    lp = torch.log_softmax(zt / temperature, 1)
    q, p = lq.exp(), lp.exp()

    def xlog(a, la, lb):  # a·(la − lb) with 0·anything = 0
        return torch.where(a == 0, torch.zeros_like(a), a * (la - lb))
    if divergence == "forward_kl":
        d = xlog(p, lp, lq).sum(1)
        dz = q - p
    elif divergence == "reverse_kl":
        d = xlog(q, lq, lp).sum(1)
        dz = torch.where(q == 0, torch.zeros_like(q), q * (lq - lp - d[:, None]))
    else:
        lm = torch.logaddexp(math.log(beta) + lp, math.log1p(-beta) + lq)
        d = beta * xlog(p, lp, lm).sum(1) + (1 - beta) * xlog(q, lq, lm).sum(1)
        kl_qm = xlog(q, lq, lm).sum(1)
        dz = torch.where(q == 0, torch.zeros_like(q), (1 - beta) * q * (lq - lm - kl_qm[:, None]))
    return _ce_and_mask(zs, d, dz / temperature, labels, ce_weight, ignore_index)


def _ce_and_mask(zs, d, dz, labels, ce_weight, ignore_index):
    """The rows' loss = D + the CE term at T = 1 (and its dz), then masked tokens' rows 0, not NaN·0 (a
    NaN teacher row of an ignored token stays out): (loss, D, valid, dz)."""
    n, v = zs.shape
    if labels is None:
        valid = torch.ones(n, dtype=torch.bool, device=zs.device)
        yc = torch.zeros(n, dtype=torch.int64, device=zs.device)
    else:
        y = labels.long()
        has_label = (y >= 0) & (y < v)
        valid = has_label & (y != ignore_index)
        yc = torch.where(has_label, y, torch.zeros_like(y))
    loss = d.clone()
    if ce_weight != 0 and labels is not None:
        ce = torch.logsumexp(zs, 1) - zs.gather(1, yc[:, None]).squeeze(1)
        loss = loss + ce_weight * ce
        sm = torch.softmax(zs, 1)
        sm[torch.arange(n, device=zs.device), yc] -= 1
        dz = dz + ce_weight * sm
    zero = torch.zeros_like(loss)
    return torch.where(valid, loss, zero), torch.where(valid, d, zero), valid, torch.where(valid[:, None], dz, 0.0)


def distill_topk_dz(zs, idx, lp, labels, temperature, ce_weight, ignore_index):
    """flce_distill_row_topk in float64: the teacher as each row's k (id, log p) pairs, forward KL
    over them, D = Σ_K p (log p − log q), dz = (q·P_K − p·1[K])/T (+ CE at T = 1); a row whose ids
    repeat or leave [0, V) is NaN. Returns what distill_dz returns."""
    n, v = zs.shape
    lq = torch.log_softmax(zs / temperature, 1)
    q = lq.exp()
    ok = ((idx >= 0) & (idx < v)).all(1)
    ok &= torch.tensor([len(set(r.tolist())) == idx.shape[1] for r in idx], dtype=torch.bool, device=zs.device)
    ic = torch.where((idx >= 0) & (idx < v), idx, torch.zeros_like(idx))
    lpd = lp.double()
    p = lpd.exp()
    d = torch.where(p == 0, torch.zeros_like(p), p * (lpd - lq.gather(1, ic))).sum(1)
    pk = p.sum(1)
    dz = q * pk[:, None]
    dz = dz.scatter_add(1, ic, -p) / temperature
    nan = torch.full_like(d, float("nan"))
    return _ce_and_mask(zs, torch.where(ok, d, nan), torch.where(ok[:, None], dz, nan[:, None]), labels, ce_weight,
                        ignore_index)


_real_distill_call = None  # flce.distill._DistillCall.__call__ before install() (the library call)


def _distill_run(self, loss, divergence, grad_hidden=None, grad_weight=None, grad_output=None):
    """flce.distill._DistillCall.__call__ in float64: what flce_distill_loss_and_grad writes."""
    p, o = self.problem, self.opts
    from flce import _distill_lib
    if _distill_lib.available():  # the library's own checks of the problem, as the real call makes them
        _distill_lib.validate(p)
    # the problem the binding built describes the tensors it passes
    topk = p.teacher_topk
    assert (p.tokens, p.hidden_student, p.hidden_teacher, p.vocab) == \
        (self.hs.shape[0], self.hs.shape[1], 0 if topk else self.ht.shape[1], self.ws.shape[0]), \
        "distill problem/tensor mismatch"
    if topk:
        assert self.ht.dtype == torch.int64 and self.ht.shape == (p.tokens, topk) and self.wt.shape == self.ht.shape
    else:
        assert self.wt.shape == (p.vocab, p.hidden_teacher) and self.ht.shape[0] == p.tokens
    assert p.divergence == _distill_lib.DIVERGENCES[o.divergence] and p.reduction == _lib.REDUCTIONS[o.reduction]
    assert abs(p.beta - o.beta) < 1e-6 and abs(p.temperature - o.temperature) < 1e-6 and p.ignore_index == o.ignore_index
    if p.ce_weight != 0 and (self.labels is None or p.temperature != 1):
        raise flce.FlceError(1, "FLCE_ERR_INVALID_ARGUMENT", "problem.ce_weight: needs labels and temperature 1",
                             "stand-in flce_distill_loss_and_grad")
    for name, t in (("loss", loss), ("divergence", divergence), ("grad_hidden", grad_hidden),
                    ("grad_weight", grad_weight), ("grad_output", grad_output)):
        assert t is None or t.is_contiguous(), f"{name}: not contiguous"
    hs, ws, wt = self.hs.double(), self.ws.double(), None if topk else self.wt.double()
    shard = slice(None)
    if p.tp_size > 1:  # flce.h's TP contract: every rank the whole problem's outputs, dWs its shard's
        ws, wt, shard = _distill_gather_shards(self, p, ws, wt)
    zs = hs @ ws.T
    reduction = o.reduction
    if topk:
        per, d, valid, dz = distill_topk_dz(zs, self.ht, self.wt, self.labels, float(p.temperature),
                                            float(p.ce_weight), p.ignore_index)
    else:
        zt = self.ht.double() @ wt.T
        per, d, valid, dz = distill_dz(zs, zt, self.labels, o.divergence, float(p.beta), float(p.temperature),
                                       float(p.ce_weight), p.ignore_index)
    count = int(valid.sum())
    if reduction == "none":
        loss.copy_(per)
    elif reduction == "sum":
        loss.copy_(per.sum())
    else:
        loss.copy_(per.sum() / count if count else per.sum() * 0)
    divergence.copy_(d)
    if grad_hidden is None and grad_weight is None:
        return
    g = torch.ones((), dtype=torch.float64) if grad_output is None else grad_output.double()
    if reduction == "none":
        assert g.shape == (p.tokens,), "grad_output: N values for reduction none"
        gi = g
    else:
        assert g.numel() == 1, "grad_output: one value for mean/sum"
        gi = g.reshape(()).expand(p.tokens)
        if reduction == "mean":
            gi = gi / count if count else gi * 0
    dz = dz * gi[:, None]
    if grad_hidden is not None:
        grad_hidden.copy_(dz @ ws)
    if grad_weight is not None:
        grad_weight.copy_(dz[:, shard].T @ hs)
    _distill_run.calls += 1


def _distill_gather_shards(self, p, ws, wt):
    """The distillation's TP (problem.tp_size > 1) on the CPU: both weights gathered from every rank's
    shard after the checks the library's all-gather makes; this rank's columns."""
    import torch.distributed as dist
    err = flce.FlceError
    if self.comm is None:
        raise err(1, "FLCE_ERR_INVALID_ARGUMENT", f"tensors.comm: NULL with tp_size={p.tp_size}", "stand-in")
    assert dist.get_world_size() == p.tp_size and dist.get_rank() == p.tp_rank, "the stand-in's group is the world"
    info = _gather_rows(torch.tensor([[p.vocab_offset, p.vocab, p.vocab_total, p.tokens]], dtype=torch.int64))
    starts, ends = info[:, 0].tolist(), (info[:, 0] + info[:, 1]).tolist()
    if starts[0] != 0 or ends[-1] != p.vocab_total or starts[1:] != ends[:-1] or \
            len(set(info[:, 2].tolist())) != 1 or len(set(info[:, 3].tolist())) != 1:
        raise err(1, "FLCE_ERR_INVALID_ARGUMENT", f"ranks disagree or shards do not tile: {info.tolist()}",
                  "stand-in")
    return _gather_rows(ws), None if wt is None else _gather_rows(wt), slice(p.vocab_offset, p.vocab_offset + p.vocab)


_distill_run.calls = 0


def _topk_run(self, logprobs, indices, lse):
    """flce.topk._TopkCall.__call__ in float64: what flce_topk_logprobs writes (larger logit first,
    equal logits by lower index: a stable descending sort, NaN first as in torch)."""
    p = self.problem
    from flce import _distill_lib
    try:  # the library's own checks of the problem, as the real call makes them
        _distill_lib._topk_fn(_distill_lib.TOPK_VALIDATE)
        have = True
    except flce.FlceError:
        have = False
    if have:
        _distill_lib.topk_validate(p)
    assert (p.tokens, p.hidden, p.vocab) == (self.hidden.shape[0], self.hidden.shape[1], self.weight.shape[0]), \
        "top-k problem/tensor mismatch"
    for name, t in (("logprobs", logprobs), ("indices", indices), ("lse", lse)):
        assert t.is_contiguous(), f"{name}: not contiguous"
    z = (self.hidden.double() @ self.weight.double().T) / float(p.temperature)
    l = torch.logsumexp(z, dim=1)
    vals, idx = torch.sort(z, dim=1, descending=True, stable=True)
    indices.copy_(idx[:, :p.k])
    logprobs.copy_(vals[:, :p.k] - l[:, None])
    lse.copy_(l)
    _topk_run.calls += 1


_topk_run.calls = 0

_TP_HEADER = 8  # words (templates/params.h FLCE_TP_HEADER): int64 vocab_offset, vocab, vocab_total, tokens


def _topk_order(logits, ids):
    """The candidates' order in a block and in the merge: logit descending (NaN first), then the
    lower id (a stable sort by id, then a stable sort by logit)."""
    by_id = torch.sort(ids, dim=1, stable=True).indices
    logits, ids = logits.gather(1, by_id), ids.gather(1, by_id)
    by_logit = torch.sort(logits, dim=1, descending=True, stable=True).indices
    return logits.gather(1, by_logit), ids.gather(1, by_logit)


def _topk_stats(self, block):
    """flce_topk_stats in float64: this rank's block as the library lays it out (templates/distill.cu):
    the header, then per token the shard's lse (fp32), 0, its k largest logits (fp32) and their int32
    global ids."""
    p = self.problem
    from flce import _distill_lib
    _distill_lib.topk_validate(p)
    assert block.dtype == torch.uint8 and block.numel() == _distill_lib.topk_stats_bytes(p), "block size"
    z = (self.hidden.double() @ self.weight.double().T) / float(p.temperature)
    vals, idx = torch.sort(z, dim=1, descending=True, stable=True)
    logits, ids = _topk_order(vals[:, :p.k].float(), idx[:, :p.k] + p.vocab_offset)
    words = block.view(torch.int32)
    words[:_TP_HEADER].view(torch.int64).copy_(
        torch.tensor([p.vocab_offset, p.vocab, p.vocab_total, p.tokens], dtype=torch.int64))
    rec = words[_TP_HEADER:].view(p.tokens, 2 + 2 * p.k)
    rec[:, 0] = torch.logsumexp(z, dim=1).float().view(torch.int32)
    rec[:, 1] = 0
    rec[:, 2:2 + p.k] = logits.view(torch.int32)
    rec[:, 2 + p.k:] = ids.to(torch.int32)
    _topk_stats.calls += 1


_topk_stats.calls = 0


def _topk_finish(self, gathered, logprobs, indices, lse):
    """flce_topk_finish in float64: the headers checked (the library raises the flag flce_check
    reports; the stand-in raises at once), lse = log Σ_r exp(lse_r), the k largest of the tp_size·k
    candidates by (logit, lower id), log p = logit − lse."""
    p = self.problem
    from flce import _distill_lib
    _distill_lib.topk_validate(p)
    words = gathered.view(torch.int32).view(p.tp_size, -1)
    heads = words[:, :_TP_HEADER].contiguous().view(torch.int64)
    starts, ends = heads[:, 0].tolist(), (heads[:, 0] + heads[:, 1]).tolist()
    if starts[0] != 0 or ends[-1] != p.vocab_total or starts[1:] != ends[:-1] or \
            set(heads[:, 2].tolist()) != {p.vocab_total} or set(heads[:, 3].tolist()) != {p.tokens}:
        raise flce.FlceError(1, "FLCE_ERR_INVALID_ARGUMENT",
                             f"tensor parallel ranks disagree: the blocks' headers {heads.tolist()}", "stand-in")
    rec = words[:, _TP_HEADER:].reshape(p.tp_size, p.tokens, 2 + 2 * p.k)
    l = torch.logsumexp(rec[:, :, 0].contiguous().view(torch.float32).double(), dim=0)
    cand = rec[:, :, 2:2 + p.k].contiguous().view(torch.float32).permute(1, 0, 2).reshape(p.tokens, -1)
    ids = rec[:, :, 2 + p.k:].permute(1, 0, 2).reshape(p.tokens, -1).to(torch.int64)
    logits, ids = _topk_order(cand, ids)
    indices.copy_(ids[:, :p.k])
    logprobs.copy_(logits[:, :p.k].double() - l[:, None])
    lse.copy_(l)


def install():
    """Routes the binding's kernel calls to the float64 stand-in (idempotent)."""
    global installed
    if installed:
        return
    global _real_scale
    _real_scale = flce._Call.scale
    flce._Call.__call__ = _run
    flce._Call.scale = _scale
    # the saved logits' workspace: a token amount (nothing is kept on the CPU), none where a small
    # budget says all tokens' would not fit (the library's rule, roughly: 2 bytes per logit; under
    # sequence parallelism every rank keeps all ranks' tokens)
    def saved_bytes(self):
        p = self.problem
        tokens = p.tokens * (p.tp_size if p.sequence_parallel else 1)
        return 0 if p.memory_budget and p.memory_budget < 2 * tokens * p.vocab_shard else 256
    flce._Call.saved_bytes = saved_bytes
    flce._Call.strategy_of = lambda self, op, strategy: _choice(
        None, self.problem.tokens, 0, 0, None, None, None, False, False,
        *flce._Options(-100, "mean", strategy, self.problem.memory_budget, 0, 0, 0, 1, False))
    choice = torch.compiler.assume_constant_result(lambda *a: _choice(*a))
    flce._auto_choice = choice
    flce._require_cuda = lambda hidden: None
    global _real_distill_call
    _real_distill_call = flce.distill._DistillCall.__call__
    flce.distill._DistillCall.__call__ = _distill_run
    flce.distill._require_cuda = lambda t, name: None
    flce.topk._TopkCall.__call__ = _topk_run
    flce.topk._TopkCall.stats = _topk_stats
    flce.topk._TopkCall.finish = _topk_finish
    flce.topk._require_cuda = lambda t, name: None
    installed = True
