"""coldstart.py — the Python side of bench/coldstart.sh (issue 16): one fresh process, the first
bf16 loss and gradients of N x D x V through the binding (flce.linear_cross_entropy, then
backward), timed from before the call to a synchronize after backward: NVRTC or the disk cache,
module loads, the workspace and the kernels. Prints one JSON line: first_call_s, process_s (from
the interpreter's start, `import torch` included), import_s, ok, error.

    FLCE_LIBRARY=build/libflce.so PYTHONPATH=python python3 bench/coldstart.py 8192 4096 128256
"""
import json
import sys
import time

T_MAIN = time.perf_counter()


def main():
    n, d, v = (int(a) for a in sys.argv[1:4])
    row = {"first_call_s": None, "process_s": None, "import_s": None, "ok": False, "error": None}
    try:
        import torch
        import flce
        row["import_s"] = round(time.perf_counter() - T_MAIN, 4)
        dev = torch.device("cuda", 0)
        g = torch.Generator(device=dev).manual_seed(0)
        h = torch.randn(n, d, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
        w = (0.02 * torch.randn(v, d, device=dev, dtype=torch.bfloat16, generator=g)).requires_grad_()
        y = torch.randint(0, v, (n,), device=dev, generator=g)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        loss = flce.linear_cross_entropy(h, w, y)
        loss.backward()
        torch.cuda.synchronize(dev)
        t1 = time.perf_counter()
        row.update(first_call_s=round(t1 - t0, 4), process_s=round(t1 - T_MAIN, 4),
                   ok=bool(torch.isfinite(loss).item()))
    except Exception as e:  # one JSON line whatever happens: the script reads it
        row["error"] = f"{type(e).__name__}: {e}"[:500]
        row["process_s"] = round(time.perf_counter() - T_MAIN, 4)
    print(json.dumps(row), flush=True)
    return 0 if row["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
