"""step.py (session 34, from session 33's m2.py): a distillation step at a shape, divergence and memory_budget (MiB, 0: default): step median of 15 (CUDA events,
leaf student tensors, loss.backward()), peak extra memory, kernel time by name over 3 profiled steps.
argv: N Ds Dt V budget_mib [divergence: forward_kl | reverse_kl | jsd (beta 0.5)]"""
import collections, statistics, sys, torch
sys.path.insert(0, "python")
import flce
from torch.profiler import ProfilerActivity, profile
torch.manual_seed(0)
n, ds, dt, v, mib = (int(a) for a in sys.argv[1:6])
div = sys.argv[6] if len(sys.argv) > 6 else "forward_kl"
label = f"{div} {n}x{ds}x{v}:{dt}@{mib or 'default'}"
hs = torch.randn(n, ds, device="cuda").bfloat16()
ht = torch.randn(n, dt, device="cuda").bfloat16()
ws = (torch.randn(v, ds, device="cuda") * 2 / ds ** 0.5).bfloat16()
wt = (torch.randn(v, dt, device="cuda") * 2 / dt ** 0.5).bfloat16()
y = torch.randint(0, v, (n,), device="cuda")
h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
kw = {"memory_budget": mib << 20} if mib else {}
if div == "jsd": kw["beta"] = 0.5
def step():
    h.grad = w.grad = None
    l = flce.linear_distillation(h, w, ht, wt, y, divergence=div, **kw)
    l.backward()
for _ in range(4): step()
torch.cuda.synchronize()
base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
ts = []
for _ in range(15):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); step(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
peak = (torch.cuda.max_memory_allocated() - base) / 2**20
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3): step()
    torch.cuda.synchronize()
tot = collections.defaultdict(float); cnt = collections.Counter()
for ev in prof.events():
    if ev.device_type == torch.autograd.DeviceType.CUDA:
        tot[ev.name[:40]] += ev.device_time_total / 1e3 / 3; cnt[ev.name[:40]] += 1
print(f"{label}: step median {statistics.median(ts):.2f} ms (min {min(ts):.2f}); peak extra {peak:.0f} MiB; kernels/step {sum(tot.values()):.2f} ms")
for k, t in sorted(tot.items(), key=lambda kv: -kv[1])[:8]:
    print(f"   {label} {t:8.3f} ms x{cnt[k] // 3:<3d} {k}")
