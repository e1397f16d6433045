"""s7 (session 32): the time cost of memory option (b) for issue 44, by cuBLAS as a proxy: dW (128256 x 4096,
bf16) = dZ^T H over 8192 tokens in one GEMM, against 2 and 4 token chunks each added into the bf16 dW
(torch.addmm with beta = 1: read, add, write dW per chunk). Median of 20 (CUDA events) after 3 warm-up."""
import statistics, torch
n, v, d = 8192, 128256, 4096
dz = torch.randn(n, v, device="cuda").bfloat16()
h = torch.randn(n, d, device="cuda").bfloat16()
out = torch.empty(v, d, device="cuda", dtype=torch.bfloat16)
def once():
    torch.mm(dz.T, h, out=out)
def chunked(c):
    step = n // c
    def f():
        torch.mm(dz[:step].T, h[:step], out=out)
        for k in range(1, c):
            out.addmm_(dz[k * step:(k + 1) * step].T, h[k * step:(k + 1) * step])
    return f
def timed(fn):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)
for rnd in (1, 2):
    print(f"round {rnd}: one GEMM {timed(once):.2f} ms; 2 chunks {timed(chunked(2)):.2f} ms; 4 chunks {timed(chunked(4)):.2f} ms", flush=True)
