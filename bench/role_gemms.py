#!/usr/bin/env python3
"""role_gemms.py — the three GEMM roles of one shape by cuBLAS (torch.matmul), once each inside a
CUDA profiler range, for ncu's --profile-from-start off (bench/ncu_limits.sh): what cuBLAS runs for
flce's roles and at what rate, next to flce's own kernels profiled at the same locked clock.
  logits  H[N×D] · W[V×D]ᵀ → bf16 N×V
  dh      dZ[N×V] · W[V×D] → N×D
  dw      dZᵀ[V×N] · H[N×D] → V×D
Usage: python3 bench/role_gemms.py NxDxV [--roles logits,dh,dw]"""
import argparse

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--roles", default="logits,dh,dw")
    a = ap.parse_args()
    n, d, v = (int(x) for x in a.shape.split("x"))
    g = torch.Generator(device="cuda").manual_seed(1)
    h = torch.randn(n, d, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(v, d, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    dz = torch.randn(n, v, device="cuda", dtype=torch.bfloat16, generator=g) * 1e-5
    steps = {"logits": lambda: h @ w.T, "dh": lambda: dz @ w, "dw": lambda: dz.T @ h}
    roles = a.roles.split(",")
    for r in roles:  # cuBLAS's heuristics and workspace settle outside the profiled range
        steps[r]()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for r in roles:
        steps[r]()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
