#!/usr/bin/env python3
"""topk_compare.py — flce.topk_logprobs (issue 44 item 2) against the same result from PyTorch, in one run.

For each shape N x D x V (bf16) and k it times, with CUDA events (2 warm-up calls, the median of
--iters), the way a caller asks for prompt log-probs:
  cublas-floor   torch.matmul(h, w.T) in bf16 alone (the GEMM every provider must do)
  flce           flce.topk_logprobs(h, w, k)
  torch-eager    logits = h @ w.T (bf16) -> float -> log_softmax -> topk
  torch-compile  torch.compile of torch-eager's function (compiled in the warm-up)
and reports ms, vs_floor, extra_mib (peak allocation beyond the inputs), and against float64 on
--samples token rows: the largest log-prob error and the rows whose index sets differ (where a
logit tie within 1e-5 does not explain it). Rows go to <out>/topk-<device>-<date>.{json,md}.

  python3 bench/topk_compare.py                       # 8192x4096x128256 and 4096x2048x32000, k = 64
  python3 bench/topk_compare.py --shapes 1024x4096x151936 --k 20
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
import torch  # noqa: E402
import flce  # noqa: E402


def timed(fn, iters):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def extra_mib(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20, out


def errors(h, w, k, lp, ix, samples):
    rows = torch.linspace(0, h.shape[0] - 1, samples).long().to(h.device)
    z = h[rows].double() @ w.double().T
    lse = torch.logsumexp(z, -1)
    vals, idx = torch.sort(z, dim=-1, descending=True, stable=True)
    ref = vals[:, :k] - lse[:, None]
    err = (lp[rows].double() - ref).abs().max().item()
    got_z = torch.gather(z, 1, ix[rows])
    bad = ((ix[rows] != idx[:, :k]) & ((got_z - vals[:, :k]).abs() > 1e-5 * (1 + vals[:, :k].abs()))).any(-1)
    return err, int(bad.sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="8192x4096x128256,4096x2048x32000")
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    a = ap.parse_args()
    dev = torch.cuda.get_device_name().lower().replace(" ", "-")
    date = datetime.date.today().isoformat()
    try:
        commit = open(os.path.join(REPO, ".device-commit")).read().strip()
    except OSError:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    rows = []
    for shape in a.shapes.split(","):
        n, d, v = (int(x) for x in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(0)
        h = torch.randn(n, d, device="cuda", generator=g).bfloat16()
        w = (torch.randn(v, d, device="cuda", generator=g) * (2.0 / d ** 0.5)).bfloat16()
        k = a.k

        def eager(h, w):
            lp = torch.log_softmax((h @ w.T).float(), -1)
            return lp.topk(k, -1)
        compiled = torch.compile(eager)
        providers = {"cublas-floor": lambda: h @ w.T, "flce": lambda: flce.topk_logprobs(h, w, k),
                     "torch-eager": lambda: eager(h, w), "torch-compile": lambda: compiled(h, w)}
        for name, fn in providers.items():
            row = {"shape": shape, "k": k, "provider": name, "device": dev, "date": date, "commit": commit,
                   "torch": torch.__version__}
            try:
                ms = timed(fn, a.iters)
                mib, out = extra_mib(fn)
                row.update(ms=round(ms, 3), extra_mib=round(mib))
                if name != "cublas-floor":
                    lp, ix = (out.logprobs, out.indices) if name == "flce" else (out.values, out.indices)
                    row["err_logprob"], row["rows_wrong"] = errors(h, w, k, lp, ix, a.samples)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
        floor = next((r["ms"] for r in rows if r["shape"] == shape and r["provider"] == "cublas-floor" and "ms" in r), None)
        for r in rows:
            if r["shape"] == shape and "ms" in r and floor:
                r["vs_floor"] = round(r["ms"] / floor, 3)
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"topk-{dev}-{date}")
    with open(base + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    md = ["| shape | k | provider | ms | vs floor | extra MiB | max log-prob err | rows wrong | note |",
          "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        md.append(f"| {r['shape']} | {r['k']} | {r['provider']} | {r.get('ms', '—')} | {r.get('vs_floor', '—')} | "
                  f"{r.get('extra_mib', '—')} | {r.get('err_logprob', '—') if 'err_logprob' not in r else format(r['err_logprob'], '.1e')} | "
                  f"{r.get('rows_wrong', '—')} | {r.get('error', '')} |")
    md.append(f"\n{dev}, {date}, commit {commit}, torch {torch.__version__}; `python3 bench/topk_compare.py "
              f"--shapes {a.shapes} --k {a.k}`")
    with open(base + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
