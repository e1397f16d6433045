#!/usr/bin/env python3
"""compare.py — flce side by side with cuBLAS floors, PyTorch eager and torch.compile, in one process.

For each shape N x D x V (tokens x hidden x vocab, bf16) it times every provider with CUDA events
(median of --iters runs after warm-up), measures the extra device memory of one call, and compares
loss and gradients with a float64 reference computed on the GPU. Prints a Markdown table per shape
and writes bench/results/compare-<device>-<date>.{md,json} (and copies to $OUT when that is set).

  python3 bench/compare.py                       # all shapes, logit std 4
  python3 bench/compare.py --quick               # 4096x2048x32000 and 8192x4096x128256, fewer iters
  python3 bench/compare.py --shapes 8192x4096x128256 --logit-std 0.5 --providers cublas-floor,flce-chunked

Providers (fwd+bwd unless noted; TFLOP/s always count 6NVD, or 2NVD for forward-only rows):
  cublas-floor         the three GEMMs of 6NVD at full size (torch.matmul), nothing else
  cublas-logits        one GEMM of the logits (forward only)
  torch-eager          F.cross_entropy(F.linear(h, w).float(), y)
  torch-compile        torch.compile of the same function (default mode, static shapes)
  flce-chunked         flce.linear_cross_entropy, default memory budget (512 MiB)
  flce-chunked-128MiB  the same with memory_budget = 128 MiB
  flce-forward         flce forward only (no grad)
  flce-recompute       flce forward, then a backward that recomputes the logits
"""
import argparse
import datetime
import gc
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flce  # noqa: E402

ALL_SHAPES = ["8192x4096x128256", "8192x2304x256000", "4096x2048x32000", "32768x4096x128256",
              "512x4096x128256"]
QUICK_SHAPES = ["4096x2048x32000", "8192x4096x128256"]
IGNORE = -100
MiB = 1 << 20


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_shape(s):
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", s.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"shape {s!r}: expected NxDxV, e.g. 8192x4096x128256")
    return tuple(int(g) for g in m.groups())


# ---- data and the float64 reference ----------------------------------------------------------

def make_data(n, d, v, logit_std, seed, device="cuda"):
    """hidden ~ N(0, 1), weight ~ N(0, (std/sqrt(D))^2) so logits have std ~ logit_std; made in fp32,
    cast to bf16. Labels uniform in [0, V), about 5% set to ignore_index."""
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(n, d, device=device, generator=g).to(torch.bfloat16)
    w32 = torch.randn(v, d, device=device, generator=g)
    w = w32.mul_(logit_std / math.sqrt(d)).to(torch.bfloat16)
    del w32
    y = torch.randint(0, v, (n,), device=device, generator=g, dtype=torch.int64)
    y[torch.rand(n, device=device, generator=g) < 0.05] = IGNORE
    return h, w, y


@torch.no_grad()
def reference(h, w, y, samples, seed, chunk_elems=1 << 27):
    """Float64 on the GPU: the exact mean loss over all tokens (logits in chunks of rows), and the
    exact gradient rows of dH for `samples` random valid tokens and of dW for `samples` vocab rows
    (half of them labels that occur, so the one-hot term is exercised)."""
    n, v = h.shape[0], w.shape[0]
    w64 = w.double()
    valid = y != IGNORE
    count = int(valid.sum())
    g = 1.0 / max(count, 1)
    lse = torch.empty(n, dtype=torch.float64, device=h.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=h.device)
    rows = max(1, min(n, chunk_elems // v))  # default: 1 GiB of fp64 logits per chunk
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        z = h[r0:r1].double() @ w64.T
        lse_c = torch.logsumexp(z, dim=1)
        zy = z.gather(1, y[r0:r1].clamp(min=0).unsqueeze(1)).squeeze(1)
        loss_sum += ((lse_c - zy) * valid[r0:r1]).sum()
        lse[r0:r1] = lse_c
        del z, lse_c, zy
    mean = (loss_sum / max(count, 1)).item()

    gen = torch.Generator(device=h.device).manual_seed(seed + 1)
    valid_idx = valid.nonzero().squeeze(1)
    tok = valid_idx[torch.randperm(valid_idx.numel(), device=h.device, generator=gen)[:samples]]
    zs = h[tok].double() @ w64.T
    ps = torch.softmax(zs, dim=1)
    ps[torch.arange(tok.numel(), device=h.device), y[tok]] -= 1
    dh_ref = (ps @ w64) * g
    del zs, ps

    present = y[valid].unique()
    from_labels = present[torch.randperm(present.numel(), device=h.device, generator=gen)[:samples // 2]]
    rand_rows = torch.randperm(v, device=h.device, generator=gen)[:samples]
    voc = list(dict.fromkeys(from_labels.tolist() + rand_rows.tolist()))[:samples]  # dedupe, keep order
    voc = torch.tensor(voc, dtype=torch.int64, device=h.device)
    h64 = h.double()
    pr = torch.exp(h64 @ w64[voc].T - lse[:, None])
    pr -= (y[:, None] == voc[None, :]).double()
    pr *= (valid.double() * g)[:, None]
    dw_ref = pr.T @ h64
    return {"mean": mean, "tok": tok, "dh": dh_ref, "voc": voc, "dw": dw_ref}


def rel_l2(x, ref):
    x = x.double()
    return ((x - ref).norm() / ref.norm()).item()


def errors(out, ref):
    loss, dh, dw = out
    e = {"err_loss": abs(loss.double().item() - ref["mean"]) / abs(ref["mean"])}
    if dh is not None:
        e["err_dh"] = rel_l2(dh[ref["tok"]], ref["dh"])
    if dw is not None:
        e["err_dw"] = rel_l2(dw[ref["voc"]], ref["dw"])
    return e


# ---- providers: each factory returns step(), one timed call returning (loss, dh, dw) or None ---

def torch_ce(h, w, y):
    return F.cross_entropy(F.linear(h, w).float(), y, ignore_index=IGNORE)


def grads_of(fn, h, w, y):
    hg, wg = h.detach().requires_grad_(), w.detach().requires_grad_()

    def step():
        loss = fn(hg, wg, y)
        dh, dw = torch.autograd.grad(loss, (hg, wg))
        return loss.detach(), dh, dw
    return step


def p_cublas_floor(h, w, y):
    dz = torch.randn(h.shape[0], w.shape[0], device=h.device, dtype=h.dtype)  # an input, not counted

    def step():
        logits = torch.matmul(h, w.T)
        dh = torch.matmul(dz, w)
        dw = torch.matmul(dz.T, h)
        del logits, dh, dw
    return step


def p_cublas_logits(h, w, y):
    def step():
        torch.matmul(h, w.T)
    return step


def p_torch_eager(h, w, y):
    return grads_of(torch_ce, h, w, y)


def p_torch_compile(h, w, y):
    torch._dynamo.reset()
    return grads_of(torch.compile(torch_ce, dynamic=False), h, w, y)


def p_flce(memory_budget=None, strategy="auto"):
    def factory(h, w, y):
        return grads_of(lambda a, b, c: flce.linear_cross_entropy(
            a, b, c, ignore_index=IGNORE, memory_budget=memory_budget, strategy=strategy), h, w, y)
    return factory


def p_flce_forward(h, w, y):
    def step():
        with torch.no_grad():
            return flce.linear_cross_entropy(h, w, y, ignore_index=IGNORE), None, None
    return step


PROVIDERS = [  # name, mode, factory
    ("cublas-floor", "fwd+bwd", p_cublas_floor),
    ("cublas-logits", "fwd", p_cublas_logits),
    ("torch-eager", "fwd+bwd", p_torch_eager),
    ("torch-compile", "fwd+bwd", p_torch_compile),
    ("flce-chunked", "fwd+bwd", p_flce()),
    ("flce-chunked-128MiB", "fwd+bwd", p_flce(memory_budget=128 << 20)),
    ("flce-forward", "fwd", p_flce_forward),
    ("flce-recompute", "fwd+bwd", p_flce(strategy="recompute")),
]


def first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


def run_provider(name, mode, factory, data, ref, args):
    """Warm-up, one call measured for memory and errors, then --iters timed calls. Any failure
    (OOM, compile error, FlceError) becomes the row's "error" and the run goes on."""
    h, w, y = data
    n, d = h.shape
    v = w.shape[0]
    row = {"provider": name, "mode": mode, "ms": None, "tflops": None, "extra_mib": None,
           "err_loss": None, "err_dh": None, "err_dw": None, "error": None}
    step = out = None
    try:
        step = factory(h, w, y)
        for _ in range(args.warmup):
            out = step()
            out = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = step()
        torch.cuda.synchronize()
        row["extra_mib"] = round((torch.cuda.max_memory_allocated() - base) / MiB, 1)
        if out is not None:
            row.update({k: float(f"{x:.3g}") for k, x in errors(out, ref).items()})
        out = None
        events = []
        for _ in range(args.iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = step()
            end.record()
            out = None
            events.append((start, end))
        torch.cuda.synchronize()
        ms = statistics.median(s.elapsed_time(e) for s, e in events)
        flops = (6 if mode == "fwd+bwd" else 2) * n * d * v
        row["ms"] = round(ms, 3)
        row["tflops"] = round(flops / (ms * 1e-3) / 1e12, 1)
    except Exception as e:  # noqa: BLE001  (every failure is a result here)
        row["error"] = first_line(e)
    finally:
        step = out = None
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if name == "torch-compile":
            torch._dynamo.reset()
    return row


# ---- output ----------------------------------------------------------------------------------

def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def markdown_table(shape, rows):
    lines = [f"### {shape} (N x D x V)", "",
             "| provider | ms | TFLOP/s | vs floor | extra MiB | err_loss | err_dh | err_dw | note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        note = r["error"] or ("forward only; vs cublas-logits" if r["mode"] == "fwd" else "")
        lines.append(f"| {r['provider']} | {fmt(r['ms'], '.3f')} | {fmt(r['tflops'], '.1f')} | "
                     f"{fmt(r['vs_floor'], '.3f')} | {fmt(r['extra_mib'], '.0f')} | {fmt(r['err_loss'], '.2e')} | "
                     f"{fmt(r['err_dh'], '.2e')} | {fmt(r['err_dw'], '.2e')} | {note.replace('|', '/')} |")
    return "\n".join(lines)


def commit():
    if os.environ.get("FLCE_COMMIT"):
        return os.environ["FLCE_COMMIT"]
    try:
        with open(os.path.join(REPO, ".device-commit")) as f:
            return f.read().strip()
    except OSError:
        pass
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=lambda s: [parse_shape(x) for x in s.split(",")],
                    help="comma-separated NxDxV (default: all five)")
    ap.add_argument("--quick", action="store_true", help="two small shapes, 5 iters, 2 warm-ups")
    ap.add_argument("--providers", help="comma-separated subset of: " + ", ".join(p[0] for p in PROVIDERS))
    ap.add_argument("--logit-std", type=float, default=4.0, help="std of the logits (default 4: peaked)")
    ap.add_argument("--iters", type=int, default=None, help="timed runs per provider (default 10, quick 5)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up runs (default 3, quick 2)")
    ap.add_argument("--samples", type=int, default=64, help="sampled tokens / vocab rows for grad errors")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out-dir", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--tag", default="", help="suffix of the result file names")
    args = ap.parse_args()
    shapes = args.shapes or [parse_shape(s) for s in (QUICK_SHAPES if args.quick else ALL_SHAPES)]
    args.iters = args.iters or (5 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    providers = PROVIDERS
    if args.providers:
        wanted = [p.strip() for p in args.providers.split(",")]
        unknown = set(wanted) - {p[0] for p in PROVIDERS}
        if unknown:
            ap.error(f"unknown providers: {', '.join(sorted(unknown))}")
        providers = [p for p in PROVIDERS if p[0] in wanted]
    if not torch.cuda.is_available():
        sys.exit("compare.py needs a CUDA device")

    device_name = torch.cuda.get_device_name()
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    date = datetime.date.today().isoformat()
    meta = {"device": device_name, "date": date, "commit": commit(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "flce": flce.version(), "flce_library": flce.library_path()}
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    header = [
        f"# flce compare: {device_name}, {date}", "",
        f"- commit {meta['commit']}; flce {meta['flce']} ({meta['flce_library']})",
        f"- torch {meta['torch']} (CUDA {meta['cuda']}), triton {meta['triton']}",
        f"- bf16; hidden ~ N(0,1), weight ~ N(0,(std/sqrt(D))^2): logit std {args.logit_std:g}; "
        f"~5% labels = {IGNORE}; seed {args.seed}",
        f"- ms: median of {args.iters} runs (CUDA events) after {args.warmup} warm-up; fwd+bwd unless "
        f"forward only. TFLOP/s count 6NVD (2NVD forward only) whatever a provider does. "
        f"vs floor: ms / cublas-floor (forward rows: / cublas-logits)",
        "- extra MiB: peak allocated during one call minus allocated before it (outputs included: "
        "grads, logits; cublas-floor's preallocated dZ excluded)",
        f"- errors: relative to float64 on the GPU: err_loss of the mean loss (all tokens), err_dh L2 over "
        f"{args.samples} sampled valid tokens, err_dw L2 over {args.samples} sampled vocab rows",
        ""]
    print("\n".join(header))
    log(f"{device_name}: {len(shapes)} shape(s), providers {', '.join(p[0] for p in providers)}")

    all_rows, sections = [], []
    for (n, d, v) in shapes:
        shape = f"{n}x{d}x{v}"
        log(f"{shape}: data and float64 reference")
        data = make_data(n, d, v, args.logit_std, args.seed)
        ref = reference(*data, args.samples, args.seed)
        torch.cuda.empty_cache()
        rows = []
        for name, mode, factory in providers:
            t0 = time.time()
            row = run_provider(name, mode, factory, data, ref, args)
            log(f"{shape} {name}: " + (f"{row['ms']} ms" if row["ms"] is not None else f"error {row['error']}")
                + f" ({time.time() - t0:.1f} s)")
            rows.append(row)
        by = {r["provider"]: r["ms"] for r in rows}
        for r in rows:
            base = by.get("cublas-floor" if r["mode"] == "fwd+bwd" else "cublas-logits")
            r["vs_floor"] = round(r["ms"] / base, 3) if r["ms"] and base else None
            r.update({"shape": shape, "logit_std": args.logit_std, "device": device_name, "date": date,
                      "commit": meta["commit"]})
        table = markdown_table(shape, rows)
        print(table + "\n", flush=True)
        sections.append(table)
        all_rows += rows
        data = ref = None
        gc.collect()
        torch.cuda.empty_cache()

    suffix = (f"-std{args.logit_std:g}" if args.logit_std != 4.0 else "") + ("-quick" if args.quick else "") \
        + (f"-{args.tag}" if args.tag else "")
    base = f"compare-{slug}-{date}{suffix}"
    md = "\n".join(header) + "\n" + "\n\n".join(sections) + "\n"
    keys = ["shape", "provider", "mode", "ms", "tflops", "vs_floor", "extra_mib", "err_loss", "err_dh",
            "err_dw", "logit_std", "error", "device", "date", "commit"]
    def clean(x):  # strict JSON: a NaN or infinite error becomes a string
        return str(x) if isinstance(x, float) and not math.isfinite(x) else x
    js = json.dumps([{k: clean(r.get(k)) for k in keys} for r in all_rows], indent=1) + "\n"
    dirs = [args.out_dir] + ([os.environ["OUT"]] if os.environ.get("OUT") else [])
    for out_dir in dict.fromkeys(os.path.abspath(p) for p in dirs):
        os.makedirs(out_dir, exist_ok=True)
        for ext, text in (("md", md), ("json", js)):
            path = os.path.join(out_dir, f"{base}.{ext}")
            with open(path, "w") as f:
                f.write(text)
            log(f"wrote {path}")


if __name__ == "__main__":
    main()
