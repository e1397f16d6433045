#!/usr/bin/env python3
"""distill_tp_compare.py — distillation (forward KL; reverse KL or JSD with --divergence) with both LM
heads sharded by vocab rows over the ranks of a tensor-parallel group (issue 44 item 1 under TP),
side by side in one run:

  torch-tp    what a framework writes (Megatron's vocab-parallel cross-entropy, for a divergence):
              both models' logits on the shard in bf16, upcast to fp32 at T; all-reduce MAX and SUM
              for each model's log-normalizer; the shard's part of D summed by one more all-reduce
              (JSD: two); for a hand-written backward forward KL keeps the shard's q and p (dZ =
              g (q - p)/T), reverse KL and JSD the shard's unscaled dz formed with the row sums;
              dH = dZ.W_r all-reduced (fp32), dW = dZ^T.H.
  flce-tp     flce.vocab_parallel_distillation(comm=flce.NcclComm()): per token chunk one all-gather
              of 16 bytes a token and one all-reduce of 8, dH summed in fp32 (README, "Distillation").
  flce-local  flce.linear_distillation on this rank's shard alone (another problem: no errors), so that
              flce-tp - flce-local is what tensor parallelism adds.

Leaf student tensors, loss.backward(); CUDA events, median of --iters steps after --warmup, the
slowest rank's; memory: the peak allocated during one step above what was allocated before it.
Errors: relative, against a float64 oracle of the same data on --samples token rows (both models'
shard logits in fp64, their statistics all-reduced in fp64): the loss (over all tokens, mean),
the per-token divergence and dH on those rows, dW on this rank's first --samples vocab rows.
Rows go into <out>/distill-tp-<device>-x<tp>-<date>.{json,md}.

  torchrun --nproc_per_node=2 bench/distill_tp_compare.py --out DIR [--shapes 8192x4096x128256]
      [--divergence reverse_kl | --divergence jsd --beta 0.5]   # the fp32-logits path
  python3 bench/distill_tp_compare.py --cpu-dry     # no GPU: 2 gloo ranks on the CPU, flce through
                                                    # python/standin.py, checks the script only
"""
import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_shape(s):
    n, d, v = (int(x) for x in s.lower().split("x"))
    return n, d, v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="8192x4096x128256", help="comma-separated NxDxV (student and teacher D alike)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--divergence", default="forward_kl", choices=("forward_kl", "reverse_kl", "jsd"),
                    help="reverse_kl, jsd: flce's fp32-logits path under TP")
    ap.add_argument("--beta", type=float, default=0.5, help="JSD's beta (0 < beta < 1)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--providers", default="torch-tp,flce-tp,flce-local")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--cpu-dry", action="store_true")
    args = ap.parse_args()
    if args.cpu_dry and "WORLD_SIZE" not in os.environ:
        # two gloo ranks on the CPU: this script again under the variables torchrun would set
        procs = []
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT="29533")
            procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
        return max(p.wait() for p in procs)
    return run(args)


def run(args):
    import torch
    import torch.distributed as dist
    import flce
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.cpu_dry:
        import standin
        standin.install()
        dev = torch.device("cpu")
        shapes = [(48, 32, 301)]
        args.iters, args.warmup, args.samples = 2, 1, 8
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dev = torch.device("cuda", torch.cuda.current_device())
        shapes = [parse_shape(s) for s in args.shapes.split(",")]
    dist.init_process_group("gloo" if args.cpu_dry else "nccl", timeout=datetime.timedelta(minutes=5))
    if args.cpu_dry:  # the stand-in emulates flce's collectives: a communicator in name only
        import ctypes
        comm = flce.NcclComm.__new__(flce.NcclComm)
        comm.ptr, comm.rank, comm.size, comm.register, comm.group = ctypes.c_void_p(0x1000), rank, world, False, None
    else:
        comm = flce.NcclComm()
    T = args.temperature
    sync = (lambda: None) if args.cpu_dry else torch.cuda.synchronize
    rows_out = []
    date = datetime.date.today().isoformat()
    device = "cpu-dry" if args.cpu_dry else torch.cuda.get_device_name().lower().replace(" ", "-")
    for n, d, v in shapes:
        sizes = [v // world] * (world - 1) + [v - v // world * (world - 1)]
        off = sum(sizes[:rank])
        shard = slice(off, off + sizes[rank])
        g = torch.Generator().manual_seed(7)
        bf = torch.bfloat16
        hs = torch.randn(n, d, generator=g).to(bf).to(dev)
        ht = torch.randn(n, d, generator=g).to(bf).to(dev)
        ws_all = (torch.randn(v, d, generator=g) * 4.0 / d ** 0.5).to(bf)
        wt_all = (torch.randn(v, d, generator=g) * 4.0 / d ** 0.5).to(bf)
        ws, wt = ws_all[shard].contiguous().to(dev), wt_all[shard].contiguous().to(dev)
        del ws_all, wt_all
        ref = oracle(hs, ws, ht, wt, T, args.samples, dist, args.divergence, args.beta)

        def torch_tp(h, w):
            return TorchTPKL.apply(h, w, ht, wt, T, args.divergence, args.beta)

        def flce_tp(h, w):
            return flce.vocab_parallel_distillation(h, w, ht, wt, vocab_offset=off, vocab_total=v, comm=comm,
                                                    temperature=T, return_per_token=True, divergence=args.divergence,
                                                    beta=args.beta)

        def flce_local(h, w):
            return flce.linear_distillation(h, w, ht, wt, temperature=T, return_per_token=True,
                                            divergence=args.divergence, beta=args.beta)
        fns = {"torch-tp": torch_tp, "flce-tp": flce_tp, "flce-local": flce_local}
        for name in args.providers.split(","):
            fn = fns[name]
            h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
            for _ in range(args.warmup):
                h.grad = w.grad = None
                out = fn(h, w)
                (out[0] if isinstance(out, tuple) else out).backward()
            sync()
            base = 0 if args.cpu_dry else torch.cuda.memory_allocated()
            if not args.cpu_dry:
                torch.cuda.reset_peak_memory_stats()
            h.grad = w.grad = None
            out = fn(h, w)
            loss, div = (out[0], out[1]) if isinstance(out, tuple) else (out, None)
            loss.backward()
            sync()
            extra = 0 if args.cpu_dry else (torch.cuda.max_memory_allocated() - base) / 2 ** 20
            err = {}
            if name != "flce-local":
                err = dict(err_loss=rel(loss, ref["loss"]), err_div=rel(div[ref["rows"]], ref["div"]),
                           err_dh=rel(h.grad[ref["rows"]], ref["dh"]), err_dw=rel(w.grad[:args.samples], ref["dw"]))
            times = []
            for _ in range(args.iters):
                h.grad = w.grad = None
                if args.cpu_dry:
                    out = fn(h, w)
                    (out[0] if isinstance(out, tuple) else out).backward()
                    times.append(0.0)
                    continue
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                dist.barrier()
                s.record()
                out = fn(h, w)
                (out[0] if isinstance(out, tuple) else out).backward()
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e))
            ms = torch.tensor([statistics.median(times), extra] + [err.get(k, -1.0) for k in
                              ("err_loss", "err_div", "err_dh", "err_dw")], dtype=torch.float64, device=dev)
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # the slowest rank, the largest error
            row = dict(shape=f"{n}x{d}x{v}", tp=world, provider=name, ms=round(ms[0].item(), 3),
                       extra_mib=round(ms[1].item()), device=device, date=date, temperature=T,
                       divergence=args.divergence, beta=args.beta if args.divergence == "jsd" else None)
            for i, k in enumerate(("err_loss", "err_div", "err_dh", "err_dw")):
                if ms[2 + i].item() >= 0:
                    row[k] = float(f"{ms[2 + i].item():.3g}")
            rows_out.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
    if rank == 0 and not args.cpu_dry:
        os.makedirs(args.out, exist_ok=True)
        tag = "" if args.divergence == "forward_kl" else "-" + args.divergence
        stem = os.path.join(args.out, f"distill-tp-{device}-x{world}-{date}{tag}")
        with open(stem + ".json", "w") as f:
            json.dump(rows_out, f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write("| shape | tp | provider | ms | extra MiB | err loss | err D | err dH | err dW |\n"
                    "|---|---:|---|---:|---:|---:|---:|---:|---:|\n")
            for r in rows_out:
                f.write(f"| {r['shape']} | {r['tp']} | {r['provider']} | {r['ms']} | {r['extra_mib']} | "
                        + " | ".join(str(r.get(k, "—")) for k in ("err_loss", "err_div", "err_dh", "err_dw")) + " |\n")
        print(f"wrote {stem}.json and .md")
    if rank == 0 and args.cpu_dry:
        print(f"cpu-dry: {len(rows_out)} rows, the script runs (nothing measured)")
    if not args.cpu_dry:
        comm.close()
    dist.destroy_process_group()
    return 0


def rel(x, ref):
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def global_lse(z, dist):
    """Each row's log-normalizer over every rank's columns of z (all-reduce MAX, then SUM)."""
    import torch
    m = z.max(dim=1).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    s = torch.exp(z - m[:, None]).sum(dim=1)
    dist.all_reduce(s)
    return m + torch.log(s)


def divergence_rows(lq, lp, divergence, beta, dist):
    """Per row of shard log-probabilities lq (student), lp (teacher): D, its shard parts all-reduced,
    and the shard's dD/dz·T (forward KL q − p; reverse KL and JSD need the row's whole sums first)."""
    import torch
    q, p = torch.exp(lq), torch.exp(lp)
    if divergence == "jsd":  # β KL(p‖m) + (1−β) KL(q‖m), m = βp + (1−β)q; dz needs KL(q‖m) whole
        lm = torch.logaddexp(math.log(beta) + lp, math.log1p(-beta) + lq)
        kp, kq = (p * (lp - lm)).sum(dim=1), (q * (lq - lm)).sum(dim=1)
        dist.all_reduce(kp)
        dist.all_reduce(kq)
        return beta * kp + (1 - beta) * kq, (1 - beta) * q * (lq - lm - kq[:, None])
    if divergence == "reverse_kl":
        d = (q * (lq - lp)).sum(dim=1)
        dist.all_reduce(d)
        return d, q * (lq - lp - d[:, None])
    d = (p * (lp - lq)).sum(dim=1)
    dist.all_reduce(d)
    return d, q - p


def oracle(hs, ws, ht, wt, T, samples, dist, divergence="forward_kl", beta=0.5):
    """float64 forward KL, reverse KL or JSD(beta) on `samples` token rows (the loss over all tokens, mean), this
    rank's shard of the statistics all-reduced in fp64: D on those rows, their dH (all-reduced) and
    this rank's first `samples` dW rows (every token's contribution, in row chunks)."""
    import torch
    n = hs.shape[0]

    def div_dz(lq, lp):  # per-row D (all-reduced over the shards) and dz/T·n (this shard's columns)
        d, dz = divergence_rows(lq, lp, divergence, beta, dist)
        return d, dz / T / n

    def stats(h_rows, ht_rows):
        zs, zt = (h_rows.double() @ ws.double().T) / T, (ht_rows.double() @ wt.double().T) / T
        return zs, zt, global_lse(zs, dist), global_lse(zt, dist)
    loss = torch.zeros((), dtype=torch.float64, device=hs.device)
    dw = torch.zeros(samples, ws.shape[1], dtype=torch.float64, device=hs.device)
    step = 1024
    for r0 in range(0, n, step):
        zs, zt, ls, lt = stats(hs[r0:r0 + step], ht[r0:r0 + step])
        d, dz = div_dz(zs - ls[:, None], zt - lt[:, None])
        loss += d.sum()
        dw += dz[:, :samples].T @ hs[r0:r0 + step].double()
    rows = torch.linspace(0, n - 1, samples).long().to(hs.device)
    zs, zt, ls, lt = stats(hs[rows], ht[rows])
    div, dz = div_dz(zs - ls[:, None], zt - lt[:, None])
    dh = dz @ ws.double()
    dist.all_reduce(dh)
    return dict(loss=loss / n, rows=rows, div=div, dh=dh, dw=dw)


def _torch_tp_kl():
    import torch
    import torch.distributed as dist

    class TorchTPKL(torch.autograd.Function):
        """Megatron-style vocab-parallel divergence (mean over tokens) with a hand-written backward: forward
        KL keeps q and p for it; reverse KL and JSD, whose dz needs the row's all-reduced sum, keep
        the shard's unscaled dz (one fp32 tensor) formed in the forward."""

        @staticmethod
        def forward(ctx, hs, ws, ht, wt, T, divergence="forward_kl", beta=0.5):
            zs = (hs @ ws.T).float() / T
            zt = (ht @ wt.T).float() / T
            lq, lp = zs - global_lse(zs, dist)[:, None], zt - global_lse(zt, dist)[:, None]
            del zs, zt
            if divergence == "forward_kl":
                p, q = torch.exp(lp), torch.exp(lq)
                div = (p * (lp - lq)).sum(dim=1)
                dist.all_reduce(div)
                saved = (q, p)
            else:
                div, dz = divergence_rows(lq, lp, divergence, beta, dist)
                saved = (dz,)
            ctx.save_for_backward(hs, ws, *saved)
            ctx.T = T
            ctx.mark_non_differentiable(div)
            return div.mean(), div

        @staticmethod
        def backward(ctx, g, _):
            hs, ws, *saved = ctx.saved_tensors
            dz = saved[0] if len(saved) == 1 else saved[0] - saved[1]
            dz = (dz * (g / (ctx.T * dz.shape[0]))).to(hs.dtype)
            dh = (dz @ ws).float()
            dist.all_reduce(dh)
            return dh.to(hs.dtype), dz.T @ hs, None, None, None, None, None
    return TorchTPKL


TorchTPKL = None

if __name__ == "__main__":
    TorchTPKL = _torch_tp_kl()
    sys.exit(main())
