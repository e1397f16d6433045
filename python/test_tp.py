#!/usr/bin/env python3
"""test_tp.py — tests of flce.vocab_parallel_cross_entropy (tensor and sequence parallelism, issue 45)
on several ranks, against the single-GPU flce.linear_cross_entropy on the whole weight (computed on
every rank) and against float64 PyTorch (flce/_reference.py, autograd for the gradients).

  torchrun --nproc_per_node=2 python/test_tp.py   # 2+ CUDA GPUs: NCCL and the real library
  python3 python/test_tp.py --standin             # no GPU: starts 2 gloo ranks on the CPU, with the
                                                  # kernels replaced by the float64 stand-in and
                                                  # flce's NCCL calls emulated (standin.py); what
                                                  # test_binding.py runs, in small shapes

Cases: route (comm=NcclComm(group), comm=None) × sequence_parallel (False, True) × option sets
(bf16 mean; bf16 none with an RL objective −Σ adv·logprobs − 0.01·Σ entropy + 1e-4·Σ lse²; fp16
sum with bias, class weights, label smoothing and z-loss; bf16 with fp32 accumulators; fp32 with
softcap and temperature; bf16 with a budget too small for the saved logits, class weights and
smoothing), uneven vocab shards, ~5 % ignored labels. Checked: loss, lse, logprobs, entropy,
z_loss, loss_per_token (rel-L2 ≤ 1e-5), argmax (a largest logit), dH, dW, db (rel-L2 ≤ 4e-3 for
16-bit, 1e-4 for fp32, against float64; twice that against the single-GPU call, itself rounded);
every rank's loss (and without sequence parallelism every per-token output) bitwise identical.
Also: comm=None refuses lse's gradient without saved logits (NotImplementedError), comm gives fp32
lse/entropy gradients, shift with sequence_parallel and bad shards raise ValueError. One line per
case (rank 0; the largest error over the ranks). Exit status 0 when all pass, 1 on a failure, 77
when skipped (fewer than 2 CUDA devices, or not launched by torchrun). Then flce.vocab_parallel_topk_logprobs
(topk_checks) over the same shards against the float64 top-k of the whole vocab, ranks bitwise the same.
"""
import ctypes
import datetime
import math
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
STANDIN = "--standin" in sys.argv


def spawn_standin_ranks(world=2, timeout=120):
    """--standin without torchrun: this script on `world` CPU ranks (what torchrun would set)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="2")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--standin"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.time() + timeout
    outs, codes = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += f"\n(timed out after {timeout} s: a rank waits in a collective)"
        outs.append(out)
        codes.append(p.returncode)
    print(outs[0], end="")
    for rank in range(1, world):
        if codes[rank] != codes[0] or codes[rank] not in (0, 77):
            print(f"---- rank {rank} (exit {codes[rank]}) ----\n{outs[rank]}", end="")
    return 0 if all(c == 0 for c in codes) else (77 if all(c == 77 for c in codes) else 1)


if STANDIN and "WORLD_SIZE" not in os.environ:
    sys.exit(spawn_standin_ranks())
if "WORLD_SIZE" not in os.environ:
    # Started directly (as CTest does): with 2 GPUs, launch the ranks through torchrun here, so that
    # a machine with fewer skips (77) instead of torchrun reporting its ranks' exits as a failure.
    try:
        import torch
    except ImportError:
        print("torch is not installed: skipped")
        sys.exit(77)
    if torch.cuda.device_count() < 2:
        print(f"{torch.cuda.device_count()} CUDA device(s): tensor parallelism needs 2; skipped "
              "(or python3 python/test_tp.py --standin on the CPU)")
        sys.exit(77)
    import subprocess
    sys.exit(subprocess.call([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                              os.path.abspath(__file__)] + sys.argv[1:]))
try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)
if not STANDIN and torch.cuda.device_count() < 2:
    print(f"{torch.cuda.device_count()} CUDA device(s): tensor parallelism needs 2; skipped")
    sys.exit(77)

import flce  # noqa: E402
from flce._reference import reference  # noqa: E402

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", RANK))
if STANDIN:
    import standin
    standin.install()
    DEV = torch.device("cpu")
    # small shapes: the stand-in materializes float64 logits (and gathers the weight) on the CPU
    N, D, V, DELTA, SMALL_BUDGET = 24, 16, 301, 10, 1 << 12
else:
    torch.cuda.set_device(LOCAL)
    DEV = torch.device("cuda", LOCAL)
    # uneven shards (2 ranks: 1400 and 1601 rows); a budget that cannot hold all tokens' logits
    N, D, V, DELTA, SMALL_BUDGET = 512, 128, 3001, 100, 1 << 16
dist.init_process_group("gloo" if STANDIN else "nccl", timeout=datetime.timedelta(minutes=3))

# The vocab shards: every rank but the last V // WORLD − DELTA rows, the last the rest.
SIZES = [V // WORLD - DELTA] * (WORLD - 1) + [V - (V // WORLD - DELTA) * (WORLD - 1)]
OFFSET = sum(SIZES[:RANK])
SHARD = slice(OFFSET, OFFSET + SIZES[RANK])
assert N % WORLD == 0
N_LOCAL = N // WORLD

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
# name, dtype, reduction, options, return_* outputs, objective
SETS = [
    ("bf16 mean", BF16, "mean", {}, (), "loss"),
    ("bf16 none RL", BF16, "none", {}, ("lse", "logprobs", "entropy"), "rl"),
    ("fp16 sum bias+cw+smoothing+zloss", F16, "sum",
     dict(bias=True, class_weights=True, label_smoothing=0.1, z_loss=1e-3),
     ("logprobs", "loss_per_token", "argmax", "z_loss"), "loss+logprobs"),
    ("bf16 accumulators", BF16, "mean", dict(accumulators=True), ("logprobs",), "loss+logprobs"),
    ("fp32 softcap+temperature", F32, "mean", dict(softcap=5.0, temperature=0.8),
     ("lse", "logprobs", "entropy", "argmax", "loss_per_token"), "loss+logprobs"),
    # without the saved logits: comm, a chunked loss-and-grad in backward; comm=None, flce_backward
    # from lse (with smoothing and class weights: the log-probs' term apart, on the plain problem)
    ("bf16 none small budget, cw+smoothing", BF16, "none",
     dict(memory_budget=SMALL_BUDGET, class_weights=True, label_smoothing=0.05), ("logprobs", "loss_per_token"),
     "loss+logprobs"),
]
OUTPUTS = ("loss", "lse", "logprobs", "entropy", "z_loss", "loss_per_token")
GRADS = ("dH", "dW", "db")
METRICS = [f"{m} {ref}" for ref in ("flce", "f64") for m in OUTPUTS + GRADS]


def rel(a, b):
    a, b = a.detach().double().reshape(-1), b.detach().double().reshape(-1)
    d = b.norm().item()
    e = (a - b).norm().item()
    return e / d if d else e


def make_data(seed, dtype, opts):
    """The whole problem, the same on every rank (drawn on the CPU, then moved)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, D, generator=g)
    w = torch.randn(V, D, generator=g) * (2.0 / math.sqrt(D))
    y = torch.randint(0, V, (N,), generator=g)
    y[torch.rand(N, generator=g) < 0.05] = -100
    y[3] = -100
    data = dict(h=h.to(dtype), w=w.to(dtype), y=y, adv=torch.randn(N, generator=g, dtype=torch.float64),
                up=torch.randn(N, generator=g, dtype=torch.float64), up_scalar=torch.tensor(1.7, dtype=torch.float64))
    data["b"] = (torch.randn(V, generator=g) * 0.5).to(dtype) if opts.get("bias") else None
    data["cw"] = torch.rand(V, generator=g) + 0.5 if opts.get("class_weights") else None
    return {k: None if v is None else v.to(DEV) for k, v in data.items()}


def objective(o, kind, reduction, outputs, data, rows):
    """The scalar each rank differentiates: o maps output names to tensors (this rank's rows of
    the per-token ones under sequence parallelism, `rows` of the data's per-token weights). Summed
    over the ranks' rows it is the objective of all tokens, the loss counted once (every rank's
    loss is the same; its gradient reaches each rank's shard once)."""
    up = data["up"][rows] if reduction == "none" else data["up_scalar"]
    adv = data["adv"][rows]
    total = torch.zeros((), dtype=torch.float64, device=DEV)
    if kind in ("loss", "loss+logprobs"):
        total = total + (o["loss"].double() * up).sum()
    if kind == "loss+logprobs":
        total = total - (o["logprobs"].double() * adv).sum()
        if "loss_per_token" in outputs:
            total = total + 0.5 * o["loss_per_token"].double().sum()
    if kind == "rl":
        total = (-(o["logprobs"].double() * adv).sum() - 0.01 * o["entropy"].double().sum() +
                 1e-4 * (o["lse"].double() ** 2).sum())
    return total


def as_dict(out):
    return out._asdict() if isinstance(out, flce.LinearCrossEntropyOutput) else {"loss": out}


def references(data, dtype, reduction, opts, outputs, kind):
    """The single-GPU flce call on the whole weight and the float64 reference, with the gradients
    of the objective over all tokens."""
    kw = {k: v for k, v in opts.items() if k not in ("bias", "class_weights", "accumulators")}
    flce_kw = dict(kw, class_weights=data["cw"], reduction=reduction, **{f"return_{k}": True for k in outputs})
    leaves = [data["h"].clone().requires_grad_(), data["w"].clone().requires_grad_()]
    if data["b"] is not None:
        leaves.append(data["b"].clone().requires_grad_())
    single = as_dict(flce.linear_cross_entropy(leaves[0], leaves[1], data["y"],
                                               bias=leaves[2] if len(leaves) > 2 else None, **flce_kw))
    objective(single, kind, reduction, outputs, data, slice(None)).backward()
    ref_kw = {k: v for k, v in kw.items() if k != "memory_budget"}
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    f64 = reference(leaves64[0], leaves64[1], data["y"], bias=leaves64[2] if len(leaves64) > 2 else None,
                    class_weights=data["cw"], reduction=reduction, **ref_kw)
    objective(f64, kind, reduction, outputs, data, slice(None)).backward()
    # float64 logits, for the argmax check
    z = data["h"].double() @ data["w"].double().T
    if data["b"] is not None:
        z = z + data["b"].double()
    z = z / kw.get("temperature", 1.0)
    if kw.get("softcap"):
        z = kw["softcap"] * torch.tanh(z / kw["softcap"])
    grads = lambda ls: dict(zip(GRADS, (t.grad for t in ls)))  # noqa: E731
    return dict(flce=(single, grads(leaves)), f64=(f64, grads(leaves64)), logits=z)


def run_case(data, dtype, reduction, opts, outputs, kind, comm, sp, refs):
    """One vocab_parallel_cross_entropy call and its backward on this rank; returns the errors
    (METRICS order, −1 where not applicable) and whether the cross-rank bits agree."""
    rows = slice(RANK * N_LOCAL, (RANK + 1) * N_LOCAL) if sp else slice(None)
    h = data["h"][rows].clone().requires_grad_()
    w = data["w"][SHARD].clone().requires_grad_()
    b = None if data["b"] is None else data["b"][SHARD].clone().requires_grad_()
    kw = {k: v for k, v in opts.items() if k not in ("bias", "class_weights", "accumulators")}
    acc = opts.get("accumulators")
    gw_acc = torch.ones(w.shape, dtype=torch.float32, device=DEV) if acc else None
    gh_acc = torch.zeros(h.shape, dtype=torch.float32, device=DEV) if acc else None
    out = flce.vocab_parallel_cross_entropy(
        h, w, data["y"][rows].contiguous(), vocab_offset=OFFSET, vocab_total=V, comm=comm, sequence_parallel=sp,
        bias=b, class_weights=data["cw"], reduction=reduction, grad_weight_accumulator=gw_acc,
        grad_hidden_accumulator=gh_acc, **kw, **{f"return_{k}": True for k in outputs})
    o = as_dict(out)
    objective(o, kind, reduction, outputs, data, rows).backward()
    # every rank's loss the same bits; without sequence parallelism every per-token output too
    # (first: the checks below only note problems, so that every rank reaches the same collectives)
    same = True
    for name, t in o.items():
        if t is None or (sp and t.dim()):
            continue
        parts = [torch.empty_like(t) for _ in range(WORLD)]
        dist.all_gather(parts, t.contiguous())
        same = same and all(torch.equal(p, parts[0]) for p in parts)
    problems = []
    if acc:
        if h.grad is not None or w.grad is not None:
            problems.append("accumulated gradients also went to .grad")
        got = dict(dH=gh_acc, dW=gw_acc - 1.0, db=None)
    else:
        got = dict(dH=h.grad, dW=w.grad, db=None if b is None else b.grad)
        problems += [f"{k}: dtype {t.dtype}" for k, t in got.items() if t is not None and t.dtype != dtype]
    errors = []
    for which in ("flce", "f64"):
        ref_out, ref_grads = refs[which]
        for name in OUTPUTS + GRADS:
            if name in OUTPUTS:
                mine = o.get(name) if name == "loss" or name in outputs else None
                want = ref_out[name] if mine is not None else None
            else:
                mine, want = got[name], ref_grads.get(name)
            if mine is None or want is None:
                errors.append(-1.0)
                continue
            want = want[SHARD] if name in ("dW", "db") else want[rows] if want.dim() else want
            if mine.shape != want.shape or (name in OUTPUTS and mine.dtype != torch.float32):
                problems.append(f"{name}: {mine.dtype} {tuple(mine.shape)}, expected {tuple(want.shape)}")
                errors.append(float("nan"))
                continue
            errors.append(rel(mine, want))
    if "argmax" in outputs:
        z, am = refs["logits"][rows], o["argmax"]
        if am.dtype != torch.int64 or am.shape != (z.shape[0],):
            problems.append(f"argmax: {am.dtype} {tuple(am.shape)}")
        elif not (z.gather(1, am.reshape(-1, 1))[:, 0] >= z.max(1).values - 1e-3).all():
            problems.append("argmax is not a largest logit")
    return errors, same, problems


def expect_raises(exc, fn, words):
    try:
        fn()
    except exc as e:
        assert words in str(e), f"{exc.__name__} without '{words}': {e}"
        return
    raise AssertionError(f"no {exc.__name__}")


def extra_checks(comm):
    """Errors that must be raised (the same on every rank, before any collective of the call)."""
    data = make_data(99, F32, {})
    # comm=None with fp32 inputs: no saved logits, so lse has no gradient there
    h = data["h"].clone().requires_grad_()
    w = data["w"][SHARD].clone().requires_grad_()
    out = flce.vocab_parallel_cross_entropy(h, w, data["y"], vocab_offset=OFFSET, vocab_total=V, return_lse=True)
    expect_raises(NotImplementedError, lambda: (out.loss + out.lse.sum()).backward(), "lse")
    # with comm it has one (the chunked loss-and-grad), against the single GPU's
    out = flce.vocab_parallel_cross_entropy(h, w, data["y"], vocab_offset=OFFSET, vocab_total=V, comm=comm,
                                            return_lse=True, return_entropy=True)
    (out.loss + 0.1 * out.lse.sum() - 0.1 * out.entropy.sum()).backward()
    hr, wr = data["h"].clone().requires_grad_(), data["w"].clone().requires_grad_()
    ref = flce.linear_cross_entropy(hr, wr, data["y"], return_lse=True, return_entropy=True)
    (ref.loss + 0.1 * ref.lse.sum() - 0.1 * ref.entropy.sum()).backward()
    e = max(rel(h.grad, hr.grad), rel(w.grad, wr.grad[SHARD]))
    assert e <= 1e-4, f"fp32 lse/entropy gradients with comm: rel err {e:.2e}"
    expect_raises(ValueError, lambda: flce.vocab_parallel_cross_entropy(
        data["h"][:N_LOCAL], w, data["y"][:N_LOCAL], vocab_offset=OFFSET, vocab_total=V, sequence_parallel=True,
        shift=1), "shift")
    expect_raises(ValueError, lambda: flce.vocab_parallel_cross_entropy(
        data["h"], w, data["y"], vocab_offset=V - 1, vocab_total=V), "vocab_offset")


def distill_checks(comm):
    """flce.vocab_parallel_distillation (issue 44): both LM heads sharded like the CE weight, against
    flce.linear_distillation on the whole weights (the single-GPU call; float64 on the stand-in):
    loss, per-token divergence and the student's gradients (hidden's summed over the ranks, weight's
    this rank's rows), mean and none, forward KL (compact) and the fp32-logits path (reverse KL, JSD,
    fp32 inputs); the teacher as top-k; and its errors."""
    g = torch.Generator().manual_seed(123)
    dt_ = 2 * D
    hs = torch.randn(N, D, generator=g).to(BF16).to(DEV)
    ws = (torch.randn(V, D, generator=g) * 1.5 / D ** 0.5).to(BF16).to(DEV)
    ht = torch.randn(N, dt_, generator=g).to(BF16).to(DEV)
    wt = (torch.randn(V, dt_, generator=g) * 2.0 / dt_ ** 0.5).to(BF16).to(DEV)
    y = torch.randint(0, V, (N,), generator=g)
    y[::5] = -100
    y = y.to(DEV)

    def whole_vs_shard(what, dtype, whole, sharded, up=None):
        """whole(h, w) on the whole student weight against sharded(h, w) on this rank's rows, both in
        `dtype` (leaf tensors, backward of the loss, times `up` per token where given): loss, per-token
        divergence within 1e-4, dH and this rank's dW rows within 8e-3. Returns sharded's output."""
        outs, grads = [], []
        for fn, w in ((whole, ws), (sharded, ws[SHARD])):
            h, w = (x.detach().to(dtype, copy=True).requires_grad_() for x in (hs, w))
            out = fn(h, w)
            (out.loss if up is None else out.loss * up).sum().backward()
            outs.append(out), grads.append((h.grad, w.grad))
        (ref, out), ((dh1, dw1), (dh2, dw2)) = outs, grads
        errs = (rel(out.loss, ref.loss), rel(out.divergence, ref.divergence), rel(dh2, dh1), rel(dw2, dw1[SHARD]))
        assert max(errs[:2]) <= 1e-4 and max(errs[2:]) <= 8e-3, f"{what}: loss, divergence, dH, dW {errs}"
        return out

    for reduction, temperature, ce in (("mean", 1.0, 0.5), ("none", 1.5, 0.0)):
        opts = dict(temperature=temperature, reduction=reduction, return_per_token=True, ce_weight=ce)
        out = whole_vs_shard(reduction, BF16, lambda h, w: flce.linear_distillation(h, w, ht, wt, y, **opts),
                             lambda h, w: flce.vocab_parallel_distillation(h, w, ht, wt[SHARD], y, vocab_offset=OFFSET,
                                                                           vocab_total=V, comm=comm, **opts),
                             up=torch.linspace(0.5, 1.5, N, device=DEV) if reduction == "none" else None)
        losses = [torch.empty_like(out.loss) for _ in range(WORLD)]
        dist.all_gather(losses, out.loss.detach().contiguous())
        assert all(torch.equal(x, losses[0]) for x in losses), f"{reduction}: the ranks' losses differ"
    # the fp32-logits path: reverse KL with the CE term, JSD(0.4) at T = 2, forward KL on fp32 inputs
    for divergence, beta, temperature, ce, dtype in (("reverse_kl", 0.0, 1.0, 0.3, BF16), ("jsd", 0.4, 2.0, 0.0, BF16),
                                                       ("forward_kl", 0.0, 1.0, 0.2, F32)):
        ht_, wt_ = ht.to(dtype), wt.to(dtype)
        opts = dict(divergence=divergence, beta=beta, temperature=temperature, return_per_token=True, ce_weight=ce)
        whole_vs_shard(divergence, dtype, lambda h, w: flce.linear_distillation(h, w, ht_, wt_, y, **opts),
                       lambda h, w: flce.vocab_parallel_distillation(h, w, ht_, wt_[SHARD], y, vocab_offset=OFFSET,
                                                                     vocab_total=V, comm=comm, **opts))
    # the teacher as top-k (global ids, 16 a token, distinct) with the CE term
    ids = torch.stack([torch.randperm(V, generator=g)[:16] for _ in range(N)]).to(DEV)
    lp = torch.log_softmax(torch.randn(N, 16, generator=g) * 2, dim=1).to(DEV) - 0.1
    for dtype in (BF16, F32):  # bf16: the compact path; fp32: the fp32-logits path's two reads
        whole_vs_shard(f"top-k teacher {dtype}", dtype,
                       lambda h, w: flce.linear_distillation_topk(h, w, ids, lp, y, ce_weight=0.3, return_per_token=True),
                       lambda h, w: flce.vocab_parallel_distillation_topk(h, w, ids, lp, y, vocab_offset=OFFSET,
                                                                          vocab_total=V, comm=comm, ce_weight=0.3,
                                                                          return_per_token=True))
    expect_raises(TypeError, lambda: flce.vocab_parallel_distillation(
        hs, ws[SHARD], ht, wt[SHARD], y, vocab_offset=OFFSET, vocab_total=V, comm=None), "comm")
    expect_raises(ValueError, lambda: flce.vocab_parallel_distillation(
        hs, ws[SHARD], ht, wt[SHARD], y, vocab_offset=V - 1, vocab_total=V, comm=comm), "vocab_offset")


def topk_checks():
    """flce.vocab_parallel_topk_logprobs (stats, all_gather_into_tensor, finish) over this run's uneven
    shards against the top-k of the float64 logits of the whole vocab: global ids (an id that lost its
    shard's offset fails), log-probs and lse within 1e-5, every rank's outputs bitwise the same; k
    larger than a shard raises before any collective."""
    g = torch.Generator().manual_seed(123)
    h = torch.randn(N, D, generator=g).to(BF16).to(DEV)
    w = (torch.randn(V, D, generator=g) * (2.0 / math.sqrt(D))).to(BF16).to(DEV)
    k, temperature = min(16, min(SIZES)), 0.8
    out = flce.vocab_parallel_topk_logprobs(h, w[SHARD].contiguous(), k, vocab_offset=OFFSET, vocab_total=V,
                                            temperature=temperature)
    differ = []  # (first: every rank reaches the same collectives whatever it finds below)
    for name, t in (("indices", out.indices), ("logprobs", out.logprobs), ("lse", out.lse)):
        mine = t.contiguous().view(torch.uint8).reshape(-1)
        every = [torch.empty_like(mine) for _ in range(WORLD)]
        dist.all_gather(every, mine)
        differ += [name] if not all(torch.equal(every[0], x) for x in every) else []
    assert not differ, f"the ranks' {', '.join(differ)} differ in their bits"
    z = (h.double() @ w.double().T) / temperature
    lse = torch.logsumexp(z, dim=1)
    vals, want = torch.sort(z, dim=1, descending=True, stable=True)
    vals, want = vals[:, :k], want[:, :k]
    ids = out.indices
    assert ids.dtype == torch.int64 and ids.shape == (N, k), f"indices {ids.dtype} {tuple(ids.shape)}"
    assert bool(((ids >= 0) & (ids < V)).all()), "an id outside [0, vocab_total)"
    # the same id, or (a GPU's fp32 logits pass) one whose float64 logit lies as close
    near = (z.gather(1, ids) - vals).abs() <= 1e-5 * (1 + vals.abs())
    wrong = int((~((ids == want) | near)).sum())
    assert wrong == 0, f"{wrong} of {N * k} ids wrong (the first: {ids[0].tolist()} want {want[0].tolist()})"
    e_lp = (out.logprobs.double() - (vals - lse[:, None])).abs().max().item()
    e_lse = ((out.lse.double() - lse).abs() / (1 + lse.abs())).max().item()
    assert e_lp <= 1e-5 and e_lse <= 1e-5, f"log-prob error {e_lp:.2e}, lse error {e_lse:.2e}"
    expect_raises(ValueError, lambda: flce.vocab_parallel_topk_logprobs(
        h, w[SHARD], min(SIZES) + 1, vocab_offset=OFFSET, vocab_total=V), "k")
    return f"log-prob {e_lp:.1e}  lse {e_lse:.1e}"


def on_every_rank(what, fn):
    """fn() on every rank; one line (rank 0: ok or FAIL with what fn returned, a failing rank its
    error). 1 when it failed on any rank."""
    try:
        note, ok = fn() or "", True
    except Exception as e:  # noqa: BLE001
        note, ok = f"{type(e).__name__}: {e}", False
        print(f"FAIL (rank {RANK}) {what}: {note}", flush=True)
    t = torch.tensor([0.0 if ok else 1.0], device=DEV)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if RANK == 0:
        print(f"{'ok  ' if t.item() == 0 else 'FAIL'} {what}{': ' + note if ok and note else ''}", flush=True)
    return int(t.item() != 0)


def make_comm():
    if not STANDIN:
        return flce.NcclComm()
    # the stand-in emulates flce's collectives with torch.distributed: a communicator in name only
    comm = flce.NcclComm.__new__(flce.NcclComm)
    comm.ptr, comm.rank, comm.size, comm.register, comm.group = ctypes.c_void_p(0x1000), RANK, WORLD, False, None
    return comm


def main():
    if RANK == 0:
        where = "CPU stand-in (gloo)" if STANDIN else f"{torch.cuda.get_device_name()} × {WORLD} (NCCL)"
        print(f"{where}: flce {flce.version()} from {flce.library_path()}, torch {torch.__version__}; N={N} D={D} "
              f"V={V} shards {SIZES}")
    comm = make_comm()
    failed = 0
    t_start = time.time()
    for seed, (set_name, dtype, reduction, opts, outputs, kind) in enumerate(SETS):
        data = make_data(seed, dtype, opts)
        refs = references(data, dtype, reduction, opts, outputs, kind)
        tol_out, tol_grad = 1e-5, (1e-4 if dtype == F32 else 4e-3)
        # the single-GPU flce is itself within tol_grad of float64: against it twice that
        tols = {f"{m} {which}": (tol_out if m in OUTPUTS else tol_grad * (2 if which == "flce" else 1))
                for which in ("flce", "f64") for m in OUTPUTS + GRADS}
        for route in ("nccl", "split"):
            for sp in (False, True):
                name = f"{set_name}, {'comm=NcclComm' if route == 'nccl' else 'comm=None'}, sp={sp}"
                t0 = time.time()
                msg = ""
                try:
                    errors, same, problems = run_case(data, dtype, reduction, opts, outputs, kind,
                                                      comm if route == "nccl" else None, sp, refs)
                    bad = [m for m, e in zip(METRICS, errors) if e > tols[m] or math.isnan(e)]
                    ok = not bad and same and not problems
                    msg = "".join(f" ({p})" for p in problems + ([] if same else ["the ranks' bits differ"]))
                except Exception as e:  # noqa: BLE001
                    errors, ok, msg = [-1.0] * len(METRICS), False, f" {type(e).__name__}: {e}"
                # the largest error and any failure over the ranks
                t = torch.tensor([1e9 if math.isnan(e) else e for e in errors] + [0.0 if ok else 1.0],
                                 dtype=torch.float64, device=DEV)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                ok = t[-1].item() == 0
                failed += not ok
                shown = "  ".join(f"{m} {e:.1e}" for m, e in zip(METRICS, t[:-1].tolist()) if e >= 0)
                if RANK == 0 or msg:
                    print(f"{'ok  ' if ok else 'FAIL'} [{time.time() - t0:4.1f} s] {name}: {shown}"
                          f"{msg if msg else ''}{'' if RANK == 0 else f' (rank {RANK})'}", flush=True)
    failed += on_every_rank("errors (shift with sequence_parallel, shards), lse without saved logits (comm=None), "
                            "fp32 lse/entropy gradients (comm)", lambda: extra_checks(comm))
    failed += on_every_rank("vocab_parallel_distillation (mean, none; reverse KL, JSD, fp32) against "
                            "linear_distillation on the whole weights, the teacher as top-k, and its errors",
                            lambda: distill_checks(comm))
    failed += on_every_rank(f"top-k log-probs (stats, all-gather, finish) over shards {SIZES}", topk_checks)
    if RANK == 0:
        print(f"{'all passed' if not failed else f'{failed} failed'} in {time.time() - t_start:.1f} s")
    if not STANDIN:
        comm.close()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
