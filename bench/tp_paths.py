"""tp_paths.py — the PyTorch side of bench/tp_compare.py's training paths under vocab (tensor)
parallelism: the Megatron/verl baseline and the float64 oracle, kept apart from flce so that
`tp_compare.py --selftest` can check them on the CPU (gloo, 1 to 3 processes).

Paths (bench/paths.py's definitions, here with W's rows split over the ranks; adv ~ N(0, 1) per token):
  mean                  cross_entropy(h·wᵀ, y), the mean over valid tokens
  logprobs-adv          −Σ_i adv_i · log p_i(y_i)          (GRPO/PPO's policy term; ignored labels give 0)
  logprobs-adv-entropy  the same − 0.01 · Σ_i H_i          (an entropy bonus over every token)

megatron_objective: the baseline as Megatron-LM and verl write it over a vocab shard: logits =
linear(h, W_shard) in bf16 upcast to fp32; mean: Megatron's _VocabParallelCrossEntropy (the
provider tp_compare.py always had); log-probs: the same three all-reduces (MAX of the row max, SUM
of the target logit, SUM of Σexp) give log p_y = z_y − lse; entropy: verl's vocab-parallel entropy
(Σ p·z all-reduced, H = lse − Σ p·z) fused into the same Function, so one all-reduce more rather
than verl's three more and a clone of the logits: the strongest PyTorch version of that recipe.
Custom backwards reuse the kept softmax in place; dH is all-reduced (bf16) in the backward of the
tensor-parallel copy (_CopyToTP), as Megatron's copy_to_tensor_model_parallel_region.

fp64_stats / fp64_reference: the oracle, vocab-parallel with float64 all-reduces, chunked over
tokens (a few GB at 16384 tokens × a 75968-row shard): per token lse, entropy and target logit,
then for each path with coefficients b_i, c_i
  objective = Σ_i b_i·(lse_i − z_iy) + Σ_i c_i·H_i
  dz_ij     = b_i·(p_ij − 1[j = y_i]) − c_i·p_ij·(log p_ij + H_i)      (dH/dz_ij = −p_ij·(log p_ij + H_i))
  mean: b = valid/count, c = 0; logprobs-adv: b = adv·valid, c = 0; logprobs-adv-entropy: c = −0.01.
"""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

IGNORE = -100
ENTROPY_BONUS = 0.01
PATHS = ("mean", "logprobs-adv", "logprobs-adv-entropy")
# Providers that have the log-prob paths (flce-local is a different problem: the shard alone).
RL_PROVIDERS = ("megatron", "flce-nccl", "flce-nccl-reg", "flce-split")


class _CopyToTP(torch.autograd.Function):
    """Identity forward; backward all-reduces the input gradient (the partial dH of this shard)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _VocabParallelCE(torch.autograd.Function):
    """Per-token loss over fp32 logits of this rank's vocab shard, three all-reduces."""

    @staticmethod
    def forward(ctx, logits, target, offset, group):
        n, vr = logits.shape
        m = logits.max(dim=-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        logits = logits - m.unsqueeze(-1)
        outside = (target < offset) | (target >= offset + vr)
        local = (target - offset).clamp(0, vr - 1)
        rows = torch.arange(n, device=logits.device)
        pred = logits[rows, local].masked_fill(outside, 0.0)
        dist.all_reduce(pred, group=group)
        exp = logits.exp_()
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)
        loss = torch.log(sum_exp) - pred
        exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(exp, outside, local)
        return loss

    @staticmethod
    def backward(ctx, g):
        softmax, outside, local = ctx.saved_tensors
        rows = torch.arange(softmax.shape[0], device=softmax.device)
        grad = softmax
        grad[rows, local] -= 1.0 - outside.to(grad.dtype)
        grad.mul_(g.unsqueeze(-1))
        return grad, None, None, None


def _row_dot(a, b, rows_per=None):
    """Σ_j a_ij·b_ij per row, a slab of rows at a time: verl compiles this product-sum so as not to
    hold an N×V product; slabs of ~256 MB do the same without a compile."""
    n, v = a.shape
    rows_per = rows_per or max(1, (1 << 26) // max(v, 1))
    out = torch.empty(n, dtype=a.dtype, device=a.device)
    for r0 in range(0, n, rows_per):
        out[r0:r0 + rows_per] = (a[r0:r0 + rows_per] * b[r0:r0 + rows_per]).sum(dim=-1)
    return out


class _VocabParallelLogProbs(torch.autograd.Function):
    """log p(y) per token, and with `entropy` H per token, from this rank's shard of fp32 logits.
    Forward: Megatron's three all-reduces (row max, target logit, Σexp) and, for H, verl's Σ p·z
    (one more). The shifted logits overwrite the upcast logits in place (as Megatron's forward
    does: they are this Function's own copy); the softmax is kept (and, for H, the shifted logits)
    for a backward that forms dZ in place in the softmax's buffer:
      dZ = −p·(g_lp + g_H·(log p + H)) + g_lp·1[j = y],   log p = z' − log Σexp."""

    @staticmethod
    def forward(ctx, logits, target, offset, group, entropy):
        n, vr = logits.shape
        m = logits.max(dim=-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        z = logits.sub_(m.unsqueeze(-1))
        outside = (target < offset) | (target >= offset + vr)
        local = (target - offset).clamp(0, vr - 1)
        rows = torch.arange(n, device=z.device)
        pred = z[rows, local].masked_fill(outside, 0.0)
        dist.all_reduce(pred, group=group)
        p = torch.exp(z) if entropy else z.exp_()  # H's backward needs z' beside p
        sum_exp = p.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)
        p.div_(sum_exp.unsqueeze(-1))
        log_s = torch.log(sum_exp)
        logp = pred - log_s
        ctx.entropy = entropy
        if entropy:
            pz = _row_dot(p, z)
            dist.all_reduce(pz, group=group)
            ent = log_s - pz
            ctx.save_for_backward(p, z, outside, local, log_s, ent)
        else:
            ent = torch.zeros_like(logp)
            ctx.mark_non_differentiable(ent)
            ctx.save_for_backward(p, outside, local)
        return logp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        if ctx.entropy:
            p, z, outside, local, log_s, ent = ctx.saved_tensors
            # z' ← −g_H·z' − (g_lp + g_H·(H − log s)) = −(g_lp + g_H·(log p + H)); then dZ = p·z'
            z.mul_(-g_ent.unsqueeze(-1)).sub_((g_lp + g_ent * (ent - log_s)).unsqueeze(-1))
            grad = p.mul_(z)
        else:
            p, outside, local = ctx.saved_tensors
            grad = p.mul_(-g_lp.unsqueeze(-1))
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local] += g_lp.masked_fill(outside, 0.0).to(grad.dtype)
        return grad, None, None, None, None


def _upcast(logits):
    """16-bit logits to fp32 (as the frameworks do); fp32 and fp64 (the CPU self-check) kept."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def megatron_objective(path, h, w, y, adv, offset, group):
    """The path's objective (a scalar, the same on every rank) through the PyTorch baseline; the
    caller runs backward."""
    valid = y != IGNORE
    tgt = torch.where(valid, y, torch.zeros_like(y))
    logits = _upcast(F.linear(_CopyToTP.apply(h, group), w))
    if path == "mean":
        per_tok = _VocabParallelCE.apply(logits, tgt, offset, group)
        return (per_tok * valid).sum() / valid.sum().clamp(min=1)
    entropy = path == "logprobs-adv-entropy"
    lp, ent = _VocabParallelLogProbs.apply(logits, tgt, offset, group, entropy)
    obj = -(lp * (adv * valid)).sum()  # the label mask after the fact, as verl's log_probs.masked_fill
    if entropy:
        obj = obj - ENTROPY_BONUS * ent.sum()
    return obj


def megatron_bytes(path, n, d, vr):
    """What megatron_objective holds at its peak beyond its inputs, roughly: fp32 logits (the mean
    keeps the upcast copy beside its shifted one; the entropy path keeps p beside z'), the 16-bit
    logits or dZ, the two gradients, and 1 GiB of slack: tp_compare.py skips the row as "oom"
    where this does not fit, so that no rank is left waiting in a collective."""
    per = {"mean": 10, "logprobs-adv": 6, "logprobs-adv-entropy": 10}[path]
    return n * vr * per + 2 * (n * d + vr * d) * 2 + (1 << 30)


# ---- the float64 oracle ---------------------------------------------------------------------------

def _rows_per(vr, chunk_elems):
    return max(1, chunk_elems // max(vr, 1))


@torch.no_grad()
def fp64_stats(h, w, y, offset, group, chunk_elems=1 << 27):
    """Per token, over the whole vocabulary: lse, entropy H and the target logit z_y (0 for ignored
    labels), float64. One pass over the shard's logits: each rank sums against its own row max,
    and the shards' sums are rescaled to the global max before one float64 all-reduce."""
    h64, w64 = h.double(), w.double()
    n, vr = h.shape[0], w.shape[0]
    valid = y != IGNORE
    mine = valid & (y >= offset) & (y < offset + vr)
    local = (y - offset).clamp(0, vr - 1)
    m = torch.empty(n, dtype=torch.float64, device=h.device)
    s, pz, zt = torch.zeros_like(m), torch.zeros_like(m), torch.zeros_like(m)
    step = _rows_per(vr, chunk_elems)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        z = h64[r0:r1] @ w64.T
        mr = z.max(dim=1).values
        e = torch.exp(z - mr[:, None])
        m[r0:r1], s[r0:r1], pz[r0:r1] = mr, e.sum(1), (e * z).sum(1)
        idx = torch.arange(r1 - r0, device=h.device)
        zt[r0:r1] = torch.where(mine[r0:r1], z[idx, local[r0:r1]], torch.zeros_like(mr))
        del z, e
    big = m.clone()
    dist.all_reduce(big, op=dist.ReduceOp.MAX, group=group)
    scale = torch.exp(m - big)
    t = torch.stack([s * scale, pz * scale, zt])
    dist.all_reduce(t, group=group)
    lse = big + torch.log(t[0])
    return {"lse": lse, "ent": lse - t[1] / t[0], "zt": t[2]}


def coefficients(path, y, adv):
    """b (the weight of −log p_y) and c (of H) per token, float64; c None where 0."""
    valid = (y != IGNORE).double()
    if path == "mean":
        return valid / valid.sum().clamp(min=1), None
    b = adv.double() * valid
    c = torch.full_like(b, -ENTROPY_BONUS) if path == "logprobs-adv-entropy" else None
    return b, c


@torch.no_grad()
def fp64_reference(path, h, w, y, adv, offset, group, stats, chunk_elems=1 << 27):
    """(objective, dH (N×D, all-reduced: the same on every rank), this rank's dW) of the path in
    float64, from fp64_stats' per-token values: the oracle of every provider's errors."""
    b, c = coefficients(path, y, adv)
    lse, ent, zt = stats["lse"], stats["ent"], stats["zt"]
    obj = (b * (lse - zt)).sum() + ((c * ent).sum() if c is not None else 0.0)
    h64, w64 = h.double(), w.double()
    n, vr = h.shape[0], w.shape[0]
    mine = (y != IGNORE) & (y >= offset) & (y < offset + vr)
    local = (y - offset).clamp(0, vr - 1)
    dh = torch.empty(n, h.shape[1], dtype=torch.float64, device=h.device)
    dw = torch.zeros(vr, h.shape[1], dtype=torch.float64, device=h.device)
    step = _rows_per(vr, chunk_elems)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        logp = (h64[r0:r1] @ w64.T).sub_(lse[r0:r1, None])
        p = torch.exp(logp)
        dz = p * b[r0:r1, None]
        if c is not None:
            dz -= c[r0:r1, None] * p * (logp + ent[r0:r1, None])
        del logp, p
        sel = mine[r0:r1].nonzero().squeeze(1)
        dz[sel, local[r0:r1][sel]] -= b[r0:r1][sel]
        dh[r0:r1] = dz @ w64
        dw.addmm_(dz.T, h64[r0:r1])
        del dz
    dist.all_reduce(dh, group=group)
    return float(obj), dh, dw


def global_rel(got, ref, group, sharded):
    """Relative L2 error over all ranks' shards (sharded) or of a tensor every rank holds."""
    num = ((got.double() - ref) ** 2).sum()
    den = (ref ** 2).sum()
    if sharded:
        t = torch.stack([num, den])
        dist.all_reduce(t, group=group)
        num, den = t[0], t[1]
    return float((num / den.clamp(min=1e-300)).sqrt())


# ---- the CPU self-check ---------------------------------------------------------------------------

def autograd_objective(path, h, w, y, adv):
    """The path on the whole vocabulary, plain autograd (bench/paths.py's torch objective): the
    truth the oracle and the baseline are checked against in float64."""
    logits = h @ w.T
    if path == "mean":
        return F.cross_entropy(logits, y, ignore_index=IGNORE)
    logp = logits.log_softmax(-1)
    valid = y != IGNORE
    lp = logp.gather(1, y.clamp(min=0)[:, None])[:, 0] * valid
    total = -(lp * adv).sum()
    if path == "logprobs-adv-entropy":
        total = total - ENTROPY_BONUS * (-(logp.exp() * logp).sum(-1)).sum()
    return total


def shard_of(v, rank, size):
    """tp_compare.py's split: V // size rows per rank, the last rank the remainder as well."""
    base = v // size
    offset = rank * base
    return offset, (v - offset if rank == size - 1 else base)


def _selftest_worker(rank, size, port, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    lines, failed = [], []

    def check(what, err, tol):
        ok = err <= tol and err == err
        lines.append(f"tp={size} {what}: {err:.2e} (≤ {tol:g}) {'ok' if ok else 'FAILED'}")
        if not ok:
            failed.append(what)

    n, d, v = 41, 24, 59
    g = torch.Generator().manual_seed(11)
    h = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(v, d, generator=g, dtype=torch.float64) * 1.5
    y = torch.randint(0, v, (n,), generator=g)
    y[::6] = IGNORE
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    # labels on every shard's first and last row: the mask and offset arithmetic
    for k in range(size):
        o, s = shard_of(v, k, size)
        y[1 + 2 * k], y[2 + 2 * k] = o, o + s - 1
    offset, shard = shard_of(v, rank, size)
    ws = w[offset:offset + shard].contiguous()
    for path in PATHS:
        hf, wf = h.clone().requires_grad_(), w.clone().requires_grad_()
        truth = autograd_objective(path, hf, wf, y, adv)
        truth.backward()
        t_obj, t_dh, t_dw = float(truth.detach()), hf.grad, wf.grad[offset:offset + shard]
        # the oracle, in chunks of 3 tokens so that the chunk loop and its edges run
        stats = fp64_stats(h, ws, y, offset, None, chunk_elems=3 * shard)
        obj, dh, dw = fp64_reference(path, h, ws, y, adv, offset, None, stats, chunk_elems=3 * shard)
        check(f"{path} oracle objective", abs(obj - t_obj) / abs(t_obj), 1e-12)
        check(f"{path} oracle dH", global_rel(dh, t_dh, None, False), 1e-12)
        check(f"{path} oracle dW", global_rel(dw, t_dw, None, True), 1e-12)
        # the baseline in float64 throughout: its math exactly
        hl, wl = h.clone().requires_grad_(), ws.clone().requires_grad_()
        o = megatron_objective(path, hl, wl, y, adv, offset, None)
        o.backward()
        check(f"{path} megatron fp64 objective", abs(float(o.detach()) - t_obj) / abs(t_obj), 1e-12)
        check(f"{path} megatron fp64 dH", global_rel(hl.grad, t_dh, None, False), 1e-12)
        check(f"{path} megatron fp64 dW", global_rel(wl.grad, t_dw, None, True), 1e-12)
        # bf16 inputs as on the GPU (fp32 softmax, bf16 dZ and dH all-reduce), against the oracle of
        # the same rounded data: that it runs and lands where the baseline lands on the GPU (err dH
        # 7.4e-3 at tp=4, bench/results s19: dZ rounded to bf16), not the 2.5e-3 for flce
        hb, wb = h.bfloat16(), ws.bfloat16()
        sb = fp64_stats(hb, wb, y, offset, None)
        obj_b, dh_b, dw_b = fp64_reference(path, hb, wb, y, adv.float(), offset, None, sb)
        hl, wl = hb.clone().requires_grad_(), wb.clone().requires_grad_()
        try:
            o = megatron_objective(path, hl, wl, y, adv.float(), offset, None)
            o.backward()
        except RuntimeError as exc:  # gloo without bf16 all-reduce: the fp64 checks above stand
            lines.append(f"tp={size} {path} megatron bf16: skipped ({str(exc).splitlines()[0][:80]})")
            continue
        check(f"{path} megatron bf16 objective", abs(float(o.detach()) - obj_b) / abs(obj_b), 2.5e-3)
        check(f"{path} megatron bf16 dH", global_rel(hl.grad, dh_b, None, False), 1.5e-2)
        check(f"{path} megatron bf16 dW", global_rel(wl.grad, dw_b, None, True), 1.5e-2)
    dist.barrier()
    dist.destroy_process_group()
    results[rank] = (lines, failed)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def selftest(sizes=(1, 2, 3)):
    """The oracle and the baseline against float64 autograd on a small problem, on the CPU, in
    process groups (gloo) of 1, 2 and 3 processes (uneven shards at 3). Returns the exit status."""
    import torch.multiprocessing as mp
    failed = []
    for size in sizes:
        with mp.Manager() as mgr:
            results = mgr.dict()
            mp.spawn(_selftest_worker, args=(size, _free_port(), results), nprocs=size, join=True)
            for rank in range(size):
                lines, bad = results[rank]
                if rank == 0:
                    print("\n".join(lines))
                failed += [f"tp={size} rank {rank}: {b}" for b in bad]
    print("selftest: " + ("all ok" if not failed else "FAILED: " + "; ".join(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(selftest())
