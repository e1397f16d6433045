# t7: flce.topk_logprobs k=64 at 8192x4096x128256 with the default 1 GiB budget (4 chunks of fp32
# logits) against budgets of 2 and 5 GiB (2 chunks, 1 chunk): what chunking costs the top-k call.
import torch, flce, statistics
torch.manual_seed(0)
n, d, v, k = 8192, 4096, 128256, 64
h = torch.randn(n, d, device="cuda", dtype=torch.bfloat16)
w = (torch.randn(v, d, device="cuda") * 4 / d ** 0.5).to(torch.bfloat16)
for budget in (1 << 30, 2 << 30, 5 << 30, 1 << 30):
    for _ in range(3):
        flce.topk_logprobs(h, w, k, memory_budget=budget)
    ts = []
    for _ in range(15):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); flce.topk_logprobs(h, w, k, memory_budget=budget); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    print(f"budget {budget >> 20} MiB: median {statistics.median(ts):.2f} ms  min {min(ts):.2f}", flush=True)
