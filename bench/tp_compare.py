#!/usr/bin/env python3
"""tp_compare.py — vocab-parallel loss and gradients on 2 or 4 GPUs, side by side in one run:

  megatron     PyTorch, as large training frameworks do it: logits = linear(h, W_shard) in bf16,
               upcast to fp32, all-reduce MAX, all-reduce SUM of the target logit, all-reduce SUM
               of Σexp, softmax kept for backward; dH all-reduced (bf16) in the backward of the
               tensor-parallel copy.
  flce-nccl    flce.vocab_parallel_cross_entropy(comm=NcclComm): flce issues the collectives (one
               all-gather of per-token statistics per token chunk, dH all-reduced in fp32), 6NVD.
  flce-nccl-reg  flce-nccl on a communicator made with NcclComm(register=True): flce's workspace is
               one buffer registered with it (ncclCommRegister), so NCCL may skip its staging copies
               (issue 20, item 3); its extra MiB include that held buffer.
  flce-split   the same through torch.distributed (split phase: one all-gather; backward
               recomputes the logits, 8NVD; dH all-reduced in fp32).
  flce-local   flce.linear_cross_entropy on this rank's shard alone (labels folded into the shard),
               no collective and no merge: what the step's kernels cost by themselves, so that
               flce-nccl − flce-local is what tensor parallelism adds (collectives, waits, merge).
               Its loss and gradients are another problem's: no error columns.

--timeline adds three profiled flce-nccl steps queued after aligned starts (torch.profiler, CUPTI)
and reports the last: every rank's kernels with their start and end on the shared host clock, its
idle time, and how long each NCCL kernel waited for the last rank to start it:
tp-timeline-<device>-x<tp>-<date>[-tag].md.

Run with torchrun, one process per GPU, NCCL's collective log on (it counts collectives):
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=/tmp/nccl.%p.log NCCL_NVLS_ENABLE=0 \\
    torchrun --nproc_per_node=2 bench/tp_compare.py --out DIR
Times: CUDA events, median of --iters steps (forward + backward) after warm-up, the slowest rank.
Memory: peak allocated during one step above what was allocated before it (gradients included), and
the same less the two gradients every provider returns (dH: N x D, dW: the shard, bf16): what the
implementation itself holds. --memory-budget MiB passes memory_budget to the flce providers, --strategy
their strategy.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flce  # noqa: E402
import stamp  # noqa: E402  (bench/, the script's own folder)

IGNORE = -100
MiB = 1 << 20


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
        grad[rows, local] -= 1.0 - outside.float()
        grad.mul_(g.unsqueeze(-1))
        return grad, None, None, None


def megatron_step(h, w, y, offset, group):
    valid = (y != IGNORE)
    tgt = torch.where(valid, y, torch.zeros_like(y))
    logits = F.linear(_CopyToTP.apply(h, group), w).float()
    per_tok = _VocabParallelCE.apply(logits, tgt, offset, group)
    loss = (per_tok * valid).sum() / valid.sum().clamp(min=1)
    loss.backward()
    return loss


def fp64_reference(h, w, y, offset, group):
    """Loss, dH (full) and this rank's dW of the mean loss in float64, computed vocab-parallel with
    float64 all-reduces: the oracle every provider's error is measured against."""
    h64, w64 = h.double(), w.double()
    valid = y != IGNORE
    count = valid.sum().clamp(min=1).double()
    z = h64 @ w64.T
    m = z.max(dim=-1).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    z.sub_(m.unsqueeze(-1))
    vr = w.shape[0]
    local = (y - offset).clamp(0, vr - 1)
    mine = valid & (y >= offset) & (y < offset + vr)
    rows = torch.arange(h.shape[0], device=h.device)
    zt = torch.where(mine, z[rows, local], torch.zeros_like(m))
    dist.all_reduce(zt, group=group)
    z.exp_()
    s = z.sum(dim=-1)
    dist.all_reduce(s, group=group)
    loss = ((torch.log(s) - zt) * valid).sum() / count
    z.div_(s.unsqueeze(-1))
    z[rows[mine], local[mine]] -= 1.0
    z.mul_((valid.double() / count).unsqueeze(-1))
    dh = z @ w64
    dist.all_reduce(dh, group=group)
    dw = z.T @ h64
    return loss, dh, dw


def global_rel(got, ref, group, sharded):
    """Relative L2 error over all ranks' shards (sharded) or of a tensor every rank holds."""
    num = ((got.double() - ref) ** 2).sum()
    den = (ref ** 2).sum()
    if sharded:
        t = torch.stack([num, den])
        dist.all_reduce(t, group=group)
        num, den = t[0], t[1]
    return float((num / den.clamp(min=1e-300)).sqrt())


def time_steps(step, iters, warmup, align=None):
    """Median of this rank's step times (CUDA events). Free-running (align None), each rank starts
    its next step when its own previous one ends, so a rank whose host is late holds the others at
    the first collective and their times include that wait. With align (a tiny all-reduce, then a
    device sync), the ranks start each step together, as a training step's LM head does after the
    layers' collectives: the skew left is the hosts' wake-up jitter."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        if align:
            align()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def time_steps_queued(step, iters, warmup):
    """Median of this rank's step times with the steps queued back to back (no host sync between
    them, as compare.py times single-GPU calls and as a training loop runs): the host's own time
    per step hides behind the GPU's, and each step's events measure its GPU time, collectives'
    waits for the other ranks included."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    events = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        events.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events)


def marker(k, dev):
    """A broadcast of a recognizable size: it brackets one step's collectives in NCCL's log."""
    t = torch.zeros(k, dtype=torch.uint8, device=dev)
    dist.broadcast(t, src=0)
    torch.cuda.synchronize()


NCCL_SIZES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2}
COLL_RE = re.compile(r"\b(AllGather|AllReduce|ReduceScatter|Broadcast|Reduce): opCount \w+ .*?count (\d+) datatype (\d+)")


def ring_bytes(kind, nbytes, ranks):
    """Bytes one rank sends for a collective whose log line names `nbytes` (count × size: the buffer
    for AllReduce/Broadcast, one rank's part for AllGather/ReduceScatter) on a ring of `ranks`:
    what the ring bytes column compares across an all-reduce and a reduce-scatter + all-gather."""
    if kind == "AllReduce":
        return 2 * (ranks - 1) * nbytes // ranks
    if kind in ("AllGather", "ReduceScatter"):
        return (ranks - 1) * nbytes
    return nbytes


def count_collectives(log_path, begin, end, ranks):
    """(count, bytes, ring bytes sent per rank) of the collectives between the marker broadcasts of
    sizes begin and end."""
    try:
        lines = open(log_path, errors="replace").read().splitlines()
    except OSError:
        return None
    inside, calls, nbytes, sent = False, 0, 0, 0
    for line in lines:
        m = COLL_RE.search(line)
        if not m:
            continue
        kind, count, dt = m.group(1), int(m.group(2)), int(m.group(3))
        if kind == "Broadcast" and count in (begin, end):
            if count == end and inside:
                return calls, nbytes, sent
            inside = count == begin
            continue
        if inside:
            calls += 1
            nbytes += count * NCCL_SIZES.get(dt, 1)
            sent += ring_bytes(kind, count * NCCL_SIZES.get(dt, 1), ranks)
    return None


def kernel_trace(step, rank, steps=3, align=None):
    """`steps` steps queued back to back under torch.profiler (CUPTI: it sees flce's driver-API
    launches and NCCL's kernels alike; nsys hangs on our GPU machines, bench/NOTES.md session 17),
    after the ranks' starts are aligned; the last step's kernels (from its flce_prepare on) as
    (start µs, end µs, stream, name), start-ordered, on the host clock the trace uses (one host:
    comparable across ranks). Profiling one step alone shows the profiler's own start-up (a 2 ms
    gap after the first launch, ranks starting ms apart); the last of a few queued steps does not."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    if align:
        align()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    path = f"/tmp/tp_compare_trace_{os.getpid()}_{rank}.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            ts, dur = float(e["ts"]), float(e.get("dur", 0))
            out.append((ts, ts + dur, int(e.get("args", {}).get("stream", -1)), e.get("name", "?")))
    out.sort()
    firsts = [i for i, k in enumerate(out) if short_kernel(k[3]) == "flce_prepare"]
    return out[firsts[-1]:] if firsts else out


def idle_us(t):
    """Time within the span when no kernel of this rank runs on any stream."""
    idle, end = 0.0, None
    for k in t:
        if end is not None and k[0] > end:
            idle += k[0] - end
        end = k[1] if end is None else max(end, k[1])
    return idle


def short_kernel(name):
    """flce's kernels by their own names; NCCL's as nccl:<collective>; the rest as <name>."""
    if name.startswith("ncclDevKernel") or name.startswith("ncclKernel"):
        m = re.search(r"(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv)", name)
        return "nccl:" + (m.group(1) if m else "?")
    return name.split("(")[0][:40]


def timeline_md(provider, traces):
    """Per rank, each kernel's start and end (µs from the first kernel on any rank) and, for the
    k-th NCCL kernel of each rank, how long it waited for the last rank to arrive (a collective
    cannot finish before its last rank starts it): where each rank waits."""
    origin = min(t[0][0] for t in traces if t)
    md = [f"## Kernel timeline, {provider} (the last of 3 steps queued after aligned starts; µs from "
          "the first kernel on any rank)", ""]
    ncc = [[k for k in t if short_kernel(k[3]).startswith("nccl:")] for t in traces]
    summary, tables = [], []
    for r, t in enumerate(traces):
        busy = sum(k[1] - k[0] for k in t)
        span = (max(k[1] for k in t) - t[0][0]) if t else 0.0
        tables += [f"### rank {r}: {len(t)} kernels, span {span:.0f} µs, kernel time {busy:.0f} µs (streams overlap)",
                   "", "| kernel | stream | start | end | µs | waited for the last rank, µs |",
                   "|---|---|---|---|---|---|"]
        j, waited = 0, 0.0
        for k in t:
            name, wait = short_kernel(k[3]), ""
            if name.startswith("nccl:"):
                starts = [c[j][0] for c in ncc if j < len(c)]
                if len(starts) == len(ncc):
                    waited += max(0.0, max(starts) - k[0])
                    wait = f"{max(starts) - k[0]:.0f}"
                j += 1
            tables.append(f"| {name} | {k[2]} | {k[0] - origin:.0f} | {k[1] - origin:.0f} | {k[1] - k[0]:.0f} | {wait} |")
        tables.append("")
        summary.append(f"| {r} | {t[0][0] - origin:.0f} | {span:.0f} | {idle_us(t):.0f} | {waited:.0f} |")
    md += ["| rank | starts at µs | span µs | idle (no kernel on any stream) µs | in collectives waiting "
           "for the last rank µs |", "|---|---|---|---|---|"] + summary + [""] + tables
    return md


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192x4096x128256")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--logit-std", type=float, default=4.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--providers", default="megatron,flce-nccl,flce-split,flce-local",
                    help="comma-separated subset, in this order")
    ap.add_argument("--tag", default="", help="suffix of the result files and of the flce provider names, "
                    "e.g. dh16 for a run under FLCE_TP_DH_16BIT=1")
    ap.add_argument("--memory-budget", type=int, default=None,
                    help="MiB of workspace flce's providers may plan (memory_budget; default: the library's)")
    ap.add_argument("--strategy", default="auto", choices=["auto", "chunked", "recompute"],
                    help="flce's providers' strategy (recompute: 8NVD, a workspace that does not grow with V)")
    ap.add_argument("--timeline", action="store_true",
                    help="after timing flce-nccl, three more steps under torch.profiler (the last reported): every rank's kernels "
                    "and NCCL's waits in tp-timeline-<device>-x<tp>-<date>[-tag].md")
    args = ap.parse_args()
    n, d, v = (int(x) for x in args.shape.split("x"))

    dist.init_process_group("nccl")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda", torch.cuda.current_device())
    group = None
    sync_t = torch.zeros(1, device=dev)  # time_steps' aligned starts
    base = v // size
    offset = rank * base
    shard = v - offset if rank == size - 1 else base

    g = torch.Generator(device=dev).manual_seed(1234)
    h0 = torch.randn(n, d, device=dev, generator=g).to(torch.bfloat16)
    w_full = (torch.randn(v, d, device=dev, generator=g) * (args.logit_std / d ** 0.5)).to(torch.bfloat16)
    w0 = w_full[offset:offset + shard].contiguous()
    del w_full
    y = torch.randint(0, v, (n,), device=dev, generator=g)
    y[torch.rand(n, device=dev, generator=g) < 0.05] = IGNORE
    y_local = torch.where(y == IGNORE, y, y % shard)
    comm = flce.NcclComm(group)
    budget = args.memory_budget * MiB if args.memory_budget else None
    grad_mib = (n * d + shard * d) * h0.element_size() / MiB  # dH and this rank's dW
    wanted = [x.strip() for x in args.providers.split(",") if x.strip()]
    known = ["megatron", "flce-nccl", "flce-nccl-reg", "flce-split", "flce-local"]
    if set(wanted) - set(known):
        ap.error(f"unknown providers: {sorted(set(wanted) - set(known))}")
    comm_reg = flce.NcclComm(group, register=True) if "flce-nccl-reg" in wanted else None

    def make(provider):
        def step():
            h = h0.detach().requires_grad_()
            w = w0.detach().requires_grad_()
            if provider == "megatron":
                loss = megatron_step(h, w, y, offset, group)
            elif provider == "flce-local":
                loss = flce.linear_cross_entropy(h, w, y_local, memory_budget=budget, strategy=args.strategy)
                loss.backward()
            else:
                loss = flce.vocab_parallel_cross_entropy(
                    h, w, y, vocab_offset=offset, vocab_total=v, group=group, memory_budget=budget, strategy=args.strategy,
                    comm={"flce-nccl": comm, "flce-nccl-reg": comm_reg}.get(provider))
                loss.backward()
            step.out = (loss.detach(), h.grad, w.grad)
        return step

    log_path = None
    if os.environ.get("NCCL_DEBUG_FILE"):
        log_path = os.environ["NCCL_DEBUG_FILE"].replace("%p", str(os.getpid())).replace("%h", os.uname().nodename)
    rows, results, timelines = [], {}, []
    commit = stamp.commit(REPO)
    date = datetime.date.today().isoformat()
    for k, provider in enumerate(wanted):  # in the order given: a second run can swap an A/B pair
        step = make(provider)
        step()
        torch.cuda.synchronize()
        marker(1000 + k, dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated(dev) - before) / MiB
        if provider == "flce-nccl-reg" and comm_reg._ws is not None:
            peak += comm_reg._ws.numel() / MiB  # held from the first step on, so not in `before − peak`
        marker(2000 + k, dev)
        results[provider] = [t.float().clone() if t is not None else None for t in step.out]
        ms = time_steps(step, args.iters, args.warmup)
        ms_aligned = time_steps(step, args.iters, 1, align=lambda: (dist.all_reduce(sync_t, group=group),
                                                                     torch.cuda.synchronize()))
        ms_queued = time_steps_queued(step, args.iters, 1)
        if args.timeline and provider == "flce-nccl":
            try:
                trace = kernel_trace(step, rank, align=lambda: (dist.all_reduce(sync_t, group=group),
                                                                 torch.cuda.synchronize()))
            except Exception as exc:  # the profiler is a diagnostic: its failure must not lose the run
                trace = [(0.0, 0.0, -1, f"profiler failed: {exc!r}")]
            traces = [None] * size
            dist.all_gather_object(traces, trace)
            timelines.append(timeline_md(provider + (f"-{args.tag}" if args.tag else ""), traces))
        t = torch.tensor([ms, peak, ms_aligned, ms_queued, peak - grad_mib], device=dev)
        all_t = [torch.zeros_like(t) for _ in range(size)]
        dist.all_gather(all_t, t)
        ms_max = max(float(x[0]) for x in all_t)
        ms_aligned_max = max(float(x[2]) for x in all_t)
        ms_queued_max = max(float(x[3]) for x in all_t)
        peak_max = max(float(x[1]) for x in all_t)
        own_max = max(float(x[4]) for x in all_t)
        coll = count_collectives(log_path, 1000 + k, 2000 + k, size) if log_path else None
        env = {k: os.environ[k] for k in ("FLCE_TP_DH_16BIT", "FLCE_TP_DH_GATHER16", "FLCE_TP_OVERLAP",
                                          "FLCE_TP_OVERLAP_SMS") if k in os.environ}
        rows.append({"shape": args.shape, "tp": size, "ms": round(ms_max, 3), "ms_aligned": round(ms_aligned_max, 3),
                     "ms_queued": round(ms_queued_max, 3),
                     "env": env, "base": provider,
                     "provider": provider + (f"-{args.tag}" if args.tag and provider.startswith("flce") else ""),
                     "tflops": round(6 * n * v * d / (ms_max * 1e-3) / 1e12, 1), "extra_mib": round(peak_max, 1),
                     "extra_mib_without_grads": round(own_max, 1), "memory_budget_mib": args.memory_budget, "strategy": args.strategy,
                     "collectives": coll[0] if coll else None, "coll_bytes": coll[1] if coll else None,
                     "bytes_per_rank": coll[1] if coll else None, "ring_bytes_sent_per_rank": coll[2] if coll else None, "date": date, "commit": commit})
        step.out = None
        torch.cuda.empty_cache()

    r_loss, r_dh, r_dw = fp64_reference(h0, w0, y, offset, group)
    for r in rows:
        if r["base"] == "flce-local":
            r.update(loss=float(results["flce-local"][0]), err_loss=None, err_dh=None, err_dw=None)
            continue
        got = results[r["base"]]
        r["loss"] = float(got[0])
        r["err_loss"] = abs(float(got[0]) - float(r_loss)) / abs(float(r_loss))
        r["err_dh"] = global_rel(got[1], r_dh, group, False)
        r["err_dw"] = global_rel(got[2], r_dw, group, True)
    del r_dh, r_dw
    # the same loss bits on every rank?
    lt = torch.tensor([r["loss"] for r in rows], device=dev, dtype=torch.float64)
    all_l = [torch.zeros_like(lt) for _ in range(size)]
    dist.all_gather(all_l, lt)
    for i, r in enumerate(rows):
        r["loss_same_on_all_ranks"] = (None if r["base"] == "flce-local"  # each rank's own problem
                                       else all(bool(x[i] == lt[i]) for x in all_l))

    if rank == 0:
        name = torch.cuda.get_device_name(dev).replace(" ", "-")
        md = [f"# Vocab-parallel loss+grad, {args.shape}, bf16, logit std {args.logit_std}, tp={size}",
              f"{torch.cuda.get_device_name(dev)} x{size}, {date}, torch {torch.__version__}, "
              f"flce {flce.version()}, median of {args.iters}, slowest rank", "",
              "Errors: relative L2 against a float64 vocab-parallel reference of the same data.", "",
              "ms: free-running steps (each rank starts when its previous step ends); ms aligned: the ranks "
              "start each step together (an all-reduce and a device sync before it), as after a model's layers; "
              "ms queued: the steps queued back to back with no host sync between them (as compare.py and a "
              "training loop run: the host's time per step hidden).", "",
              "| provider | ms | ms aligned | ms queued | TFLOP/s (6NVD) | peak extra MiB | without the grads | collectives/step | bytes/step/rank | ring bytes sent/rank | loss | err loss | err dH | err dW | same loss on all ranks |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            e = lambda x: "–" if x is None else f"{x:.1e}"  # noqa: E731
            md.append(f"| {r['provider']} | {r['ms']:.2f} | {r['ms_aligned']:.2f} | {r['ms_queued']:.2f} | {r['tflops']} | {r['extra_mib']:.0f} | {r['extra_mib_without_grads']:.0f} | "
                      f"{r['collectives']} | {r['coll_bytes']} | {r['ring_bytes_sent_per_rank']} | {r['loss']:.6f} | {e(r['err_loss'])} | "
                      f"{e(r['err_dh'])} | {e(r['err_dw'])} | {r['loss_same_on_all_ranks']} |")
        local = next((r for r in rows if r["base"] == "flce-local"), None)
        nccl = next((r for r in rows if r["base"] == "flce-nccl"), None)
        if local and nccl:
            md += ["", f"Tensor parallelism adds {nccl['ms'] - local['ms']:.2f} ms to flce's kernels on the shard "
                   f"({nccl['provider']} {nccl['ms']:.2f} − {local['provider']} {local['ms']:.2f}); aligned "
                   f"{nccl['ms_aligned'] - local['ms_aligned']:.2f} ms, queued {nccl['ms_queued'] - local['ms_queued']:.2f} ms."]
        if args.memory_budget:
            md += ["", f"flce's memory_budget: {args.memory_budget} MiB."]
        if args.strategy != "auto":
            md += ["", f"flce's strategy: {args.strategy}."]
        if any(r["env"] for r in rows):
            md += ["", "Settings: " + "; ".join(f"{r['provider']} {r['env']}" for r in rows if r["env"])]
        md += ["", f"commit {commit}"]
        text = "\n".join(md) + "\n"
        print(text)
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"tp-compare-{name}-x{size}-{date}" + (f"-{args.tag}" if args.tag else ""))
        with open(stem + ".md", "w") as f:
            f.write(text)
        with open(stem + ".json", "w") as f:
            json.dump(rows, f, indent=1)
        for tl in timelines:
            tstem = os.path.join(args.out, f"tp-timeline-{name}-x{size}-{date}" + (f"-{args.tag}" if args.tag else ""))
            with open(tstem + ".md", "w") as f:
                f.write("\n".join(tl) + "\n")
            print(f"timeline: {tstem}.md")
    comm.close()
    if comm_reg is not None:
        comm_reg.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
