#!/usr/bin/env python3
"""test_binding.py — tests of the flce PyTorch binding against torch's own cross_entropy and
flce.h's math (flce/_reference.py) in float64.

  python3 python/test_binding.py        # on a CUDA machine: the real library on the GPU
                                        # without CUDA (torch installed): everything above the
                                        # kernels (argument checks, the custom ops, their fake
                                        # kernels and autograd, torch.compile with aot_eager), with
                                        # the kernels replaced by a float64 stand-in (standin.py)
  python3 python/test_binding.py -k compile   # only the cases whose name contains 'compile'
  FLCE_TEST_COMPILE_BACKEND=inductor ...       # the torch.compile backend (default: inductor on a
                                               # GPU, aot_eager without one)

Covers: values and gradients against torch (dtypes, reductions, strategies, budgets); the custom
ops (torch.library.opcheck); torch.compile(fullgraph=True) against eager, no graph breaks
(torch._dynamo.explain), dynamic shapes; CUDA-graph capture (GPU); per-token outputs (lse,
logprobs, entropy, argmax, z-loss part, loss_per_token) and their gradients where defined,
class weights, bias, label smoothing, z-loss, softcap, temperature, shift; fp32 accumulators
(main_grad); the F.linear_cross_entropy and Cut Cross-Entropy argument conventions;
flce.vocab_parallel_cross_entropy's argument errors and a group of one rank (without a GPU also
python/test_tp.py --standin: both routes, sequence parallelism, on 2 gloo ranks of the CPU).
Exit status 0 when all pass, 1 on a failure, 77 when torch (or, without a GPU, libflce.so) is
missing (a skip, as in CTest). The last line reads 'N passed, N failed'.
"""
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)

import flce  # noqa: E402
from flce import _lib, _ops  # noqa: E402
from flce._reference import reference  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
# Inductor on the GPU (what users run); aot_eager without one (the same AOTAutograd tracing and
# functionalization, no C++ compile on the CPU).
BACKEND = os.environ.get("FLCE_TEST_COMPILE_BACKEND", "inductor" if GPU else "aot_eager")
passed, failed = 0, 0
ONLY = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else None


def case(name, fn):
    global passed, failed
    if ONLY and ONLY not in name:
        return
    t0 = time.time()
    try:
        fn()
        passed += 1
        if time.time() - t0 > 5:
            print(f"  ({name}: {time.time() - t0:.1f} s)")
    except Exception as e:  # noqa: BLE001
        failed += 1
        print(f"FAIL {name}: {type(e).__name__}: {e}")


def rel(a, b):
    a, b = a.double(), b.double()
    d = b.norm().item()
    return (a - b).norm().item() / d if d else (a - b).norm().item()


def gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


def inputs(n, d, v, dtype=torch.float32, seed=0, std=2.0, ignore=0.1, ignore_index=-100, label_dtype=torch.int64):
    g = gen(seed)
    h = torch.randn(n, d, device=DEV, generator=g).to(dtype)
    w = (torch.randn(v, d, device=DEV, generator=g) * (std / math.sqrt(d))).to(dtype)
    y = torch.randint(0, v, (n,), device=DEV, generator=g).to(label_dtype)
    y[torch.rand(n, device=DEV, generator=g) < ignore] = ignore_index
    return h, w, y


# ---- values and gradients against torch.nn.functional.cross_entropy ------------------------------

def check_against_torch(n, d, v, dtype, reduction, strategy, label_dtype, lead=None, budget=None,
                        need=(True, True), upstream=2.0, ignore_index=-100, std=2.0):
    h, w, y = inputs(n, d, v, dtype, n * 7919 + d * 31 + v, std, ignore_index=ignore_index, label_dtype=label_dtype)
    if lead:
        h, y = h.reshape(*lead, d), y.reshape(lead)
    h1, w1 = h.clone().requires_grad_(need[0]), w.clone().requires_grad_(need[1])
    h2, w2 = h.double().requires_grad_(need[0]), w.double().requires_grad_(need[1])
    out = flce.linear_cross_entropy(h1, w1, y, reduction=reduction, strategy=strategy, memory_budget=budget,
                                    ignore_index=ignore_index)
    z = h2.reshape(-1, d) @ w2.T
    ref = F.cross_entropy(z, y.reshape(-1).long(), ignore_index=ignore_index, reduction=reduction)
    if reduction == "mean" and not (y != ignore_index).any():
        ref = ref.nan_to_num(0.0)  # flce: a mean over no tokens is 0
    ref = ref.reshape(y.shape) if reduction == "none" else ref
    assert out.dtype == torch.float32 and out.shape == ref.shape, (out.shape, ref.shape)
    e = rel(out.detach(), ref.detach())
    assert e < 1e-5, f"loss rel err {e:.2e}"
    up = torch.randn(ref.shape, device=DEV, dtype=torch.float64) if reduction == "none" else \
        torch.tensor(upstream, device=DEV, dtype=torch.float64)
    (out.double() * up).sum().backward()
    (ref * up).sum().backward()
    tol = 1e-4 if dtype == torch.float32 else 4e-3
    for name, a, b in (("dH", h1.grad, h2.grad), ("dW", w1.grad, w2.grad)):
        if b is None:
            assert a is None, f"{name} should be None"
            continue
        assert a.dtype == dtype and a.shape == b.shape
        e = rel(a, b)
        assert e < tol, f"{name} rel err {e:.2e} > {tol}"


def _all_ignored(dtype):
    h = torch.randn(9, 16, device=DEV).to(dtype).requires_grad_()
    w = torch.randn(40, 16, device=DEV).to(dtype).requires_grad_()
    out = flce.linear_cross_entropy(h, w, torch.full((9,), -100, device=DEV))
    out.backward()
    assert out.item() == 0 and h.grad.abs().max().item() == 0 and w.grad.abs().max().item() == 0


def _no_tokens(dtype):
    h = torch.randn(0, 16, device=DEV).to(dtype).requires_grad_()
    w = torch.randn(40, 16, device=DEV).to(dtype).requires_grad_()
    y = torch.zeros(0, dtype=torch.int64, device=DEV)
    for reduction in ("mean", "none"):
        out = flce.linear_cross_entropy(h, w, y, reduction=reduction, return_logprobs=True, return_argmax=True)
        assert out.loss.shape == (() if reduction == "mean" else (0,)) and out.logprobs.shape == (0,)
        out.loss.sum().backward()
    assert w.grad.abs().max().item() == 0


def basic_cases():
    dtypes = [torch.float32, torch.bfloat16] if GPU else [torch.float32]
    for dtype in dtypes:
        for reduction in ("mean", "sum", "none"):
            for strategy in ("auto", "chunked", "recompute"):
                for label_dtype in (torch.int64, torch.int32):
                    name = f"{dtype} {reduction} {strategy} {label_dtype}"
                    case(name, lambda: check_against_torch(300, 64, 1000, dtype, reduction, strategy, label_dtype))
                    case(name + " 1 MiB budget", lambda: check_against_torch(
                        515, 72, 3001, dtype, reduction, strategy, label_dtype, budget=1 << 20))
            case(f"{dtype} {reduction} (2,3,5) leading dims",
                 lambda: check_against_torch(30, 16, 100, dtype, reduction, "auto", torch.int64, lead=(2, 3, 5)))
            for need in ((True, False), (False, True)):
                case(f"{dtype} {reduction} grads {need}",
                     lambda: check_against_torch(64, 32, 257, dtype, reduction, "auto", torch.int64, need=need))
        # more than 256 tokens (_DEFER_TOKENS): AUTO asks the library (gradients in forward when it
        # picks chunked)
        case(f"{dtype} mean auto 1500 tokens", lambda: check_against_torch(1500, 64, 1000, dtype, "mean", "auto",
                                                                          torch.int64))
        case(f"{dtype} N=1", lambda: check_against_torch(1, 8, 50, dtype, "mean", "auto", torch.int64))
        case(f"{dtype} V=1", lambda: check_against_torch(17, 8, 1, dtype, "sum", "auto", torch.int64))
        case(f"{dtype} all ignored", lambda: _all_ignored(dtype))
        case(f"{dtype} no tokens", lambda: _no_tokens(dtype))
        case(f"{dtype} ignore_index=7", lambda: check_against_torch(100, 16, 50, dtype, "mean", "auto", torch.int64,
                                                                    ignore_index=7))

    def no_grad_forward():
        h = torch.randn(40, 16, device=DEV)
        w = torch.randn(30, 16, device=DEV)
        y = torch.randint(0, 30, (40,), device=DEV)
        with torch.no_grad():
            out = flce.linear_cross_entropy(h, w, y, reduction="none")
        assert not out.requires_grad
        assert rel(out, F.cross_entropy(h.double() @ w.double().T, y, reduction="none")) < 1e-5
    case("no_grad forward", no_grad_forward)

    def auto_that_recomputes_defers_the_gradients():
        # 1500 tokens x 3001 vocab in 1 MiB: AUTO recomputes, so the binding runs forward now and
        # flce_backward later, exactly what strategy='recompute' runs: the same bits, and a second
        # backward (retain_graph) works.
        h, w, y = inputs(1500, 72, 3001, seed=5, std=1.0, ignore=0)
        call = flce._Call(h, w, y, flce._Options(-100, "mean", "auto", 1 << 20, 0.0, 0.0, 0.0, 1.0, False))
        assert call.strategy_of(_lib.FLCE_OP_LOSS_AND_GRAD, "auto") == "recompute", \
            "the library's AUTO no longer recomputes 1500x72x3001 in 1 MiB: the test needs a shape where it does"
        grads = []
        for strategy in ("auto", "recompute"):
            h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
            out = flce.linear_cross_entropy(h1, w1, y, strategy=strategy, memory_budget=1 << 20)
            out.backward(retain_graph=True)
            out.backward()  # deferred gradients: backward may run again and adds up
            grads.append((h1.grad, w1.grad))
        for a, b in zip(grads[0], grads[1]):
            assert torch.equal(a, b), "auto (recompute) and recompute differ"
    case("auto that recomputes defers the gradients", auto_that_recomputes_defers_the_gradients)

    def second_backward():
        # gradients computed in forward (chunked): with flce_scale_gradients they are scaled in
        # place, so a second backward raises (autograd's saved-tensor version check); without it
        # they are scaled into new tensors and a second backward works.
        h = torch.randn(8, 8, device=DEV, requires_grad=True)
        out = flce.linear_cross_entropy(h, torch.randn(5, 8, device=DEV), torch.randint(0, 5, (8,), device=DEV),
                                        strategy="chunked")
        out.backward(retain_graph=True)
        first = h.grad.clone()
        try:
            out.backward()
        except RuntimeError:
            assert _lib.has("flce_scale_gradients"), "raised without in-place scaling"
            return
        assert not _lib.has("flce_scale_gradients"), "a second backward after in-place scaling should raise"
        assert torch.equal(h.grad, 2 * first)
    case("second backward after gradients in forward", second_backward)

    def bad_args():
        h = torch.randn(8, 16, device=DEV)
        w = torch.randn(5, 16, device=DEV)
        y = torch.randint(0, 5, (8,), device=DEV)
        for kwargs, args in (({}, (h.half(), w, y)), ({}, (h, w, y[:4])), ({}, (h, w.T.contiguous().T, y)),
                             ({"reduction": "avg"}, (h, w, y)),
                             ({}, (h[:, :12].contiguous(), w[:, :12].contiguous(), y)),
                             ({"bias": torch.randn(4, device=DEV)}, (h, w, y)),
                             ({"bias": torch.randn(5, device=DEV).double()}, (h, w, y)),
                             ({"class_weights": torch.rand(6, device=DEV)}, (h, w, y)),
                             ({"grad_weight_accumulator": torch.zeros(5, 16, device=DEV).half()}, (h, w, y)),
                             ({"grad_hidden_accumulator": torch.zeros(8, 8, device=DEV)}, (h, w, y)),
                             ({"shift": 8}, (h, w, y))):
            try:
                flce.linear_cross_entropy(*args, **kwargs)
            except ValueError:
                continue
            raise AssertionError(f"no ValueError for {list(kwargs)} {[tuple(a.shape) for a in args]}")
    case("argument errors", bad_args)

    if GPU:
        def bad_label_reported():
            h = torch.randn(8, 16, device=DEV)
            w = torch.randn(5, 16, device=DEV)
            y = torch.tensor([0, 1, 2, 3, 4, 5, 0, 1], device=DEV)  # 5 is out of range
            flce.linear_cross_entropy(h, w, y)
            try:
                flce.check()
            except flce.FlceError as e:
                assert e.status_name == "FLCE_ERR_BAD_LABEL", e
                return
            raise AssertionError("flce.check() should report the label 5 >= V")
        case("bad label reported by check()", bad_label_reported)

        def side_stream():
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                check_against_torch(200, 32, 500, torch.bfloat16, "mean", "auto", torch.int64)
            torch.cuda.synchronize()
        case("side stream", side_stream)


# ---- everything the C API has: per-token outputs, bias, class weights, options ---------------------

OPTION_SETS = [  # name, keyword arguments of flce.linear_cross_entropy (and of the reference)
    ("plain", {}),
    ("bias+weights+smoothing+zloss", dict(bias=True, class_weights=True, label_smoothing=0.1, z_loss=1e-3)),
    ("softcap+temperature", dict(softcap=3.0, temperature=0.7)),
    ("all", dict(bias=True, class_weights=True, label_smoothing=0.05, z_loss=1e-4, softcap=5.0, temperature=1.3)),
]


def make_options(n, d, v, dtype, spec, seed):
    g = gen(seed)
    h, w, y = inputs(n, d, v, dtype, seed)
    kw = dict(spec)
    if kw.pop("bias", False):
        kw["bias"] = (torch.randn(v, device=DEV, generator=g) * 0.5).to(dtype)
    if kw.pop("class_weights", False):
        kw["class_weights"] = torch.rand(v, device=DEV, generator=g) + 0.5
    return h, w, y, kw


def check_outputs(n, d, v, dtype, spec, reduction, seed=1, objective="loss+logprobs"):
    """All per-token outputs against the float64 reference; gradients of a loss + logprob
    objective (an RL-style sum with per-token advantages) against the reference's autograd."""
    h, w, y, kw = make_options(n, d, v, dtype, spec, seed)
    leaves = [h.clone().requires_grad_(), w.clone().requires_grad_()]
    ref_leaves = [h.double().requires_grad_(), w.double().requires_grad_()]
    if "bias" in kw:
        leaves.append(kw["bias"].clone().requires_grad_())
        ref_leaves.append(kw["bias"].double().requires_grad_())
    kw_f = dict(kw, bias=leaves[2] if "bias" in kw else None)
    kw_r = dict(kw, bias=ref_leaves[2] if "bias" in kw else None)
    kw_r.pop("memory_budget", None)  # (how flce cuts the work, not the math)
    out = flce.linear_cross_entropy(leaves[0], leaves[1], y, reduction=reduction, return_lse=True,
                                    return_logprobs=True, return_entropy=True, return_argmax=True,
                                    return_z_loss=True, return_loss_per_token=True, **kw_f)
    assert isinstance(out, flce.LinearCrossEntropyOutput)
    ref = reference(ref_leaves[0], ref_leaves[1], y, reduction=reduction, **kw_r)
    for name in ("loss", "lse", "logprobs", "entropy", "z_loss", "loss_per_token"):
        got, want = getattr(out, name), ref[name]
        assert got.shape == want.shape and got.dtype == torch.float32, (name, got.shape, want.shape)
        e = (got.double() - want.detach()).abs().max().item()
        scale = max(1.0, want.detach().abs().max().item())
        assert e <= 2e-5 * scale, f"{name}: max abs err {e:.2e}"
    # argmax: a largest logit (ties and near-ties may pick another index of the same value)
    logits = h.double() @ w.double().T
    if "bias" in kw:
        logits = logits + kw["bias"].double()
    logits = logits / kw.get("temperature", 1.0)
    if kw.get("softcap"):
        logits = kw["softcap"] * torch.tanh(logits / kw["softcap"])
    picked = logits.gather(1, out.argmax.long().reshape(-1, 1))[:, 0]
    assert (picked >= logits.max(1).values - 1e-4).all(), "argmax is not a largest logit"
    assert out.argmax.dtype == torch.int64
    # gradients
    g = gen(seed + 1)
    adv = torch.randn(y.shape, device=DEV, generator=g, dtype=torch.float64)
    up = torch.randn(out.loss.shape, device=DEV, generator=g, dtype=torch.float64)

    def obj(o):
        if objective == "logprobs":
            return -(o["logprobs"].double() * adv).sum()
        if objective == "rl":  # GRPO-like: advantages, an entropy bonus and a hand-written z-loss
            total = -(o["logprobs"].double() * adv).sum() - 0.01 * o["entropy"].double().sum()
            return total + 1e-2 * (o["lse"].double() ** 2 * adv.abs()).sum() + 0.5 * o["loss_per_token"].double().sum()
        total = (o["loss"].double() * up).sum() - (o["logprobs"].double() * adv).sum()
        return total + 0.5 * o["loss_per_token"].double().sum()
    obj(out._asdict()).backward()
    obj(ref).backward()
    # bf16: dZ is 16-bit; with smoothing, z-loss or class weights the logprob term is a second
    # flce_backward call whose bf16 gradients are added to the loss term's (two roundings)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    for name, a, b in zip(("dH", "dW", "db"), leaves, ref_leaves):
        assert a.grad is not None and a.grad.dtype == dtype, name
        e = rel(a.grad, b.grad)
        assert e < tol, f"{name} rel err {e:.2e} > {tol}"


def feature_cases():
    # every option set in fp32; bf16 (GPU) with all options at once (each set is its own kernels)
    combos = [(torch.float32, name, spec) for name, spec in OPTION_SETS]
    if GPU:
        combos.append((torch.bfloat16,) + OPTION_SETS[3])
    for dtype, name, spec in combos:
        for reduction in ("mean", "none"):
            case(f"outputs {dtype} {name} {reduction}", lambda: check_outputs(200, 64, 700, dtype, spec, reduction))
    case("outputs sum, logprob objective only",
         lambda: check_outputs(150, 32, 300, torch.float32, OPTION_SETS[3][1], "sum", objective="logprobs"))

    def against_torch_weights_bias_smoothing():
        # class weights, bias and smoothing as F.cross_entropy / F.linear define them
        h, w, y, kw = make_options(300, 64, 500, torch.float32, dict(bias=True, class_weights=True), 3)
        for reduction in ("mean", "sum", "none"):
            for eps in (0.0, 0.1):
                h1, w1, b1 = (t.clone().requires_grad_() for t in (h, w, kw["bias"]))
                h2, w2, b2 = (t.double().requires_grad_() for t in (h, w, kw["bias"]))
                out = flce.linear_cross_entropy(h1, w1, y, bias=b1, class_weights=kw["class_weights"],
                                                reduction=reduction, label_smoothing=eps)
                ref = F.cross_entropy(F.linear(h2, w2, b2), y, weight=kw["class_weights"].double(),
                                      reduction=reduction, label_smoothing=eps)
                assert rel(out.detach(), ref.detach()) < 1e-5, (reduction, eps)
                out.sum().backward()
                ref.sum().backward()
                for a, b in ((h1, h2), (w1, w2), (b1, b2)):
                    assert rel(a.grad, b.grad) < 1e-4, (reduction, eps, rel(a.grad, b.grad))
    case("class weights, bias, smoothing against F.cross_entropy", against_torch_weights_bias_smoothing)

    def bias_only_grad():
        h, w, y, kw = make_options(100, 32, 200, torch.float32, dict(bias=True), 4)
        b1 = kw["bias"].clone().requires_grad_()
        b2 = kw["bias"].double().requires_grad_()
        for strategy in ("auto", "chunked", "recompute"):
            b1.grad = b2.grad = None
            flce.linear_cross_entropy(h, w, y, bias=b1, strategy=strategy).backward()
            F.cross_entropy(F.linear(h.double(), w.double(), b2), y).backward()
            assert rel(b1.grad, b2.grad) < 1e-4, strategy
    case("bias the only input that requires grad", bias_only_grad)

    def scoring_no_grad():
        h, w, y = inputs(120, 32, 400, seed=6)
        with torch.no_grad():
            out = flce.linear_cross_entropy(h, w, y, reduction="none", return_logprobs=True, return_entropy=True,
                                            temperature=0.8)
        ref = reference(h, w, y, reduction="none", temperature=0.8)
        assert not out.logprobs.requires_grad and not out.entropy.requires_grad
        assert (out.logprobs.double() - ref["logprobs"]).abs().max() < 2e-5
        assert (out.entropy.double() - ref["entropy"]).abs().max() < 2e-5
    case("scoring under no_grad (temperature)", scoring_no_grad)

    def not_differentiable_outputs():
        h, w, y = inputs(50, 16, 100, seed=7)
        h = h.requires_grad_()
        for name in ("z_loss",):
            out = flce.linear_cross_entropy(h, w, y, z_loss=1e-3, **{f"return_{name}": True})
            try:
                (out.loss + getattr(out, name).sum()).backward()
            except NotImplementedError as e:
                assert name in str(e), e
                continue
            raise AssertionError(f"a gradient through {name} should raise NotImplementedError")
        # used for logging only: no error
        out = flce.linear_cross_entropy(h, w, y, return_entropy=True, return_lse=True)
        out.loss.backward()
        assert out.entropy.requires_grad
    case("z_loss not differentiable: NotImplementedError", not_differentiable_outputs)

    def differentiable_lse_and_entropy():
        # RL objectives: log-probs with advantages, an entropy bonus, z-loss written by hand on lse,
        # per-token losses; every dtype, both logit regimes, reductions, options, a small budget
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for reduction, spec in (("mean", {}), ("none", dict(temperature=0.7)), ("sum", dict(label_smoothing=0.1)),
                                    ("mean", dict(class_weights=True, bias=True)), ("mean", dict(softcap=5.0)),
                                    ("mean", dict(memory_budget=1 << 12))):
                check_outputs(48, 16, 120, dtype, spec, reduction, seed=31, objective="rl")
    case("lse and entropy differentiable (RL objective) against float64 autograd", differentiable_lse_and_entropy)

    def grpo_step():
        # python/example_grpo.py, the README's RL example: clipped ratio, k3 KL, entropy bonus
        import example_grpo
        for dtype in (torch.bfloat16, torch.float32):
            e_loss, e_dh, e_dw = example_grpo.check(DEV, dtype)
            tol = 1e-4 if dtype == torch.float32 else 1e-2
            assert e_loss < 1e-4 and e_dh < tol and e_dw < tol, (dtype, e_loss, e_dh, e_dw)
    case("GRPO step on flce's outputs matches float64 logits (example_grpo.py)", grpo_step)

    def saved_logits_edges():
        # the saved logits are consumed by the backward: a second one through the graph raises
        h, w, y = inputs(64, 16, 200, torch.bfloat16, seed=41)
        h, w = h.requires_grad_(), w.requires_grad_()
        out = flce.linear_cross_entropy(h, w, y, reduction="none", return_logprobs=True)
        obj = out.logprobs.sum()
        obj.backward(retain_graph=True)
        try:
            obj.backward()
        except RuntimeError:
            pass
        else:
            raise AssertionError("a second backward through saved logits must raise")
        # every token ignored: zero gradients, also for lse's term on ignored tokens being exact
        y_all = torch.full_like(y, -100)
        h.grad = w.grad = None
        out = flce.linear_cross_entropy(h, w, y_all, return_logprobs=True, return_lse=True)
        (out.loss + out.logprobs.sum()).backward()
        assert float(h.grad.abs().max()) == 0 and float(w.grad.abs().max()) == 0
        # one token
        check_outputs(1, 16, 50, torch.bfloat16, {}, "none", seed=43, objective="rl")
        # strategy='saved' forced on a plain mean loss (the fuzzer found its gradients dropped)
        h2, w2, y2 = inputs(300, 16, 200, torch.bfloat16, seed=44)
        h2, w2 = h2.requires_grad_(), w2.requires_grad_()
        flce.linear_cross_entropy(h2, w2, y2, strategy="saved").backward()
        ref_h, ref_w = h2.detach().double().requires_grad_(), w2.detach().double().requires_grad_()
        F.cross_entropy(ref_h @ ref_w.T, y2).backward()
        assert h2.grad is not None and rel(h2.grad, ref_h.grad) < 1e-2 and rel(w2.grad, ref_w.grad) < 1e-2
        # steps keep memory flat: what forward keeps is freed with the graph
        if GPU:
            hl, wl = h.detach().requires_grad_(), w.detach().requires_grad_()
            torch.cuda.synchronize()
            before = None
            for step in range(1000):
                o = flce.linear_cross_entropy(hl, wl, y, reduction="none", return_logprobs=True,
                                              return_entropy=True)
                (o.logprobs.sum() + 0.01 * o.entropy.sum()).backward()
                hl.grad = wl.grad = None
                if step == 10:
                    torch.cuda.synchronize()
                    before = torch.cuda.memory_allocated()
            torch.cuda.synchronize()
            assert torch.cuda.memory_allocated() <= before, (torch.cuda.memory_allocated(), before)
    case("saved logits: second backward raises, all ignored, N = 1, 1000 steps flat memory", saved_logits_edges)

    def shift_matches_slicing():
        g = gen(8)
        hb = torch.randn(3, 20, 32, device=DEV, generator=g)
        w = torch.randn(100, 32, device=DEV, generator=g) * 0.3
        yb = torch.randint(0, 100, (3, 20), device=DEV, generator=g)
        yb[0, 5] = -100
        for reduction in ("mean", "sum", "none"):
            h1 = hb.clone().requires_grad_()
            h2 = hb.clone().requires_grad_()
            out = flce.linear_cross_entropy(h1, w, yb, shift=1, reduction=reduction, return_logprobs=True)
            ref = flce.linear_cross_entropy(h2[:, :-1].contiguous(), w, yb[:, 1:].contiguous(), reduction=reduction,
                                            return_logprobs=True)
            if reduction == "none":
                assert torch.equal(out.loss[:, 0], torch.zeros(3, device=DEV))
                assert (out.loss[:, 1:] - ref.loss).abs().max() < 1e-5
            else:
                assert (out.loss - ref.loss).abs() < 1e-5 * max(1, ref.loss.abs().item())
            assert (out.logprobs[:, 1:] - ref.logprobs).abs().max() < 1e-5
            (out.loss.sum() + out.logprobs.sum()).backward()
            (ref.loss.sum() + ref.logprobs.sum()).backward()
            assert rel(h1.grad[:, :-1], h2.grad[:, :-1]) < 1e-5 and h1.grad[:, -1].abs().max() == 0
    case("shift=1 equals slicing hidden and labels", shift_matches_slicing)

    def accumulators():
        # Megatron's main_grad: dW (and dH) added in fp32 into the given buffers, .grad untouched
        dtype = torch.bfloat16 if GPU else torch.float32
        tol = 4e-3 if dtype == torch.bfloat16 else 1e-4  # bf16: 16-bit dZ; the sums are fp32
        h, w, y = inputs(300, 64, 500, dtype, seed=9)
        ref_h, ref_w = h.double().requires_grad_(), w.double().requires_grad_()
        F.cross_entropy(ref_h @ ref_w.T, y).backward()
        for strategy in ("auto", "chunked", "recompute"):
            h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
            main_grad = torch.full(w.shape, 1.0, device=DEV)
            dh_acc = torch.zeros(h.shape, device=DEV)
            for _ in range(2):
                loss = flce.linear_cross_entropy(h1, w1, y, strategy=strategy, grad_weight_accumulator=main_grad,
                                                 grad_hidden_accumulator=dh_acc)
                (loss * 0.5).backward()
            assert w1.grad is None and h1.grad is None, "accumulated gradients must not also go to .grad"
            assert rel(main_grad - 1.0, ref_w.grad) < tol, (strategy, rel(main_grad - 1.0, ref_w.grad))
            assert rel(dh_acc, ref_h.grad) < tol, (strategy, rel(dh_acc, ref_h.grad))
        # only the weight accumulated: hidden's gradient flows on as usual
        h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
        main_grad = torch.zeros(w.shape, device=DEV)
        flce.linear_cross_entropy(h1, w1, y, grad_weight_accumulator=main_grad).backward()
        assert w1.grad is None and rel(h1.grad, ref_h.grad) < 5e-3 and rel(main_grad, ref_w.grad) < tol
    case("fp32 accumulators (main_grad)", accumulators)

    def functional_names():
        h, w, y, kw = make_options(64, 32, 100, torch.float32, dict(bias=True, class_weights=True), 10)
        out = flce.functional.linear_cross_entropy(h, w, y, linear_bias=kw["bias"], weight=kw["class_weights"],
                                                   label_smoothing=0.1, ignore_index=None)
        ref = F.cross_entropy(F.linear(h.double(), w.double(), kw["bias"].double()), y,
                              weight=kw["class_weights"].double(), label_smoothing=0.1)
        assert rel(out, ref) < 1e-5
        one = flce.functional.linear_cross_entropy(h[3], w, y[3].clamp(min=0), reduction="none")
        assert one.shape == ()
        try:
            flce.functional.linear_cross_entropy(h.reshape(4, 16, 32), w, y.reshape(4, 16))
        except ValueError:
            pass
        else:
            raise AssertionError("3-D input should be refused (F.linear_cross_entropy's class dim differs)")
    case("flce.functional: F.linear_cross_entropy's names", functional_names)

    def cce_names():
        g = gen(11)
        e = torch.randn(2, 12, 32, device=DEV, generator=g)
        c = torch.randn(80, 32, device=DEV, generator=g) * 0.3
        t = torch.randint(0, 80, (2, 12), device=DEV, generator=g)
        loss, lse = flce.cce.linear_cross_entropy(e, c, t, shift=1, softcap=4.0, return_lse=True)
        z = 4.0 * torch.tanh((e.double() @ c.double().T) / 4.0)
        ref = F.cross_entropy(z[:, :-1].reshape(-1, 80), t[:, 1:].reshape(-1))
        assert rel(loss, ref) < 1e-5
        assert lse.shape == t.shape and (lse[:, 1:].double() - torch.logsumexp(z, -1)[:, :-1]).abs().max() < 1e-4
        per = flce.cce.linear_cross_entropy(e, c, t, shift=True, reduction="none")
        assert per.shape == t.shape and torch.equal(per[:, 0], torch.zeros(2, device=DEV))
        mod = flce.cce.LinearCrossEntropy(shift=1, softcap=4.0)
        assert rel(mod(e, c, t), ref) < 1e-5
    case("flce.cce: Cut Cross-Entropy's names", cce_names)


# ---- flce.vocab_parallel_cross_entropy (python/test_tp.py has the multi-rank tests) ------------------

def parallel_cases():
    import tempfile
    import torch.distributed as dist

    def one_rank_group(fn):
        """fn() inside a torch.distributed group of this process alone (gloo, a FileStore)."""
        def run():
            if dist.is_initialized():
                return fn()
            with tempfile.TemporaryDirectory() as tmp:
                dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0,
                                        world_size=1)
                try:
                    return fn()
                finally:
                    dist.destroy_process_group()
        return run

    def vp(h, w, y, **kw):
        kw.setdefault("vocab_offset", 0)
        kw.setdefault("vocab_total", w.shape[0])
        return flce.vocab_parallel_cross_entropy(h, w, y, **kw)

    def bad_args():
        h, w, y = inputs(8, 16, 5, seed=50)
        for exc, kwargs, args, words in (
                (ValueError, dict(sequence_parallel=True, shift=1), (h, w, y), "shift"),
                (ValueError, dict(vocab_offset=3, vocab_total=7), (h, w, y), "vocab_offset"),
                (ValueError, dict(vocab_offset=-1), (h, w, y), "vocab_offset"),
                (ValueError, dict(vocab_offset=2, vocab_total=7), (h, w, y), "whole vocab"),  # one rank
                (ValueError, dict(vocab_total=9), (h, w, y), "whole vocab"),
                (TypeError, dict(vocab_offset=1.5), (h, w, y), "vocab_offset"),
                (TypeError, dict(sequence_parallel="yes"), (h, w, y), "sequence_parallel"),
                (TypeError, dict(comm=object()), (h, w, y), "comm"),
                (ValueError, {}, (h, w, y[:4]), "labels"),
                (ValueError, {}, (h[:, :8].contiguous(), w, y), "weight"),
                (ValueError, dict(bias=torch.zeros(7, device=DEV)), (h, w, y), "bias"),
                (ValueError, dict(vocab_total=9, class_weights=torch.ones(5, device=DEV)), (h, w, y), "class"),
                (ValueError, dict(grad_hidden_accumulator=torch.zeros(4, 16, device=DEV)), (h, w, y),
                 "grad_hidden_accumulator"),
                (ValueError, dict(grad_weight_accumulator=torch.zeros(5, 16, device=DEV).half()), (h, w, y),
                 "grad_weight_accumulator")):
            try:
                vp(*args, **kwargs)
            except exc as e:
                assert words in str(e), f"{exc.__name__} for {sorted(kwargs)} does not name '{words}': {e}"
                continue
            raise AssertionError(f"no {exc.__name__} for {sorted(kwargs)} {[tuple(a.shape) for a in args]}")
    case("vocab_parallel_cross_entropy: argument errors", one_rank_group(bad_args))

    def no_process_group():
        h, w, y = inputs(8, 16, 5, seed=51)
        try:
            vp(h, w, y)
        except RuntimeError as e:
            assert "init_process_group" in str(e), e
            return
        raise AssertionError("no RuntimeError without torch.distributed initialized")
    if not dist.is_initialized():
        case("vocab_parallel_cross_entropy: no process group", no_process_group)

    def one_rank_is_linear_cross_entropy():
        # a group of one rank: linear_cross_entropy's values and gradients (logprobs, entropy, lse)
        outs = dict(return_lse=True, return_logprobs=True, return_entropy=True, return_argmax=True,
                    return_z_loss=True, return_loss_per_token=True)
        for dtype, spec, reduction, shift, sp in ((torch.float32, OPTION_SETS[3][1], "mean", 0, False),
                                                  (torch.bfloat16, dict(bias=True, z_loss=1e-3), "none", 0, True),
                                                  (torch.float32, {}, "sum", 1, False)):
            h, w, y, kw = make_options(40, 16, 90, dtype, spec, 52)
            results = []
            for fn in (flce.linear_cross_entropy, vp):
                leaves = [h.clone().requires_grad_(), w.clone().requires_grad_()]
                if "bias" in kw:
                    leaves.append(kw["bias"].clone().requires_grad_())
                kw_fn = dict(kw, bias=leaves[2] if "bias" in kw else None, reduction=reduction, shift=shift, **outs)
                o = fn(leaves[0], leaves[1], y, **kw_fn, **({} if fn is flce.linear_cross_entropy else
                                                            dict(sequence_parallel=sp)))
                adv = torch.linspace(-1, 1, y.numel(), device=DEV, dtype=torch.float64)
                obj = (o.loss.double().sum() - (o.logprobs.double() * adv).sum() - 0.01 * o.entropy.double().sum() +
                       1e-3 * (o.lse.double() ** 2).sum())
                obj.backward()
                results.append((o, [t.grad for t in leaves]))
            (a, ga), (b, gb) = results
            for name in flce.LinearCrossEntropyOutput._fields:
                assert torch.equal(getattr(a, name), getattr(b, name)), (dtype, name)
            for x, z in zip(ga, gb):
                assert torch.equal(x, z), (dtype, "gradients differ")
    case("vocab_parallel_cross_entropy: a group of one rank is linear_cross_entropy",
         one_rank_group(one_rank_is_linear_cross_entropy))

    if not GPU:
        def two_ranks():
            # python/test_tp.py on 2 gloo ranks: both routes, sequence parallelism, option sets
            r = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_tp.py"),
                                "--standin"], capture_output=True, text=True, timeout=240)
            assert r.returncode == 0, f"exit {r.returncode}:\n{r.stdout[-4000:]}{r.stderr[-2000:]}"
        case("vocab_parallel_cross_entropy on 2 CPU ranks (test_tp.py --standin)", two_ranks)


# ---- custom ops: opcheck, fake tensors, torch.compile, CUDA graphs -------------------------------

def fwd_args(h, w, y, bias=None, cw=None, reduction="mean", outputs=0, grads=0, strategy="auto", eps=0.0, lam=0.0,
             softcap=0.0, temperature=1.0, gh_acc=None, gw_acc=None):
    return (h, w, y, bias, cw, gh_acc, gw_acc, reduction, -100, eps, lam, softcap, temperature, strategy, 0, outputs,
            grads, 0, 1, 0, w.shape[0], 0)


def op_cases():
    all_out = (_ops.OUT_LOGPROB | _ops.OUT_ENTROPY | _ops.OUT_ARGMAX | _ops.OUT_ZLOSS | _ops.OUT_LOSS_PER_TOKEN)
    all_grads = _ops.GRAD_HIDDEN | _ops.GRAD_WEIGHT | _ops.GRAD_BIAS

    def import_is_light():
        # issue 41: `import flce` loads neither torch._dynamo nor sympy (over 1 s); once torch.compile
        # imports them, _auto_choice carries assume_constant_result's mark (here _auto_choice_now
        # calls ctypes, which Dynamo cannot trace: fullgraph=True fails unless the call is a constant)
        script = """if True:
            import ctypes, sys, time
            sys.path.insert(0, sys.argv[1])
            import torch
            t = time.perf_counter()
            import flce
            took = time.perf_counter() - t
            heavy = [m for m in ("torch._dynamo", "sympy", "torch.fx.experimental.symbolic_shapes") if m in sys.modules]
            assert not heavy, f"import flce loaded {heavy}"
            assert took < 0.3, f"import flce took {took:.3f} s after import torch (issue 41: at most 0.3 s)"
            flce._auto_choice_now = lambda *a: "chunked" if ctypes.c_int(a[1]).value > 100 else "recompute"
            opts = (None,) * len(flce._Options._fields)  # unread by this _auto_choice_now

            def f(x):
                c = flce._auto_choice(-1, x.shape[0], 8, 16, x.dtype, torch.int64, None, False, False, *opts)
                return x * (2 if c == "chunked" else 3)
            out = torch.compile(f, fullgraph=True, backend="eager")(torch.ones(300))
            shapes = sys.modules["torch.fx.experimental.symbolic_shapes"]  # (PyTorch 2.4 has neither name)
            hint = getattr(shapes, "optimization_hint", None) or getattr(shapes, "size_hint", None)
            assert out.eq(2).all(), out
            assert flce._compat.size_hint is hint, (flce._compat.size_hint, hint)
            print(f"import flce: {took:.3f} s after import torch")
        """
        r = subprocess.run([sys.executable, "-c", script, os.path.dirname(os.path.abspath(__file__))],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    case("import flce: no torch._dynamo or sympy; constant mark once torch.compile imports them", import_is_light)

    def opcheck_forward():
        h, w, y, kw = make_options(40, 16, 50, torch.float32, dict(bias=True, class_weights=True), 12)
        h, w, b = (t.requires_grad_() for t in (h, w, kw["bias"]))
        cw = kw["class_weights"]
        for args in (fwd_args(h, w, y),
                     fwd_args(h, w, y, b, cw, "none", all_out, eps=0.1, lam=1e-3, softcap=3.0, temperature=0.9),
                     fwd_args(h, w, y, b, cw, "sum", all_out, all_grads, "chunked", eps=0.1),
                     fwd_args(h, w, y, b, None, "mean", _ops.OUT_LOGPROB | _ops.OUT_LOSS_PER_TOKEN, softcap=3.0)):
            torch.library.opcheck(_ops.forward_op, args)
    case("opcheck flce::forward", opcheck_forward)

    def opcheck_backward_and_scale():
        h, w, y, kw = make_options(40, 16, 50, torch.float32, dict(bias=True), 13)
        b = kw["bias"]
        lse = reference(h, w, y, bias=b)["lse"].float()
        acc = torch.zeros(w.shape, device=DEV)
        for g, reduction, grads, gw_acc in ((torch.tensor(2.0, device=DEV), "mean", 7, None),
                                             (torch.randn(40, device=DEV), "none", 7, acc),
                                             (torch.tensor(0.5, device=DEV), "sum", _ops.GRAD_BIAS, None)):
            torch.library.opcheck(_ops.backward_op, (h, w, y, b, None, lse, g, reduction, -100, 0.0, 0.0, 0.0, 1.0,
                                                     "recompute", 0, grads, 0, 1, 0, 50, 0, None, gw_acc))
        dh, dw, db = torch.randn(40, 16, device=DEV), torch.randn(50, 16, device=DEV), torch.randn(50, device=DEV)
        torch.library.opcheck(_ops.scale_gradients_, (dh, dw, db, torch.tensor(3.0, device=DEV), 40, 16, 50,
                                                       torch.float32, torch.int64, "mean", -100, 0.0, 0.0, 0.0, 1.0,
                                                       0, True, False, 0, 1, 0, 50))
        torch.library.opcheck(_ops.not_differentiable, (torch.randn(40, device=DEV), h.requires_grad_(), "entropy"),
                              test_utils=("test_schema", "test_faketensor"))
    case("opcheck flce::backward, flce::scale_gradients_, flce::not_differentiable", opcheck_backward_and_scale)

    def fake_tensor_shapes():
        # the wrapper and the ops under FakeTensorMode: shapes and dtypes only, no library call
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            h = torch.empty(4, 7, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
            w = torch.empty(1000, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
            b = torch.empty(1000, device=DEV, dtype=torch.bfloat16, requires_grad=True)
            y = torch.empty(4, 7, device=DEV, dtype=torch.int64)
            out = flce.linear_cross_entropy(h, w, y, bias=b, reduction="none", shift=1, return_lse=True,
                                            return_logprobs=True, return_entropy=True, return_argmax=True,
                                            return_z_loss=True, return_loss_per_token=True)
            for name in ("loss", "lse", "logprobs", "entropy", "z_loss", "loss_per_token"):
                t = getattr(out, name)
                assert t.shape == (4, 7) and t.dtype == torch.float32, (name, t.shape, t.dtype)
            assert out.argmax.shape == (4, 7) and out.argmax.dtype == torch.int64
            res = _ops.forward_op(*fwd_args(h.reshape(28, 64), w, y.reshape(28), b, None, "sum", 0, 7, "chunked"))
            assert res[0].shape == () and res[7].shape == (28, 64) and res[8].shape == (1000, 64) and \
                res[9].shape == (1000,) and res[7].dtype == torch.bfloat16
    case("FakeTensorMode shapes", fake_tensor_shapes)

    def compiled_equals_eager(fn, args_fn, backend=BACKEND, dynamic=None, exact=True):
        """fn(*args) and its backward, eager and compiled with fullgraph=True: the same values."""
        results = []
        for f in (fn, torch.compile(fn, fullgraph=True, backend=backend, dynamic=dynamic)):
            args = args_fn()
            out = f(*args)
            out.backward()
            results.append([out.detach()] + [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad])
        for a, b in zip(*results):
            if exact:
                assert torch.equal(a, b), f"compiled differs from eager by {(a.double() - b.double()).abs().max():.3e}"
            else:
                assert rel(a, b) < 1e-6, f"compiled differs from eager: rel {rel(a, b):.2e}"

    def leaf_args(n, d, v, dtype=torch.float32, seed=14, bias=False):
        def make():
            h, w, y = inputs(n, d, v, dtype, seed)
            args = [h.requires_grad_(), w.requires_grad_(), y]
            if bias:
                args.append((torch.randn(v, device=DEV, generator=gen(seed)) * 0.1).to(dtype).requires_grad_())
            return args
        return make

    def compile_grads_in_forward():
        # > 256 tokens, mean: the gradients come from forward and are scaled by the upstream 2.0
        torch._dynamo.reset()
        compiled_equals_eager(lambda h, w, y: 2 * flce.linear_cross_entropy(h, w, y, strategy="chunked"),
                              leaf_args(1500, 64, 1000, torch.bfloat16 if GPU else torch.float32))
    case("torch.compile fullgraph = eager: gradients in forward (chunked)", compile_grads_in_forward)

    def compile_auto_choice():
        # > 256 tokens, strategy auto, static shapes: the library's AUTO is asked while tracing
        # (_auto_choice, a constant to Dynamo; PyTorch 2.15 emptied a NamedTuple argument there)
        torch._dynamo.reset()
        compiled_equals_eager(lambda h, w, y: 2 * flce.linear_cross_entropy(h, w, y, label_smoothing=0.1),
                              leaf_args(1500, 64, 1000, torch.bfloat16 if GPU else torch.float32))
    case("torch.compile fullgraph = eager: AUTO's choice above 256 tokens", compile_auto_choice)

    def compile_deferred_rl():
        # per-token logprobs with temperature and a loss term: gradients in backward (flce_backward)
        torch._dynamo.reset()
        g = gen(15)
        adv = torch.randn(300, device=DEV, generator=g)

        def objective(h, w, y, b):
            out = flce.linear_cross_entropy(h, w, y, bias=b, reduction="none", temperature=0.7,
                                            return_logprobs=True, return_entropy=True)
            return -(out.logprobs * adv).mean() + 0.1 * out.loss.mean() + 0 * out.entropy.detach().sum()
        compiled_equals_eager(objective, leaf_args(300, 64, 1000, bias=True), exact=False)
    case("torch.compile fullgraph = eager: RL logprobs, bias, temperature", compile_deferred_rl)

    def compile_explain_no_breaks():
        torch._dynamo.reset()
        h, w, y, kw = make_options(200, 32, 300, torch.float32, OPTION_SETS[3][1], 16)
        h, w, b = h.requires_grad_(), w.requires_grad_(), kw["bias"].requires_grad_()
        main_grad = torch.zeros(w.shape, device=DEV)

        def step(h, w, y, b, cw, main_grad):
            a = flce.linear_cross_entropy(h, w, y, bias=b, class_weights=cw, label_smoothing=0.05, z_loss=1e-4,
                                          softcap=5.0, temperature=1.3, return_logprobs=True, return_argmax=True)
            c = flce.linear_cross_entropy(h.reshape(4, 50, 32), w, y.reshape(4, 50), shift=1, reduction="sum",
                                          grad_weight_accumulator=main_grad)
            d = flce.functional.linear_cross_entropy(h, w, y, linear_bias=b, weight=cw)
            e = flce.cce.linear_cross_entropy(h, w, y, bias=b, softcap=5.0)
            return a.loss + a.logprobs.sum() + c + d + e
        ex = torch._dynamo.explain(step)(h, w, y, b, kw["class_weights"], main_grad)
        assert ex.graph_break_count == 0 and ex.graph_count == 1, (ex.graph_count, ex.break_reasons)
    case("torch._dynamo.explain: no graph break (all options, wrappers)", compile_explain_no_breaks)

    def compile_dynamic_shapes():
        # dynamic token count: one graph serves several N (aot_eager: the tracing is what is tested)
        torch._dynamo.reset()
        f = torch.compile(lambda h, w, y: flce.linear_cross_entropy(h, w, y, reduction="sum"), fullgraph=True,
                          backend="aot_eager", dynamic=True)
        for n in (1200, 1700, 300):
            h, w, y = inputs(n, 32, 500, seed=n)
            h1, h2 = h.clone().requires_grad_(), h.double().requires_grad_()
            loss = f(h1, w, y)
            loss.backward()
            ref = F.cross_entropy(h2 @ w.double().T, y, reduction="sum")
            ref.backward()
            assert rel(loss, ref) < 1e-5 and rel(h1.grad, h2.grad) < 1e-4, n
    case("torch.compile dynamic=True over several token counts", compile_dynamic_shapes)

    def compile_accumulator():
        torch._dynamo.reset()
        results = []
        for f in (None, "compiled"):
            h, w, y = inputs(300, 32, 400, seed=17)
            h, w = h.requires_grad_(), w.requires_grad_()
            acc = torch.ones(w.shape, device=DEV)

            def step(h, w, y, acc):
                return flce.linear_cross_entropy(h, w, y, grad_weight_accumulator=acc)
            fn = step if f is None else torch.compile(step, fullgraph=True, backend=BACKEND)
            for _ in range(2):
                (fn(h, w, y, acc) * 3).backward()
            assert w.grad is None
            results.append((h.grad, acc))
        assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    case("torch.compile with grad_weight_accumulator (main_grad)", compile_accumulator)

    if GPU:
        def cuda_graph_capture():
            # a whole step (forward, backward into .grad) captured and replayed, for both ways the
            # gradients are computed (in forward and scaled: 1500 tokens chunked; in backward: 300)
            for n, strategy in ((1500, "chunked"), (300, "auto"), (300, "recompute")):
                h0, w0, y = inputs(n, 64, 1000, torch.bfloat16, seed=18)
                h = h0.clone().requires_grad_()
                w = w0.clone().requires_grad_()

                def step():
                    loss = flce.linear_cross_entropy(h, w, y, strategy=strategy) * 2
                    loss.backward()
                    return loss
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(2):
                        h.grad = w.grad = None
                        step()
                torch.cuda.current_stream().wait_stream(s)
                h.grad = w.grad = None
                eager = (step().detach().clone(), h.grad.clone(), w.grad.clone())
                h.grad = w.grad = None
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    loss = step()
                graph.replay()
                torch.cuda.synchronize()
                for a, b in zip(eager, (loss, h.grad, w.grad)):
                    assert torch.equal(a, b), (n, strategy)
        case("CUDA graph capture of forward + backward", cuda_graph_capture)

        def compile_reduce_overhead():
            torch._dynamo.reset()
            h0, w0, y = inputs(300, 64, 1000, torch.bfloat16, seed=19)
            w = w0.clone().requires_grad_()

            @torch.compile(mode="reduce-overhead", fullgraph=True)
            def step(h, w, y):
                return flce.linear_cross_entropy(h, w, y, reduction="sum")
            for _ in range(3):
                w.grad = None
                loss = step(h0, w, y)
                loss.backward()
            ref_w = w0.double().requires_grad_()
            F.cross_entropy(h0.double() @ ref_w.T, y, reduction="sum").backward()
            assert rel(w.grad, ref_w.grad) < 5e-3
        case("torch.compile mode=reduce-overhead (CUDA graphs)", compile_reduce_overhead)


# ---- issue 41: autocast, flce.prepare, the supported PyTorch range --------------------------------

class SpyCalls:
    """Records the library calls (_Call.__call__ and _Call.scale, whatever runs them: the library or
    the stand-in) as flce.prepare's dry run records them: (kind, op, problem bytes, pointer names),
    and the dtypes of hidden, weight and bias of each."""

    def __enter__(self):
        self.calls, self.dtypes = [], []
        self.run, self.scale = flce._Call.__call__, flce._Call.scale
        spy = self

        def run(call, op, strategy, half=None, buffer=None, workspace=None, **outs):
            if call.device.type != "meta":
                spy.note(call, flce._OP_NAMES[op], op, strategy, outs)
            return spy.run(call, op, strategy, half, buffer, workspace, **outs)

        def scale(call, grad_output, grad_hidden=None, grad_weight=None, grad_bias=None):
            if call.device.type != "meta":
                spy.note(call, "scale_gradients", _lib.FLCE_OP_LOSS_AND_GRAD, "auto",
                         dict(grad_output=grad_output, grad_hidden=grad_hidden, grad_weight=grad_weight,
                              grad_bias=grad_bias))
            return spy.scale(call, grad_output, grad_hidden, grad_weight, grad_bias)
        flce._Call.__call__, flce._Call.scale = run, scale
        return self

    def note(self, call, kind, op, strategy, outs):
        p = _lib.Problem.from_buffer_copy(call.problem)
        p.strategy = _lib.STRATEGIES[strategy]
        self.calls.append((kind, op, bytes(p), frozenset(k for k, v in outs.items() if v is not None)))
        if kind != "scale_gradients":  # (its _Call holds no tensors)
            self.dtypes.append(tuple(None if t is None else t.dtype for t in (call.hidden, call.weight, call.bias)))

    def __exit__(self, *exc):
        flce._Call.__call__, flce._Call.scale = self.run, self.scale


def issue41_cases():
    bf16 = torch.bfloat16

    def autocast_leaves(n=300, d=64, v=500, seed=60):
        g = gen(seed)
        h = torch.randn(n, d, device=DEV, generator=g).requires_grad_()
        w = (torch.randn(v, d, device=DEV, generator=g) * 0.2).requires_grad_()
        b = (torch.randn(v, device=DEV, generator=g) * 0.1).requires_grad_()
        y = torch.randint(0, v, (n,), device=DEV, generator=g)
        return h, w, b, y

    def autocast_16bit_kernels():
        # fp32 leaves under torch.autocast: the library sees the autocast dtype (as F.linear would run),
        # the leaves get fp32 gradients close to fp64's; eager, compiled (fullgraph) and the wrappers
        h, w, b, y = autocast_leaves()
        hd, wd, bd = (t.detach().double().requires_grad_() for t in (h, w, b))
        ref = F.cross_entropy(hd @ wd.T + bd, y)
        ref.backward()

        def step(h, w, y, b):
            return flce.linear_cross_entropy(h, w, y, bias=b, return_logprobs=True).loss
        wrappers = (("eager", step), ("compiled", torch.compile(step, fullgraph=True, backend=BACKEND)),
                    ("module", lambda h, w, y, b: flce.LinearCrossEntropy()(h, w, y, b)),
                    ("functional", lambda h, w, y, b: flce.functional.linear_cross_entropy(h, w, y, linear_bias=b)),
                    ("cce", lambda h, w, y, b: flce.cce.linear_cross_entropy(h, w, y, bias=b)))
        for name, fn in wrappers:
            h.grad = w.grad = b.grad = None
            with SpyCalls() as spy, torch.autocast(DEV, dtype=bf16):
                loss = fn(h, w, y, b)
            loss.backward()
            assert spy.dtypes and set(spy.dtypes) == {(bf16, bf16, bf16)}, (name, set(spy.dtypes))
            assert loss.dtype == torch.float32 and abs(loss.item() - ref.item()) < 2e-2 * abs(ref.item()), name
            for t, r in ((h, hd), (w, wd), (b, bd)):
                assert t.grad.dtype == torch.float32 and rel(t.grad, r.grad) < 2e-2, (name, rel(t.grad, r.grad))
        with SpyCalls() as spy:  # outside autocast: the dtypes as given
            flce.linear_cross_entropy(h, w, y, bias=b).backward()
        assert set(spy.dtypes) == {(torch.float32, torch.float32, torch.float32)}, set(spy.dtypes)
        with SpyCalls() as spy, torch.autocast(DEV, dtype=bf16, enabled=False):
            flce.linear_cross_entropy(h, w, y)
        assert set(spy.dtypes) == {(torch.float32, torch.float32, None)}, set(spy.dtypes)
        # the custom op itself is not cast by autocast (the wrapper casts before it): fp32 in, fp32 seen
        with SpyCalls() as spy, torch.autocast(DEV, dtype=bf16):
            _ops.forward_op(*fwd_args(h, w, y))[0].backward()
        assert set(spy.dtypes) == {(torch.float32, torch.float32, None)}, set(spy.dtypes)
    case("autocast: fp32 leaves run the bf16 kernels, fp32 grads (eager, compiled, wrappers)", autocast_16bit_kernels)

    def autocast_vocab_parallel():
        import tempfile
        import torch.distributed as dist
        h, w, b, y = autocast_leaves(64, 32, 100, seed=61)
        with tempfile.TemporaryDirectory() as tmp:
            dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0,
                                    world_size=1)
            try:
                with SpyCalls() as spy, torch.autocast(DEV, dtype=bf16):
                    loss = flce.vocab_parallel_cross_entropy(h, w, y, bias=b, vocab_offset=0, vocab_total=100)
                loss.backward()
            finally:
                dist.destroy_process_group()
        assert set(spy.dtypes) == {(bf16, bf16, bf16)} and w.grad.dtype == torch.float32, set(spy.dtypes)
    if not dist_initialized():
        case("autocast: vocab_parallel_cross_entropy casts too", autocast_vocab_parallel)

    # (options of flce.prepare, the leading dims of the real call)
    configs = [
        dict(args=(100, 64, 1000)),
        dict(args=(100, 64, 1000), dtype=torch.float32),
        dict(args=(1500, 64, 1000), dtype=torch.float32),
        dict(args=(1500, 64, 1000), dtype=torch.float32, strategy="chunked", return_argmax=True),
        dict(args=(200, 64, 1000), return_logprobs=True, return_entropy=True, reduction="none", temperature=0.7),
        dict(args=(200, 64, 1000), dtype=torch.float32, return_logprobs=True, label_smoothing=0.1),
        dict(args=(200, 64, 1000), training=False, return_argmax=True, return_entropy=True),
        dict(args=(200, 64, 1000), bias=True, class_weights=True, grad_weight_accumulator=True, z_loss=1e-3),
        dict(args=(200, 64, 1000), grad_weight=False, softcap=20.0),
    ]

    def real_calls(cfg):
        """The library calls of linear_cross_entropy with cfg's options on real tensors, and the
        backward flce.prepare plans for (the loss and the differentiable per-token outputs)."""
        cfg = dict(cfg)
        n, d, v = cfg.pop("args")
        dtype = cfg.pop("dtype", bf16)
        training, grad_weight = cfg.pop("training", True), cfg.pop("grad_weight", True)
        h, w, y = inputs(n, d, v, dtype, seed=62)
        h.requires_grad_(training)
        w.requires_grad_(training and grad_weight)
        if cfg.pop("bias", False):
            cfg["bias"] = torch.zeros(v, device=DEV, dtype=dtype).requires_grad_(training)
        if cfg.pop("class_weights", False):
            cfg["class_weights"] = torch.ones(v, device=DEV)
        if cfg.pop("grad_weight_accumulator", False):
            cfg["grad_weight_accumulator"] = torch.zeros(v, d, device=DEV)
        with SpyCalls() as spy, torch.set_grad_enabled(training):
            out = flce.linear_cross_entropy(h, w, y, **cfg)
            if training:
                terms = [out] if isinstance(out, torch.Tensor) else [out.loss] + [
                    getattr(out, k) for k in ("lse", "logprobs", "entropy", "loss_per_token") if cfg.get("return_" + k)]
                sum(t.sum() for t in terms).backward()
        return spy.calls

    def dry_run_is_the_real_call():
        # flce.prepare plans what linear_cross_entropy runs: the same problems, ops and pointers
        index = torch.cuda.current_device() if GPU else -1
        for cfg in configs:
            kw = dict(cfg)
            dry = [(k, op, bytes(p), names) for k, op, p, names in flce._prepare_calls(*kw.pop("args"), index, **kw)]
            real = real_calls(cfg)
            assert dry == real, (cfg, [c[0] for c in dry], [c[0] for c in real],
                                 [sorted(c[3]) for c in dry], [sorted(c[3]) for c in real])
    case("prepare: its dry run makes the real call's library calls (9 option sets)", dry_run_is_the_real_call)

    def prepare_argument_errors():
        for exc, args, kw, words in (
                (ValueError, (0, 64, 1000), {}, "tokens"),
                (ValueError, (10, 60, 1000), {}, "multiple of 8"),
                (ValueError, (10, 64, True), {}, "vocab"),
                (ValueError, (10, 64, 1000), dict(dtype=torch.float64), "dtype"),
                (ValueError, (10, 64, 1000), dict(label_dtype=torch.int16), "label_dtype"),
                (ValueError, (10, 64, 1000), dict(reduction="avg"), "reduction"),
                (ValueError, (10, 64, 1000), dict(strategy="fast"), "strategy"),
                (ValueError, (10, 64, 1000), dict(memory_budget=-1), "memory_budget"),
                (TypeError, (10, 64, 1000), dict(label_smoothing="0.1"), "label_smoothing"),
                (TypeError, (10, 64, 1000), dict(training="yes"), "training"),
                (TypeError, (10, 64, 1000), dict(return_entropy=2), "return_entropy"),
                (TypeError, (10, 64, 1000), dict(bias="yes"), "bias"),
                (flce.FlceError, (10, 64, 1000), dict(label_smoothing=1.5), "smoothing"),
                (ValueError, (10, 64, 1000), dict(device="cpu"), "device")):
            try:
                flce.prepare(*args, **kw)
            except exc as e:
                assert words in str(e), f"{exc.__name__} for {args} {kw} does not name '{words}': {e}"
                continue
            raise AssertionError(f"no {exc.__name__} for {args} {kw}")
    case("prepare: argument errors", prepare_argument_errors)

    def prepare_plans():
        # _prepare_recorded with the library's flce_prepare and flce_strategy_of stubbed: which calls go
        # to flce_prepare (distinct ones; the scale kernel only where no prepared call holds it)
        got = []

        def fake_prepare(ctx, problem, op, tensors):
            names = {f for f, _ in _lib.Tensors._fields_ if f != "struct_size" and getattr(tensors, f)}
            got.append((op, problem.strategy, names))
        saved = _lib.prepare, _lib.strategy_of
        _lib.prepare = fake_prepare
        _lib.strategy_of = lambda ctx, problem, op: "saved" if problem.strategy == _lib.FLCE_STRATEGY_SAVED else \
            "forward" if op == _lib.FLCE_OP_FORWARD else "chunked"
        try:
            def plan(*args, **kw):
                got.clear()
                # (the dry run asks AUTO through a real context on a GPU machine: its device, not -1)
                index = torch.cuda.current_device() if GPU else -1
                return flce._prepare_recorded(None, flce._prepare_calls(*args, index, **kw), time.perf_counter())
            r = plan(100, 64, 1000)
            assert r.strategy == "saved" and r.calls == (("forward", "saved"), ("backward", "saved")), r
            assert {"hidden", "weight", "labels", "loss", "lse", "grad_hidden", "grad_weight"} <= got[0][2], got
            r = plan(100, 64, 1000, training=False, return_entropy=True, return_argmax=True)
            assert r.strategy == "forward" and r.calls == (("forward", "forward"),), r
            assert {"entropy", "argmax"} <= got[0][2] and "grad_hidden" not in got[0][2], got
            r = plan(1500, 64, 1000, dtype=torch.float32)  # its loss-and-grad call's module holds the scale kernel
            assert r.calls == (("loss_and_grad", "chunked"),), r
            r = plan(1500, 64, 1000, dtype=torch.float32, strategy="chunked", return_argmax=True)
            assert r.calls == (("loss_and_grad", "chunked"), ("scale_gradients", "chunked")), r
            assert "argmax" not in got[1][2] and got[1][1] == _lib.FLCE_STRATEGY_AUTO, got
            r = plan(200, 64, 1000, dtype=torch.float32, return_logprobs=True, label_smoothing=0.1)
            assert [c[0] for c in r.calls] == ["forward", "backward", "backward"], r  # two problems
        finally:
            _lib.prepare, _lib.strategy_of = saved
    case("prepare: distinct calls to flce_prepare, the strategy it reports (library stubbed)", prepare_plans)

    if not GPU:
        def prepare_without_gpu():
            try:
                flce.prepare(4096, 4096, 128256, dtype=bf16, return_entropy=True)
            except flce.FlceError as e:
                assert e.status == _lib.FLCE_ERR_NO_DEVICE and "flce warmup" in str(e), e
                return
            raise AssertionError("no FlceError without a GPU")
        case("prepare without a GPU: FlceError FLCE_ERR_NO_DEVICE naming flce warmup", prepare_without_gpu)
    else:
        def prepare_on_gpu():
            # (up to 256 tokens the gradients are deferred to backward: 16-bit, the saved logits)
            r = flce.prepare(200, 256, 5000, dtype=bf16, device=torch.cuda.current_device())
            assert r.strategy == "saved" and r.calls == (("forward", "saved"), ("backward", "saved")), r
            r = flce.prepare(1000, 256, 5000, dtype=torch.float32, training=False, return_argmax=True,
                             device="cuda")
            assert r.strategy == "forward" and r.calls == (("forward", "forward"),), r
            r2 = flce.prepare(1000, 256, 5000, dtype=torch.float32, training=False, return_argmax=True)
            assert r2.seconds < 0.5, r2  # loaded already
            h, w, y = inputs(200, 256, 5000, bf16, seed=63)
            flce.linear_cross_entropy(h.requires_grad_(), w, y).backward()
            with torch.inference_mode():  # (the dry run makes tensors that require grad)
                flce.prepare(200, 256, 5000)
        case("prepare on the GPU: saved logits, then an inference forward", prepare_on_gpu)

    def compile_only_accumulators():
        # every gradient into an accumulator (hidden needs none): kept under torch.compile from 2.11 on;
        # below, flce refuses it (PyTorch 2.4's AOTAutograd drops that backward, the gradients would be lost)
        from flce import _compat
        h, w, y = inputs(300, 32, 400, seed=64)
        w.requires_grad_()

        def step(h, w, y, acc):
            return flce.linear_cross_entropy(h, w, y, grad_weight_accumulator=acc)
        eager_acc = torch.zeros(w.shape, device=DEV)
        step(h, w, y, eager_acc).backward()
        saved = _compat.compile_drops_accumulated
        for drops in ((saved,) if saved else (False, True)):
            _compat.compile_drops_accumulated = drops
            torch._dynamo.reset()
            acc = torch.zeros(w.shape, device=DEV)
            try:
                out = torch.compile(step, fullgraph=True, backend=BACKEND)(h, w, y, acc)
            except Exception as e:  # noqa: BLE001  (Dynamo wraps the NotImplementedError)
                assert drops, f"refused although PyTorch {torch.__version__} keeps the backward: {e}"
                continue
            finally:
                _compat.compile_drops_accumulated = saved
            assert not drops, "not refused"
            out.backward()
            assert w.grad is None and rel(acc, eager_acc) < 1e-6, rel(acc, eager_acc)
    case("torch.compile with every gradient in an accumulator: kept (2.11+) or refused", compile_only_accumulators)

    def torch_version_check():
        from flce import _compat
        for v in ("2.3.1", "2.0.0+cu118", "1.13.1", "2.3.0a0+git1234"):
            try:
                _compat.require_torch(v)
            except ImportError as e:
                assert f"PyTorch {v}" in str(e) and "PyTorch >= 2.4" in str(e) and "torch>=2.4" in str(e), e
                continue
            raise AssertionError(f"no ImportError for {v}")
        for v in ("2.4.0", "2.4.1+cu121", "2.5.0a0+gitabc", "2.11.0", "2.15.0+cu132", "3.0", "unknown"):
            _compat.require_torch(v)
        assert _compat.torch_version_tuple(torch.__version__) >= _compat.MIN_TORCH
        # `import flce` itself, under a PyTorch that says it is 2.3: the ImportError, before anything else
        script = """if True:
            import sys
            sys.path.insert(0, sys.argv[1])
            import torch
            torch.__version__ = "2.3.1"
            try:
                import flce
            except ImportError as e:
                print("ImportError:", e)
        """
        r = subprocess.run([sys.executable, "-c", script, os.path.dirname(os.path.abspath(__file__))],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "ImportError: flce needs PyTorch >= 2.4" in r.stdout, r.stdout + r.stderr[-2000:]
        toml = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyproject.toml")).read()
        assert '"torch>=%d.%d"' % _compat.MIN_TORCH in toml, "pyproject.toml's torch dependency is not MIN_TORCH"
    case("supported PyTorch: ImportError naming the range for older versions (faked)", torch_version_check)


def dist_initialized():
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def main():
    if not GPU:
        try:
            _lib.lib()
        except flce.FlceLibraryNotFound as e:
            print(f"no CUDA device and no libflce.so to build problems with: skipped ({e})")
            return 77
        import standin
        standin.install()
        print(f"no CUDA device: the binding, custom ops and torch.compile ({BACKEND}) on the CPU, with a float64 "
              "stand-in for the kernels")
    else:
        print(f"{torch.cuda.get_device_name()}: flce {flce.version()} from {flce.library_path()}, torch "
              f"{torch.__version__}")
    for name, section in (("basic", basic_cases), ("features", feature_cases), ("parallel", parallel_cases),
                          ("ops", op_cases), ("issue 41", issue41_cases)):
        t0 = time.time()
        section()
        print(f"[{name}: {time.time() - t0:.1f} s]")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
