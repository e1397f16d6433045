#!/usr/bin/env python3
"""tp_compare.py — vocab-parallel loss and gradients on 2 or 4 GPUs, side by side in one run:

  megatron     PyTorch, as large training frameworks do it: logits = linear(h, W_shard) in bf16,
               upcast to fp32, all-reduce MAX, all-reduce SUM of the target logit, all-reduce SUM
               of Σexp, softmax kept for backward; dH all-reduced (bf16) in the backward of the
               tensor-parallel copy. The log-prob paths: the same three all-reduces give log p_y,
               verl's vocab-parallel entropy adds one (Σ p·z); bench/tp_paths.py.
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
               Its loss and gradients are another problem's: no error columns. Mean path only.

--paths (issue 45, item 3; bench/paths.py's definitions; adv ~ N(0, 1) per token, fixed by the seed):
  mean                  the mean cross-entropy over valid tokens (every provider; the default)
  logprobs-adv          −Σ_i adv_i · log p_i(y_i)   (ignored labels give 0)
  logprobs-adv-entropy  the same − 0.01 · Σ_i H_i   (the entropy of every token)
The log-prob paths run megatron, flce-nccl, flce-split and flce-nccl-reg (those of --providers): flce
through vocab_parallel_cross_entropy(reduction="none", return_logprobs=True[, return_entropy=True]),
then loss.backward() on the objective. Ratios: vs flce mean = ms / flce-nccl's mean row of the same
shape; vs own mean = ms / the same provider's mean row; vs megatron = ms / megatron's row of the same
path; mem vs megatron = MiB without the grads / megatron's. Below each shape's table, the issue's
targets for the flce log-prob rows: ≤ 1.05× their own mean row, megatron ≥ 1.4× slower, ≤ 0.5× its
memory, errors ≤ 2.5e-3. --shapes runs several shapes in one process (communicators made once).

--timeline adds three profiled flce-nccl steps (mean path) queued after aligned starts (torch.profiler,
CUPTI) and reports the last: every rank's kernels with their start and end on the shared host clock,
its idle time, and how long each NCCL kernel waited for the last rank to start it:
tp-timeline-<device>-x<tp>-<date>[-tag].md.

Run with torchrun, one process per GPU, NCCL's collective log on (it counts collectives):
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL NCCL_DEBUG_FILE=/tmp/nccl.%p.log NCCL_NVLS_ENABLE=0 \\
    torchrun --nproc_per_node=2 bench/tp_compare.py --out DIR \\
      --shapes 8192x4096x128256,16384x4096x151936 --paths mean,logprobs-adv,logprobs-adv-entropy
`python3 bench/tp_compare.py --selftest` (no GPU, no torchrun) checks the PyTorch baseline and the
float64 oracle against float64 autograd on the CPU in gloo groups of 1, 2 and 3 processes.
Times: CUDA events, median of --iters steps (forward + backward) after warm-up, the slowest rank.
Memory: peak allocated during one step above what was allocated before it (gradients included), and
the same less the two gradients every provider returns (dH: N x D, dW: the shard, bf16): what the
implementation itself holds. --memory-budget MiB passes memory_budget to the flce providers, --strategy
their strategy. Errors: relative L2 against a float64 vocab-parallel oracle of the same data (all
tokens, all rows; bench/tp_paths.py), err loss on the objective's value. The files are rewritten
after every row, so that a run cut short keeps its rows.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import flce  # noqa: E402
import stamp  # noqa: E402  (bench/, the script's own folder)
import tp_paths  # noqa: E402
from tp_paths import ENTROPY_BONUS, IGNORE, PATHS, RL_PROVIDERS, global_rel  # noqa: E402

MiB = 1 << 20
DEFAULT_SHAPE = "8192x4096x128256"
PROVIDERS = ["megatron", "flce-nccl", "flce-nccl-reg", "flce-split", "flce-local"]
# The issue's targets for the flce log-prob rows (issue 45).
TARGET_VS_OWN_MEAN, TARGET_SPEEDUP, TARGET_MEM, TARGET_ERR = 1.05, 1.4, 0.5, 2.5e-3


def flce_objective(path, h, w, y, adv, **kw):
    """The path through flce.vocab_parallel_cross_entropy, called as bench/paths.py calls
    linear_cross_entropy: the log-prob paths take reduction "none" and the per-token outputs of the
    returned NamedTuple (.logprobs, .entropy); ignored labels' log-probs are flce's (0), unmasked."""
    if path == "mean":
        return flce.vocab_parallel_cross_entropy(h, w, y, **kw)
    entropy = path == "logprobs-adv-entropy"
    o = flce.vocab_parallel_cross_entropy(h, w, y, ignore_index=IGNORE, reduction="none", return_logprobs=True,
                                          **({"return_entropy": True} if entropy else {}), **kw)
    obj = -(o.logprobs * adv).sum()
    if entropy:
        obj = obj - ENTROPY_BONUS * o.entropy.sum()
    return obj


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


def split_list(text, known, what, ap):
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if known is not None and x not in known]
    if bad:
        ap.error(f"unknown {what}: {bad} (known: {', '.join(known)})")
    return items


def make_data(n, d, v, rank, size, logit_std, dev):
    """One shape's inputs, the same on every rank but for the weight's shard; the generator draws
    in today's order (adv last), so that the mean rows' data are those of earlier runs."""
    offset, shard = tp_paths.shard_of(v, rank, size)
    g = torch.Generator(device=dev).manual_seed(1234)
    h0 = torch.randn(n, d, device=dev, generator=g).to(torch.bfloat16)
    w_full = (torch.randn(v, d, device=dev, generator=g) * (logit_std / d ** 0.5)).to(torch.bfloat16)
    w0 = w_full[offset:offset + shard].contiguous()
    del w_full
    y = torch.randint(0, v, (n,), device=dev, generator=g)
    y[torch.rand(n, device=dev, generator=g) < 0.05] = IGNORE
    adv = torch.randn(n, device=dev, generator=g)
    return {"n": n, "d": d, "v": v, "offset": offset, "shard": shard, "h0": h0, "w0": w0, "y": y,
            "y_local": torch.where(y == IGNORE, y, y % shard), "adv": adv}


def add_ratios(rows):
    """The ratio columns, from the rows there are so far (see the module doc)."""
    def find(shape, path, base):
        return next((x for x in rows if x["shape"] == shape and x["path"] == path and x["base"] == base
                     and x.get("ms")), None)

    def ratio(a, b, key):
        return round(a[key] / b[key], 3) if b is not None and a.get(key) is not None and b.get(key) else None
    for r in rows:
        flce_mean = find(r["shape"], "mean", "flce-nccl")
        own_mean = find(r["shape"], "mean", r["base"]) if r["path"] != "mean" else None
        meg = find(r["shape"], r["path"], "megatron")
        r["vs_flce_mean"] = ratio(r, flce_mean, "ms")
        r["vs_own_mean"] = ratio(r, own_mean, "ms")
        r["vs_megatron"] = ratio(r, meg, "ms")
        r["mem_vs_megatron"] = ratio(r, meg, "extra_mib_without_grads")


def targets_md(rows, shape):
    """The issue's targets, one line per flce log-prob row of the shape."""
    out = []
    for r in rows:
        if r["shape"] != shape or r["path"] == "mean" or not r["base"].startswith("flce") or r.get("error"):
            continue
        errs = [x for x in (r.get("err_loss"), r.get("err_dh"), r.get("err_dw")) if x is not None]

        def mark(ok):
            return "–" if ok is None else ("met" if ok else "MISSED")
        own, meg, mem = r.get("vs_own_mean"), r.get("vs_megatron"), r.get("mem_vs_megatron")
        out.append(
            f"- {r['path']} {r['provider']}: {own if own is not None else '–'}× its mean row "
            f"(≤ {TARGET_VS_OWN_MEAN}: {mark(None if own is None else own <= TARGET_VS_OWN_MEAN)}); megatron takes "
            f"{'–' if not meg else f'{1 / meg:.2f}'}× its time (≥ {TARGET_SPEEDUP}: "
            f"{mark(None if not meg else 1 / meg >= TARGET_SPEEDUP)}); memory {mem if mem is not None else '–'}× "
            f"megatron's (≤ {TARGET_MEM}: {mark(None if mem is None else mem <= TARGET_MEM)}); largest error "
            f"{f'{max(errs):.1e}' if errs else '–'} (≤ {TARGET_ERR}: {mark(max(errs) <= TARGET_ERR if errs else None)})")
    if out:
        out = ["", "Issue 45's targets for the log-prob rows (ms; memory without the grads):"] + out
    return out


def markdown(rows, shapes, args, size, dev, date, commit):
    e = lambda x: "–" if x is None else f"{x:.1e}"  # noqa: E731
    f = lambda x, spec: "–" if x is None else format(x, spec)  # noqa: E731
    md = [f"# Vocab-parallel loss+grad, {', '.join(shapes)}, bf16, logit std {args.logit_std}, tp={size}",
          f"{torch.cuda.get_device_name(dev)} x{size}, {date}, torch {torch.__version__}, "
          f"flce {flce.version()}, median of {args.iters}, slowest rank", "",
          "Errors: relative L2 against a float64 vocab-parallel reference of the same data (err loss: of the "
          "objective's value: the mean loss, or −Σ adv·log p [− 0.01 Σ H]).", "",
          "ms: free-running steps (each rank starts when its previous step ends); ms aligned: the ranks "
          "start each step together (an all-reduce and a device sync before it), as after a model's layers; "
          "ms queued: the steps queued back to back with no host sync between them (as compare.py and a "
          "training loop run: the host's time per step hidden). vs flce mean: ms / flce-nccl's mean row; "
          "vs own mean: ms / the provider's mean row; vs megatron: ms / megatron's row of the path; mem vs "
          "megatron: without the grads, / megatron's."]
    for shape in shapes:
        rs = [r for r in rows if r["shape"] == shape]
        if not rs:
            continue
        md += ["", f"## {shape}", "",
               "| path | provider | ms | ms aligned | ms queued | vs flce mean | vs own mean | vs megatron | TFLOP/s (6NVD) | "
               "peak extra MiB | without the grads | mem vs megatron | collectives/step | bytes/step/rank | "
               "ring bytes sent/rank | loss / objective | err loss | err dH | err dW | same loss on all ranks |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            if r.get("error"):
                md.append(f"| {r['path']} | {r['provider']} | {r['error']} |" + " |" * 17)
                continue
            md.append(f"| {r['path']} | {r['provider']} | {r['ms']:.2f} | {r['ms_aligned']:.2f} | {r['ms_queued']:.2f} | "
                      f"{f(r.get('vs_flce_mean'), '.3f')} | {f(r.get('vs_own_mean'), '.3f')} | "
                      f"{f(r.get('vs_megatron'), '.3f')} | "
                      f"{r['tflops']} | {r['extra_mib']:.0f} | {r['extra_mib_without_grads']:.0f} | "
                      f"{f(r.get('mem_vs_megatron'), '.3f')} | {r['collectives']} | {r['coll_bytes']} | "
                      f"{r['ring_bytes_sent_per_rank']} | {r['loss']:.6f} | {e(r['err_loss'])} | {e(r['err_dh'])} | "
                      f"{e(r['err_dw'])} | {r['loss_same_on_all_ranks']} |")
        local = next((r for r in rs if r["base"] == "flce-local" and not r.get("error")), None)
        nccl = next((r for r in rs if r["base"] == "flce-nccl" and r["path"] == "mean" and not r.get("error")), None)
        if local and nccl:
            md += ["", f"Tensor parallelism adds {nccl['ms'] - local['ms']:.2f} ms to flce's kernels on the shard "
                   f"({nccl['provider']} {nccl['ms']:.2f} − {local['provider']} {local['ms']:.2f}); aligned "
                   f"{nccl['ms_aligned'] - local['ms_aligned']:.2f} ms, queued {nccl['ms_queued'] - local['ms_queued']:.2f} ms."]
        md += targets_md(rows, shape)
    if args.memory_budget:
        md += ["", f"flce's memory_budget: {args.memory_budget} MiB."]
    if args.strategy != "auto":
        md += ["", f"flce's strategy: {args.strategy}."]
    envs = {r["provider"]: r["env"] for r in rows if r.get("env")}
    if envs:
        md += ["", "Settings: " + "; ".join(f"{p} {e_}" for p, e_ in envs.items())]
    md += ["", f"commit {commit}"]
    return "\n".join(md) + "\n"


def main():
    ap = argparse.ArgumentParser(description="vocab-parallel loss+grad: megatron and flce side by side (torchrun)")
    ap.add_argument("--shape", default=None, help=f"one NxDxV shape (default {DEFAULT_SHAPE}); --shapes takes a list")
    ap.add_argument("--shapes", default=None, help="comma-separated NxDxV shapes, run in this order in one process")
    ap.add_argument("--paths", default="mean", help=f"comma-separated subset of {','.join(PATHS)}, in this order "
                    "(default: mean)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--logit-std", type=float, default=4.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--providers", default="megatron,flce-nccl,flce-split,flce-local",
                    help="comma-separated subset, in this order (the log-prob paths run those of "
                    f"{','.join(RL_PROVIDERS)})")
    ap.add_argument("--tag", default="", help="suffix of the result files and of the flce provider names, "
                    "e.g. dh16 for a run under FLCE_DEV=tp_dh_16bit=1")
    ap.add_argument("--memory-budget", type=int, default=None,
                    help="MiB of workspace flce's providers may plan (memory_budget; default: the library's)")
    ap.add_argument("--strategy", default="auto", choices=["auto", "chunked", "recompute"],
                    help="flce's providers' strategy (recompute: 8NVD, a workspace that does not grow with V)")
    ap.add_argument("--timeline", action="store_true",
                    help="after timing flce-nccl (mean), three more steps under torch.profiler (the last reported): every "
                    "rank's kernels and NCCL's waits in tp-timeline-<device>-x<tp>-<date>[-tag].md")
    ap.add_argument("--selftest", action="store_true",
                    help="no GPU: check the PyTorch baseline and the float64 oracle against float64 autograd on the CPU "
                    "(gloo groups of 1, 2 and 3 processes) and exit")
    args = ap.parse_args()
    if args.selftest:
        sys.exit(tp_paths.selftest())
    shapes = split_list(args.shapes or args.shape or DEFAULT_SHAPE, None, "shapes", ap)
    for s in shapes:
        if not re.fullmatch(r"\d+x\d+x\d+", s):
            ap.error(f"shape {s!r}: want NxDxV")
    paths = split_list(args.paths, PATHS, "paths", ap)
    wanted = split_list(args.providers, PROVIDERS, "providers", ap)

    dist.init_process_group("nccl")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda", torch.cuda.current_device())
    group = None
    sync_t = torch.zeros(1, device=dev)  # time_steps' aligned starts

    def align():
        dist.all_reduce(sync_t, group=group)
        torch.cuda.synchronize()

    # one communicator each for the whole run: made once, not per shape or row
    comm = flce.NcclComm(group)
    comm_reg = flce.NcclComm(group, register=True) if "flce-nccl-reg" in wanted else None
    budget = args.memory_budget * MiB if args.memory_budget else None

    def log(msg):
        if rank == 0:
            print(f"[tp_compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def make(provider, path, data):
        h0, w0, y, adv, offset = data["h0"], data["w0"], data["y"], data["adv"], data["offset"]

        def step():
            h = h0.detach().requires_grad_()
            w = w0.detach().requires_grad_()
            if provider == "megatron":
                loss = tp_paths.megatron_objective(path, h, w, y, adv, offset, group)
            elif provider == "flce-local":
                loss = flce.linear_cross_entropy(h, w, data["y_local"], memory_budget=budget, strategy=args.strategy)
            else:
                loss = flce_objective(path, h, w, y, adv, vocab_offset=offset, vocab_total=data["v"], group=group,
                                      memory_budget=budget, strategy=args.strategy,
                                      comm={"flce-nccl": comm, "flce-nccl-reg": comm_reg}.get(provider))
            loss.backward()
            step.out = (loss.detach(), h.grad, w.grad)
        step.out = None
        return step

    def agree(ok):
        """Whether every rank's `ok` holds (one tiny all-reduce): a row fails on all ranks or on none."""
        t = torch.tensor([1.0 if ok else 0.0], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
        return bool(t.item() == 1.0)

    log_path = None
    if os.environ.get("NCCL_DEBUG_FILE"):
        log_path = os.environ["NCCL_DEBUG_FILE"].replace("%p", str(os.getpid())).replace("%h", os.uname().nodename)
    # the developer switches (tp_overlap, tp_dh_16bit, ...) this run was made under, as given
    env = {k: os.environ[k] for k in ("FLCE_DEV",) if k in os.environ}
    rows, timelines = [], []
    commit = stamp.commit(REPO)
    date = datetime.date.today().isoformat()
    name = torch.cuda.get_device_name(dev).replace(" ", "-")
    stem = os.path.join(args.out, f"tp-compare-{name}-x{size}-{date}" + (f"-{args.tag}" if args.tag else ""))

    def save(final=False):
        """Rank 0 rewrites the result files with the rows so far."""
        if rank != 0:
            return
        add_ratios(rows)
        text = markdown(rows, shapes, args, size, dev, date, commit)
        if final:
            print(text)
        os.makedirs(args.out, exist_ok=True)
        for ext, body in ((".md", text), (".json", json.dumps(rows, indent=1))):
            with open(stem + ext + ".tmp", "w") as fh:
                fh.write(body)
            os.replace(stem + ext + ".tmp", stem + ext)
        if timelines:
            tstem = os.path.join(args.out, f"tp-timeline-{name}-x{size}-{date}" + (f"-{args.tag}" if args.tag else ""))
            with open(tstem + ".md", "w") as fh:
                fh.write("\n\n".join("\n".join(tl) for tl in timelines) + "\n")
            if final:
                print(f"timeline: {tstem}.md")

    k = 0  # the row's number: its NCCL log markers (broadcasts of 1000 + k and 2000 + k bytes)
    t_start = time.time()
    for shape in shapes:
        n, d, v = (int(x) for x in shape.split("x"))
        data = make_data(n, d, v, rank, size, args.logit_std, dev)
        shard = data["shard"]
        grad_mib = (n * d + shard * d) * data["h0"].element_size() / MiB  # dH and this rank's dW
        stats = None
        for path in paths:
            providers = wanted if path == "mean" else [p for p in wanted if p in RL_PROVIDERS]
            ref = None
            if any(p != "flce-local" for p in providers):
                t0 = time.time()
                if stats is None:
                    stats = tp_paths.fp64_stats(data["h0"], data["w0"], data["y"], data["offset"], group)
                ref = tp_paths.fp64_reference(path, data["h0"], data["w0"], data["y"], data["adv"], data["offset"],
                                              group, stats)
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                log(f"{shape} {path}: float64 reference in {time.time() - t0:.1f} s")
            for provider in providers:  # in the order given: a second run can swap an A/B pair
                t0 = time.time()
                k += 1
                label = provider + (f"-{args.tag}" if args.tag and provider.startswith("flce") else "")
                row = {"shape": shape, "path": path, "tp": size, "base": provider, "provider": label,
                       "logit_std": args.logit_std, "env": env, "memory_budget_mib": args.memory_budget,
                       "strategy": args.strategy, "date": date, "commit": commit}
                rows.append(row)
                error = None
                if provider == "megatron":
                    # a symmetric decision before any collective: an OOM inside the step on one rank
                    # would leave the others waiting in an all-reduce
                    free, _ = torch.cuda.mem_get_info(dev)
                    free += torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
                    need = tp_paths.megatron_bytes(path, n, d, shard)
                    if not agree(free >= need):
                        error = f"oom (skipped: needs ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free)"
                step = make(provider, path, data)
                if error is None:
                    try:
                        step()
                        torch.cuda.synchronize()
                    except torch.cuda.OutOfMemoryError:
                        error = "oom"
                    except Exception as exc:  # noqa: BLE001  (the row records it: e.g. an API not there yet)
                        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
                    step.out = None
                    if not agree(error is None) and error is None:
                        error = "failed on another rank"
                if error is not None:
                    row["error"] = error
                    log(f"{shape} {path} {label}: {error}")
                    del step
                    torch.cuda.empty_cache()
                    save()
                    continue

                marker(1000 + k, dev)
                torch.cuda.reset_peak_memory_stats(dev)
                before = torch.cuda.memory_allocated(dev)
                step()
                torch.cuda.synchronize()
                peak = (torch.cuda.max_memory_allocated(dev) - before) / MiB
                if provider == "flce-nccl-reg" and comm_reg._ws is not None:
                    peak += comm_reg._ws.numel() / MiB  # held from the first step on, so not in `before − peak`
                marker(2000 + k, dev)
                loss = float(step.out[0])
                if provider == "flce-local" or ref is None:  # another problem's loss: no errors
                    row.update(err_loss=None, err_dh=None, err_dw=None)
                else:
                    r_obj, r_dh, r_dw = ref
                    row.update(err_loss=abs(loss - r_obj) / abs(r_obj),
                               err_dh=global_rel(step.out[1], r_dh, group, False),
                               err_dw=global_rel(step.out[2], r_dw, group, True))
                step.out = None
                ms = time_steps(step, args.iters, args.warmup)
                ms_aligned = time_steps(step, args.iters, 1, align=align)
                ms_queued = time_steps_queued(step, args.iters, 1)
                if args.timeline and provider == "flce-nccl" and path == "mean":
                    try:
                        trace = kernel_trace(step, rank, align=align)
                    except Exception as exc:  # the profiler is a diagnostic: its failure must not lose the run
                        trace = [(0.0, 0.0, -1, f"profiler failed: {exc!r}")]
                    traces = [None] * size
                    dist.all_gather_object(traces, trace)
                    timelines.append(timeline_md(label + (f", {shape}" if len(shapes) > 1 else ""), traces))
                step.out = None
                t = torch.tensor([ms, peak, ms_aligned, ms_queued, peak - grad_mib, loss], device=dev, dtype=torch.float64)
                all_t = [torch.zeros_like(t) for _ in range(size)]
                dist.all_gather(all_t, t)
                ms_max = max(float(x[0]) for x in all_t)
                coll = count_collectives(log_path, 1000 + k, 2000 + k, size) if log_path else None
                row.update(ms=round(ms_max, 3), ms_aligned=round(max(float(x[2]) for x in all_t), 3),
                           ms_queued=round(max(float(x[3]) for x in all_t), 3),
                           tflops=round(6 * n * v * d / (ms_max * 1e-3) / 1e12, 1),
                           extra_mib=round(max(float(x[1]) for x in all_t), 1),
                           extra_mib_without_grads=round(max(float(x[4]) for x in all_t), 1),
                           collectives=coll[0] if coll else None, coll_bytes=coll[1] if coll else None,
                           bytes_per_rank=coll[1] if coll else None, ring_bytes_sent_per_rank=coll[2] if coll else None,
                           loss=loss,
                           # the same loss bits on every rank? (flce-local: each rank's own problem)
                           loss_same_on_all_ranks=None if provider == "flce-local"
                           else all(bool(x[5] == t[5]) for x in all_t))
                del step
                torch.cuda.empty_cache()
                log(f"{shape} {path} {label}: {ms_max:.2f} ms, {row['extra_mib']:.0f} MiB, err dH "
                    f"{row['err_dh'] if row['err_dh'] is None else format(row['err_dh'], '.1e')} "
                    f"({time.time() - t0:.0f} s; {time.time() - t_start:.0f} s in all)")
                save()
            del ref
            torch.cuda.empty_cache()
        del data, stats
        torch.cuda.empty_cache()

    save(final=True)
    comm.close()
    if comm_reg is not None:
        comm_reg.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
