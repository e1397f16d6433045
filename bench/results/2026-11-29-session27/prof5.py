import sys, time, torch, flce, cProfile, pstats, io
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
for _ in range(3):
    t0 = time.perf_counter(); step(); t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    print(f"host enqueue {1e3*(t1-t0):.2f} ms, until done {1e3*(t2-t0):.2f} ms", flush=True)
pr = cProfile.Profile(); pr.enable()
for _ in range(5): step()
torch.cuda.synchronize(); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); print(s.getvalue()[-5000:])
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    step(); torch.cuda.synchronize()
ev = sorted([e for e in prof.events()], key=lambda e: e.time_range.start)
t0 = ev[0].time_range.start
for e in ev:
    dur = (e.time_range.end - e.time_range.start) / 1000
    if e.device_type.name == "CUDA" or dur > 0.05 or "aunch" in e.name or "ync" in e.name or "lloc" in e.name:
        print(f"  {e.device_type.name[:4]} {e.name[:48]:48s} start {(e.time_range.start-t0)/1000:8.3f} dur {dur:7.3f}")
