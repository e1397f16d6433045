"""coldstart.py — the Python side of bench/coldstart.sh (issue 16): one fresh process, the first
bf16 loss and gradients of N x D x V through the binding (flce.linear_cross_entropy, then
backward), timed from before the call to a synchronize after backward: NVRTC or the disk cache,
module loads, the workspace and the kernels. Prints one JSON line:
  first_call_s      forward + backward + synchronize, the first time
  forward_return_s  when the forward returned (host side: its compiles and launches; no sync)
  first_call_cpu_s  the process's CPU time (all threads) during the first call: NVRTC's work when
                    it compiles (a compile cache hit costs little)
  second_call_s     the same again (everything loaded)
  process_s         from the interpreter's start to the end of the first call
  import_s          `import torch` and `import flce`
  setup_s           CUDA initialization and the inputs (torch.randn ...), synchronized
  log               [[t, line], ...]: every line written to the process's stderr (fd 2: the
                    library's FLCE_LOG lines; bench/coldstart.sh sets FLCE_LOG=debug), t = seconds
                    since the start of the first call, taken when a reader thread got the line
                    from a pipe (the GIL is free while the library runs: ctypes releases it)
  ok, error

    FLCE_LOG=debug FLCE_LIBRARY=build/libflce.so PYTHONPATH=python python3 bench/coldstart.py 8192 4096 128256
"""
import json
import os
import resource
import sys
import threading
import time

T_MAIN = time.perf_counter()
LOG_MAX = 512


def cpu_s():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class StderrLines:
    """fd 2 through a pipe: each line with its arrival time, copied to the original stderr."""

    def __init__(self):
        self.lines, self.dropped = [], 0
        self.saved = os.dup(2)
        r, w = os.pipe()
        os.dup2(w, 2)
        os.close(w)
        self.r = r
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        buf = b""
        while True:
            chunk = os.read(self.r, 65536)
            if not chunk:
                break
            t = time.perf_counter()
            os.write(self.saved, chunk)
            buf += chunk
            *done, buf = buf.split(b"\n")
            for line in done:
                if len(self.lines) < LOG_MAX:
                    self.lines.append((t, line.decode("utf-8", "replace")[:400]))
                else:
                    self.dropped += 1

    def stop(self):
        try:
            sys.stderr.flush()
        except Exception:
            pass
        os.dup2(self.saved, 2)  # the pipe's last write end: the reader sees EOF
        self.thread.join(timeout=5)
        os.close(self.r)


def main():
    n, d, v = (int(a) for a in sys.argv[1:4])
    row = {"first_call_s": None, "forward_return_s": None, "first_call_cpu_s": None, "second_call_s": None,
           "process_s": None,
           "import_s": None, "setup_s": None, "ok": False, "error": None}
    log = StderrLines()
    t0 = None
    try:
        import torch
        import flce
        row["import_s"] = round(time.perf_counter() - T_MAIN, 4)
        ts = time.perf_counter()
        dev = torch.device("cuda", 0)
        g = torch.Generator(device=dev).manual_seed(0)
        h = torch.randn(n, d, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
        w = (0.02 * torch.randn(v, d, device=dev, dtype=torch.bfloat16, generator=g)).requires_grad_()
        y = torch.randint(0, v, (n,), device=dev, generator=g)
        torch.cuda.synchronize(dev)
        row["setup_s"] = round(time.perf_counter() - ts, 4)
        for call in range(2):
            h.grad = w.grad = None
            tc, cc = time.perf_counter(), cpu_s()
            if call == 0:
                t0 = tc
            loss = flce.linear_cross_entropy(h, w, y)
            tf = time.perf_counter()
            loss.backward()
            torch.cuda.synchronize(dev)
            t1 = time.perf_counter()
            if call == 0:
                row.update(first_call_s=round(t1 - tc, 4), forward_return_s=round(tf - tc, 4),
                           first_call_cpu_s=round(cpu_s() - cc, 4), process_s=round(t1 - T_MAIN, 4),
                           ok=bool(torch.isfinite(loss).item()))
            else:
                row["second_call_s"] = round(t1 - tc, 4)
    except Exception as e:  # one JSON line whatever happens: the script reads it
        row["error"] = f"{type(e).__name__}: {e}"[:500]
        row["process_s"] = round(time.perf_counter() - T_MAIN, 4)
    log.stop()
    base = t0 if t0 is not None else time.perf_counter()
    row["log"] = [[round(t - base, 4), line] for t, line in log.lines]
    row["log_dropped"] = log.dropped
    print(json.dumps(row), flush=True)
    return 0 if row["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
