#!/usr/bin/env python3
"""distill_compare.py — flce.linear_distillation (issue 44) against the same loss in PyTorch, in one run.

For each shape N x Ds x V[:Dt] (tokens x student hidden x vocab, teacher hidden Dt, default Ds; bf16)
it times every provider the way a training step calls it (leaf student tensors, teacher tensors
without grad, loss.backward(), the gradients in .grad) with CUDA events: --warmup calls, one call
measured for memory and errors, then the median of --iters timed calls. Rows go into
<out>/distill-<device>-<date>[-tag].{json,md}, rewritten after every provider (a run cut short keeps
what it measured); the Markdown also goes to stdout at the end, progress to stderr.

  python3 bench/distill_compare.py                      # the three shapes of issue 44 (~2-2.5 min on an H200)
  python3 bench/distill_compare.py --quick              # one small shape, few iterations (~30 s)
  python3 bench/distill_compare.py --shapes 8192x2048x151936:4096 --divergence jsd --beta 0.5
  python3 bench/distill_compare.py --cpu-dry            # no GPU: tiny shapes on the CPU, flce through
                                                        # python/standin.py, to check the script itself

Providers:
  cublas-floor     the student's three GEMMs (logits, dH = dZ.W, dW = dZ^T.H) and the teacher's forward
                   GEMM, torch.matmul in bf16, nothing else (dZ: a preallocated random N x V input)
  flce             flce.linear_distillation (default options)
  flce@M           the same with memory_budget = M MiB (e.g. flce@1024; a budget given bounds flce's whole
                   workspace)
  torch-eager      the loss written in PyTorch on materialized logits: both logit tensors, fp32
                   log_softmax at T, the divergence, masked mean; autograd (skipped with a note where
                   its estimated peak exceeds the free memory)
  torch-compile    torch.compile of the same function (default mode, dynamic=False; compiled per shape,
                   the compile in the warm-up)
  torch-chunked    what RL / post-training frameworks do (Liger's chunked-loss base, TRL, NeMo-RL):
                   a loop over token chunks (--chunk tokens) materializing each chunk's logits of both
                   models, the chunk's gradients by autograd inside the forward (accumulated: dH rows,
                   dW in fp32), scaled by the upstream gradient in backward
  liger-jsd        liger_kernel's LigerFusedLinearJSD (jsd_beta: 0 = forward KL, 1 = reverse KL, as ours)
                   when importable; else a row whose note says it was skipped

Each row: shape, provider, ms (median), ms_min, ms_max, iters (timed calls: --iters, fewer for a
provider whose checked call says they would take over --provider-seconds, at least 3), vs_floor (ms / cublas-floor), extra_mib
(torch.cuda.max_memory_allocated during the checked call minus what was allocated before it: the
inputs; the gradients it returns count), err_loss (relative, against the float64 loss over all
tokens), err_dh (relative L2 over --samples token rows), err_dw (relative L2 over --samples vocab
rows, every token's contribution), divergence, beta, temperature, note, error, device, date,
commit, torch. The float64 reference is computed on the GPU in chunks of rows (both models' full-V
logits in fp64), from the same bf16 inputs.
"""
import argparse
import datetime
import gc
import json
import math
import os
import re
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import stamp  # noqa: E402  (bench/)

ALL_SHAPES = ["8192x4096x128256", "8192x2048x151936:4096", "4096x2048x32000"]
QUICK_SHAPES = ["2048x1024x32000:2048"]
DRY_SHAPES = ["96x32x500", "64x16x300:24"]
PROVIDERS = ["cublas-floor", "flce", "torch-eager", "torch-compile", "torch-chunked", "liger-jsd"]
IGNORE = -100
MiB = 1 << 20
T_START = time.time()


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')} +{time.time() - T_START:5.0f}s] {msg}", file=sys.stderr, flush=True)


def parse_shape(s):
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)(?::(\d+))?", s.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"shape {s!r}: expected NxDsxV or NxDsxV:Dt, e.g. 8192x2048x151936:4096")
    n, ds, v, dt = m.groups()
    return int(n), int(ds), int(v), int(dt or ds)


def shape_name(n, ds, v, dt):
    return f"{n}x{ds}x{v}" + (f":{dt}" if dt != ds else "")


# ---- data and the float64 reference ----------------------------------------------------------

def make_data(n, ds, dt, v, dtype, device, seed, logit_std=4.0):
    """Student and teacher hidden ~ N(0, 1), weights scaled so the logits have std ~ logit_std (the
    teacher's from its own weights, a different distribution); ~5% of the labels ignore_index."""
    g = torch.Generator(device=device).manual_seed(seed)

    def weight(d):
        w = torch.randn(v, d, device=device, generator=g)
        return w.mul_(logit_std / math.sqrt(d)).to(dtype)
    hs = torch.randn(n, ds, device=device, generator=g).to(dtype)
    ws = weight(ds)
    ht = torch.randn(n, dt, device=device, generator=g).to(dtype)
    wt = weight(dt)
    y = torch.randint(0, v, (n,), device=device, generator=g, dtype=torch.int64)
    y[torch.rand(n, device=device, generator=g) < 0.05] = IGNORE
    return hs, ws, ht, wt, y


@torch.no_grad()
def reference(data, opts, samples, seed, chunk_elems=1 << 26):
    """Float64: the mean loss over all tokens, dH rows of `samples` random valid tokens and dW rows of
    `samples` random vocab rows (all tokens' contributions), from both models' fp64 logits in chunks
    of rows (standin.distill_dz: testing/ref.c's formulas, checked against autograd by
    python/test_distill.py)."""
    from standin import distill_dz
    hs, ws, ht, wt, y = data
    n, v = hs.shape[0], ws.shape[0]
    dev = hs.device
    ws64, wt64 = ws.double(), wt.double()
    valid = y != IGNORE
    count = max(int(valid.sum()), 1)
    gen = torch.Generator(device=dev).manual_seed(seed + 1)
    valid_idx = valid.nonzero().squeeze(1)
    tok = valid_idx[torch.randperm(valid_idx.numel(), device=dev, generator=gen)[:samples]].sort().values
    voc = torch.randperm(v, device=dev, generator=gen)[:samples].sort().values
    dh_ref = torch.zeros(tok.numel(), ws.shape[1], dtype=torch.float64, device=dev)
    dw_ref = torch.zeros(voc.numel(), ws.shape[1], dtype=torch.float64, device=dev)
    total = torch.zeros((), dtype=torch.float64, device=dev)
    rows = max(1, min(n, chunk_elems // v))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        h64 = hs[r0:r1].double()
        zs, zt = h64 @ ws64.T, ht[r0:r1].double() @ wt64.T
        per, _, _, dz = distill_dz(zs, zt, y[r0:r1], opts["divergence"], opts["beta"], opts["temperature"], 0.0,
                                   IGNORE)
        del zs, zt
        total += per.sum()
        dz /= count
        dw_ref += dz[:, voc].T @ h64
        inside = (tok >= r0) & (tok < r1)
        if inside.any():
            dh_ref[inside] = dz[tok[inside] - r0] @ ws64
        del dz, per, h64
    return {"mean": (total / count).item(), "tok": tok, "dh": dh_ref, "voc": voc, "dw": dw_ref}


def rel_l2(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def errors(out, ref):
    loss, dh, dw = out
    e = {"err_loss": abs(float(loss) - ref["mean"]) / abs(ref["mean"]) if ref["mean"] else abs(float(loss))}
    if dh is not None:
        e["err_dh"] = rel_l2(dh[ref["tok"]], ref["dh"])
    if dw is not None:
        e["err_dw"] = rel_l2(dw[ref["voc"]], ref["dw"])
    return e


# ---- the loss in PyTorch ---------------------------------------------------------------------

def torch_token_divergence(zs, zt, divergence, beta, temperature):
    """Per-token D_i from raw logits (student with grad, teacher without), fp32, at temperature T."""
    lq = F.log_softmax(zs.float() / temperature, -1)
    lp = F.log_softmax(zt.float() / temperature, -1)
    if divergence == "jsd" and beta == 0:
        divergence = "forward_kl"
    elif divergence == "jsd" and beta == 1:
        divergence = "reverse_kl"
    if divergence == "forward_kl":
        return (lp.exp() * (lp - lq)).sum(-1)
    if divergence == "reverse_kl":
        return (lq.exp() * (lq - lp)).sum(-1)
    lm = torch.logaddexp(lp + math.log(beta), lq + math.log1p(-beta))
    return beta * (lp.exp() * (lp - lm)).sum(-1) + (1 - beta) * (lq.exp() * (lq - lm)).sum(-1)


def torch_distill(hs, ws, ht, wt, y, divergence="forward_kl", beta=0.5, temperature=1.0):
    """The whole loss materialized: both N x V logit tensors, the masked mean."""
    zs = hs @ ws.T
    with torch.no_grad():
        zt = ht @ wt.T
    d = torch_token_divergence(zs, zt, divergence, beta, temperature)
    valid = y != IGNORE
    return (d * valid).sum() / valid.sum().clamp(min=1)


class ChunkedDistill(torch.autograd.Function):
    """Token chunks: each chunk's logits of both models materialized, its student gradients by
    autograd inside forward (dH rows; dW summed in fp32), scaled by the upstream gradient in
    backward — the chunked loss of the RL / post-training frameworks."""

    @staticmethod
    def forward(ctx, hs, ws, ht, wt, y, chunk, divergence, beta, temperature):
        n = hs.shape[0]
        valid = y != IGNORE
        count = valid.sum().clamp(min=1).to(torch.float32)
        dh = torch.empty_like(hs)
        dw = torch.zeros(ws.shape, dtype=torch.float32, device=ws.device)
        total = torch.zeros((), dtype=torch.float32, device=hs.device)
        w_leaf = ws.detach().requires_grad_()
        for r0 in range(0, n, chunk):
            r1 = min(n, r0 + chunk)
            h_leaf = hs[r0:r1].detach().requires_grad_()
            with torch.enable_grad():
                zs = h_leaf @ w_leaf.T
                with torch.no_grad():
                    zt = ht[r0:r1] @ wt.T
                d = torch_token_divergence(zs, zt, divergence, beta, temperature)
                loss_c = (d * valid[r0:r1]).sum() / count
            gh, gw = torch.autograd.grad(loss_c, (h_leaf, w_leaf))
            dh[r0:r1] = gh
            dw += gw
            total += loss_c.detach()
            del zs, zt, d, loss_c, gh, gw
        ctx.save_for_backward(dh, dw.to(ws.dtype))
        return total

    @staticmethod
    def backward(ctx, g):
        dh, dw = ctx.saved_tensors
        return dh * g, dw * g, None, None, None, None, None, None, None


# ---- providers -------------------------------------------------------------------------------
# factory(data, opts, state, args) returns step(): one call as a training step makes it, returning
# (loss, dh, dw) or None; optional attribute note.

def user_step(fn, data):
    """fn(hs, ws, ht, wt, y) -> loss on leaf student tensors; loss.backward(); the .grad's."""
    hs, ws, ht, wt, y = data
    h, w = hs.detach().requires_grad_(), ws.detach().requires_grad_()

    def step():
        h.grad = w.grad = None
        loss = fn(h, w, ht, wt, y)
        loss.backward()
        return loss.detach(), h.grad, w.grad
    return step


def p_floor(data, opts, state, args):
    hs, ws, ht, wt, y = data
    dz = torch.randn(hs.shape[0], ws.shape[0], device=hs.device, dtype=hs.dtype)

    def step():
        zs = torch.matmul(hs, ws.T)
        zt = torch.matmul(ht, wt.T)
        dh = torch.matmul(dz, ws)
        dw = torch.matmul(dz.T, hs)
        del zs, zt, dh, dw
    return step


def p_flce(data, opts, state, args):
    import flce
    return user_step(lambda h, w, t_h, t_w, y: flce.linear_distillation(h, w, t_h, t_w, y, ignore_index=IGNORE,
                                                                        **opts), data)


def eager_peak_bytes(n, v, dtype_bytes):
    """A generous estimate of torch-eager's peak: the 16-bit logits of both models, about eight fp32
    N x V tensors alive at once in forward and backward."""
    return n * v * (2 * dtype_bytes + 8 * 4)


def free_bytes(device):
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free


def p_eager(data, opts, state, args):
    hs, ws = data[0], data[1]
    need, free = eager_peak_bytes(hs.shape[0], ws.shape[0], hs.element_size()), free_bytes(hs.device)
    if free is not None and need > 0.9 * free:
        raise Skip(f"skipped: estimated peak {need / MiB:.0f} MiB > 90% of the {free / MiB:.0f} MiB free (would OOM)")
    return user_step(lambda *a: torch_distill(*a, **opts), data)


def p_compile(data, opts, state, args):
    hs, ws = data[0], data[1]
    need, free = eager_peak_bytes(hs.shape[0], ws.shape[0], hs.element_size()), free_bytes(hs.device)
    if free is not None and need > 0.9 * free:
        raise Skip(f"skipped: estimated peak {need / MiB:.0f} MiB > 90% of the {free / MiB:.0f} MiB free")
    compiled = torch.compile(lambda *a: torch_distill(*a, **opts), dynamic=False, backend=args.compile_backend)
    step = user_step(compiled, data)
    step.note = f"compiled in the warm-up ({args.compile_backend})"
    return step


def p_chunked(data, opts, state, args):
    step = user_step(lambda h, w, t_h, t_w, y: ChunkedDistill.apply(
        h, w, t_h, t_w, y, args.chunk, opts["divergence"], opts["beta"], opts["temperature"]), data)
    step.note = f"{args.chunk}-token chunks, grads in forward"
    return step


def p_liger(data, opts, state, args):
    try:
        from liger_kernel.transformers import LigerFusedLinearJSD
    except Exception as e:  # noqa: BLE001
        raise Skip(f"skipped: liger_kernel not importable ({type(e).__name__}: {str(e)[:120]})")
    beta = {"forward_kl": 0.0, "reverse_kl": 1.0}.get(opts["divergence"], opts["beta"])
    try:
        jsd = LigerFusedLinearJSD(jsd_beta=beta, ignore_index=IGNORE, temperature=opts["temperature"])
    except (AssertionError, TypeError) as e:
        raise Skip(f"skipped: this liger_kernel refuses jsd_beta={beta} ({type(e).__name__}: {str(e)[:120]})")
    step = user_step(lambda h, w, t_h, t_w, y: jsd(h, w, t_h, t_w, y), data)
    step.note = f"LigerFusedLinearJSD(jsd_beta={beta})"
    return step


FACTORIES = {"cublas-floor": p_floor, "flce": p_flce, "torch-eager": p_eager, "torch-compile": p_compile,
             "torch-chunked": p_chunked, "liger-jsd": p_liger}


class Skip(Exception):
    """A provider that does not run here; the message becomes the row's note."""


# ---- running one provider --------------------------------------------------------------------

ROW_KEYS = ["shape", "provider", "ms", "ms_min", "ms_max", "iters", "vs_floor", "extra_mib", "err_loss", "err_dh",
            "err_dw", "divergence", "beta", "temperature", "note", "error", "device", "date", "commit", "torch"]


def first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


class Timer:
    """CUDA events on a GPU, perf_counter on the CPU (--cpu-dry)."""

    def __init__(self, cuda):
        self.cuda = cuda

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def start(self):
        if self.cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            return (s, e)
        return [time.perf_counter(), None]

    def stop(self, t):
        if self.cuda:
            t[1].record()
        else:
            t[1] = time.perf_counter()

    def ms(self, t):
        return t[0].elapsed_time(t[1]) if self.cuda else (t[1] - t[0]) * 1e3


def run_provider(name, data, opts, ref, state, args, timer):
    row = {k: None for k in ROW_KEYS}
    row["provider"] = name
    step = out = None
    cuda = timer.cuda
    try:
        if name.startswith("flce@"):
            step = p_flce(data, dict(opts, memory_budget=int(name[5:]) * MiB), state, args)
            step.note = f"memory_budget {name[5:]} MiB"
        else:
            step = FACTORIES[name](data, opts, state, args)
        row["note"] = getattr(step, "note", None)
        for _ in range(args.warmup):
            out = step()
            out = None
        timer.sync()
        if cuda:
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        t_check = time.perf_counter()
        out = step()
        timer.sync()
        t_check = time.perf_counter() - t_check
        # a slow provider gets fewer timed calls (at least 3): the run's length stays predictable
        iters = min(args.iters, max(3, int(args.provider_seconds / max(t_check, 1e-6))))
        row["iters"] = iters
        if cuda:
            row["extra_mib"] = round((torch.cuda.max_memory_allocated() - base) / MiB, 1)
        if out is not None and ref is not None:
            row.update({k: float(f"{x:.3g}") for k, x in errors(out, ref).items()})
        out = None
        marks = []
        for _ in range(iters):
            t = timer.start()
            out = step()
            timer.stop(t)
            out = None
            marks.append(t)
        timer.sync()
        times = [timer.ms(t) for t in marks]
        row["ms"], row["ms_min"], row["ms_max"] = (round(statistics.median(times), 3), round(min(times), 3),
                                                   round(max(times), 3))
    except Skip as e:
        row["note"] = str(e)
    except Exception as e:  # noqa: BLE001  (every failure is a result here: OOM, compile error, FlceError)
        row["error"] = first_line(e)
        for k in ("ms", "ms_min", "ms_max", "extra_mib", "err_loss", "err_dh", "err_dw"):
            row[k] = None
    finally:
        step = out = None
        gc.collect()
        if cuda:
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001  (a sticky CUDA error: later rows will say so too)
                row["error"] = row["error"] or first_line(e)
    return row


# ---- output ----------------------------------------------------------------------------------

def fmt(x, spec):
    return "—" if x is None else format(x, spec) if isinstance(x, (int, float)) else str(x)


def clean(x):  # strict JSON: a NaN or infinite error becomes a string
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def markdown(rows, header):
    lines = header + ["", "| shape | provider | ms | vs floor | extra MiB | err loss | err dH | err dW | note |",
                      "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        note = "; ".join(x for x in (r.get("error"), r.get("note")) if x)
        lines.append(f"| {r['shape']} | {r['provider']} | {fmt(r['ms'], '.2f')} | {fmt(r['vs_floor'], '.3f')} | "
                     f"{fmt(r['extra_mib'], '.0f')} | {fmt(r['err_loss'], '.2e')} | {fmt(r['err_dh'], '.2e')} | "
                     f"{fmt(r['err_dw'], '.2e')} | {note} |")
    return "\n".join(lines) + "\n"


def write(stem, rows, header):
    with open(stem + ".json", "w") as f:
        f.write(json.dumps([{k: clean(r.get(k)) for k in ROW_KEYS} for r in rows], indent=1) + "\n")
    with open(stem + ".md", "w") as f:
        f.write(markdown(rows, header))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", type=lambda s: [parse_shape(x) for x in s.split(",") if x.strip()],
                    help="comma-separated NxDsxV[:Dt] (default: " + ", ".join(ALL_SHAPES) + ")")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_SHAPES[0]}, 2 warm-up and 5 timed calls")
    ap.add_argument("--cpu-dry", action="store_true",
                    help="no GPU: tiny shapes on the CPU in fp32, flce through python/standin.py (a float64 "
                         "stand-in), torch.compile with aot_eager; checks the script, measures nothing")
    ap.add_argument("--providers", default=",".join(PROVIDERS), help="comma-separated, of " + ", ".join(PROVIDERS))
    ap.add_argument("--divergence", default="forward_kl", choices=["forward_kl", "reverse_kl", "jsd"])
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--iters", type=int, default=None, help="timed calls per provider (default 10, --quick 5)")
    ap.add_argument("--warmup", type=int, default=None, help="calls before the checked one (default 2)")
    ap.add_argument("--provider-seconds", type=float, default=6.0,
                    help="timed calls per provider capped at this many seconds' worth, at least 3 (default 6)")
    ap.add_argument("--chunk", type=int, default=1024, help="torch-chunked's tokens per chunk (default 1024)")
    ap.add_argument("--samples", type=int, default=64, help="token rows (dH) and vocab rows (dW) checked in fp64")
    ap.add_argument("--compile-backend", default=None, help="torch.compile's backend (default inductor; "
                                                            "--cpu-dry aot_eager)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"), help="directory of the results")
    ap.add_argument("--tag", default="", help="suffix of the file names")
    args = ap.parse_args()

    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = [p for p in providers if p not in FACTORIES and not re.fullmatch(r"flce@[1-9][0-9]*", p)]
    if unknown:
        ap.error(f"unknown providers {unknown}; known: {', '.join(PROVIDERS)}")
    if args.cpu_dry:
        device, dtype, shapes = torch.device("cpu"), torch.float32, args.shapes or [parse_shape(s) for s in DRY_SHAPES]
        args.compile_backend = args.compile_backend or "aot_eager"
        args.iters = 2 if args.iters is None else args.iters
        args.warmup = 1 if args.warmup is None else args.warmup
        args.chunk = min(args.chunk, 40)
        import flce
        import standin
        standin.install()
        device_name = "cpu-dry"
    else:
        if not torch.cuda.is_available():
            ap.error("no CUDA device (use --cpu-dry to check the script on the CPU)")
        import flce
        device, dtype = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16
        shapes = args.shapes or [parse_shape(s) for s in (QUICK_SHAPES if args.quick else ALL_SHAPES)]
        args.compile_backend = args.compile_backend or "inductor"
        args.iters = (5 if args.quick else 10) if args.iters is None else args.iters
        args.warmup = 2 if args.warmup is None else args.warmup
        device_name = torch.cuda.get_device_name()
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    date = datetime.date.today().isoformat()
    commit = stamp.commit(REPO)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"distill-{slug}-{date}" + (f"-{args.tag}" if args.tag else ""))
    opts = {"divergence": args.divergence, "beta": args.beta, "temperature": args.temperature}
    header = [f"# flce distillation compare: {device_name}, {date}", "",
              f"commit {commit}, torch {torch.__version__}, flce {flce.version()} ({flce.library_path()}); "
              f"divergence {args.divergence}" + (f" beta {args.beta}" if args.divergence == "jsd" else "") +
              f", temperature {args.temperature}, {str(dtype).replace('torch.', '')} inputs, ~5% ignored labels; "
              f"median of {args.iters} calls (fewer, at least 3, where they would take over {args.provider_seconds:g} s: "
              f"the row's iters) after {args.warmup} warm-up + 1 checked; leaf student tensors, "
              f"loss.backward(). err_*: vs float64 (loss over all tokens, dH on {args.samples} token rows, dW on "
              f"{args.samples} vocab rows). Produced by bench/distill_compare.py."]
    log(f"{device_name}: shapes {', '.join(shape_name(*s) for s in shapes)}; providers {', '.join(providers)}")
    rows = []
    timer = Timer(device.type == "cuda")
    for si, (n, ds, v, dt) in enumerate(shapes):
        name = shape_name(n, ds, v, dt)
        torch._dynamo.reset()
        data = make_data(n, ds, dt, v, dtype, device, seed=1000 + si)
        t0 = time.time()
        ref = reference(data, opts, args.samples, seed=si)
        log(f"{name}: fp64 reference {time.time() - t0:.1f} s (loss {ref['mean']:.6g})")
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the reference's fp64 chunks: not in the providers' free memory
        shape_rows = []
        for p in providers:
            t0 = time.time()
            row = run_provider(p, data, opts, ref, {}, args, timer)
            row.update(shape=name, device=device_name, date=date, commit=commit, torch=torch.__version__, **opts)
            shape_rows.append(row)
            floor = next((r["ms"] for r in shape_rows if r["provider"] == "cublas-floor" and r["ms"]), None)
            for r in shape_rows:
                r["vs_floor"] = round(r["ms"] / floor, 3) if floor and r["ms"] else None
            log(f"{name} {p}: {fmt(row['ms'], '.2f')} ms, {fmt(row['extra_mib'], '.0f')} MiB, err loss "
                f"{fmt(row['err_loss'], '.1e')} dH {fmt(row['err_dh'], '.1e')} dW {fmt(row['err_dw'], '.1e')}"
                f"{' ' + row['error'] if row['error'] else ''}{' (' + row['note'] + ')' if row['note'] else ''} "
                f"[{time.time() - t0:.0f} s]")
            write(stem, rows + shape_rows, header)
        rows += shape_rows
        del data, ref
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    write(stem, rows, header)
    sys.stdout.write(markdown(rows, header))
    log(f"wrote {stem}.json and .md ({time.time() - T_START:.0f} s)")
    bad = [r for r in rows if r["error"] and (r["provider"] in ("flce", "cublas-floor") or r["provider"].startswith("flce@"))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
