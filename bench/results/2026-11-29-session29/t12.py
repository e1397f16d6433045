"""t12 (session 29): what chunking costs the fp32-logits path: reverse KL and JSD(0.5) at 8192x4096x128256
bf16 by memory_budget (4 GiB default: 3 chunks and an fp32 dW accumulator; 6 GiB: 2; 11 GiB: 1).
CUDA events, median of 10 after 2 warm-up, leaf tensors, loss.backward(); peak extra memory."""
import statistics, sys, torch
sys.path.insert(0, "python")
import flce
torch.manual_seed(0)
n, d, v = 8192, 4096, 128256
dev = "cuda"
hs = torch.randn(n, d, device=dev).bfloat16()
ht = torch.randn(n, d, device=dev).bfloat16()
ws = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
wt = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
y = torch.randint(0, v, (n,), device=dev)
for div, beta in (("reverse_kl", 0.0), ("jsd", 0.5)):
    for gib in (4, 6, 11):
        h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
        def step():
            h.grad = w.grad = None
            flce.linear_distillation(h, w, ht, wt, y, divergence=div, beta=beta, memory_budget=gib << 30).backward()
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
        step(); torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
        ts = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); step(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
        print(f"{div} beta={beta} budget {gib} GiB: {statistics.median(ts):.2f} ms (min {min(ts):.2f}), extra {extra:.0f} MiB", flush=True)
