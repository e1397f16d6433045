#!/usr/bin/env python3
"""test_topk.py — flce.topk_logprobs (issue 44 item 2) against the top-k of float64 logits.

On a GPU the library call (flce_topk_logprobs); without one the binding, its custom op and
torch.compile run against python/standin.py's float64 stand-in, and the library's own checks of the
problem the binding builds (flce_topk_problem_validate) still run. Checked: log-probs and lse within
1e-5·(1 + |value|) of float64 (the GPU's fp32 sums may order near-equal logits either way, so an
index may differ from float64's only where their logits agree as closely), equal logits (twin
weight rows) in index order, leading batch dimensions, torch.compile(fullgraph=True), and each bad
argument raising an error that names it. Exit 0 when all pass, 1 on a failure, 77 without torch or
libflce.so. Last line: 'N passed, N failed, N skipped'.
"""
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)

import flce  # noqa: E402
from flce import _distill_lib, _lib  # noqa: E402

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
BACKEND = os.environ.get("FLCE_TEST_COMPILE_BACKEND", "inductor" if GPU else "aot_eager")
passed, failed = 0, 0


def case(name, fn):
    global passed, failed
    t0 = time.time()
    try:
        fn()
        passed += 1
        if time.time() - t0 > 5:
            print(f"  ({name}: {time.time() - t0:.1f} s)")
    except Exception as e:  # noqa: BLE001
        failed += 1
        print(f"FAIL {name}: {type(e).__name__}: {e}")


def inputs(n, d, v, dtype, twin=-1, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).to(dtype)
    w = (torch.randn(v, d, generator=g) * (2.0 / math.sqrt(d))).to(dtype)
    if twin >= 0:
        w[twin + 1] = w[twin]
    return h.to(DEV), w.to(DEV)


def check(out, h, w, k, temperature, twin=-1):
    z = (h.double() @ w.double().T) / temperature
    lse = torch.logsumexp(z, dim=-1)
    vals, idx = torch.sort(z, dim=-1, descending=True, stable=True)
    lp, ix, ls = out.logprobs.double(), out.indices, out.lse.double()
    assert out.logprobs.dtype == torch.float32 and out.indices.dtype == torch.int64 and out.lse.dtype == torch.float32
    assert lp.shape == (*h.shape[:-1], k) and ix.shape == lp.shape and ls.shape == h.shape[:-1], (lp.shape, ls.shape)
    z2, lp2, ix2 = z.reshape(-1, z.shape[-1]), lp.reshape(-1, k), ix.reshape(-1, k)
    vals2, idx2, lse2 = vals.reshape(-1, z.shape[-1])[:, :k], idx.reshape(-1, z.shape[-1])[:, :k], lse.reshape(-1)
    assert torch.all((ls.reshape(-1) - lse2).abs() <= 1e-5 * (1 + lse2.abs())), "lse"
    assert torch.all((lp2 - (vals2 - lse2[:, None])).abs() <= 1e-5 * (1 + vals2.abs() + lse2.abs()[:, None])), \
        f"log-probs: largest error {(lp2 - (vals2 - lse2[:, None])).abs().max().item():.2e}"
    got_z = torch.gather(z2, 1, ix2.clamp(0, z2.shape[1] - 1))
    assert torch.all((ix2 == idx2) | ((got_z - vals2).abs() <= 1e-5 * (1 + vals2.abs()))), "indices"
    assert torch.all(ix2.sort(dim=1).values[:, 1:] != ix2.sort(dim=1).values[:, :-1]) if k > 1 else True, "an index twice"
    if twin >= 0:  # equal logits: the lower index first, right before its twin
        at = (ix2 == twin + 1).nonzero()
        for r, q in at.tolist():
            assert q > 0 and ix2[r, q - 1].item() == twin, f"row {r}: twin {twin + 1} at rank {q} not after {twin}"


def value_cases():
    for dtype, n, d, v, k, t in ((torch.bfloat16, 200, 64, 1000, 5, 1.0), (torch.float16, 64, 32, 500, 1, 2.0),
                                 (torch.float32, 64, 32, 40, 40, 1.0), (torch.bfloat16, 300, 64, 3001, 64, 0.7)):
        def run(dtype=dtype, n=n, d=d, v=v, k=k, t=t):
            h, w = inputs(n, d, v, dtype)
            check(flce.topk_logprobs(h, w, k, temperature=t), h, w, k, t)
        case(f"{dtype} {n}x{d}x{v} k={k} T={t} matches float64", run)

    def chunks():
        h, w = inputs(300, 64, 3001, torch.bfloat16, seed=3)
        check(flce.topk_logprobs(h, w, 64, memory_budget=3008 * 4 * 100), h, w, 64, 1.0)
    case("several token chunks (memory_budget) match float64", chunks)

    def twins():
        h, w = inputs(128, 64, 800, torch.bfloat16, twin=17, seed=4)
        check(flce.topk_logprobs(h, w, 64), h, w, 64, 1.0, twin=17)
    case("equal logits (twin weight rows): the lower index first", twins)

    def batch_dims():
        h, w = inputs(24, 32, 300, torch.bfloat16, seed=5)
        out = flce.topk_logprobs(h.reshape(2, 3, 4, 32), w, 7)
        check(out, h.reshape(2, 3, 4, 32), w, 7, 1.0)
    case("leading batch dimensions are kept", batch_dims)

    def compiled():
        h, w = inputs(64, 32, 500, torch.bfloat16, seed=6)

        def f(h, w):
            out = flce.topk_logprobs(h, w, 8, temperature=0.5)
            return out.logprobs.exp().sum(-1), out.indices
        g = torch.compile(f, fullgraph=True, backend=BACKEND)
        a, ia = g(h, w)
        b, ib = f(h, w)
        assert torch.equal(ia, ib) and torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    case(f"torch.compile(fullgraph=True, backend={BACKEND}) equals eager", compiled)

    def no_grad():
        h, w = inputs(16, 32, 100, torch.float32, seed=7)
        h.requires_grad_(True)
        out = flce.topk_logprobs(h, w, 3)
        assert not out.logprobs.requires_grad and not out.lse.requires_grad
    case("outputs carry no gradient", no_grad)


def bad_input_cases():
    h, w = inputs(8, 32, 100, torch.bfloat16)
    for name, kwargs, word, exc in (("k=0", dict(k=0), "k", ValueError), ("k=65", dict(k=65), "k", ValueError),
                                    ("k > V", dict(k=101), "k", ValueError), ("k=True", dict(k=True), "k", ValueError),
                                    ("T=0", dict(k=3, temperature=0.0), "temperature", ValueError),
                                    ("T=nan", dict(k=3, temperature=float("nan")), "temperature", ValueError),
                                    ("memory_budget=0", dict(k=3, memory_budget=0), "memory_budget", ValueError)):
        def run(kwargs=kwargs, word=word, exc=exc):
            try:
                flce.topk_logprobs(h, w, **kwargs)
            except exc as e:
                assert word in str(e), str(e)
            else:
                raise AssertionError("no error")
        case(f"bad argument {name}: {exc.__name__} naming {word}", run)

    def shapes():
        for hh, ww, word in ((h[:, :16], w, "hidden"), (h, w.float(), "dtype"), (h.int(), w, "hidden")):
            try:
                flce.topk_logprobs(hh, ww, 3)
            except (ValueError, TypeError) as e:
                assert word in str(e), str(e)
            else:
                raise AssertionError(f"{word}: no error")
    case("mismatched shapes and dtypes are named", shapes)

    def library_checks():  # the library's own validation of what the binding builds, no GPU needed
        p = _distill_lib.new_topk_problem(tokens=8, hidden=32, vocab=100, dtype=_lib.FLCE_DTYPE_BF16, k=3,
                                          temperature=1.0)
        _distill_lib.topk_validate(p)
        for field, value, word in (("k", 65, "problem.k=65"), ("hidden", 12, "problem.hidden=12"),
                                   ("temperature", -1.0, "problem.temperature")):
            q = _distill_lib.TopkProblem.from_buffer_copy(p)
            setattr(q, field, value)
            try:
                _distill_lib.topk_validate(q)
            except flce.FlceError as e:
                assert word in str(e) and e.call == "flce_topk_problem_validate", str(e)
            else:
                raise AssertionError(f"{field}={value}: no FlceError")
    case("flce_topk_problem_validate names the field", library_checks)

    def vocab_parallel():  # the TP fields: the library names them, the block's size; the binding's own errors
        p = _distill_lib.new_topk_problem(tokens=8, hidden=32, vocab=100, dtype=_lib.FLCE_DTYPE_BF16, k=3,
                                          vocab_offset=100, vocab_total=250, tp_rank=1, tp_size=3)
        _distill_lib.topk_validate(p)
        assert _distill_lib.topk_stats_bytes(p) == 4 * (8 + 8 * (2 + 2 * 3))
        for field, value, word in (("tp_rank", 3, "problem.tp_rank=3"), ("vocab_offset", 200, "vocab_offset + vocab"),
                                   ("tp_size", 5000, "problem.tp_size=5000")):
            q = _distill_lib.TopkProblem.from_buffer_copy(p)
            setattr(q, field, value)
            try:
                _distill_lib.topk_validate(q)
            except flce.FlceError as e:
                assert word in str(e), str(e)
            else:
                raise AssertionError(f"{field}={value}: no FlceError")
        for kwargs, word in ((dict(vocab_offset=-1, vocab_total=100), "vocab_offset"),
                             (dict(vocab_offset=50, vocab_total=100), "vocab_total"),
                             (dict(vocab_offset=0, vocab_total=100, temperature=0.0), "temperature")):
            try:  # (each raises before any torch.distributed call)
                flce.vocab_parallel_topk_logprobs(h, w, 3, **kwargs)
            except ValueError as e:
                assert word in str(e), str(e)
            else:
                raise AssertionError(f"{kwargs}: no error")
    case("vocab_parallel_topk_logprobs: TP fields checked by the library, bad arguments named", vocab_parallel)

    def prepare():
        for kwargs, word in ((dict(k=0), "k"), (dict(k=65), "k"), (dict(k=3, device="cpu"), "device"),
                             (dict(k=3, dtype=torch.int8), "dtype")):
            try:
                flce.prepare_topk_logprobs(8, 32, 100, **kwargs)
            except ValueError as e:
                assert word in str(e), str(e)
            else:
                raise AssertionError(f"{kwargs}: no error")
        # the ctypes binding of flce_topk_prepare itself (no GPU needed): a NULL context is named
        p = _distill_lib.new_topk_problem(tokens=8, hidden=32, vocab=100, dtype=_lib.FLCE_DTYPE_BF16, k=3)
        try:
            _distill_lib.topk_prepare(None, p)
        except flce.FlceError as e:
            assert "ctx: NULL" in str(e) and e.call == "flce_topk_prepare", str(e)
        else:
            raise AssertionError("flce_topk_prepare(NULL): no FlceError")
        if not GPU:  # no context without a GPU: the error names the device
            try:
                flce.prepare_topk_logprobs(8, 32, 100, 3)
            except ValueError as e:
                assert "device" in str(e), str(e)
            else:
                raise AssertionError("prepare without a CUDA device: no error")
            return
        flce.prepare_topk_logprobs(64, 32, 500, 8, temperature=0.5)  # compiles or loads, then the call
        h, w = inputs(64, 32, 500, torch.bfloat16, seed=8)
        check(flce.topk_logprobs(h, w, 8, temperature=0.5), h, w, 8, 0.5)
    case("prepare_topk_logprobs: bad arguments named; on a GPU the call after it", prepare)


def main():
    try:
        _lib.lib()
    except flce.FlceLibraryNotFound as e:
        print(f"no libflce.so: skipped ({e})")
        return 77
    if not GPU:
        import standin
        standin.install()
        print(f"no CUDA device: flce.topk_logprobs's binding, custom op and torch.compile ({BACKEND}) on the CPU "
              f"with a float64 stand-in for flce_topk_logprobs")
    else:
        print(f"{torch.cuda.get_device_name()}: flce {flce.version()} from {flce.library_path()}, torch {torch.__version__}")
    for name, section in (("values", value_cases), ("bad input", bad_input_cases)):
        t0 = time.time()
        section()
        print(f"[{name}: {time.time() - t0:.1f} s]")
    print(f"{passed} passed, {failed} failed, 0 skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
