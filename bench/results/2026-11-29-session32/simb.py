# CPU simulation for issue 44's memory option (b): dW = dZ^T H summed over 4 token chunks, each chunk's fp32
# product rounded into a bf16 dW (added in fp32, rounded to bf16 after each chunk) against one fp32 sum
# rounded once; both against fp64. dZ like a distillation's (q - p)/N-scaled rows, H ~ N(0,1) in bf16.
import torch
torch.manual_seed(0)
N, V, D = 8192, 512, 256
h = torch.randn(N, D).bfloat16().double()
q = torch.softmax(torch.randn(N, V) * 2, 1); p = torch.softmax(torch.randn(N, V) * 2, 1)
dz = ((q - p) / N).bfloat16().double()
exact = dz.T @ h
one = (dz.T.float() @ h.float()).bfloat16().double()
for chunks in (2, 4, 8):
    acc = torch.zeros(V, D).bfloat16()
    c = N // chunks
    for k in range(chunks):
        part = dz[k*c:(k+1)*c].T.float() @ h[k*c:(k+1)*c].float()
        acc = (acc.float() + part).bfloat16()
    e_many = ((acc.double() - exact).norm() / exact.norm()).item()
    print(f"chunks {chunks}: dW rel L2 err {e_many:.3e}")
print(f"one rounding: dW rel L2 err {((one - exact).norm() / exact.norm()).item():.3e}")
