#!/usr/bin/env python3
"""fuzz_binding.py — a random-case fuzzer of the flce PyTorch binding's public surface (issue 43,
deliverable 4), against flce.h's math in float64 PyTorch (flce/_reference.py; autograd on the
float64 logits gives the reference gradients).

  python3 python/fuzz_binding.py --cases 300 --seed 1                 # 300 cases, exit 1 on a failure
  python3 python/fuzz_binding.py --cases 1000 --seed 7 --json OUT     # also {cases, passed, failed,
                                                                      # seed, device, date, commit}
  python3 python/fuzz_binding.py --seed 7 --case 123                  # only case 123 of seed 7 (what
                                                                      # a failure prints to reproduce)
  python3 python/fuzz_binding.py --cases 1000 --jobs 6 --json OUT     # the cases dealt to 6 processes
                                                                      # (on a GPU most of a case's time
                                                                      # is NVRTC compiling its kernels)

With CUDA the real library runs on the GPU; without it the kernels are replaced by the float64
stand-in (standin.py, as test_binding.py does) and everything above them runs on the CPU: argument
checks, the custom ops and their autograd formulas, the strategy choices, torch.compile (backend
aot_eager; inductor on a GPU; FLCE_FUZZ_COMPILE_BACKEND overrides).

Each case draws from its own generator (seeded by --seed and the case number, so one case
reproduces alone):
  good calls (~85 %): flce.linear_cross_entropy (or the flce.LinearCrossEntropy module) on
    N = 1..600 tokens, hidden (N, D) or (B, T, D), D a multiple of 8 in 8..256, V = 1..3000;
    float32 / float16 / bfloat16; int32 / int64 labels; a share of ignored labels (none .. all) and
    an ignore_index of -100 or a class id; reduction mean / sum / none; strategy auto / chunked /
    recompute; memory_budget None or small (other plans); label_smoothing, z_loss, softcap,
    temperature, bias (differentiable or not), class weights (any float dtype, sometimes strided
    or with zeros), shift; every return_* combination; an objective over a random subset of the
    differentiable outputs (loss, logprobs, lse, entropy, loss_per_token) with random upstream
    weights (a scalar upstream sometimes exactly 1); random requires_grad of hidden / weight / bias,
    torch.no_grad() sometimes; fp32 grad_weight / grad_hidden accumulators (starting non-zero);
    batch_invariant; inputs with a misaligned storage offset (copied by the binding); autocast
    (bfloat16) around the call, which makes the binding cast hidden, weight and bias to bfloat16
    (the reference then takes the rounded inputs, and 16-bit gradient tolerances apply); hidden a
    non-leaf (a layer's output) sometimes; ~10 % under torch.compile(fullgraph=True) (static or
    dynamic shapes; --compile-share changes the share).
    Checked: the result's type and fields, shapes and dtypes, every returned value (max abs error
    <= 2e-5 * max(1, max |reference|)), argmax (a largest logit; -1 at shifted-out positions),
    gradients of hidden, weight and bias or what the accumulators received (relative norm error
    1e-4 fp32, 1e-2 16-bit, test_binding.py's check_outputs tolerances, plus rounding floors: fp16's
    subnormal range, an accumulator's fp32 start value, float64 noise of a zero gradient), .grad
    left None where an accumulator took the gradient, accumulators untouched without a backward,
    and on a GPU a clear bad-label flag (flce.check()) after every case.
  bad calls (~15 %): non-contiguous or overlapping (expand()) tensors, a wrong device (meta on a
    CPU machine), wrong dtypes, wrong shapes, a non-tensor argument, bad reduction / strategy /
    memory_budget / shift values, an unknown keyword: a ValueError or TypeError naming the
    argument; option values out of range: flce.FlceError naming the problem field; a gradient
    through the z_loss output: NotImplementedError naming it.

Exit status 0 when all cases pass, 1 on any failure, 77 when torch (or, without a GPU, libflce.so)
is missing. A failing case prints its seed, number, every parameter and the command reproducing it.
Gaps it found in the binding (fixed in 2a7e700) are part of the default draw: strategy='saved'
asked for explicitly, misaligned fp32 accumulators, scalar options of a wrong type
(--include-known is kept and changes nothing).
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import random
import re
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)

import flce  # noqa: E402
from flce import _lib  # noqa: E402
from flce._reference import reference  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
BACKEND = os.environ.get("FLCE_FUZZ_COMPILE_BACKEND", "inductor" if GPU else "aot_eager")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
LABEL_DTYPES = {"int32": torch.int32, "int64": torch.int64}
CW_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
             "bfloat16": torch.bfloat16}
OUTPUTS = ("lse", "logprobs", "entropy", "argmax", "z_loss", "loss_per_token")
DIFFERENTIABLE = ("loss", "logprobs", "lse", "entropy", "loss_per_token")
VALUE_TOL = 2e-5
GRAD_TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}
COMPILE_SHARE = 0.1  # --compile-share


class CaseFailure(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise CaseFailure(msg)


# ---- drawing a case --------------------------------------------------------------------------------

def case_seed(seed, index):
    return (seed * 1_000_003 + index * 7_919 + 12_345) % (1 << 62)


def log_int(rng, lo, hi):
    """An integer in [lo, hi], log-uniform (small sizes as often as large ones)."""
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def draw_shape(rng, min_tokens=1):
    # a third above 256 tokens, where AUTO may compute the gradients in forward (_DEFER_TOKENS)
    n = rng.randint(257, 600) if rng.random() < 0.3 else log_int(rng, min_tokens, 600)
    if rng.random() < 0.4:  # 3-D hidden (B, T, D)
        b = rng.randint(1, 6)
        t = max(1, n // b)
        if t < min_tokens:
            b, t = 1, n
        return [b, t]
    return [n]


def draw_good(rng, include_known=False):
    p = {"kind": "good"}
    p["lead"] = draw_shape(rng)
    p["D"] = 8 * rng.randint(1, 32)
    p["V"] = log_int(rng, 1, 3000)
    p["dtype"] = rng.choice(list(DTYPES))
    p["label_dtype"] = rng.choice(list(LABEL_DTYPES))
    p["hidden_std"] = rng.choice([0.5, 1.0, 2.0, 4.0])
    p["ignore_share"] = rng.choice([0.0, 0.0, 0.1, 0.3, 0.7, 1.0])
    p["ignore_index"] = -100 if rng.random() < 0.8 or p["V"] < 2 else rng.choice([-1, rng.randrange(p["V"])])
    p["reduction"] = rng.choice(["mean", "sum", "none"])
    strategies = ["auto", "auto", "auto", "chunked", "recompute"] + ["saved"]
    p["strategy"] = rng.choice(strategies)
    p["memory_budget"] = None if rng.random() < 0.75 else rng.choice([1 << 12, 1 << 14, 1 << 16, 1 << 20, 1 << 21])
    p["label_smoothing"] = 0.0 if rng.random() < 0.6 else round(rng.uniform(0.01, 0.3), 4)
    p["z_loss"] = 0.0 if rng.random() < 0.7 else float(f"{math.exp(rng.uniform(math.log(1e-4), math.log(1e-2))):.3g}")
    r = rng.random()
    p["softcap"] = (None if r < 0.2 else 0.0) if r < 0.7 else round(rng.uniform(2.0, 30.0), 3)
    p["temperature"] = 1.0 if rng.random() < 0.65 else round(rng.uniform(0.5, 2.0), 3)
    p["bias"] = rng.random() < 0.3
    p["bias_grad"] = p["bias"] and rng.random() < 0.7
    p["class_weights"] = None
    if rng.random() < 0.25:
        p["class_weights"] = {"dtype": rng.choice(list(CW_DTYPES)), "strided": rng.random() < 0.3,
                              "zeros": rng.random() < 0.3}
    last = p["lead"][-1]
    p["shift"] = rng.randint(1, min(3, last - 1)) if last >= 2 and rng.random() < 0.25 else 0
    if rng.random() < 0.35:  # the plain loss: a training step's usual call
        p["returns"] = []
    else:
        p["returns"] = [k for k in OUTPUTS if rng.random() < 0.5]
    p["no_grad"] = rng.random() < 0.1
    r = rng.random()
    p["need_h"], p["need_w"] = (True, True) if r < 0.55 else (True, False) if r < 0.7 else \
        (False, True) if r < 0.85 else (False, False)
    available = ["loss"] + [k for k in p["returns"] if k in DIFFERENTIABLE]
    p["objective"] = sorted({k for k in available if rng.random() < 0.6} or {rng.choice(available)},
                            key=DIFFERENTIABLE.index)
    p["upstream_one"] = rng.random() < 0.3  # a scalar loss's upstream gradient exactly 1
    p["gw_acc"] = p["need_w"] and rng.random() < 0.15
    p["gh_acc"] = p["need_h"] and rng.random() < 0.1
    p["batch_invariant"] = rng.random() < 0.15
    p["misaligned"] = rng.choice(["hidden", "weight", "bias"]) if rng.random() < 0.1 else None
    p["module"] = rng.random() < 0.1
    p["nonleaf"] = rng.random() < 0.15  # hidden = leaf * 1 (a layer's output), inside the compiled function
    p["autocast"] = rng.random() < 0.08
    p["compile"] = rng.random() < COMPILE_SHARE
    p["dynamic"] = p["compile"] and rng.random() < 0.4
    p["explicit_defaults"] = rng.random() < 0.3
    return p


# (argument, what goes wrong) -> the exception type and the name its message must contain
BAD_KINDS = [
    "noncontig:hidden", "noncontig:weight", "noncontig:labels", "noncontig:bias",
    "noncontig:grad_hidden_accumulator", "noncontig:grad_weight_accumulator",
    "expand:hidden", "expand:weight", "expand:labels", "expand:bias",
    "expand:grad_hidden_accumulator", "expand:grad_weight_accumulator",
    "device:hidden", "device:weight", "device:labels", "device:bias", "device:class_weights",
    "device:grad_hidden_accumulator", "device:grad_weight_accumulator",
    "dtype:hidden", "dtype:weight", "dtype:labels", "dtype:bias", "dtype:class_weights",
    "dtype:grad_hidden_accumulator", "dtype:grad_weight_accumulator",
    "shape:hidden_d", "shape:hidden_scalar", "shape:weight_d", "shape:weight_1d", "shape:weight_3d",
    "shape:weight_v0", "shape:labels", "shape:labels_flat", "shape:bias", "shape:class_weights",
    "shape:grad_hidden_accumulator", "shape:grad_weight_accumulator",
    "type:hidden", "type:weight", "type:labels", "type:bias", "type:class_weights",
    "type:grad_hidden_accumulator", "type:grad_weight_accumulator",
    "value:reduction", "value:strategy", "value:memory_budget", "value:shift", "value:kwarg",
    "range:label_smoothing", "range:z_loss", "range:softcap", "range:temperature",
    "zloss_grad",
]
# Gaps the fuzzer found (fixed in 2a7e700): a misaligned accumulator passed the call's checks, scalar
# options of a wrong type failed without naming the argument. Drawn with the rest.
KNOWN_BAD_KINDS = [
    "misaligned:grad_hidden_accumulator", "misaligned:grad_weight_accumulator",
    "scalar:shift", "scalar:ignore_index", "scalar:temperature", "scalar:z_loss", "scalar:softcap",
    "scalar:label_smoothing", "scalar:reduction",
]


def draw_bad(rng, include_known=False):
    p = draw_good(rng)
    p.update(kind="bad", compile=False, dynamic=False, module=False, autocast=False, no_grad=False,
             misaligned=None, nonleaf=False)
    p["bad"] = kind = rng.choice(BAD_KINDS + KNOWN_BAD_KINDS)
    # sizes where the perturbation is possible (a 1-element tensor is contiguous whatever its strides)
    p["lead"] = draw_shape(rng, min_tokens=2)
    if len(p["lead"]) == 2 and (p["lead"][0] < 2 or p["lead"][1] < 2):
        p["lead"] = [2, max(2, p["lead"][1])]
    p["V"] = max(p["V"], 2)
    if p["shift"] >= p["lead"][-1]:
        p["shift"] = 0
    if p["ignore_index"] >= p["V"]:
        p["ignore_index"] = -100
    target = kind.split(":")[1] if ":" in kind else None
    if target in ("bias",):
        p["bias"] = True
    if target == "class_weights":
        p["class_weights"] = {"dtype": "float32", "strided": False, "zeros": False}
    if target == "grad_hidden_accumulator":
        p["need_h"], p["gh_acc"] = True, True
    if target == "grad_weight_accumulator":
        p["need_w"], p["gw_acc"] = True, True
    if kind == "zloss_grad":
        p.update(z_loss=0.01, returns=sorted(set(p["returns"]) | {"z_loss"}, key=OUTPUTS.index), need_h=True)
    p["value"] = rng.choice({
        "value:reduction": ["avg", "Mean", "", None, "batchmean"],
        "value:strategy": ["fast", "CHUNKED", "forward", "", None],
        "value:memory_budget": [0, -1, -(1 << 20), 1.5, "1GB"],
        "value:shift": ["neg", "last", "beyond"],
        "value:kwarg": ["return_logits", "reduce", "label_smooth"],
        "range:label_smoothing": [1.0, 1.5, -0.1],
        "range:z_loss": [-1e-3, float("inf")],
        "range:softcap": [-1.0, float("nan")],
        "range:temperature": [0.0, -0.5, float("inf")],
        "scalar:shift": [1.5, "1"],
        "scalar:ignore_index": ["x", None],
        "scalar:temperature": [None, "x"],
        "scalar:z_loss": [None, "x"],
        "scalar:softcap": ["x", [1.0]],
        "scalar:label_smoothing": [None, "x"],
        "scalar:reduction": [["mean"], {"mean": 1}],
    }.get(kind, [None]))
    return p


def draw(seed, index, include_known=False):
    rng = random.Random(case_seed(seed, index))
    return draw_bad(rng, include_known) if rng.random() < 0.15 else draw_good(rng, include_known)


# ---- building the tensors --------------------------------------------------------------------------

def misaligned_copy(t):
    """A contiguous copy of t whose data starts one element after an aligned address."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    v = buf[1:].view(t.shape)
    v.copy_(t)
    return v.detach()


def noncontig_copy(t):
    """A non-contiguous tensor equal to t (every other element of a larger one)."""
    big = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
    v = big[..., ::2]
    if v.is_contiguous():  # last dim 1
        big = torch.zeros((2 * t.shape[0],) + t.shape[1:], dtype=t.dtype, device=t.device)
        v = big[::2]
    v.copy_(t)
    return v


def expanded(t):
    """An overlapping view shaped like t: its first element(s) expand()ed over the first dim."""
    return t[:1].expand(t.shape)


def build(p, g):
    """The inputs of a case from its generator g (on the CPU, so CPU and GPU runs see the same data)."""
    dtype = DTYPES[p["dtype"]]
    lead, d, v = tuple(p["lead"]), p["D"], p["V"]
    x = {}
    x["hidden"] = (torch.randn(lead + (d,), generator=g) * p["hidden_std"]).to(dtype).to(DEV)
    x["weight"] = (torch.randn(v, d, generator=g) * (2.0 / math.sqrt(d))).to(dtype).to(DEV)
    y = torch.randint(0, v, lead, generator=g)
    y[torch.rand(lead, generator=g) < p["ignore_share"]] = p["ignore_index"]
    x["labels"] = y.to(LABEL_DTYPES[p["label_dtype"]]).to(DEV)
    x["bias"] = (torch.randn(v, generator=g) * 0.5).to(dtype).to(DEV) if p["bias"] else None
    x["class_weights"] = None
    if p["class_weights"]:
        cw = torch.rand(v, generator=g) + 0.5
        if p["class_weights"]["zeros"]:
            cw[torch.rand(v, generator=g) < 0.3] = 0.0
        cw = cw.to(CW_DTYPES[p["class_weights"]["dtype"]]).to(DEV)
        x["class_weights"] = noncontig_copy(cw) if p["class_weights"]["strided"] else cw
    x["gh_acc"] = torch.randn(lead + (d,), generator=g).to(DEV) if p["gh_acc"] else None
    x["gw_acc"] = torch.randn(v, d, generator=g).to(DEV) if p["gw_acc"] else None
    n_out = lead if p["reduction"] == "none" else ()
    x["up"] = {}
    for k in DIFFERENTIABLE:
        shape = n_out if k == "loss" else lead
        x["up"][k] = torch.randn(shape, generator=g, dtype=torch.float64).to(DEV)
    if p["upstream_one"] and p["reduction"] != "none":
        x["up"]["loss"] = torch.ones((), dtype=torch.float64, device=DEV)
    return x


def call_kwargs(p, x, bias, gh_acc, gw_acc):
    """linear_cross_entropy's keyword arguments of the case (defaults left out unless drawn so)."""
    kw = dict(bias=bias, class_weights=x["class_weights"], ignore_index=p["ignore_index"],
              reduction=p["reduction"], memory_budget=p["memory_budget"], strategy=p["strategy"],
              label_smoothing=p["label_smoothing"], z_loss=p["z_loss"], softcap=p["softcap"],
              temperature=p["temperature"], shift=p["shift"], grad_weight_accumulator=gw_acc,
              grad_hidden_accumulator=gh_acc, batch_invariant=p["batch_invariant"])
    for k in OUTPUTS:
        kw[f"return_{k}"] = k in p["returns"]
    if not p["explicit_defaults"]:
        defaults = flce.linear_cross_entropy.__kwdefaults__
        kw = {k: val for k, val in kw.items()
              if not (k in defaults and type(val) is type(defaults[k]) and val == defaults[k]) and
              not (val is None and defaults.get(k) is None)}
    return kw


# ---- the reference ---------------------------------------------------------------------------------

def unshift(t, s, fill=0):
    return t if s == 0 else F.pad(t, (s, 0), value=fill)


def reference_outputs(p, h, w, y, b, cw):
    """flce.h's math in float64 with the shift done by slicing (hidden position t against label t + s,
    the per-token results put at the label's position, the first s ones 0)."""
    s = p["shift"]
    if s:
        h, y = h[..., :-s, :], y[..., s:]
    r = reference(h, w, y, bias=b, class_weights=cw, ignore_index=p["ignore_index"], reduction=p["reduction"],
                  label_smoothing=p["label_smoothing"], z_loss=p["z_loss"], softcap=p["softcap"] or 0.0,
                  temperature=p["temperature"])
    out = {}
    for k, val in r.items():
        if k == "argmax" or (k in ("loss", "z_loss") and p["reduction"] != "none"):
            out[k] = val
        else:
            out[k] = unshift(val, s)
    return out


def logits64(p, x):
    h = x["hidden"].double().reshape(-1, p["D"])
    z = h @ x["weight"].double().T
    if x["bias"] is not None:
        z = z + x["bias"].double()
    z = z / p["temperature"]
    if p["softcap"]:
        z = p["softcap"] * torch.tanh(z / p["softcap"])
    return z.reshape(tuple(p["lead"]) + (p["V"],))


def objective(outs, keys, up):
    total = None
    for k in keys:
        term = (outs[k].double() * up[k]).sum()
        total = term if total is None else total + term
    return total


# ---- one good case ---------------------------------------------------------------------------------

def run_good(p, x):
    dtype = DTYPES[p["dtype"]]
    grad_on = not p["no_grad"]
    if p["compile"] and flce._compat.compile_drops_accumulated and grad_on and not p["bias_grad"] and \
            (p["need_h"] or p["need_w"]) and (p["gh_acc"] or not p["need_h"]) and (p["gw_acc"] or not p["need_w"]):
        # every gradient into an accumulator: flce refuses that under torch.compile below PyTorch 2.11
        # (2.4's AOTAutograd drops the backward): run it eager
        p = dict(p, compile=False, dynamic=False)
    lay = {k: (misaligned_copy(x[k]) if p["misaligned"] == k and x[k] is not None else x[k].clone())
           if x[k] is not None else None for k in ("hidden", "weight", "bias")}
    h = lay["hidden"].requires_grad_(p["need_h"])
    w = lay["weight"].requires_grad_(p["need_w"])
    b = lay["bias"].requires_grad_(p["bias_grad"]) if lay["bias"] is not None else None
    gh_acc = x["gh_acc"].clone() if x["gh_acc"] is not None else None
    gw_acc = x["gw_acc"].clone() if x["gw_acc"] is not None else None
    y = x["labels"]
    kw = call_kwargs(p, x, b, gh_acc, gw_acc)
    want = set(p["returns"])
    keys = list(p["objective"])
    ups = [x["up"][k] for k in keys]

    def fn(h, w, y, b, cw, gh_acc, gw_acc, *ups):
        if p["nonleaf"]:
            h = h * 1
        # ({**kw, ...}, not dict(kw, ...): PyTorch 2.4's Dynamo cannot trace the latter)
        kwargs = {**kw, "bias": b, "class_weights": cw, "grad_hidden_accumulator": gh_acc,
                  "grad_weight_accumulator": gw_acc}
        kwargs = {k: v for k, v in kwargs.items() if k in kw}
        if p["module"]:
            bias = kwargs.pop("bias", None)
            res = flce.LinearCrossEntropy(**kwargs)(h, w, y, bias)
        else:
            res = flce.linear_cross_entropy(h, w, y, **kwargs)
        if isinstance(res, torch.Tensor):
            outs = {"loss": res}
        else:
            outs = {k: getattr(res, k) for k in ("loss",) + OUTPUTS if getattr(res, k) is not None}
        obj = objective(outs, keys, dict(zip(keys, ups)))
        return obj, {k: (v.detach() if k in ("z_loss", "argmax") else v) for k, v in outs.items()}, res

    if p["compile"]:
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: fn(*a)[:2], fullgraph=True, backend=BACKEND,
                                 dynamic=True if p["dynamic"] else None)
        runner = compiled
    else:
        runner = fn
    grad_ctx = torch.no_grad() if not grad_on else contextlib.nullcontext()
    cast_ctx = torch.autocast(device_type=DEV, dtype=torch.bfloat16) if p["autocast"] else contextlib.nullcontext()
    with grad_ctx, cast_ctx:
        res = runner(h, w, y, b, x["class_weights"], gh_acc, gw_acc, *ups)
    obj, outs = res[0], res[1]

    # the result's form
    if not p["compile"]:
        raw = res[2]
        if want:
            check(isinstance(raw, flce.LinearCrossEntropyOutput), f"result is {type(raw).__name__}, "
                  "expected a LinearCrossEntropyOutput (a return_* option is set)")
            for k in OUTPUTS:
                check((getattr(raw, k) is not None) == (k in want), f"field {k}: "
                      f"{'missing' if k in want else 'present but not asked for'}")
        else:
            check(isinstance(raw, torch.Tensor), f"result is {type(raw).__name__}, expected a Tensor")
    check(set(outs) == {"loss"} | want, f"outputs {sorted(outs)}, expected {sorted({'loss'} | want)}")

    # values: under autocast the binding computes with hidden, weight and bias rounded to bfloat16
    xr = x
    if p["autocast"]:
        xr = dict(x, **{k: x[k].to(torch.bfloat16).to(dtype) for k in ("hidden", "weight", "bias")
                        if x[k] is not None})
    h64 = xr["hidden"].double().requires_grad_(p["need_h"] and grad_on)
    w64 = xr["weight"].double().requires_grad_(p["need_w"] and grad_on)
    b64 = xr["bias"].double().requires_grad_(p["bias_grad"] and grad_on) if xr["bias"] is not None else None
    ref = reference_outputs(p, h64, w64, y, b64, x["class_weights"])
    lead = tuple(p["lead"])
    for k, got in outs.items():
        if k == "argmax":
            continue
        exp = ref[k]
        check(got.dtype == torch.float32, f"{k}: dtype {got.dtype}, expected float32")
        check(tuple(got.shape) == tuple(exp.shape), f"{k}: shape {tuple(got.shape)}, expected {tuple(exp.shape)}")
        e = (got.detach().double() - exp.detach()).abs().max().item() if got.numel() else 0.0
        scale = max(1.0, exp.detach().abs().max().item() if exp.numel() else 0.0)
        check(e <= VALUE_TOL * scale, f"{k}: max abs error {e:.3e} > {VALUE_TOL} * {scale:.3g}")
    if "argmax" in outs:
        am = outs["argmax"]
        check(am.dtype == torch.int64 and tuple(am.shape) == lead, f"argmax: {am.dtype} {tuple(am.shape)}")
        s = p["shift"]
        z = logits64(p, xr)
        if s:
            check(bool((am[..., :s] == -1).all()), "argmax: shifted-out positions are not -1")
            am, z = am[..., s:], z[..., :-s, :]
        check(bool(((am >= 0) & (am < p["V"])).all()), "argmax out of [0, V)")
        picked = z.gather(-1, am.long().unsqueeze(-1)).squeeze(-1)
        top = z.max(-1).values
        check(bool((picked >= top - 1e-4 * top.abs().clamp(min=1)).all()),
              f"argmax is not a largest logit (worst gap {(top - picked).max().item():.3e})")

    # gradients
    if obj is not None and obj.requires_grad:
        check(grad_on and (p["need_h"] or p["need_w"] or p["bias_grad"]),
              "the objective requires grad although no input does")
        obj.backward()
        ref_obj = objective(ref, keys, dict(zip(keys, ups)))
        if ref_obj.requires_grad:
            ref_obj.backward()
        tol = GRAD_TOL["bfloat16" if p["autocast"] else p["dtype"]]  # (the leaves' .grad keep their dtype)
        gmax = max(1.0, ups[keys.index("loss")].abs().max().item()) if "loss" in keys else 1.0
        gsum = sum(u.abs().sum().item() for u in ups)
        for name, leaf, leaf64, acc, acc0 in (("dH", h, h64, gh_acc, x["gh_acc"]), ("dW", w, w64, gw_acc, x["gw_acc"]),
                                               ("db", b, b64, None, None)):
            if leaf is None or not leaf.requires_grad:
                check(leaf is None or leaf.grad is None, f"{name}: a gradient for an input that does not require it")
                continue
            exp = leaf64.grad if leaf64.grad is not None else torch.zeros_like(leaf64)
            if acc is not None:
                check(leaf.grad is None, f"{name}: .grad set although an accumulator took the gradient")
                got = acc.double() - acc0.double()
                what = f"{name} (accumulator)"
            else:
                got = leaf.grad
                if got is None:
                    check(exp.abs().max().item() == 0, f"{name}: .grad is None, the reference's is not zero")
                    continue
                check(got.dtype == dtype and got.shape == leaf.shape, f"{name}: {got.dtype} {tuple(got.shape)}")
                what = name
            # float16 gradients of a mean over hundreds of tokens fall into its subnormal range (spacing
            # 2^-24, GradScaler's reason to be): allow what rounding there costs, once in the output and
            # once more before a scaling by the upstream gradient (gradients computed in forward)
            # A gradient that is exactly 0 (V = 1, say) is float64 noise in the reference: an absolute
            # 1e-13 per element and unit of upstream gradient. An accumulator holds its start value +
            # the gradient in fp32: its rounding.
            floor = 1e-13 * math.sqrt(got.numel()) * (1.0 + gsum)
            if got.dtype == torch.float16:
                floor += 2.0 ** -24 * math.sqrt(got.numel()) * (1.0 + gmax)
            if acc is not None:
                floor += 2.0 ** -23 * (acc0.double() + exp).norm().item()
            if p["V"] == 1:
                # One class: p = 1 and dZ = 0 exactly in the math, but the kernels form p as
                # exp(z - lse) in fp32 from a z and an lse that each carry their rounding (softcap's
                # tanh, the temperature's division): |dZ| <= a few 2^-24 |z| per unit of upstream
                # gradient. dH = dZ W and dW = dZ^T H bound it by the other operand's norms.
                with torch.no_grad():
                    z64 = logits64(p, xr)
                zmax = 1.0 + (z64.abs().max().item() if z64.numel() else 0.0)
                other = {"dH": w64.detach().norm().item(), "dW": h64.detach().flatten(0, -2).norm(dim=-1).max().item()
                         if h64.numel() else 0.0, "db": 1.0}[name]
                floor += 8 * 2.0 ** -24 * zmax * (1.0 + gsum) * other
            err, norm = (got.double() - exp).norm().item(), exp.norm().item()
            check(err <= tol * norm + floor, f"{what}: relative error {err / norm if norm else err:.3e} > {tol} "
                  f"(error norm {err:.3e}, reference norm {norm:.3e}, rounding floor {floor:.2e})")
    else:
        check(not grad_on or not (p["need_h"] or p["need_w"] or p["bias_grad"]),
              "the objective does not require grad although an input does")
        for name, acc, acc0 in (("grad_hidden_accumulator", gh_acc, x["gh_acc"]),
                                ("grad_weight_accumulator", gw_acc, x["gw_acc"])):
            if acc is not None:
                check(torch.equal(acc, acc0), f"{name} changed without a backward")


# ---- one bad case ----------------------------------------------------------------------------------

ARG_NAME = {"hidden": "hidden", "weight": "weight", "labels": "labels", "bias": "bias",
            "class_weights": "class weights", "grad_hidden_accumulator": "grad_hidden_accumulator",
            "grad_weight_accumulator": "grad_weight_accumulator"}
KW = {"bias": "bias", "class_weights": "class_weights", "grad_hidden_accumulator": "grad_hidden_accumulator",
      "grad_weight_accumulator": "grad_weight_accumulator"}


def other_device():
    return "cpu" if GPU else "meta"


def run_bad(p, x):
    kind = p["bad"]
    what, target = (kind.split(":") + [None])[:2]
    h = x["hidden"].clone().requires_grad_(p["need_h"])
    w = x["weight"].clone().requires_grad_(p["need_w"])
    args = {"hidden": h, "weight": w, "labels": x["labels"]}
    kw = call_kwargs(p, x, x["bias"], x["gh_acc"], x["gw_acc"])
    kw.update({k: v for k, v in (("bias", x["bias"]), ("class_weights", x["class_weights"]),
                                 ("grad_hidden_accumulator", x["gh_acc"]),
                                 ("grad_weight_accumulator", x["gw_acc"])) if v is not None})

    def get(name):
        return args[name] if name in args else kw[KW[name]]

    def put(name, val):
        if name in args:
            args[name] = val
        else:
            kw[KW[name]] = val

    exc, needle = (ValueError, ARG_NAME.get(target))
    if what == "noncontig":
        put(target, noncontig_copy(get(target).detach()))
    elif what == "expand":
        put(target, expanded(get(target).detach()))
    elif what == "device":
        if target == "hidden" and not GPU:  # the stand-in cannot tell a CPU hidden from a CUDA one
            put("weight", get("weight").detach().to("meta"))
            needle = "weight"
        else:
            put(target, get(target).detach().to(other_device()))
    elif what == "dtype":
        t = get(target).detach()
        alt = {"hidden": torch.float64, "labels": torch.float32 if p["V"] % 2 else torch.int16,
               "class_weights": torch.int64, "grad_hidden_accumulator": torch.float16,
               "grad_weight_accumulator": torch.float64}.get(target)
        if alt is None:  # weight, bias: another supported float dtype than hidden's
            alt = next(dt for dt in DTYPES.values() if dt != t.dtype)
        put(target, t.to(alt))
    elif what == "shape":
        d = p["D"]
        if target == "hidden_d":  # D not a multiple of 8 (weight made to match)
            args["hidden"] = h.detach()[..., :d - 3].contiguous()
            args["weight"] = w.detach()[:, :d - 3].contiguous()
            needle = "hidden"
        elif target == "hidden_scalar":
            args["hidden"], needle = h.detach().reshape(-1)[0].clone(), "hidden"
        elif target == "weight_d":
            args["weight"], needle = torch.cat([w.detach(), w.detach()[:, :8]], 1), "weight"
        elif target == "weight_1d":
            args["weight"], needle = w.detach().reshape(-1).contiguous(), "weight"
        elif target == "weight_3d":
            args["weight"], needle = w.detach().unsqueeze(0).contiguous(), "weight"
        elif target == "weight_v0":
            args["weight"], needle = w.detach()[:0].contiguous(), "weight"
            kw.pop("bias", None), kw.pop("class_weights", None), kw.pop("grad_weight_accumulator", None)
        elif target == "labels":
            y = x["labels"]
            args["labels"], needle = torch.cat([y.reshape(-1), y.reshape(-1)[:1]]), "labels"
        elif target == "labels_flat":
            y = x["labels"]
            args["labels"], needle = (y.reshape(-1) if y.dim() == 2 else y.reshape(1, -1)), "labels"
        elif target in ("bias", "class_weights"):
            t = get(target)
            put(target, torch.cat([t, t[:1]]))
            needle = ARG_NAME[target]
        else:  # accumulators
            t = get(target)
            put(target, torch.cat([t, t[:1]]))
            needle = ARG_NAME[target]
    elif what == "type":
        exc = TypeError
        put(target, get(target).detach().cpu().tolist())
    elif what == "value":
        needle = target
        if target == "reduction":
            kw["reduction"] = p["value"]
        elif target == "strategy":
            kw["strategy"] = p["value"]
        elif target == "memory_budget":
            kw["memory_budget"] = p["value"]
        elif target == "shift":
            last = p["lead"][-1]
            kw["shift"] = {"neg": -1, "last": last, "beyond": last + 5}[p["value"]]
        elif target == "kwarg":
            exc = TypeError
            needle = p["value"]
            kw[p["value"]] = True
    elif what == "range":
        exc, needle = flce.FlceError, f"problem.{target}"
        kw[target] = p["value"]
    elif what == "zloss_grad":
        exc, needle = NotImplementedError, "z_loss"
    elif what == "misaligned":
        put(target, misaligned_copy(get(target)))
    elif what == "scalar":
        exc, needle = (TypeError, ValueError), target
        kw[target] = p["value"]

    names = exc.__name__ if isinstance(exc, type) else " or ".join(t.__name__ for t in exc)
    try:
        res = flce.linear_cross_entropy(args["hidden"], args["weight"], args["labels"], **kw)
        if what == "zloss_grad":
            (res.loss.sum() + res.z_loss.sum()).backward()
    except exc as e:
        msg = str(e)
        check(needle is None or needle in msg, f"{type(e).__name__} does not name {needle!r}: {msg}")
        return
    except Exception as e:  # noqa: BLE001
        raise CaseFailure(f"expected {names} naming {needle!r}, got {type(e).__name__}: {e}") from e
    later = ""
    if what == "misaligned":  # what the backward then does with it
        try:
            (res if isinstance(res, torch.Tensor) else res.loss).sum().backward()
            later = "; the backward then ran without error"
        except Exception as e:  # noqa: BLE001
            later = f"; the backward then raised {type(e).__name__}: {e}"
    raise CaseFailure(f"no error from the call; expected {names} naming {needle!r}{later}")


# ---- driver ----------------------------------------------------------------------------------------

def describe(p):
    return json.dumps(p, sort_keys=True)


BUDGET_REFUSED = re.compile(r"memory_budget=(\d+) bytes: too small for [^(]*\((\d+) bytes needed\)")


def budget_refusal(p, e):
    """True when e (or an exception it wraps: torch.compile re-raises) is flce's documented refusal of a
    memory_budget below the plan's smallest chunk, for this case's budget and a real shortfall."""
    while e is not None:
        m = BUDGET_REFUSED.search(str(e))
        if m:
            return p["memory_budget"] is not None and int(m.group(1)) == p["memory_budget"] \
                and int(m.group(2)) > int(m.group(1))
        e = e.__cause__ or e.__context__
    return False


def run_case(seed, index, include_known=False):
    p = draw(seed, index, include_known)
    g = torch.Generator().manual_seed(case_seed(seed, index))
    x = build(p, g)
    try:
        (run_good if p["kind"] == "good" else run_bad)(p, x)
    except Exception as e:  # noqa: BLE001
        # A budget smaller than one token's row (or one 8-column vocab chunk) of logits is refused
        # with FLCE_ERR_INVALID_ARGUMENT naming memory_budget and the bytes needed (flce.h): the
        # documented answer, not a failure. Whether it happens depends on N, V and the strategy.
        if p["kind"] != "good" or not budget_refusal(p, e):
            raise
        p["refused"] = True
    if GPU:  # every label is valid or ignore_index: the device's bad-label flag must be clear; and a
        # kernel's asynchronous fault is charged to the case that launched it
        torch.cuda.synchronize()
        flce.check()
    return p


COMMIT = None  # --commit: the caller's word (a device copy of the tree may carry a stale .git)


def commit_id():
    if COMMIT:
        return COMMIT
    root = os.path.dirname(HERE)
    stamp = os.path.join(root, ".device-commit")  # a device copy: written by bench/stamp-commit.sh
    if os.path.exists(stamp) and not os.path.isdir(os.path.join(root, ".git")):
        with open(stamp) as f:
            text = f.read().strip()
        if text:
            return text
    try:
        r = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           timeout=30)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open(os.path.join(root, ".device-commit")) as f:
            text = f.read().strip()
            if text:
                return text
    except OSError:
        pass
    return "unknown"


def main():
    global COMPILE_SHARE, COMMIT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--case", type=int, default=None, help="run only this case number (to reproduce one)")
    ap.add_argument("--json", default=None, help="write {cases, passed, failed, seed, device, date, commit} here")
    ap.add_argument("--include-known", action="store_true",
                    help="also draw what the binding is known to get wrong (see the docstring): strategy='saved', "
                         "misaligned accumulators, scalar options of a wrong type")
    ap.add_argument("--compile-share", type=float, default=COMPILE_SHARE,
                    help="share of good calls under torch.compile(fullgraph=True) (default 0.1; part of a case's draw)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case's parameters")
    ap.add_argument("--jobs", type=int, default=1,
                    help="deal the cases to this many processes (case i to process i mod jobs) and merge their "
                         "results; the same cases and checks as one process")
    ap.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # k/n: one process of --jobs n
    ap.add_argument("--after", type=int, default=-1, help=argparse.SUPPRESS)  # resume past this case
    ap.add_argument("--deadline", type=float, default=None,
                    help="with --jobs: after this many seconds stop the processes and record the cases that "
                         "finished (the run then fails: fewer cases than asked for)")
    ap.add_argument("--log-dir", default=None, help="with --jobs: keep each process's log here (default: a "
                    "temporary folder, named at the start)")
    ap.add_argument("--commit", default=None, help="the commit to record (default: the .device-commit stamp "
                    "where there is no .git, else git's)")
    a = ap.parse_args()
    COMMIT = a.commit
    COMPILE_SHARE = a.compile_share
    if a.jobs < 1:
        ap.error("--jobs must be at least 1")
    if a.jobs > 1 and a.case is None and a.shard is None:
        return run_jobs(a)

    if GPU:
        device = torch.cuda.get_device_name()
        print(f"{device}: flce {flce.version()} from {flce.library_path()}, torch {torch.__version__}, "
              f"compile backend {BACKEND}")
    else:
        try:
            _lib.lib()
        except flce.FlceLibraryNotFound as e:
            print(f"no CUDA device and no libflce.so to build problems with: skipped ({e})")
            return 77
        import standin
        standin.install()
        device = "cpu (float64 stand-in for the kernels)"
        print(f"no CUDA device: the binding on the CPU with the float64 stand-in (standin.py), torch "
              f"{torch.__version__}, compile backend {BACKEND}")

    indices = [a.case] if a.case is not None else list(range(a.cases))
    if a.shard is not None:
        k, n = (int(x) for x in a.shard.split("/"))
        indices = [i for i in indices[k::n] if i > a.after]
    passed = failed = 0
    lost = None
    counts = {"good": 0, "bad": 0, "compiled": 0}
    t0 = time.time()
    for i in indices:
        t1 = time.time()
        p = draw(a.seed, i, a.include_known)
        try:
            run_case(a.seed, i, a.include_known)
            passed += 1
            counts[p["kind"]] += 1
            counts["compiled"] += bool(p.get("compile"))
            if a.verbose:
                print(f"ok   case {i} ({time.time() - t1:.2f} s): {describe(p)}")
            elif (passed + failed) % 50 == 0:
                print(f"  {passed + failed} of {len(indices)} cases, {failed} failed, {time.time() - t0:.0f} s",
                      flush=True)
            if a.shard is not None and a.json:  # the parent may stop this process at its deadline
                write_record(a.json, passed, failed, a.seed, device, counts, time.time() - t0)
        except Exception as e:  # noqa: BLE001
            failed += 1
            tb = traceback.format_exc(limit=-4) if not isinstance(e, CaseFailure) else ""
            print(f"FAIL case {i} seed {a.seed}: {type(e).__name__}: {e}\n  parameters: {describe(p)}\n"
                  f"  reproduce: python3 python/fuzz_binding.py --seed {a.seed} --case {i}"
                  f"{' --include-known' if a.include_known else ''}"
                  f"{f' --compile-share {a.compile_share}' if a.compile_share != 0.1 else ''}\n{tb}", flush=True)
            if GPU and "CUDA error" in str(e):
                # A fault of a kernel leaves this process's CUDA context unusable: every later case
                # would fail for it. Stop; under --jobs the parent resumes the shard in a new process.
                lost = i
                print(f"the CUDA context is lost after case {i}: stopping", flush=True)
                break
    took = time.time() - t0
    print(f"{passed} passed, {failed} failed ({len(indices)} cases, seed {a.seed}: {counts['good']} good calls "
          f"of which {counts['compiled']} compiled, {counts['bad']} bad calls passed; {took:.1f} s)")
    if a.json:
        write_record(a.json, passed, failed, a.seed, device, counts, took, lost)
    return 3 if lost is not None else 1 if failed else 0


def write_record(path, passed, failed, seed, device, counts, took, lost=None):
    """One process's record (written whole, then renamed: a reader never sees half of one)."""
    with open(path + ".tmp", "w") as f:
        json.dump({"cases": passed + failed, "passed": passed, "failed": failed, "seed": seed, "device": device,
                   "date": datetime.date.today().isoformat(), "commit": commit_id(),
                   "counts": counts, "seconds": round(took, 1), "stopped_after": lost}, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def run_jobs(a):
    """--jobs n: n copies of this script, each taking every n-th case (--shard k/n), their output in
    one log each (a failure's report is printed from it), their JSON records merged into one. A copy
    that stops because a kernel fault lost its CUDA context (exit 3) is followed by a new one that
    resumes its shard after the faulting case, so one fault costs one case, not the rest of a shard."""
    import tempfile
    logdir = a.log_dir or tempfile.mkdtemp(prefix="flce-fuzz-")
    os.makedirs(logdir, exist_ok=True)
    base = [sys.executable, os.path.abspath(__file__), "--cases", str(a.cases), "--seed", str(a.seed),
            "--compile-share", str(a.compile_share)] + (["--include-known"] if a.include_known else []) \
        + (["--commit", a.commit] if a.commit else []) \
        + (["-v"] if a.verbose else [])
    total = {"cases": 0, "passed": 0, "failed": 0}
    counts = {"good": 0, "bad": 0, "compiled": 0}
    meta = {}
    faults = []

    def start(k, after, part):
        name = os.path.join(logdir, f"shard{k}.{part}")
        log = open(name + ".log", "w")
        proc = subprocess.Popen(base + ["--shard", f"{k}/{a.jobs}", "--after", str(after), "--json", name + ".json"],
                                stdout=log, stderr=subprocess.STDOUT)
        return {"k": k, "part": part, "proc": proc, "log": log, "name": name}

    running = [start(k, -1, 0) for k in range(a.jobs)]
    print(f"{a.cases} cases of seed {a.seed} in {a.jobs} processes; their logs in {logdir}", flush=True)
    t0 = last = time.time()
    stopped = False
    while running:
        time.sleep(0.5)
        if a.deadline is not None and not stopped and time.time() - t0 > a.deadline:
            stopped = True
            print(f"deadline of {a.deadline:.0f} s: stopping {len(running)} process(es)", flush=True)
            for r in running:
                r["proc"].terminate()
        for r in [r for r in running if r["proc"].poll() is not None]:
            running.remove(r)
            r["log"].close()
            code = r["proc"].returncode
            text = open(r["name"] + ".log").read()
            if "FAIL case" in text or code not in (0, 1, 3):
                print(f"--- process {r['k']} part {r['part']} (exit {code}) ---\n{text[-20000:]}", flush=True)
            try:
                with open(r["name"] + ".json") as f:
                    rec = json.load(f)
            except (OSError, ValueError):
                if not stopped:
                    print(f"process {r['k']} part {r['part']} wrote no record (exit {code}): its shard's remaining "
                          "cases are not run and the run fails", flush=True)
                    total["failed"] += 1
                continue
            for key in total:
                total[key] += rec[key]
            for key in counts:
                counts[key] += rec.get("counts", {}).get(key, 0)
            meta = rec
            if code == 3 and rec.get("stopped_after") is not None and not stopped:
                faults.append(rec["stopped_after"])
                running.append(start(r["k"], rec["stopped_after"], r["part"] + 1))
        if time.time() - last >= 30:
            last = time.time()
            print(f"  {last - t0:.0f} s, {a.jobs - len({r['k'] for r in running})} of {a.jobs} shards done",
                  flush=True)
    complete = total["cases"] == a.cases
    if not complete:
        print(f"only {total['cases']} of {a.cases} cases ran{' (deadline)' if stopped else ''}: the run fails")
    if faults:
        print(f"cases whose kernels faulted (each process resumed after it): {sorted(faults)}")
    print(f"{total['passed']} passed, {total['failed']} failed ({total['cases']} of {a.cases} cases, seed {a.seed}, {a.jobs} "
          f"processes: {counts['good']} good calls of which {counts['compiled']} compiled, {counts['bad']} bad calls "
          f"passed; {time.time() - t0:.1f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cases": total["cases"], "requested": a.cases, "passed": total["passed"],
                       "failed": total["failed"], "seed": a.seed,
                       "device": meta.get("device"), "date": datetime.date.today().isoformat(),
                       "commit": meta.get("commit") or commit_id(), "jobs": a.jobs, "counts": counts,
                       "faulted_cases": sorted(faults), "seconds": round(time.time() - t0, 1)}, f, indent=1)
            f.write("\n")
    return 1 if total["failed"] or not complete else 0

if __name__ == "__main__":
    sys.exit(main())
