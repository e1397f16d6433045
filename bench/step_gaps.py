#!/usr/bin/env python3
"""step_gaps.py — where a queued Python training step of flce leaves the GPU idle (issue 20: the tp = 4
shard's step, 8192x4096x32064, measured 10.2 ms queued in tp_compare against ~8.8 ms of kernels).
Runs `steps` steps back to back under torch.profiler (CUPTI) and prints every kernel with the idle time
before it on the GPU, then the sum of kernel time and of idle time per step.
Usage: FLCE_LIBRARY=build/libflce.so PYTHONPATH=python python3 bench/step_gaps.py [NxDxV] [std]"""
import sys
import torch
import flce
from torch.profiler import ProfilerActivity, profile

shape = sys.argv[1] if len(sys.argv) > 1 else "8192x4096x32064"
std = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
n, d, v = (int(x) for x in shape.split("x"))
g = torch.Generator(device="cuda").manual_seed(1)
h0 = torch.randn(n, d, device="cuda", generator=g).to(torch.bfloat16)
w0 = (torch.randn(v, d, device="cuda", generator=g) * (std / d ** 0.5)).to(torch.bfloat16)
y = torch.randint(0, v, (n,), device="cuda", generator=g)
y[torch.rand(n, device="cuda", generator=g) < 0.05] = -100


def step():
    h = h0.detach().requires_grad_()
    w = w0.detach().requires_grad_()
    flce.linear_cross_entropy(h, w, y).backward()


for _ in range(5):
    step()
torch.cuda.synchronize()
steps = 3
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
ks = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[0])
busy_end, idle, busy = ks[0][0], 0.0, 0.0
for s, e, name in ks:
    gap = max(0.0, s - busy_end)
    idle += gap
    busy += max(0.0, e - max(s, busy_end))
    print(f"{s - ks[0][0]:10.0f} µs  {e - s:8.0f} µs  idle before {gap:7.0f} µs  {name[:70]}")
    busy_end = max(busy_end, e)
span = busy_end - ks[0][0]
print(f"{shape} std {std}: {steps} steps span {span / 1e3:.3f} ms: GPU busy {busy / 1e3 / steps:.3f} ms per step, "
      f"idle {idle / 1e3 / steps:.3f} ms per step (after the first kernel)")
