import sys, torch, flce
from torch.profiler import profile, ProfilerActivity
n, d, v = [int(x) for x in sys.argv[1].split("x")]
g = torch.Generator(device="cuda").manual_seed(0)
h = torch.randn(n, d, device="cuda", generator=g).bfloat16()
w = (torch.randn(v, d, device="cuda", generator=g) * (4.0 / d ** 0.5)).bfloat16()
f = lambda: flce.topk_logprobs(h, w, 64)
for _ in range(3): out = f()
torch.cuda.synchronize()
ts = []
for _ in range(10):
    a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
ts.sort()
ref = torch.log_softmax((h[:32].double() @ w.double().T), -1)
lp, idx = ref.topk(64, -1)
got = f()
err = (got[0][:32].double() - lp).abs().max().item()
same = (got[1][:32] == idx).float().mean().item()
print(f"{sys.argv[2]} {sys.argv[1]} median {ts[5]:.3f} ms min {ts[0]:.3f}; max log-prob err (32 rows) {err:.2e}, ids equal {same:.4f}")
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    f(); torch.cuda.synchronize()
for e in prof.events():
    if e.device_type.name == "CUDA" and e.device_time_total > 20:
        print(f"  gpu {e.name[:40]:40s} dur {e.device_time_total/1000:7.3f}")
