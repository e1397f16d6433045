#!/usr/bin/env python3
"""distill_topk_compare.py — flce.linear_distillation_topk (the teacher as each token's top-k ids and
log-probabilities, issue 44) against the same loss in PyTorch, in one run.

For each shape N x D x V (bf16 student, the teacher's k log-probabilities given in fp32) it times
every provider the way a training step calls it (leaf student tensors, loss.backward()) with CUDA
events: warm-up, one checked call (memory and errors against float64), then the median of --iters.
Rows go to <out>/distill-topk-<device>-<date>[-tag].{json,md}.

  python3 bench/distill_topk_compare.py                  # 8192x4096x128256 and 4096x2048x32000, k = 64
  python3 bench/distill_topk_compare.py --k 16 --shapes 8192x2048x151936
  python3 bench/distill_topk_compare.py --cpu-dry        # no GPU: tiny shapes, flce through python/standin.py

Providers:
  cublas-floor   the student's three GEMMs (logits, dH = dZ.W, dW = dZ^T.H), torch.matmul, nothing else
  flce           flce.linear_distillation_topk
  torch-eager    logits = H.W^T, fp32 log_softmax at T, D = sum_K p (log p - log q[ids]), masked mean;
                 autograd
  torch-compile  torch.compile of the same function (default mode, dynamic=False)

Each row: shape, k, provider, ms, ms_min, ms_max, vs_floor, extra_mib, err_loss, err_dh, err_dw (relative
L2 against float64 on the same bf16 inputs: dH on --samples token rows, dW on --samples vocab rows),
note, error, device, date, commit, torch.
"""
import argparse
import datetime
import gc
import json
import os
import re
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import stamp  # noqa: E402  (bench/)
from distill_compare import user_step  # noqa: E402  (leaf student tensors, the teacher's two tensors as given)

SHAPES = ["8192x4096x128256", "4096x2048x32000"]
DRY_SHAPES = ["96x32x500"]
IGNORE = -100
MiB = float(1 << 20)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def make_data(n, d, v, k, dtype, device, seed=0):
    """Student inputs (logit std ~4 like bench/distill_compare.py), labels with ~5 % ignored, and a
    teacher's top-k: the k largest of a random teacher's log-softmax (its full mass is not 1 over K)."""
    g = torch.Generator(device=device).manual_seed(seed)
    hs = torch.randn(n, d, device=device, generator=g).to(dtype)
    ws = (torch.randn(v, d, device=device, generator=g) * (4.0 / d ** 0.5)).to(dtype)
    y = torch.randint(0, v, (n,), device=device, generator=g)
    y[torch.rand(n, device=device, generator=g) < 0.05] = IGNORE
    ids = torch.empty(n, k, dtype=torch.int64, device=device)
    lp = torch.empty(n, k, dtype=torch.float32, device=device)
    for r0 in range(0, n, 1024):  # the teacher's logits a block of rows at a time
        zt = torch.randn(min(1024, n - r0), v, device=device, generator=g) * 4.0
        vals, idx = torch.log_softmax(zt, 1).topk(k, 1)
        ids[r0:r0 + idx.shape[0]], lp[r0:r0 + idx.shape[0]] = idx, vals
    return hs, ws, ids, lp, y


def torch_loss(hs, ws, ids, lp, y, temperature=1.0):
    lq = torch.log_softmax((hs @ ws.T).float() / temperature, -1)
    d = (lp.exp() * (lp - lq.gather(1, ids))).sum(-1)
    valid = y != IGNORE
    return torch.where(valid, d, 0.0).sum() / valid.sum().clamp(min=1)


def reference(data, samples, temperature):
    """float64 loss over all tokens, dH on `samples` token rows, dW on `samples` vocab rows."""
    hs, ws, ids, lp, y = data
    n, v = hs.shape[0], ws.shape[0]
    g = torch.Generator(device="cpu").manual_seed(7)
    rows = torch.randperm(n, generator=g)[:samples].to(hs.device)
    cols = torch.randperm(v, generator=g)[:samples].to(hs.device)
    w64 = ws.double()
    valid = y != IGNORE
    count = int(valid.sum())
    total, dw = 0.0, torch.zeros(samples, hs.shape[1], dtype=torch.float64, device=hs.device)
    dh = torch.zeros(samples, hs.shape[1], dtype=torch.float64, device=hs.device)
    for r0 in range(0, n, 512):
        h = hs[r0:r0 + 512].double()
        z = h @ w64.T / temperature
        lq = torch.log_softmax(z, 1)
        p = lp[r0:r0 + 512].double().exp()
        i = ids[r0:r0 + 512]
        d = (p * (lp[r0:r0 + 512].double() - lq.gather(1, i))).sum(1)
        m = valid[r0:r0 + 512]
        total += float(torch.where(m, d, 0.0).sum())
        dz = lq.exp() * p.sum(1, keepdim=True)
        dz.scatter_add_(1, i, -p)
        dz = torch.where(m[:, None], dz, 0.0) / temperature / max(count, 1)
        dw += dz[:, cols].T @ h
        sel = (rows >= r0) & (rows < r0 + h.shape[0])
        if sel.any():
            dh[sel] = dz[rows[sel] - r0] @ w64
    return total / max(count, 1), rows, cols, dh, dw


def rel_l2(x, ref):
    return float((x.double() - ref).norm() / ref.norm().clamp(min=1e-300))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=None, help="comma-separated NxDxV (default: " + ", ".join(SHAPES) + ")")
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--providers", default="cublas-floor,flce,torch-eager,torch-compile")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--cpu-dry", action="store_true", help="tiny shapes on the CPU through python/standin.py")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    import flce
    if args.cpu_dry:
        import standin
        standin.install()
        device, dtype, device_name, backend = torch.device("cpu"), torch.float32, "cpu-dry", "aot_eager"
        shapes, args.iters, args.warmup = args.shapes or ",".join(DRY_SHAPES), 2, 1
        args.k = min(args.k, 16)
    else:
        if not torch.cuda.is_available():
            ap.error("no CUDA device (use --cpu-dry to check the script on the CPU)")
        device, dtype = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16
        device_name, backend, shapes = torch.cuda.get_device_name(), "inductor", args.shapes or ",".join(SHAPES)
    T = args.temperature
    factories = {
        "cublas-floor": None,
        "flce": lambda data: user_step(lambda h, w, i, p, y: flce.linear_distillation_topk(
            h, w, i, p, y, temperature=T, ignore_index=IGNORE), data),
        "torch-eager": lambda data: user_step(lambda h, w, i, p, y: torch_loss(h, w, i, p, y, T), data),
        "torch-compile": lambda data: user_step(torch.compile(lambda h, w, i, p, y: torch_loss(h, w, i, p, y, T),
                                                              backend=backend, dynamic=False), data),
    }
    rows, cuda = [], device.type == "cuda"
    for shape in [s.strip() for s in shapes.split(",") if s.strip()]:
        n, d, v = (int(x) for x in shape.split("x"))
        data = make_data(n, d, v, args.k, dtype, device)
        ref = reference(data, min(args.samples, n, v), T)
        floor_ms = None
        for name in [p.strip() for p in args.providers.split(",") if p.strip()]:
            row = {"shape": shape, "k": args.k, "provider": name, "note": None, "error": None}
            try:
                if name == "cublas-floor":
                    hs, ws = data[0], data[1]
                    dz = torch.randn(n, v, device=device, dtype=dtype)

                    def step():
                        zs, dh, dw = hs @ ws.T, dz @ ws, dz.T @ hs
                        del zs, dh, dw
                else:
                    step = factories[name](data)
                for _ in range(args.warmup):
                    step()
                if cuda:
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                out = step()
                if cuda:
                    torch.cuda.synchronize()
                    row["extra_mib"] = round((torch.cuda.max_memory_allocated() - base) / MiB, 1)
                if out is not None:
                    loss, gh, gw = out
                    row["err_loss"] = float(f"{abs(float(loss) - ref[0]) / max(abs(ref[0]), 1e-300):.3g}")
                    row["err_dh"] = float(f"{rel_l2(gh[ref[1]], ref[3]):.3g}")
                    row["err_dw"] = float(f"{rel_l2(gw[ref[2]], ref[4]):.3g}")
                out, times = None, []
                for _ in range(args.iters):
                    if cuda:
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record()
                        step()
                        b.record()
                        torch.cuda.synchronize()
                        times.append(a.elapsed_time(b))
                    else:
                        import time
                        t0 = time.perf_counter()
                        step()
                        times.append(1e3 * (time.perf_counter() - t0))
                row["ms"], row["ms_min"], row["ms_max"] = (round(statistics.median(times), 3), round(min(times), 3),
                                                           round(max(times), 3))
                if name == "cublas-floor":
                    floor_ms = row["ms"]
                row["vs_floor"] = round(row["ms"] / floor_ms, 3) if floor_ms else None
            except Exception as e:  # noqa: BLE001  (OOM, compile errors, FlceError: a result row)
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            finally:
                step = out = None
                gc.collect()
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            row.update(device=device_name, date=datetime.date.today().isoformat(), commit=stamp.commit(REPO),
                       torch=torch.__version__)
            rows.append(row)
            log(f"{shape} k={args.k} {name}: {row.get('ms')} ms {row.get('error') or ''}")
        del data
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    stem = os.path.join(args.out, f"distill-topk-{slug}-{datetime.date.today().isoformat()}"
                        + (f"-{args.tag}" if args.tag else ""))
    os.makedirs(args.out, exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    keys = ["shape", "k", "provider", "ms", "vs_floor", "extra_mib", "err_loss", "err_dh", "err_dw", "note", "error"]
    md = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    md += ["| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in keys) + " |" for r in rows]
    with open(stem + ".md", "w") as f:
        f.write(f"# flce distillation from a top-k teacher: {device_name}, {datetime.date.today()}\n\n"
                f"commit {stamp.commit(REPO)}, torch {torch.__version__}, temperature {T}; produced by "
                f"bench/distill_topk_compare.py\n\n" + "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
