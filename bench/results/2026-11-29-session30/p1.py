"""p1 (session 30): where the distillation step's time goes, by kernel, at 8192x4096x128256 bf16 (forward KL,
reverse KL, JSD 0.5, labels with the CE term off): torch.profiler (CUPTI) over 3 steps after warm-up, kernel
time summed by name per step; and the step's median of 10 with CUDA events (leaf tensors, loss.backward())."""
import collections, statistics, sys, torch
sys.path.insert(0, "python")
import flce
from torch.profiler import ProfilerActivity, profile
torch.manual_seed(0)
n, d, v = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "8192x4096x128256").split("x"))
dev = "cuda"
hs = torch.randn(n, d, device=dev).bfloat16()
ht = torch.randn(n, d, device=dev).bfloat16()
ws = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
wt = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
y = torch.randint(0, v, (n,), device=dev)
for div, beta in (("forward_kl", 0.0), ("reverse_kl", 0.0), ("jsd", 0.5)):
    h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
    def step():
        h.grad = w.grad = None
        flce.linear_distillation(h, w, ht, wt, y, divergence=div, beta=beta).backward()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    tot = collections.defaultdict(float); cnt = collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            tot[ev.name[:60]] += ev.device_time_total / 1e3 / 3; cnt[ev.name[:60]] += 1
    print(f"== {div} beta={beta}: step median {statistics.median(ts):.2f} ms (min {min(ts):.2f}); kernels per step {sum(tot.values()):.2f} ms")
    for k, t in sorted(tot.items(), key=lambda kv: -kv[1])[:14]:
        print(f"   {t:8.3f} ms  x{cnt[k] // 3:<3d} {k}")
    sys.stdout.flush()
