import sys, time, torch, flce
from torch.profiler import profile, ProfilerActivity
n, d, v = [int(x) for x in sys.argv[1].split("x")]
k = 64
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
hs = torch.randn(n, d, device=dev, generator=g).bfloat16().requires_grad_()
ws = (torch.randn(v, d, device=dev, generator=g) * (4.0 / d ** 0.5)).bfloat16().requires_grad_()
y = torch.randint(0, v, (n,), device=dev, generator=g)
zt = torch.randn(n, v, device=dev, generator=g) * 4.0
lp, ids = torch.log_softmax(zt, 1).topk(k, 1)
del zt
def step():
    hs.grad = ws.grad = None
    flce.linear_distillation_topk(hs, ws, ids, lp, y).backward()
for _ in range(3): step()
torch.cuda.synchronize()
ts = []
for _ in range(10):
    a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    a.record(); step(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
ts.sort(); print(f"{sys.argv[2]} median {ts[5]:.3f} ms min {ts[0]:.3f}")
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    step(); torch.cuda.synchronize()
ev = sorted([e for e in prof.events() if e.device_type.name == "CUDA"], key=lambda e: e.time_range.start)
t0 = ev[0].time_range.start
for e in ev:
    if e.device_time_total > 20:
        print(f"  gpu {e.name[:40]:40s} start {(e.time_range.start-t0)/1000:8.3f} dur {e.device_time_total/1000:7.3f}")
