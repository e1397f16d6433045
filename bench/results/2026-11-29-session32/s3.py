"""s3 (session 32, as s2.py): A/B of flce_distill_row_cl (rows by clusters, the second read from L2)
at 8192x4096x128256 bf16: step median of 20 (CUDA events, leaf tensors, loss.backward()) for reverse KL, JSD(0.5),
forward KL, and kernel time by name over 3 profiled steps. argv[1]: the tree's label; argv[2]: 'warm' = one step each."""
import collections, statistics, sys, torch
sys.path.insert(0, "python")
import flce
from torch.profiler import ProfilerActivity, profile
torch.manual_seed(0)
label, warm = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "warm"
n, d, v = 8192, 4096, 128256
dev = "cuda"
hs = torch.randn(n, d, device=dev).bfloat16()
ht = torch.randn(n, d, device=dev).bfloat16()
ws = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
wt = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
y = torch.randint(0, v, (n,), device=dev)
todo = (("reverse_kl", 0.0), ("jsd", 0.5), ("forward_kl", 0.0))
if len(sys.argv) > 3:
    todo = [t for t in todo if t[0] in sys.argv[3].split(",")]
for div, beta in todo:
    h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
    out = {}
    def step():
        h.grad = w.grad = None
        l = flce.linear_distillation(h, w, ht, wt, y, divergence=div, beta=beta)
        l.backward()
        out["l"] = l
    step(); torch.cuda.synchronize()
    if warm:
        continue
    print(f"{label} {div}: loss {out['l'].item():.9g} |dH| {h.grad.float().norm().item():.9g} |dW| {w.grad.float().norm().item():.9g}")
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); step(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    tot = collections.defaultdict(float); cnt = collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            tot[ev.name[:48]] += ev.device_time_total / 1e3 / 3; cnt[ev.name[:48]] += 1
    print(f"{label} {div}: step median {statistics.median(ts):.2f} ms (min {min(ts):.2f}); kernels/step {sum(tot.values()):.2f} ms")
    for k, t in sorted(tot.items(), key=lambda kv: -kv[1])[:6]:
        print(f"   {label} {t:8.3f} ms x{cnt[k] // 3:<3d} {k}")
    sys.stdout.flush()
