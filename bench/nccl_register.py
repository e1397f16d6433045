#!/usr/bin/env python3
"""nccl_register.py — does NCCL buffer registration make flce's TP collectives cheaper here?

Issue 20 asks for ncclCommRegister (or symmetric memory) "where it measures faster". flce's two
collectives per TP step are one small all-gather of per-token statistics and the fp32 dH
all-reduce (N x D x 4 bytes: 128 MiB at N = 8192, D = 4096), which runs beside dW's GEMM. This
measures both with NCCL through torch.distributed, with the buffers

  plain       from PyTorch's caching allocator (what flce's workspace is to NCCL today),
  registered  from a MemPool on NCCL's allocator registered with the communicator (local
              registration: ncclCommRegister on every segment),
  symmetric   the same pool registered as a symmetric window (ncclCommWindowRegister), where
              this PyTorch supports it,

each alone and while a bf16 GEMM of dW's shape at this tp runs on another stream (what the
all-reduce shares the GPU with in flce's step): the GEMM's time, the collective's time and the
pair's makespan. CUDA events, median over --iters, the slowest rank. NVLink multicast stays off.

  NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 bench/nccl_register.py --out DIR
"""
import argparse
import datetime
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

MiB = 1 << 20


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return out


def slowest(ms):
    t = torch.tensor([statistics.median(ms)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192x4096x128256", help="N x D x V of the whole (unsharded) problem")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    n, d, v = (int(x) for x in args.shape.split("x"))

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.barrier()
    backend = dist.distributed_c10d._get_default_group()._get_backend(dev)

    # dW's GEMM at this tp: dZ^T [V/tp x N] . H [N x D].
    vs = v // size
    dzt = torch.randn(vs, n, device=dev).to(torch.bfloat16)
    hid = torch.randn(n, d, device=dev).to(torch.bfloat16)
    dw = torch.empty(vs, d, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    stats_bytes = n * 16  # the statistics all-gather is a few floats per token

    def buffers(kind):
        if kind == "plain":
            return (torch.randn(n * d, device=dev), torch.zeros(stats_bytes, dtype=torch.uint8, device=dev),
                    torch.zeros(stats_bytes * size, dtype=torch.uint8, device=dev), None)
        pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(pool):
            dh = torch.randn(n * d, device=dev)
            s = torch.zeros(stats_bytes, dtype=torch.uint8, device=dev)
            g = torch.zeros(stats_bytes * size, dtype=torch.uint8, device=dev)
        if kind == "registered":
            backend.register_mem_pool(pool)
        else:
            backend.register_mem_pool(pool, symm=True)
        return dh, s, g, pool

    rows, notes = [], []
    gemm = lambda: torch.matmul(dzt, hid, out=dw)  # noqa: E731
    gemm_alone = slowest(timed(gemm, args.iters, args.warmup))
    for kind in ("plain", "registered", "symmetric"):
        try:
            dh, s, g, pool = buffers(kind)
        except Exception as e:  # an older PyTorch or NCCL: say so, measure the rest
            notes.append(f"{kind}: not available here ({type(e).__name__}: {e})")
            continue
        ar = lambda: dist.all_reduce(dh)  # noqa: E731
        ag = lambda: dist.all_gather_into_tensor(g, s)  # noqa: E731

        def pair():
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                gemm()
            dist.all_reduce(dh)
            torch.cuda.current_stream().wait_stream(side)

        row = {"kind": kind, "tp": size,
               "allreduce_dh_ms": slowest(timed(ar, args.iters, args.warmup)),
               "allgather_stats_ms": slowest(timed(ag, args.iters, args.warmup)),
               "gemm_dw_alone_ms": gemm_alone,
               "gemm_dw_with_allreduce_ms": slowest(timed(pair, args.iters, args.warmup))}
        rows.append(row)
        if pool is not None:
            del dh, s, g
            torch.cuda.synchronize()
            try:
                backend.deregister_mem_pool(pool)
            except Exception as e:
                notes.append(f"{kind}: deregister failed ({e})")
        if rank == 0:
            print(json.dumps(row), flush=True)

    if rank == 0:
        name = torch.cuda.get_device_name(dev).replace(" ", "-")
        date = datetime.date.today().isoformat()
        doc = {"device": torch.cuda.get_device_name(dev), "date": date, "tp": size, "shape": args.shape,
               "dh_bytes": n * d * 4, "stats_bytes_per_rank": stats_bytes, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
               "torch": torch.__version__, "rows": rows, "notes": notes}
        path = os.path.join(args.out, f"nccl-register-{name}-x{size}-{date}.json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        for x in notes:
            print(x, flush=True)
        print(f"wrote {path}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
