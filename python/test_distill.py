#!/usr/bin/env python3
"""test_distill.py — tests of flce.linear_distillation (issue 44) against plain PyTorch in float64:
materialized logits of student and teacher, log_softmax at the temperature, the divergence written
with torch ops, autograd for the student's gradients (testing/ref.c ref_distill's conventions: JSD's
beta weights the teacher, beta = 0/1 are the KLs, CE at temperature 1, ignored tokens masked
entirely, no T^2).

  python3 python/test_distill.py          # on a CUDA machine: the real library on the GPU
                                          # without CUDA: the binding, custom op, autograd and
                                          # torch.compile (aot_eager) on the CPU with the float64
                                          # stand-in of standin.py for the library call
  python3 python/test_distill.py -k compile

Covers: each divergence x CE off/on x reductions x temperature, JSD's ends, labels None, ignored
tokens (a NaN teacher row of an ignored token stays out), leading dims, partial gradients, the
teacher getting no gradient, the per-token divergence output, the module form, autocast,
torch.library.opcheck, torch.compile(fullgraph=True) against eager (static and dynamic shapes, no
graph break), bad inputs (errors naming the argument) and a library without the distillation entry
points (FlceError naming flce_distill_loss_and_grad), the library's validation of the problem the
binding builds. On a GPU whose libflce.so lacks them, or answers a small call with
FLCE_ERR_UNSUPPORTED (the API before its kernels), the cases that call the library are skipped with
a message. Exit status 0 when all pass, 1 on a
failure, 77 when torch or libflce.so is missing or the library calls were skipped. Last line: 'N passed,
N failed, N skipped'.
"""
import math
import os
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
from flce import _distill_lib, _lib  # noqa: E402
from flce import distill as _distill  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
BACKEND = os.environ.get("FLCE_TEST_COMPILE_BACKEND", "inductor" if GPU else "aot_eager")
ONLY = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else None
passed, failed, skipped = 0, 0, 0
LIBRARY_CALLS = True  # False on a GPU whose library predates flce_distill_loss_and_grad
DIVERGENCES = ("forward_kl", "reverse_kl", "jsd")


def case(name, fn, calls_library=True):
    global passed, failed, skipped
    if ONLY and ONLY not in name:
        return
    if calls_library and not LIBRARY_CALLS:
        skipped += 1
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


def inputs(n, ds, dt, v, dtype=torch.float32, seed=0, ignore=0.2, ignore_index=-100, std=2.0, label_dtype=torch.int64):
    g = torch.Generator(device=DEV).manual_seed(seed)
    hs = torch.randn(n, ds, device=DEV, generator=g).to(dtype)
    ws = (torch.randn(v, ds, device=DEV, generator=g) * (std / math.sqrt(ds))).to(dtype)
    ht = torch.randn(n, dt, device=DEV, generator=g).to(dtype)
    wt = (torch.randn(v, dt, device=DEV, generator=g) * (std / math.sqrt(dt))).to(dtype)
    y = torch.randint(0, v, (n,), device=DEV, generator=g).to(label_dtype)
    y[torch.rand(n, device=DEV, generator=g) < ignore] = ignore_index
    return hs, ws, ht, wt, y


def torch_distill(hs, ws, ht, wt, labels=None, divergence="forward_kl", beta=0.5, temperature=1.0, ce_weight=0.0,
                  ignore_index=-100, reduction="mean"):
    """The loss in plain PyTorch (float64 in, autograd through it): (loss, per-token divergence)."""
    d_ = hs.shape[-1]
    zs = hs.reshape(-1, d_) @ ws.T
    zt = (ht.reshape(-1, ht.shape[-1]) @ wt.T).detach()
    lq = F.log_softmax(zs / temperature, -1)
    lp = F.log_softmax(zt / temperature, -1)
    if divergence == "jsd" and beta == 0:
        divergence = "forward_kl"
    if divergence == "jsd" and beta == 1:
        divergence = "reverse_kl"
    if divergence == "forward_kl":
        d = F.kl_div(lq, lp, log_target=True, reduction="none").sum(-1)     # Σ p (log p − log q)
    elif divergence == "reverse_kl":
        d = F.kl_div(lp, lq, log_target=True, reduction="none").sum(-1)     # Σ q (log q − log p)
    else:
        lm = torch.logsumexp(torch.stack([lp + math.log(beta), lq + math.log(1 - beta)]), 0)
        d = beta * F.kl_div(lm, lp, log_target=True, reduction="none").sum(-1) + \
            (1 - beta) * F.kl_div(lm, lq, log_target=True, reduction="none").sum(-1)
    return ce_mask_reduce(zs, d, labels, ce_weight, ignore_index, reduction, hs.shape[:-1])


def ce_mask_reduce(zs, d, labels, ce_weight, ignore_index, reduction, lead):
    """loss_i = D_i + ce_weight·CE_i (T = 1), masked tokens 0, then the reduction: (loss, D)."""
    n = zs.shape[0]
    if labels is None:
        valid = torch.ones(n, dtype=torch.bool, device=zs.device)
    else:
        y = labels.reshape(-1).long()
        valid = (y != ignore_index) & (y >= 0) & (y < zs.shape[1])
    loss = d
    if ce_weight:
        loss = loss + ce_weight * F.cross_entropy(zs, torch.where(valid, y, 0), reduction="none")
    loss, d = torch.where(valid, loss, 0.0), torch.where(valid, d, 0.0)
    if reduction == "mean":
        count = int(valid.sum())
        loss = loss.sum() / count if count else loss.sum() * 0
    elif reduction == "sum":
        loss = loss.sum()
    else:
        loss = loss.reshape(lead)
    return loss, d.reshape(lead).detach()


def tolerance(dtype, compact=False):
    """(loss and per-token divergence, gradients): issue 44 asks for the CE path's tolerances
    (test_binding.py's check_against_torch: loss 1e-5; dH, dW 1e-4 fp32, 4e-3 16-bit); the stand-in
    is float64 throughout (1e-6: the fp32 outputs). compact: forward KL on 16-bit inputs, whose
    divergence weighs each term by the teacher's probability as stored in fp16 (2^-11 relative):
    its error is about 2^-12·sqrt(Σ p²)·|log p − log q| per token, measured 3.5e-5 relative at this
    file's V = 300 (6.7e-6 at 8192×4096×128256, where torch.compile's bf16 logits give 6.0e-5), so
    1e-4 there — a looser loss than the CE path's (bench/NOTES.md, session 25)."""
    if not GPU:
        return 1e-6, 1e-6
    return 1e-4 if compact else 1e-5, 1e-4 if dtype == torch.float32 else 4e-3


def check(n=64, ds=32, dt=48, v=300, dtype=torch.float32, lead=None, need=(True, True), seed=1, upstream=2.0,
          with_labels=True, **opts):
    hs, ws, ht, wt, y = inputs(n, ds, dt, v, dtype, seed, ignore_index=opts.get("ignore_index", -100),
                               label_dtype=opts.pop("label_dtype", torch.int64))
    if lead:
        hs, ht, y = hs.reshape(*lead, ds), ht.reshape(*lead, dt), y.reshape(lead)
    labels = y if with_labels else None
    h1, w1 = hs.clone().requires_grad_(need[0]), ws.clone().requires_grad_(need[1])
    h2, w2 = hs.double().requires_grad_(need[0]), ws.double().requires_grad_(need[1])
    out = flce.linear_distillation(h1, w1, ht, wt, labels, return_per_token=True, **opts)
    ref, ref_div = torch_distill(h2, w2, ht.double(), wt.double(), labels,
                                 **{k: v for k, v in opts.items() if k != "memory_budget"})
    compact = dtype != torch.float32 and (opts.get("divergence", "forward_kl") == "forward_kl" or (
        opts.get("divergence") == "jsd" and opts.get("beta", 0.5) <= 0.0))
    tol, tol_grad = tolerance(dtype, compact)
    assert out.loss.dtype == torch.float32 and out.loss.shape == ref.shape, (out.loss.shape, ref.shape)
    assert out.divergence.shape == ref_div.shape and not out.divergence.requires_grad
    e = rel(out.loss.detach(), ref.detach())
    assert e < tol, f"loss rel err {e:.2e}"
    e = rel(out.divergence, ref_div)
    assert e < tol, f"per-token divergence rel err {e:.2e}"
    if not (need[0] or need[1]):
        return
    up = torch.randn(ref.shape, device=DEV, dtype=torch.float64) if opts.get("reduction") == "none" else \
        torch.tensor(upstream, device=DEV, dtype=torch.float64)
    (out.loss.double() * up).sum().backward()
    (ref * up).sum().backward()
    for name, a, b in (("dH", h1.grad, h2.grad), ("dW", w1.grad, w2.grad)):
        if b is None:
            assert a is None, f"{name} should be None"
            continue
        assert a is not None and a.dtype == dtype and a.shape == b.shape, name
        e = rel(a, b)
        assert e < tol_grad, f"{name} rel err {e:.2e} > {tol_grad}"


# ---- values and gradients ------------------------------------------------------------------------

def value_cases():
    dtypes = [torch.float32, torch.bfloat16] if GPU else [torch.float32]
    for dtype in dtypes:
        for div in DIVERGENCES:
            for ce in (0.0, 0.7):
                for temperature in ((1.0,) if ce else (1.0, 2.0)):
                    for reduction in ("mean", "sum", "none"):
                        name = f"{dtype} {div} ce={ce} T={temperature} {reduction}"
                        case(name, lambda: check(dtype=dtype, divergence=div, ce_weight=ce, temperature=temperature,
                                                 reduction=reduction, beta=0.3))
    for beta in (0.0, 1.0, 0.5, 0.9):
        case(f"jsd beta={beta}", lambda: check(divergence="jsd", beta=beta, temperature=1.5))

    def jsd_ends_are_kls():
        hs, ws, ht, wt, y = inputs(40, 16, 24, 90, seed=3)
        for beta, other in ((0.0, "forward_kl"), (1.0, "reverse_kl")):
            a = flce.linear_distillation(hs, ws, ht, wt, y, divergence="jsd", beta=beta)
            b = flce.linear_distillation(hs, ws, ht, wt, y, divergence=other)
            assert torch.equal(a, b), (beta, a, b)
    case("jsd beta=0/1 is forward/reverse KL (Liger's convention)", jsd_ends_are_kls)
    case("labels None: every token, no CE", lambda: check(with_labels=False, divergence="reverse_kl"))
    case("labels None, reduction none", lambda: check(with_labels=False, divergence="jsd", reduction="none"))
    case("int32 labels, CE", lambda: check(label_dtype=torch.int32, ce_weight=1.0))
    case("ignore_index 7 (inside the vocab)", lambda: check(ignore_index=7, ce_weight=0.5))
    case("leading dims (2,4,8)", lambda: check(n=64, lead=(2, 4, 8), divergence="jsd", reduction="none"))
    case("leading dims (4,16), mean, CE", lambda: check(n=64, lead=(4, 16), ce_weight=0.2))
    case("dH only", lambda: check(need=(True, False), divergence="reverse_kl"))
    case("dW only", lambda: check(need=(False, True), divergence="jsd"))
    case("dH only, none", lambda: check(need=(True, False), reduction="none"))
    case("no gradients", lambda: check(need=(False, False)))
    case("equal student and teacher widths", lambda: check(ds=32, dt=32))
    case("memory_budget given", lambda: check(memory_budget=1 << 20))

    def all_ignored():
        hs, ws, ht, wt, _ = inputs(9, 16, 16, 40)
        h, w = hs.requires_grad_(), ws.requires_grad_()
        y = torch.full((9,), -100, device=DEV)
        for reduction in ("mean", "sum"):
            h.grad = w.grad = None
            out = flce.linear_distillation(h, w, ht, wt, y, ce_weight=1.0, reduction=reduction)
            out.backward()
            assert out.item() == 0 and h.grad.abs().max().item() == 0 and w.grad.abs().max().item() == 0
    case("all tokens ignored: loss 0, zero gradients", all_ignored)

    def nan_teacher_row_of_ignored_token():
        hs, ws, ht, wt, y = inputs(20, 16, 16, 50, ignore=0.0)
        y[3] = -100
        ht[3] = float("nan")
        h = hs.requires_grad_()
        out = flce.linear_distillation(h, ws, ht, wt, y, divergence="jsd", return_per_token=True)
        out.loss.backward()
        assert torch.isfinite(out.loss) and torch.isfinite(out.divergence).all() and torch.isfinite(h.grad).all()
        assert out.divergence[3].item() == 0 and h.grad[3].abs().max().item() == 0
    case("a NaN teacher row of an ignored token stays out", nan_teacher_row_of_ignored_token)

    def nan_teacher_row_stays_in_token():
        hs, ws, ht, wt, y = inputs(20, 16, 16, 50, ignore=0.0)
        ht[5] = float("nan")
        out = flce.linear_distillation(hs, ws, ht, wt, y, reduction="none", return_per_token=True)
        bad = ~torch.isfinite(out.loss)
        assert bad[5] and bad.sum() == 1, bad
    case("a NaN teacher row stays in its token (reduction none)", nan_teacher_row_stays_in_token)

    def no_tokens():
        hs, ws, ht, wt, y = inputs(0, 16, 16, 40)
        h, w = hs.requires_grad_(), ws.requires_grad_()
        for reduction in ("mean", "none"):
            out = flce.linear_distillation(h, w, ht, wt, y, reduction=reduction, return_per_token=True)
            assert out.loss.shape == (() if reduction == "mean" else (0,)) and out.divergence.shape == (0,)
            out.loss.sum().backward()
    case("no tokens", no_tokens)

    def teacher_gets_no_gradient():
        hs, ws, ht, wt, y = inputs(30, 16, 24, 60)
        h, w = hs.requires_grad_(), ws.requires_grad_()
        t_h, t_w = ht.requires_grad_(), wt.requires_grad_()
        for reduction in ("mean", "none"):
            out = flce.linear_distillation(h, w, t_h, t_w, y, divergence="reverse_kl", reduction=reduction)
            out.sum().backward()
            assert t_h.grad is None and t_w.grad is None and h.grad is not None and w.grad is not None
    case("teacher inputs are detached: no gradient", teacher_gets_no_gradient)

    def module_form():
        hs, ws, ht, wt, y = inputs(30, 16, 24, 60)
        m = flce.LinearDistillation(divergence="jsd", beta=0.25, temperature=2.0)
        assert "beta=0.25" in repr(m)
        a = m(hs, ws, ht, wt, y)
        b = flce.linear_distillation(hs, ws, ht, wt, y, divergence="jsd", beta=0.25, temperature=2.0)
        assert torch.equal(a, b)
        try:
            flce.LinearDistillation(betta=0.3)
        except TypeError as e:
            assert "betta" in str(e)
        else:
            raise AssertionError("no TypeError for an unknown option")
    case("module form flce.LinearDistillation", module_form)

    def upstream_twice_then_once():
        # mean: the gradients computed in forward are scaled in backward by the upstream scalar
        hs, ws, ht, wt, y = inputs(30, 16, 24, 60)
        grads = []
        for g in (1.0, 3.0):
            h = hs.clone().requires_grad_()
            (flce.linear_distillation(h, ws, ht, wt, y) * g).backward()
            grads.append(h.grad)
        e = rel(grads[1], 3 * grads[0])
        assert e < 1e-6, e
    case("mean: upstream scalar scales the forward's gradients", upstream_twice_then_once)

    if not GPU:
        def eager_route():
            # eager: the autograd.Function route (no dispatcher); mean: one library call with gradients,
            # scaled in place by flce_scale_gradients, and a second backward through it raises; none:
            # the gradients come from a second call in backward
            import standin
            hs, ws, ht, wt, y = inputs(30, 16, 24, 60)
            h = hs.requires_grad_()
            c0, s0 = standin._distill_run.calls, standin._scale.calls
            loss = flce.linear_distillation(h, ws, ht, wt, y)
            assert type(loss.grad_fn).__name__ == "_EagerDistillBackward", loss.grad_fn
            (loss * 2).backward(retain_graph=True)
            assert (standin._distill_run.calls - c0, standin._scale.calls - s0) == (1, 1)
            try:
                loss.backward()
            except RuntimeError as e:
                assert "inplace" in str(e), e
            else:
                raise AssertionError("a second backward through the scaled gradients did not raise")
            loss = flce.linear_distillation(h, ws, ht, wt, y, reduction="none")
            c0 = standin._distill_run.calls
            loss.sum().backward()
            assert standin._distill_run.calls - c0 == 1
        case("eager route: one call + in-place scaling (mean), a second call in backward (none)", eager_route)

    if not GPU:
        def autocast_cpu():
            hs, ws, ht, wt, y = inputs(30, 16, 24, 60)
            h = hs.requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = flce.linear_distillation(h, ws, ht, wt, y)
            out.backward()
            assert h.grad.dtype == torch.float32 and torch.isfinite(out)
            ref, _ = torch_distill(*(t.to(torch.bfloat16).double() for t in (hs, ws, ht, wt)), y)
            assert rel(out.detach(), ref) < 1e-6
        case("autocast: the four tensors in its dtype", autocast_cpu)


# ---- custom op, torch.compile --------------------------------------------------------------------

def op_cases():
    def opcheck():
        hs, ws, ht, wt, y = inputs(24, 16, 24, 40)
        h, w = hs.requires_grad_(), ws.requires_grad_()
        for reduction, grads in (("mean", 3), ("sum", 1), ("none", 0)):
            torch.library.opcheck(_distill.distill_op, (h, w, ht, wt, y, None, "jsd", 0.4, 1.0, 0.5, -100, reduction,
                                                        0, grads, 0, []))
        g = torch.randn(24, device=DEV)
        torch.library.opcheck(_distill.distill_op, (hs.detach(), ws.detach(), ht, wt, None, g, "forward_kl", 0.5,
                                                    2.0, 0.0, -100, "none", 0, 3, 0, []))
        # the teacher as top-k: its ids and log-probabilities in the teacher's two places
        _, _, ids, lp, _ = topk_inputs(24, 16, 40, 6)
        for reduction, grads in (("mean", 3), ("none", 0)):
            torch.library.opcheck(_distill.distill_op, (h, w, ids, lp, y, None, "forward_kl", 0.0, 1.0, 0.0, -100,
                                                        reduction, 0, grads, 6, []))
    case("opcheck flce::distill", opcheck)

    def compiled_matches_eager(reduction, dynamic, ce):
        torch._dynamo.reset()

        def step(h, w, t_h, t_w, y):
            return flce.linear_distillation(h, w, t_h, t_w, y, divergence="jsd", beta=0.3, ce_weight=ce,
                                            reduction=reduction, return_per_token=True)
        compiled = torch.compile(step, fullgraph=True, backend=BACKEND, dynamic=dynamic)
        for n in ((40, 56) if dynamic else (40,)):
            hs, ws, ht, wt, y = inputs(n, 16, 24, 70, seed=n)
            res = []
            for fn in (step, compiled):
                h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
                out = fn(h, w, ht, wt, y)
                (out.loss * 1.5).sum().backward()
                res.append((out.loss.detach(), out.divergence, h.grad, w.grad))
            for a, b, what in zip(*res, ("loss", "divergence", "dH", "dW")):
                e = rel(b, a)
                assert e < 1e-5, f"{what} compiled vs eager rel err {e:.2e} (n={n})"
    for reduction in ("mean", "none"):
        for dynamic in (False, True):
            case(f"torch.compile fullgraph {reduction} dynamic={dynamic}",
                 lambda: compiled_matches_eager(reduction, dynamic, 0.5 if reduction == "mean" else 0.0))

    def explain_no_breaks():
        torch._dynamo.reset()
        m = flce.LinearDistillation(divergence="reverse_kl", temperature=2.0)

        def step(h, w, t_h, t_w, y):
            return m(h, w, t_h, t_w, y)
        hs, ws, ht, wt, y = inputs(32, 16, 24, 50)
        ex = torch._dynamo.explain(step)(hs.requires_grad_(), ws.requires_grad_(), ht, wt, y)
        assert ex.graph_break_count == 0 and ex.graph_count == 1, ex
    case("torch._dynamo.explain: no graph break (module form)", explain_no_breaks)

    def compiled_training_step():
        # a student module's parameters, the teacher frozen, under torch.compile: an optimizer step
        torch._dynamo.reset()
        hs, ws, ht, wt, y = inputs(32, 16, 24, 50)
        student = torch.nn.Linear(16, 16, bias=False).to(DEV)
        head = torch.nn.Parameter(ws.clone())

        @torch.compile(fullgraph=True, backend=BACKEND)
        def loss_fn(x, t_h, y):
            return flce.linear_distillation(student(x), head, t_h, wt, y, divergence="forward_kl", ce_weight=0.1)
        opt = torch.optim.SGD(list(student.parameters()) + [head], lr=0.5)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = loss_fn(hs, ht, y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0], losses
    case("torch.compile: a training step lowers the loss", compiled_training_step)

    def example_runs():
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("  (example_distill.py: transformers is not installed, not run)")
            return
        import subprocess
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run([sys.executable, os.path.join(here, "example_distill.py"), "--steps", "8"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-2000:] + r.stderr[-2000:]
    case("python/example_distill.py (tiny HF models) runs and agrees with float64", example_runs)

    def bench_dry_run():
        # bench/distill_compare.py's logic on the CPU (tiny shapes, the stand-in): every provider row
        # written, no error, the errors against its float64 reference small
        import json
        import subprocess
        import tempfile
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with tempfile.TemporaryDirectory() as out:
            r = subprocess.run([sys.executable, os.path.join(repo, "bench", "distill_compare.py"), "--cpu-dry", "--out",
                                out, "--divergence", "jsd", "--beta", "0.3"], capture_output=True, text=True,
                               timeout=600)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
            rows = json.load(open(os.path.join(out, [f for f in os.listdir(out) if f.endswith(".json")][0])))
        assert len(rows) == 12 and not any(x["error"] for x in rows if x["provider"] != "liger-jsd"), rows
        for x in rows:
            if x["provider"] not in ("cublas-floor", "liger-jsd"):
                assert x["ms"] and max(x["err_loss"], x["err_dh"], x["err_dw"]) < 1e-5, x
    if not GPU:
        case("bench/distill_compare.py --cpu-dry", bench_dry_run)


# ---- bad inputs ----------------------------------------------------------------------------------

def bad_input_cases():
    hs, ws, ht, wt, y = inputs(10, 16, 24, 30)

    def raises(kind, words, *args, **kw):
        try:
            flce.linear_distillation(*args, **kw)
        except kind as e:
            for w in words:
                assert w in str(e), f"{w!r} not in {e}"
            return
        raise AssertionError(f"no {kind.__name__} for {kw or args[-1]!r}")
    bad = [
        ("mismatched N", ValueError, ["teacher_hidden", "leading shape"], (hs, ws, ht[:9], wt, y), {}),
        ("vocab sizes differ", ValueError, ["teacher_weight", "V = 29"], (hs, ws, ht, wt[:29], y), {}),
        ("teacher width", ValueError, ["teacher_weight"], (hs, ws, ht, wt[:, :16].contiguous(), y), {}),
        ("student width", ValueError, ["student_weight"], (hs, ws[:, :8].contiguous(), ht, wt, y), {}),
        ("beta > 1", ValueError, ["beta", "[0, 1]"], (hs, ws, ht, wt, y), dict(divergence="jsd", beta=1.5)),
        ("beta < 0", ValueError, ["beta"], (hs, ws, ht, wt, y), dict(beta=-0.1)),
        ("beta a string", TypeError, ["beta"], (hs, ws, ht, wt, y), dict(beta="0.5")),
        ("temperature 0", ValueError, ["temperature"], (hs, ws, ht, wt, y), dict(temperature=0.0)),
        ("temperature nan", ValueError, ["temperature"], (hs, ws, ht, wt, y), dict(temperature=float("nan"))),
        ("ce_weight < 0", ValueError, ["ce_weight"], (hs, ws, ht, wt, y), dict(ce_weight=-1.0)),
        ("ce_weight without labels", ValueError, ["ce_weight", "labels"], (hs, ws, ht, wt, None),
         dict(ce_weight=0.5)),
        ("ce_weight at T != 1", ValueError, ["ce_weight", "temperature"], (hs, ws, ht, wt, y),
         dict(ce_weight=0.5, temperature=2.0)),
        ("divergence name", ValueError, ["divergence", "kl"], (hs, ws, ht, wt, y), dict(divergence="kl")),
        ("reduction name", ValueError, ["reduction"], (hs, ws, ht, wt, y), dict(reduction="avg")),
        ("ignore_index float", TypeError, ["ignore_index"], (hs, ws, ht, wt, y), dict(ignore_index=-100.0)),
        ("memory_budget 0", ValueError, ["memory_budget"], (hs, ws, ht, wt, y), dict(memory_budget=0)),
        ("return_per_token str", TypeError, ["return_per_token"], (hs, ws, ht, wt, y), dict(return_per_token="y")),
        ("labels shape", ValueError, ["labels", "shape"], (hs, ws, ht, wt, y[:9]), {}),
        ("labels float", ValueError, ["labels", "dtype"], (hs, ws, ht, wt, y.float()), {}),
        ("labels a list", TypeError, ["labels"], (hs, ws, ht, wt, y.tolist()), {}),
        ("teacher a list", TypeError, ["teacher_hidden"], (hs, ws, ht.tolist(), wt, y), {}),
        ("teacher dtype", ValueError, ["teacher_weight", "dtype"], (hs, ws, ht, wt.double(), y), {}),
        ("student dtype float64", ValueError, ["student_hidden", "dtype"],
         (hs.double(), ws.double(), ht.double(), wt.double(), y), {}),
        ("D not a multiple of 8", ValueError, ["student_hidden", "multiple of 8"],
         (hs[:, :12].contiguous(), ws[:, :12].contiguous(), ht, wt, y), {}),
        ("non-contiguous teacher", ValueError, ["teacher_hidden", "contiguous"],
         (hs, ws, torch.randn(24, 10, device=DEV).T, wt, y), {}),
        ("weight 3-d", ValueError, ["student_weight", "(V, D)"], (hs, ws[None], ht, wt, y), {}),
    ]
    for name, kind, words, args, kw in bad:
        case(f"bad input: {name}", lambda: raises(kind, words, *args, **kw), calls_library=False)

    def missing_symbol():
        # a library without the distillation entry points: FlceError naming the call
        real_lib, declared = _lib.lib, dict(_distill_lib._declared)

        class Old:
            pass
        try:
            _distill_lib._declared.clear()
            _lib.lib = lambda: Old()
            try:
                _distill_lib._fn(_distill_lib.LOSS_AND_GRAD)
            except flce.FlceError as e:
                assert e.call == "flce_distill_loss_and_grad" and "flce_distill_loss_and_grad" in str(e) and \
                    e.status_name == "FLCE_ERR_UNSUPPORTED", e
            else:
                raise AssertionError("no FlceError")
            assert not _distill_lib.available()
        finally:
            _lib.lib = real_lib
            _distill_lib._declared.clear()
            _distill_lib._declared.update(declared)
        if not GPU:
            import standin
            call = _distill._DistillCall(hs, ws, ht, wt, y, _distill._DistillOptions("jsd", 0.5, 1.0, 0.0, -100,
                                                                                       "mean", 0))
            if not _distill_lib.available():
                try:
                    standin._real_distill_call(call, torch.empty(()), torch.empty(10))
                except flce.FlceError as e:
                    assert "flce_distill_loss_and_grad" in str(e), e
                else:
                    raise AssertionError("no FlceError from the real call")
    case("a library without flce_distill_loss_and_grad: FlceError naming it", missing_symbol, calls_library=False)

    def library_validates_binding_problem():
        # the problem the binding builds, checked by flce_distill_problem_validate: valid as built, and
        # each field set out of range is named by the library (a wrong ctypes offset would name another)
        if not _distill_lib.available():
            print("  (the library has no distillation API: its validation not checked)")
            return
        call = _distill._DistillCall(hs, ws, ht, wt, y, _distill._DistillOptions("jsd", 0.5, 2.0, 0.0, -100, "none",
                                                                                   1 << 20))
        _distill_lib.validate(call.problem)
        for field, value, word in (("beta", 1.5, "beta"), ("temperature", 0.0, "temperature"),
                                   ("ce_weight", -1.0, "ce_weight"), ("hidden_teacher", 12, "hidden_teacher"),
                                   ("hidden_student", 4, "hidden_student"), ("vocab", 0, "vocab"),
                                   ("tokens", 0, "tokens"), ("divergence", 7, "divergence"),
                                   ("reduction", 9, "reduction"), ("label_bits", 16, "label_bits"),
                                   ("dtype", 11, "dtype"), ("ce_weight", 0.5, "temperature")):
            q = _distill_lib.DistillProblem.from_buffer_copy(call.problem)
            setattr(q, field, value)
            try:
                _distill_lib.validate(q)
            except flce.FlceError as e:
                assert f"problem.{word}" in str(e) and e.call == "flce_distill_problem_validate", (field, str(e))
            else:
                raise AssertionError(f"{field}={value}: no FlceError")
    case("flce_distill_problem_validate on the binding's problem (fields named by the library)",
         library_validates_binding_problem, calls_library=False)

    def prepare():
        for kwargs, word in ((dict(divergence="kl"), "divergence"), (dict(reduction="avg"), "reduction"),
                             (dict(device="cpu"), "device"), (dict(label_dtype=torch.int16), "label_dtype"),
                             (dict(teacher_topk=65), "teacher_topk"), (dict(teacher_topk=8), "hidden_teacher")):
            try:
                flce.prepare_linear_distillation(16, 32, 64, 100, **kwargs)
            except ValueError as e:
                assert word in str(e), str(e)
            else:
                raise AssertionError(f"{kwargs}: no error")
        # the ctypes binding of flce_distill_prepare itself (no GPU needed): a NULL context is named
        try:
            _distill_lib.distill_prepare(None, _distill_lib.new_problem(tokens=16, hidden_student=32,
                                                                        hidden_teacher=64, vocab=100))
        except flce.FlceError as e:
            assert "ctx: NULL" in str(e) and e.call == "flce_distill_prepare", str(e)
        else:
            raise AssertionError("flce_distill_prepare(NULL): no FlceError")
        if not GPU:
            return
        flce.prepare_linear_distillation(16, 32, 64, 100, divergence="jsd", beta=0.3)
        hs = torch.randn(16, 32, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        ws = (torch.randn(100, 32, device=DEV) * 0.2).bfloat16().requires_grad_()
        ht, wt = torch.randn(16, 64, device=DEV).bfloat16(), (torch.randn(100, 64, device=DEV) * 0.2).bfloat16()
        loss = flce.linear_distillation(hs, ws, ht, wt, divergence="jsd", beta=0.3)
        loss.backward()
        assert torch.isfinite(loss) and hs.grad is not None and torch.isfinite(ws.grad.float()).all()
        flce.prepare_linear_distillation(16, 32, 0, 100, teacher_topk=8)  # the top-k teacher's kernels
        _, _, ids, lp, _ = topk_inputs(16, 32, 100, 8)
        loss = flce.linear_distillation_topk(hs, ws, ids, lp)
        assert torch.isfinite(loss), loss
    case("prepare_linear_distillation: bad arguments named; on a GPU a step after it", prepare, calls_library=False)


# ---- the teacher as top-k (flce.linear_distillation_topk) ---------------------------------------

def topk_inputs(n, ds, v, k, dtype=torch.float32, seed=0, ignore=0.2):
    """The student as inputs() makes it; the teacher's k largest log-probabilities (of a random
    teacher's full log-softmax, so they are not renormalized) and their ids in a shuffled order."""
    hs, ws, ht, wt, y = inputs(n, ds, 24, v, dtype, seed, ignore=ignore)
    lp_full = torch.log_softmax(ht.double() @ wt.double().T, 1)
    vals, ids = lp_full.topk(k, 1)
    g = torch.Generator(device=DEV).manual_seed(seed + 1)
    perm = torch.randperm(k, generator=g, device=DEV)
    return hs, ws, ids[:, perm].contiguous(), vals[:, perm].float().contiguous(), y


def torch_distill_topk(hs, ws, ids, lp, labels, temperature=1.0, ce_weight=0.0, ignore_index=-100,
                       reduction="mean"):
    """The top-k forward KL in plain PyTorch (float64, autograd): Σ_K p (log p − log q)."""
    zs = hs.reshape(-1, hs.shape[-1]) @ ws.T
    lq = torch.log_softmax(zs / temperature, -1)
    lpd = lp.reshape(-1, lp.shape[-1]).double()
    d = (lpd.exp() * (lpd - lq.gather(1, ids.reshape(-1, ids.shape[-1])))).sum(-1)
    return ce_mask_reduce(zs, d, labels, ce_weight, ignore_index, reduction, hs.shape[:-1])


def check_topk(n=64, ds=32, v=300, k=16, dtype=torch.float32, seed=2, with_labels=True, **opts):
    hs, ws, ids, lp, y = topk_inputs(n, ds, v, k, dtype, seed)
    labels = y if with_labels else None
    h1, w1 = hs.clone().requires_grad_(), ws.clone().requires_grad_()
    h2, w2 = hs.double().requires_grad_(), ws.double().requires_grad_()
    out = flce.linear_distillation_topk(h1, w1, ids, lp, labels, return_per_token=True, **opts)
    ref, ref_div = torch_distill_topk(h2, w2, ids, lp, labels, **{a: b for a, b in opts.items() if a != "memory_budget"})
    tol, tol_grad = tolerance(dtype)  # the fp32 path: exact student logits, exact teacher log-probs
    e = rel(out.loss.detach(), ref.detach())
    assert e < tol, f"loss rel err {e:.2e}"
    e = rel(out.divergence, ref_div)
    assert e < tol, f"per-token divergence rel err {e:.2e}"
    up = torch.randn(ref.shape, device=DEV, dtype=torch.float64) if opts.get("reduction") == "none" else \
        torch.tensor(1.5, device=DEV, dtype=torch.float64)
    (out.loss.double() * up).sum().backward()
    (ref * up).sum().backward()
    for name, a, b in (("dH", h1.grad, h2.grad), ("dW", w1.grad, w2.grad)):
        e = rel(a, b)
        assert e < tol_grad, f"{name} rel err {e:.2e} > {tol_grad}"


def topk_cases():
    dtypes = [torch.float32, torch.bfloat16] if GPU else [torch.float32]
    for dtype in dtypes:
        for k in (1, 16, 64):
            for reduction in ("mean", "sum", "none"):
                case(f"topk teacher {dtype} k={k} {reduction}",
                     lambda: check_topk(k=k, dtype=dtype, reduction=reduction, temperature=1.5))
    case("topk teacher, CE at T = 1", lambda: check_topk(ce_weight=0.5, reduction="mean"))
    case("topk teacher, labels None", lambda: check_topk(with_labels=False, reduction="none"))
    case("topk teacher, k = V", lambda: check_topk(v=40, k=40))

    def bad_ids_are_nan():
        hs, ws, ids, lp, y = topk_inputs(8, 16, 50, 4, ignore=0.0)
        ids[2, 1] = ids[2, 0]  # repeated
        ids[5, 3] = 50 + 7     # outside [0, V)
        out = flce.linear_distillation_topk(hs, ws, ids, lp, y, reduction="none", return_per_token=True)
        bad = torch.zeros(8, dtype=torch.bool, device=DEV)
        bad[2] = bad[5] = True
        assert torch.isnan(out.divergence[bad]).all() and torch.isfinite(out.divergence[~bad]).all(), out.divergence
    case("topk teacher: repeated or out-of-range ids make that token NaN", bad_ids_are_nan)

    def compiled():
        hs, ws, ids, lp, y = topk_inputs(32, 16, 80, 8)
        f = torch.compile(flce.linear_distillation_topk, backend=BACKEND, fullgraph=True)
        a = f(hs, ws, ids, lp, y)
        b = flce.linear_distillation_topk(hs, ws, ids, lp, y)
        assert rel(a, b) < 1e-6, (a, b)
    case("topk teacher under torch.compile(fullgraph=True)", compiled)

    def bad_input():
        hs, ws, ids, lp, y = topk_inputs(8, 16, 50, 4)
        for what, args, kw in (
                ("teacher_topk_indices", (hs, ws, ids.int(), lp, y), {}),
                ("teacher_topk_logprobs", (hs, ws, ids, lp.double(), y), {}),
                ("teacher_topk_logprobs", (hs, ws, ids, lp[:, :3].contiguous(), y), {}),
                ("teacher_topk_indices", (hs, ws, ids[:4].contiguous(), lp[:4].contiguous(), y), {}),
                ("k = 65", (hs, ws, torch.zeros(8, 65, dtype=torch.int64, device=DEV),
                            torch.zeros(8, 65, device=DEV), y), {})):
            try:
                flce.linear_distillation_topk(*args, **kw)
            except ValueError as e:
                assert what in str(e), (what, str(e))
            else:
                raise AssertionError(f"{what}: no error")
    case("topk teacher: bad inputs named", bad_input, calls_library=False)

    def bench_dry_run():
        # bench/distill_topk_compare.py's logic on the CPU (a tiny shape, the stand-in): every row, no
        # error, the errors against its float64 reference small
        import json
        import subprocess
        import tempfile
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with tempfile.TemporaryDirectory() as out:
            r = subprocess.run([sys.executable, os.path.join(repo, "bench", "distill_topk_compare.py"), "--cpu-dry",
                                "--out", out], capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
            rows = json.load(open(os.path.join(out, [f for f in os.listdir(out) if f.endswith(".json")][0])))
        assert len(rows) == 4 and not any(x["error"] for x in rows), rows
        for x in rows[1:]:
            assert x["ms"] and max(x["err_loss"], x["err_dh"], x["err_dw"]) < 1e-5, x
    if not GPU:
        case("bench/distill_topk_compare.py --cpu-dry", bench_dry_run)


def main():
    global LIBRARY_CALLS
    try:
        _lib.lib()
    except flce.FlceLibraryNotFound as e:
        print(f"no libflce.so: skipped ({e})")
        return 77
    have = _distill_lib.available()
    if not GPU:
        import standin
        standin.install()
        print(f"no CUDA device: flce.linear_distillation's binding, custom op and torch.compile ({BACKEND}) on the "
              f"CPU with a float64 stand-in for flce_distill_loss_and_grad (library has it: {have})")
    else:
        print(f"{torch.cuda.get_device_name()}: flce {flce.version()} from {flce.library_path()}, torch "
              f"{torch.__version__}")
        if not have:
            LIBRARY_CALLS = False
            print(f"SKIP the cases that call the library: {flce.library_path()} has no flce_distill_loss_and_grad "
                  f"(rebuild libflce)")
    for name, section in (("values", value_cases), ("ops", op_cases), ("bad input", bad_input_cases),
                          ("teacher top-k", topk_cases)):
        t0 = time.time()
        section()
        print(f"[{name}: {time.time() - t0:.1f} s]")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 77 if skipped else 0  # (77: CTest's skip, the library calls were not tested)


if __name__ == "__main__":
    sys.exit(main())
