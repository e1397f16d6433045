"""paths.py — `compare.py --paths`: every training path users run through a fused LM head, flce against
torch.compile doing the same job in the same process, called the way users call them: leaf tensors,
one objective, `loss.backward()`, gradients in `.grad` (or added into an fp32 main_grad buffer).

Paths (bf16; ~5% of the labels ignored; adv ~ N(0, 1) per token):
  mean                  cross_entropy(h·wᵀ, y)                       (the mean over valid tokens)
  none-adv              Σ_i adv_i · loss_i                            (reduction "none")
  logprobs-adv          −Σ_i adv_i · log p_i(y_i)                     (GRPO/PPO's policy term)
  logprobs-adv-entropy  the same − 0.01 · Σ_i H_i                      (an entropy bonus, all tokens)
  mean-main-grad        mean, dW added into an fp32 V×D main_grad (Megatron); weight.grad stays None
                        (torch.compile: loss.backward(), then main_grad.add_(w.grad), as Megatron's hook)
  mean-zloss-lse        mean + 1e-4 · mean_i lse_i²                   (z-loss written by hand on lse)
Providers: flce, torch-compile, and on mean and logprobs-adv flce-batch-invariant (batch_invariant=True).

Each row: {shape, path, provider, ms, extra_mib, err_dh, err_dw, logit_std, device, date, commit} and
the ratios the issue's targets read: vs_flce_mean (ms / flce's mean row of the same shape and std)
and vs_torch_compile (ms / torch.compile's row of the same path). ms: median of --iters steps (CUDA
events around the whole step: grads cleared, forward, backward, main_grad add) after --warmup.
extra_mib: peak allocated during one step minus allocated before it (gradients included, inputs
and main_grad excluded). Errors: relative L2 against float64 on the GPU over sampled valid tokens
(dH rows) and vocab rows (dW), half of them labels that occur. Files:
<out>/paths-<device>-<date>[-tag].{json,md}, rewritten after every row.
"""
import datetime
import json
import math
import os
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flce

IGNORE = -100
MiB = 1 << 20
PATHS = ["mean", "none-adv", "logprobs-adv", "logprobs-adv-entropy", "mean-main-grad", "mean-zloss-lse"]
SHAPES = ["8192x4096x128256", "8192x4096x151936", "16384x4096x151936", "4096x2048x32000", "32768x4096x128256"]
ENTROPY_BONUS = 0.01
# flce with batch_invariant=True (a token's outputs bitwise whatever the call holds): its cost
BI_PATHS = ("mean", "logprobs-adv")
ZLOSS = 1e-4
ROW_KEYS = ["shape", "path", "provider", "ms", "ms_min", "ms_max", "extra_mib", "err_dh", "err_dw", "logit_std",
            "vs_flce_mean", "vs_torch_compile", "error", "device", "date", "commit", "torch"]


def log(msg):
    print(f"[paths {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_data(n, d, v, std, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(n, d, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(v, d, device="cuda", generator=g).mul_(std / math.sqrt(d)).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), device="cuda", generator=g, dtype=torch.int64)
    y[torch.rand(n, device="cuda", generator=g) < 0.05] = IGNORE
    adv = torch.randn(n, device="cuda", generator=g)
    return h, w, y, adv


# ---- the objectives ------------------------------------------------------------------------------

def flce_objective(path, h, w, y, adv, main_grad, **extra):
    def lce(*a, **k):
        return flce.linear_cross_entropy(*a, **k, **extra)
    if path in ("mean", "mean-main-grad"):
        return lce(h, w, y, ignore_index=IGNORE, grad_weight_accumulator=main_grad)
    if path == "none-adv":
        return (lce(h, w, y, ignore_index=IGNORE, reduction="none") * adv).sum()
    if path == "logprobs-adv":
        return -(lce(h, w, y, ignore_index=IGNORE, reduction="none", return_logprobs=True).logprobs * adv).sum()
    if path == "logprobs-adv-entropy":
        o = lce(h, w, y, ignore_index=IGNORE, reduction="none", return_logprobs=True, return_entropy=True)
        return -(o.logprobs * adv).sum() - ENTROPY_BONUS * o.entropy.sum()
    if path == "mean-zloss-lse":
        o = lce(h, w, y, ignore_index=IGNORE, return_lse=True)
        return o.loss + ZLOSS * (o.lse ** 2).mean()
    raise ValueError(path)


def torch_objective(path):
    """The same objective on materialized logits (fp32 softmax, as users write it), for torch.compile."""
    def fn(h, w, y, adv):
        logits = F.linear(h, w).float()
        if path in ("mean", "mean-main-grad"):
            return F.cross_entropy(logits, y, ignore_index=IGNORE)
        if path == "none-adv":
            return (F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="none") * adv).sum()
        if path == "mean-zloss-lse":
            return F.cross_entropy(logits, y, ignore_index=IGNORE) + ZLOSS * (torch.logsumexp(logits, -1) ** 2).mean()
        logp = logits.log_softmax(-1)
        valid = y != IGNORE
        lp = logp.gather(1, y.clamp(min=0)[:, None])[:, 0] * valid
        total = -(lp * adv).sum()
        if path == "logprobs-adv-entropy":
            total = total - ENTROPY_BONUS * (-(logp.exp() * logp).sum(-1)).sum()
        return total
    return fn


# ---- the float64 reference: dz_ij = a_i·p_ij − b_i·1[j = y_i] − c_i·p_ij·(log p_ij + H_i) ----------

def coefficients(path, y, adv, lse):
    valid = (y != IGNORE).double()
    n = y.numel()
    a = torch.zeros(n, dtype=torch.float64, device=y.device)
    c = torch.zeros_like(a)
    if path in ("mean", "mean-main-grad", "mean-zloss-lse"):
        a = valid / max(int(valid.sum()), 1)
        b = a.clone()
        if path == "mean-zloss-lse":
            a = a + ZLOSS * 2 * lse / n
    else:  # none-adv and the log-prob paths: d(adv·loss) = d(−adv·log p)
        a = adv.double() * valid
        b = a.clone()
        if path == "logprobs-adv-entropy":
            c = torch.full_like(a, -ENTROPY_BONUS)  # d(−0.01·H)/dz = +0.01·p·(log p + H)
    return a, b, c


@torch.no_grad()
def reference_base(h, w, y, samples, seed, chunk_elems=1 << 27):
    """What every path's reference shares: lse and entropy of all tokens, the sampled tokens' full
    rows of logits and the sampled vocab rows' columns (all tokens), in float64 on the GPU."""
    n, v = h.shape[0], w.shape[0]
    w64, h64 = w.double(), h.double()
    lse = torch.empty(n, dtype=torch.float64, device=h.device)
    ent = torch.empty_like(lse)
    rows = max(1, min(n, chunk_elems // v))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        z = h64[r0:r1] @ w64.T
        lse[r0:r1] = torch.logsumexp(z, 1)
        ent[r0:r1] = lse[r0:r1] - (torch.exp(z - lse[r0:r1, None]) * z).sum(1)
        del z
    gen = torch.Generator(device=h.device).manual_seed(seed + 1)
    valid_idx = (y != IGNORE).nonzero().squeeze(1)
    tok = valid_idx[torch.randperm(valid_idx.numel(), device=h.device, generator=gen)[:samples]]
    present = y[y != IGNORE].unique()
    from_labels = present[torch.randperm(present.numel(), device=h.device, generator=gen)[:samples // 2]]
    rand_rows = torch.randperm(v, device=h.device, generator=gen)[:samples]
    voc = torch.tensor(list(dict.fromkeys(from_labels.tolist() + rand_rows.tolist()))[:samples],
                       dtype=torch.int64, device=h.device)
    return {"lse": lse, "ent": ent, "tok": tok, "voc": voc, "z_tok": h64[tok] @ w64.T, "z_voc": h64 @ w64[voc].T,
            "w64": w64, "h64": h64}


@torch.no_grad()
def reference(path, base, y, adv):
    lse, ent, tok, voc = base["lse"], base["ent"], base["tok"], base["voc"]
    a, b, c = coefficients(path, y, adv, lse)

    def dz_of(z, rows_idx, cols):
        logp = z - lse[rows_idx, None]
        p = torch.exp(logp)
        dz = a[rows_idx, None] * p - c[rows_idx, None] * p * (logp + ent[rows_idx, None])
        return dz - b[rows_idx, None] * (y[rows_idx, None] == cols[None, :]).double()

    n, v = base["h64"].shape[0], base["w64"].shape[0]
    dh = dz_of(base["z_tok"], tok, torch.arange(v, device=y.device)) @ base["w64"]
    dw = dz_of(base["z_voc"], torch.arange(n, device=y.device), voc).T @ base["h64"]
    return {"tok": tok, "dh": dh, "voc": voc, "dw": dw}


def rel_l2(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


# ---- one row ---------------------------------------------------------------------------------------

def make_step(provider, path, h, w, y, adv, state):
    """A step on leaf tensors: clears the gradients, forward, loss.backward(); returns (dh, dw)."""
    hl, wl = h.detach().requires_grad_(), w.detach().requires_grad_()
    main_grad = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if path == "mean-main-grad" else None
    if provider == "torch-compile":
        key = ("compiled", path)
        if key not in state:
            state[key] = torch.compile(torch_objective(path), dynamic=False)
        fn = state[key]

        def step():
            hl.grad = wl.grad = None
            fn(hl, wl, y, adv).backward()
            if main_grad is not None:  # Megatron's hook: the 16-bit grad into the fp32 buffer
                main_grad.add_(wl.grad)
                wl.grad = None
            return hl.grad, main_grad if main_grad is not None else wl.grad
    else:
        extra = {"batch_invariant": True} if provider == "flce-batch-invariant" else {}

        def step():
            hl.grad = wl.grad = None
            flce_objective(path, hl, wl, y, adv, main_grad, **extra).backward()
            return hl.grad, main_grad if main_grad is not None else wl.grad
    step.main_grad = main_grad
    return step


def run_row(provider, path, h, w, y, adv, ref, state, iters, warmup):
    row = {"provider": provider, "path": path}
    try:
        step = make_step(provider, path, h, w, y, adv, state)
        for _ in range(max(1, warmup)):
            step()
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            step()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        row.update(ms=statistics.median(times), ms_min=min(times), ms_max=max(times))
        # extra memory and the checked step (outputs poisoned: fresh grads; main_grad zeroed)
        torch.cuda.synchronize()
        gc_before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        if step.main_grad is not None:
            step.main_grad.zero_()
        dh, dw = step()
        torch.cuda.synchronize()
        row["extra_mib"] = round((torch.cuda.max_memory_allocated() - gc_before) / MiB, 1)
        row["err_dh"] = rel_l2(dh[ref["tok"]], ref["dh"])
        row["err_dw"] = rel_l2(dw[ref["voc"]], ref["dw"])
        del step, dh, dw
    except Exception as e:  # noqa: BLE001  (the row records it; the run goes on)
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        log(f"  {provider} {path}: {row['error']}")
    torch.cuda.empty_cache()
    return row


def fmt(x, spec):
    return "" if x is None else format(x, spec)


def markdown(rows, shapes, stds):
    out = []
    for shape in shapes:
        for std in stds:
            rs = [r for r in rows if r["shape"] == shape and r["logit_std"] == std]
            if not rs:
                continue
            out += [f"### {shape}, logit std {std:g}", "",
                    "| path | provider | ms | vs flce mean | vs torch.compile | extra MiB | err dH | err dW |",
                    "|---|---|---|---|---|---|---|---|"]
            for r in rs:
                out.append(f"| {r['path']} | {r['provider']} | {fmt(r.get('ms'), '.2f')} | "
                           f"{fmt(r.get('vs_flce_mean'), '.3f')} | {fmt(r.get('vs_torch_compile'), '.3f')} | "
                           f"{fmt(r.get('extra_mib'), '.0f')} | {fmt(r.get('err_dh'), '.1e')} | "
                           f"{fmt(r.get('err_dw'), '.1e')} |" + (f" {r['error']}" if r.get("error") else ""))
            out.append("")
    return "\n".join(out)


def run(args, meta):
    shapes = [s.strip() for s in (args.shapes_text or ",".join(SHAPES)).split(",") if s.strip()]
    stds = args.stds or [4.0, 0.5]
    paths = [p for p in (args.paths_list or PATHS)]
    providers = ["flce", "torch-compile"]
    slug = re.sub(r"[^a-z0-9]+", "-", meta["device"].lower()).strip("-")
    stem = os.path.join(os.path.abspath(args.out), f"paths-{slug}-{meta['date']}" + (f"-{args.tag}" if args.tag else ""))
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    rows = []
    header = [f"# flce training paths: {meta['device']}, {meta['date']}", "",
              f"- commit {meta['commit']}; torch {meta['torch']}; bf16; ~5% labels ignored; adv ~ N(0,1)",
              f"- ms: median of {args.iters} steps after {args.warmup} warm-up (CUDA events around clear grads + "
              "forward + loss.backward() [+ main_grad add]); extra MiB: peak allocated in one step minus before it "
              "(gradients included)",
              f"- errors: relative L2 vs float64 over {args.samples} sampled tokens (dH) and vocab rows (dW)", ""]

    def save():
        for r in rows:
            base = next((x.get("ms") for x in rows if x["shape"] == r["shape"] and x["logit_std"] == r["logit_std"]
                         and x["provider"] == "flce" and x["path"] == "mean"), None)
            tc = next((x.get("ms") for x in rows if x["shape"] == r["shape"] and x["logit_std"] == r["logit_std"]
                       and x["provider"] == "torch-compile" and x["path"] == r["path"]), None)
            r["vs_flce_mean"] = round(r["ms"] / base, 3) if r.get("ms") and base else None
            r["vs_torch_compile"] = round(r["ms"] / tc, 3) if r.get("ms") and tc else None
        md = "\n".join(header) + "\n" + markdown(rows, shapes, stds)
        with open(stem + ".md.tmp", "w") as f:
            f.write(md)
        os.replace(stem + ".md.tmp", stem + ".md")
        with open(stem + ".json.tmp", "w") as f:
            json.dump([{k: r.get(k) for k in ROW_KEYS} for r in rows], f, indent=1)
        os.replace(stem + ".json.tmp", stem + ".json")
        return md

    for shape in shapes:
        n, d, v = (int(x) for x in shape.split("x"))
        torch._dynamo.reset()
        state = {}
        for std in stds:
            h, w, y, adv = make_data(n, d, v, std, args.seed)
            base = reference_base(h, w, y, args.samples, args.seed)
            for path in paths:
                ref = reference(path, base, y, adv)
                for provider in providers + (["flce-batch-invariant"] if path in BI_PATHS else []):
                    t0 = time.time()
                    row = run_row(provider, path, h, w, y, adv, ref, state, args.iters, args.warmup)
                    row.update(shape=shape, logit_std=std, device=meta["device"], date=meta["date"],
                               commit=meta["commit"], torch=meta["torch"])
                    rows.append(row)
                    save()
                    log(f"{shape} std {std:g} {path} {provider}: {fmt(row.get('ms'), '.2f')} ms "
                        f"({time.time() - t0:.0f} s)")
                del ref
            del h, w, y, adv, base
            torch.cuda.empty_cache()
    md = save()
    print(md)
    return rows
