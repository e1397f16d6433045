"""n1 (session 30): one distillation step each, forward KL (compact pass) and reverse KL at an 11 GiB budget
(plain pass with the fp32 Z store, one chunk), at 4096x4096x128256 bf16, warmed outside the profiled range
(torch.cuda.profiler.start/stop around one step each) so that ncu sees only the four logits passes."""
import sys, torch
sys.path.insert(0, "python")
import flce
torch.manual_seed(0)
n, d, v = 4096, 4096, 128256
dev = "cuda"
hs = torch.randn(n, d, device=dev).bfloat16()
ht = torch.randn(n, d, device=dev).bfloat16()
ws = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
wt = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
y = torch.randint(0, v, (n,), device=dev)
h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
def step(div):
    h.grad = w.grad = None
    flce.linear_distillation(h, w, ht, wt, y, divergence=div, memory_budget=11 << 30).backward()
for div in ("forward_kl", "reverse_kl"):
    for _ in range(2): step(div)
torch.cuda.synchronize()
torch.cuda.profiler.start()
for div in ("forward_kl", "reverse_kl"):
    step(div)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("done")
