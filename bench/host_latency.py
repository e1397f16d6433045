#!/usr/bin/env python3
"""host_latency.py — the Python binding's per-step latency on one GPU (issue 20's open question: tp_compare's
flce-local steps exceed their kernels' sum by ~1.3 ms): CUDA-event time of one training step synced per
step (as tp_compare.py times) and queued (as compare.py does), and the host's own time per step, at
the tp = 4 shard's shape 8192x4096x32064. Not yet run on a GPU (written at the end of session 10).
Usage: FLCE_LIBRARY=build/libflce.so PYTHONPATH=python python3 bench/host_latency.py"""
import statistics, time, torch, flce
n, d, v = 8192, 4096, 32064
g = torch.Generator(device="cuda").manual_seed(1)
h0 = torch.randn(n, d, device="cuda", dtype=torch.bfloat16, generator=g)
w0 = torch.randn(v, d, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
y = torch.randint(0, v, (n,), device="cuda", generator=g)
def step():
    h = h0.detach().requires_grad_(); w = w0.detach().requires_grad_()
    flce.linear_cross_entropy(h, w, y).backward()
for _ in range(5): step()
torch.cuda.synchronize()
for rep in range(2):
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); step(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    evs = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); step(); b.record(); evs.append((a, b))
    torch.cuda.synchronize()
    tq = [a.elapsed_time(b) for a, b in evs]
    t0 = time.perf_counter()
    for _ in range(20): step()
    t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    print(f"rep {rep}: synced per step {statistics.median(ts):.3f} ms, queued {statistics.median(tq):.3f} ms, "
          f"host per step {(t1 - t0) / 20 * 1e3:.3f} ms, 20 steps wall {(t2 - t0) * 1e3:.1f} ms")
