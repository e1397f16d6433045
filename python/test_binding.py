#!/usr/bin/env python3
"""test_binding.py — tests of the flce PyTorch binding against torch's own cross_entropy in float64.

  python3 python/test_binding.py        # on a CUDA machine: the real library on the GPU
                                        # without CUDA (torch installed): the autograd plumbing, with
                                        # the library's kernels replaced by a float64 torch version
Exit status 0 when all pass, 1 on a failure, 77 when torch is missing (a skip, as in CTest).
The last line reads 'N passed, N failed'.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)

import flce  # noqa: E402
from flce import _lib  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
passed, failed = 0, 0


def case(name, fn):
    global passed, failed
    try:
        fn()
        passed += 1
    except Exception as e:  # noqa: BLE001
        failed += 1
        print(f"FAIL {name}: {type(e).__name__}: {e}")


def rel(a, b):
    a, b = a.double(), b.double()
    d = b.norm().item()
    return (a - b).norm().item() / d if d else (a - b).norm().item()


def fake_call(self, op, strategy, **outs):
    """Stands in for the library without a GPU: flce.h's math in float64, same inputs and outputs."""
    p = self.problem
    p.strategy = _lib.STRATEGIES[strategy]
    _lib.validate(p)
    h, w, y = self.hidden.double(), self.weight.double(), self.labels
    z = h @ w.T
    lse = torch.logsumexp(z, 1)
    valid = y != p.ignore_index
    yc = torch.where(valid, y.long(), 0)
    loss_i = (lse - z.gather(1, yc[:, None])[:, 0]) * valid
    count = int(valid.sum())
    loss = {0: loss_i.sum() / max(count, 1), 1: loss_i.sum(), 2: loss_i}[p.reduction]
    if op != _lib.FLCE_OP_BACKWARD:
        for name, val in (("loss", loss), ("lse", lse)):
            if outs.get(name) is not None:
                outs[name].copy_(val)
    else:
        assert torch.allclose(outs["lse"].double(), lse, rtol=1e-5, atol=1e-5), "backward got a wrong lse"
    if op == _lib.FLCE_OP_FORWARD:
        return
    g = torch.ones((), dtype=torch.float64) if outs.get("grad_output") is None else outs["grad_output"].double()
    if p.reduction == _lib.FLCE_REDUCTION_MEAN:
        g = g / max(count, 1)
    dz = torch.softmax(z, 1)
    dz[torch.arange(h.shape[0]), yc] -= 1
    dz *= (g * valid)[:, None]
    if outs.get("grad_hidden") is not None:
        outs["grad_hidden"].copy_(dz @ w)
    if outs.get("grad_weight") is not None:
        outs["grad_weight"].copy_(dz.T @ h)


def check_against_torch(n, d, v, dtype, reduction, strategy, label_dtype, lead=None, budget=None,
                        need=(True, True), upstream=2.0, ignore_index=-100, std=2.0):
    g = torch.Generator(device=DEV).manual_seed(n * 7919 + d * 31 + v)
    h = torch.randn(n, d, device=DEV, generator=g).to(dtype)
    w = (torch.randn(v, d, device=DEV, generator=g) * (std / math.sqrt(d))).to(dtype)
    y = torch.randint(0, v, (n,), device=DEV, generator=g).to(label_dtype)
    y[torch.rand(n, device=DEV, generator=g) < 0.1] = ignore_index
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


def main():
    if not GPU:
        print("no CUDA device: testing the binding's autograd plumbing with a float64 stand-in for the kernels")
        flce._Call.__call__ = fake_call
        # AUTO's choice without a device: recompute under a small budget, as the planner decides
        flce._Call.strategy_of = lambda self, op, strategy: (
            "recompute" if strategy == "auto" and 0 < self.problem.memory_budget < (1 << 21) else "chunked")
        flce._require_cuda = lambda hidden: None
    else:
        print(f"{torch.cuda.get_device_name()}: flce {flce.version()} from {flce.library_path()}")
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
        case(f"{dtype} N=1", lambda: check_against_torch(1, 8, 50, dtype, "mean", "auto", torch.int64))
        case(f"{dtype} V=1", lambda: check_against_torch(17, 8, 1, dtype, "sum", "auto", torch.int64))
        case(f"{dtype} all ignored", lambda: _all_ignored(dtype))
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
        # 515 tokens x 3001 vocab in 1 MiB: AUTO recomputes, so the binding runs forward now and
        # flce_backward later, exactly what strategy='recompute' runs: the same bits, and a second
        # backward (retain_graph) works.
        g = torch.Generator(device=DEV).manual_seed(5)
        h = torch.randn(515, 72, device=DEV, generator=g)
        w = torch.randn(3001, 72, device=DEV, generator=g) * 0.2
        y = torch.randint(0, 3001, (515,), device=DEV, generator=g)
        call = flce._Call(h, w, y, flce._Options(-100, "mean", "auto", 1 << 20, 0.0, 0.0, 0.0, 1.0))
        assert call.strategy_of(_lib.FLCE_OP_LOSS_AND_GRAD, "auto") == "recompute"
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

    def second_backward_refused():
        h = torch.randn(8, 8, device=DEV, requires_grad=True)
        out = flce.linear_cross_entropy(h, torch.randn(5, 8, device=DEV), torch.randint(0, 5, (8,), device=DEV))
        out.backward(retain_graph=True)
        try:
            out.backward()
        except RuntimeError:
            return
        raise AssertionError("a second backward should raise")
    case("second backward refused", second_backward_refused)

    def bad_args():
        h = torch.randn(8, 16, device=DEV)
        w = torch.randn(5, 16, device=DEV)
        y = torch.randint(0, 5, (8,), device=DEV)
        for kwargs, args in (({}, (h.half(), w, y)), ({}, (h, w, y[:4])), ({}, (h, w.T.contiguous().T, y)),
                             ({"reduction": "avg"}, (h, w, y)), ({}, (h[:, :12].contiguous(), w[:, :12].contiguous(), y))):
            try:
                flce.linear_cross_entropy(*args, **kwargs)
            except ValueError:
                continue
            raise AssertionError(f"no ValueError for {kwargs} {[tuple(a.shape) for a in args]}")
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

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def _all_ignored(dtype):
    h = torch.randn(9, 16, device=DEV).to(dtype).requires_grad_()
    w = torch.randn(40, 16, device=DEV).to(dtype).requires_grad_()
    out = flce.linear_cross_entropy(h, w, torch.full((9,), -100, device=DEV))
    out.backward()
    assert out.item() == 0 and h.grad.abs().max().item() == 0 and w.grad.abs().max().item() == 0


if __name__ == "__main__":
    sys.exit(main())
