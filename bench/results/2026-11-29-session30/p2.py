"""p2 (session 30): the timeline of one distillation step at 8192x4096x128256 bf16 (kernel, stream, start,
duration), from torch.profiler's chrome trace: forward KL (compact), reverse KL at the default budget (3
chunks) and at 11 GiB (1 chunk), JSD(0.5) default."""
import json, os, sys, torch
sys.path.insert(0, "python")
import flce
from torch.profiler import ProfilerActivity, profile
torch.manual_seed(0)
n, d, v = 8192, 4096, 128256
dev = "cuda"
hs = torch.randn(n, d, device=dev).bfloat16()
ht = torch.randn(n, d, device=dev).bfloat16()
ws = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
wt = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
y = torch.randint(0, v, (n,), device=dev)
out = os.environ.get("OUT", ".")
for div, beta, gib in (("forward_kl", 0.0, 4), ("reverse_kl", 0.0, 4), ("reverse_kl", 0.0, 11), ("jsd", 0.5, 4)):
    h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
    def step():
        h.grad = w.grad = None
        flce.linear_distillation(h, w, ht, wt, y, divergence=div, beta=beta, memory_budget=gib << 30).backward()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(); torch.cuda.synchronize()
    path = f"{out}/trace_{div}_{gib}.json"
    prof.export_chrome_trace(path)
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    os.remove(path)
    ev.sort(key=lambda e: e["ts"])
    t0 = ev[0]["ts"]; end = max(e["ts"] + e["dur"] for e in ev)
    print(f"== {div} beta={beta} budget {gib} GiB: span {(end - t0) / 1e3:.2f} ms")
    for e in ev:
        if e["dur"] < 20: continue
        print(f"   s{e['args'].get('stream', '?'):<3} {(e['ts'] - t0) / 1e3:8.3f} +{e['dur'] / 1e3:7.3f}  {e['name'][:40]}  grid {e['args'].get('grid')} block {e['args'].get('block')} regs {e['args'].get('registers per thread')} smem {e['args'].get('shared memory')}")
    sys.stdout.flush()
