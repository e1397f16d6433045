"""s1.py (session 32): flce.topk_logprobs at 8192x4096x128256 bf16, k = 64, logit std 2 and 4: median ms
of 20 calls (CUDA events, 3 warm-up) and, on 128 sampled rows, the largest log-prob and lse error
against fp64 logits. argv[1]: a label; argv[2] == "warm": one call per case only (compiles)."""
import sys, torch
sys.path.insert(0, "python")
import flce
label = sys.argv[1]
warm = len(sys.argv) > 2 and sys.argv[2] == "warm"
n, d, v, k = 8192, 4096, 128256, 64
g = torch.Generator(device="cuda"); g.manual_seed(1234)
h = torch.randn(n, d, device="cuda", generator=g).bfloat16()
w0 = torch.randn(v, d, device="cuda", generator=g)
for std in (2.0, 4.0):
    w = (w0 * (std / d ** 0.5)).bfloat16()
    out = flce.topk_logprobs(h, w, k)
    if warm:
        torch.cuda.synchronize(); print(label, "warm ok", std); continue
    for _ in range(3): flce.topk_logprobs(h, w, k)
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); flce.topk_logprobs(h, w, k); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(7))[:128].cuda()
    z = h[rows].double() @ w.double().T
    lse = torch.logsumexp(z, dim=1)
    lp, idx = out.logprobs[rows].double(), out.indices
    lerr = (out.lse[rows].double() - lse).abs().max().item()
    want = torch.gather(z, 1, idx[rows]) - lse[:, None]
    err = (lp - want).abs().max().item()
    bias = (lp - want).mean().item()
    print(f"{label} std={std} ms={ts[10]:.3f} min={ts[0]:.3f} maxerr={err:.3e} meanerr={bias:+.3e} lse_err={lerr:.3e}", flush=True)
