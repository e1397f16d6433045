#!/usr/bin/env python3
"""compare.py — flce side by side with cuBLAS floors, PyTorch eager and torch.compile, in one process.

For each shape N x D x V (tokens x hidden x vocab, bf16) and each logit std (default 4 and 0.5: the
peaked and the near-uniform regime) it times every provider with CUDA events (median of --iters
runs after --warmup), measures the extra device memory of one call, and compares loss and gradients
with a float64 reference computed on the GPU. All rows go into one JSON file and one Markdown file,
<out>/compare-<device>-<date>[-tag].{json,md}, rewritten after every provider (so a run cut short
keeps what it measured); the Markdown also goes to stdout at the end, progress to stderr.

  python3 bench/compare.py                                  # five shapes x stds 4,0.5 (~4-6 min on an H100)
  python3 bench/compare.py --out "$OUT" --roles             # also the three GEMM roles by cuBLAS
  python3 bench/compare.py --quick                          # two small shapes, fewer iters
  python3 bench/compare.py --shapes 8192x4096x128256 --stds 4 --providers cublas-floor,flce-default

Providers (TFLOP/s count 6NVD for fwd+bwd rows, 2NVD for forward and role rows, whatever a provider
really does):
  cublas-floor         fwd+bwd  the three GEMMs of 6NVD at full size (torch.matmul, bf16), nothing else
  cublas-logits        fwd      one GEMM of the logits
  torch-eager          fwd+bwd  F.cross_entropy(F.linear(h, w).float(), y)
  torch-compile        fwd+bwd  torch.compile of the same function (default mode, dynamic=False; compiled
                                once per shape, reused for every logit std)
  flce-default         fwd+bwd  flce.linear_cross_entropy, strategy AUTO, default budget (512 MiB), bf16 dW
  flce-main-grad       fwd+bwd  flce_loss_and_grad (AUTO) called through the binding's ctypes layer with
                                problem.accumulate_grad_weight = 1: dW is added into a preallocated fp32
                                V x D buffer (Megatron's main_grad; an input, not counted in extra MiB),
                                dH is bf16. The buffer is zeroed before the checked call only.
  flce-lean            fwd+bwd  flce-default with memory_budget = 128 MiB
  flce-recompute       fwd+bwd  strategy recompute (forward, then a backward that recomputes the logits)
  flce-chunked         fwd+bwd  strategy chunked, forced (before this version "flce-chunked" was AUTO,
                                now flce-default; "flce-chunked-128MiB" is accepted for flce-lean)
  flce-forward         fwd      flce forward only (loss; lse computed, no gradients)
 with --roles (or named in --providers), the GEMM roles of flce timed with cuBLAS on the same layouts:
  cublas-role-logits   role     H[NxD] . W[VxD]^T -> bf16 N x V (same as cublas-logits)
  cublas-role-dh       role     dZ[NxV] bf16 . W[VxD] -> N x D
  cublas-role-dw       role     dZ^T[VxN] . H[NxD] -> V x D   (dZ: a preallocated random bf16 N x V input)
 and flce's own role kernels, each one's time per call inside flce's AUTO loss-and-grad (and forward)
 calls, from `FLCE_DEV=grad_streams=0 flce bench --timeline --json` run as a subprocess (--flce-bin; dH
 and dW one after the other so their times do not overlap; CUDA events between
 launches, so in-run, back to back with the other kernels, where the cuBLAS role rows time one GEMM
 in a loop; vs_role: ms / the cublas-inrun row of the same GEMM, else the cublas-role row):
  cublas-inrun-logits, -dh, -dw  role  cublas-floor's three GEMMs back to back with events between them:
                                each one's time inside the sequence (what the flce-role rows compare to)
  flce-role-logits     role     the logits pass of AUTO's strategy (chunked: the compact-logits epilogue)
  flce-role-logits-dz  role     recompute's logits pass writing dZ (when AUTO recomputes)
  flce-role-logits-stats role   the forward's logits pass (statistics epilogue only)
  flce-role-dz         role     the dZ pass over the compact logits (memory-bound: no TFLOP/s)
  flce-role-dh         role     dH = dZ . W, all launches of one call
  flce-role-dw         role     dW = dZ^T . H, all launches of one call
 with --portable, the Ampere path on this GPU (issue 19), from the same tools as subprocesses:
  flce-portable-default fwd+bwd `FLCE_PORTABLE=1 flce bench --strategies auto` (the mma.sync tile,
                                its own data; errors are flce bench's sampled ones)
  flce-portable-forward fwd     the same, forward only
  mma-sync-peak        peak     `flce_mma_peak bf16`: the mma.sync ceiling (tflops; vs_peak of the
                                portable rows = their TFLOP/s over it)
  ffma-peak            peak     `flce_mma_peak f32`: the fp32 FFMA ceiling, the fp32 path's reference

Each row: shape, provider, mode, ms (median), ms_min, ms_max, tflops, vs_floor (ms / cublas-floor,
forward rows / cublas-logits), extra_mib, err_loss, err_dh, err_dw, logit_std, strategy and
auto_choice (flce rows: requested, and what the library runs: flce_strategy_of), sm_mhz, power_w,
clock_reasons and gpu_samples (NVML, sampled every 50 ms while the timed calls run; no clock data
without libnvidia-ml), joules (the board's energy counter over the timed calls, per call: what a
power-capped GPU trades clock for), error (a failure: the row's numbers are null), note, device, date, commit, torch.
"""
import argparse
import datetime
import gc
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flce  # noqa: E402
import stamp  # noqa: E402  (bench/, the script's own folder)

ALL_SHAPES = ["8192x4096x128256", "8192x2304x256000", "4096x2048x32000", "32768x4096x128256",
              "512x4096x128256"]
QUICK_SHAPES = ["4096x2048x32000", "8192x4096x128256"]
DEFAULT_STDS = [4.0, 0.5]
IGNORE = -100
MiB = 1 << 20
LEAN_BUDGET = 128 << 20

T_START = time.time()


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')} +{time.time() - T_START:5.0f}s] {msg}", file=sys.stderr, flush=True)


def parse_shape(s):
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", s.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"shape {s!r}: expected NxDxV, e.g. 8192x4096x128256")
    return tuple(int(g) for g in m.groups())


def parse_stds(s):
    try:
        stds = [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"stds {s!r}: expected comma-separated numbers, e.g. 4,0.5")
    if not stds or any(not (x > 0 and math.isfinite(x)) for x in stds):
        raise argparse.ArgumentTypeError(f"stds {s!r}: expected positive numbers")
    return stds


# ---- data and the float64 reference ----------------------------------------------------------

def make_data(n, d, v, logit_std, seed, device="cuda"):
    """hidden ~ N(0, 1), weight ~ N(0, (std/sqrt(D))^2) so logits have std ~ logit_std; made in fp32,
    cast to bf16. Labels uniform in [0, V), about 5% set to ignore_index."""
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(n, d, device=device, generator=g).to(torch.bfloat16)
    w32 = torch.randn(v, d, device=device, generator=g)
    w = w32.mul_(logit_std / math.sqrt(d)).to(torch.bfloat16)
    del w32
    y = torch.randint(0, v, (n,), device=device, generator=g, dtype=torch.int64)
    y[torch.rand(n, device=device, generator=g) < 0.05] = IGNORE
    return h, w, y


@torch.no_grad()
def reference(h, w, y, samples, seed, chunk_elems=1 << 27):
    """Float64 on the GPU: the exact mean loss over all tokens (logits in chunks of rows), and the
    exact gradient rows of dH for `samples` random valid tokens and of dW for `samples` vocab rows
    (half of them labels that occur, so the one-hot term is exercised)."""
    n, v = h.shape[0], w.shape[0]
    w64 = w.double()
    valid = y != IGNORE
    count = int(valid.sum())
    g = 1.0 / max(count, 1)
    lse = torch.empty(n, dtype=torch.float64, device=h.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=h.device)
    rows = max(1, min(n, chunk_elems // v))  # default: 1 GiB of fp64 logits per chunk
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        z = h[r0:r1].double() @ w64.T
        lse_c = torch.logsumexp(z, dim=1)
        zy = z.gather(1, y[r0:r1].clamp(min=0).unsqueeze(1)).squeeze(1)
        loss_sum += ((lse_c - zy) * valid[r0:r1]).sum()
        lse[r0:r1] = lse_c
        del z, lse_c, zy
    mean = (loss_sum / max(count, 1)).item()

    gen = torch.Generator(device=h.device).manual_seed(seed + 1)
    valid_idx = valid.nonzero().squeeze(1)
    tok = valid_idx[torch.randperm(valid_idx.numel(), device=h.device, generator=gen)[:samples]]
    zs = h[tok].double() @ w64.T
    ps = torch.softmax(zs, dim=1)
    ps[torch.arange(tok.numel(), device=h.device), y[tok]] -= 1
    dh_ref = (ps @ w64) * g
    del zs, ps

    present = y[valid].unique()
    from_labels = present[torch.randperm(present.numel(), device=h.device, generator=gen)[:samples // 2]]
    rand_rows = torch.randperm(v, device=h.device, generator=gen)[:samples]
    voc = list(dict.fromkeys(from_labels.tolist() + rand_rows.tolist()))[:samples]  # dedupe, keep order
    voc = torch.tensor(voc, dtype=torch.int64, device=h.device)
    h64 = h.double()
    pr = torch.exp(h64 @ w64[voc].T - lse[:, None])
    pr -= (y[:, None] == voc[None, :]).double()
    pr *= (valid.double() * g)[:, None]
    dw_ref = pr.T @ h64
    return {"mean": mean, "tok": tok, "dh": dh_ref, "voc": voc, "dw": dw_ref}


def rel_l2(x, ref):
    x = x.double()
    return ((x - ref).norm() / ref.norm()).item()


def errors(out, ref):
    loss, dh, dw = out
    e = {"err_loss": abs(loss.double().item() - ref["mean"]) / abs(ref["mean"])}
    if dh is not None:
        e["err_dh"] = rel_l2(dh[ref["tok"]], ref["dh"])
    if dw is not None:
        e["err_dw"] = rel_l2(dw[ref["voc"]], ref["dw"])
    return e


# ---- providers -------------------------------------------------------------------------------
# A factory(h, w, y, state) returns step(): one timed call, returning (loss, dh, dw) or None.
# Optional attributes of step: before_check (called before the checked call), strategy,
# auto_choice, note. `state` lives for one shape (all stds): the compiled torch function.

def torch_ce(h, w, y):
    return F.cross_entropy(F.linear(h, w).float(), y, ignore_index=IGNORE)


def grads_of(fn, h, w, y):
    hg, wg = h.detach().requires_grad_(), w.detach().requires_grad_()

    def step():
        loss = fn(hg, wg, y)
        dh, dw = torch.autograd.grad(loss, (hg, wg))
        return loss.detach(), dh, dw
    return step


def random_dz(h, w):
    """A bf16 N x V stand-in for dZ (values do not change a GEMM's work): an input, allocated
    before the memory baseline."""
    return torch.randn(h.shape[0], w.shape[0], device=h.device, dtype=h.dtype)


def p_cublas_floor(h, w, y, state):
    dz = random_dz(h, w)

    def step():
        logits = torch.matmul(h, w.T)
        dh = torch.matmul(dz, w)
        dw = torch.matmul(dz.T, h)
        del logits, dh, dw
    return step


def p_cublas_logits(h, w, y, state):
    def step():
        torch.matmul(h, w.T)
    return step


def p_role_dh(h, w, y, state):
    dz = random_dz(h, w)

    def step():
        torch.matmul(dz, w)
    return step


def p_role_dw(h, w, y, state):
    dz = random_dz(h, w)

    def step():
        torch.matmul(dz.T, h)
    return step


def p_torch_eager(h, w, y, state):
    return grads_of(torch_ce, h, w, y)


def p_torch_compile(h, w, y, state):
    """Compiled once per shape (main() resets dynamo at each new shape); later stds reuse it: the
    guards see the same shapes, dtypes and strides, so nothing recompiles."""
    if state.get("compiled") is None:
        state["compiled"] = torch.compile(torch_ce, dynamic=False)
        state["compiled_fresh"] = True
    else:
        state["compiled_fresh"] = False
    step = grads_of(state["compiled"], h, w, y)
    step.note = "compiles here" if state["compiled_fresh"] else "compiled at an earlier std"
    return step


def _options(strategy="auto", memory_budget=None):
    return flce._Options(ignore_index=IGNORE, reduction="mean", strategy=strategy, memory_budget=memory_budget,
                         label_smoothing=0.0, z_loss=0.0, softcap=0.0, temperature=1.0, batch_invariant=False)


def _accumulate_dw(call):
    """Sets problem.accumulate_grad_weight, refusing a library built without the field."""
    field = flce._lib.Problem.accumulate_grad_weight
    if field.offset + field.size > call.problem.struct_size:
        raise RuntimeError("libflce was built without problem.accumulate_grad_weight: rebuild it")
    call.problem.accumulate_grad_weight = 1


def auto_choice(h, w, y, op, strategy, memory_budget=None):
    """What the library runs `op` with (flce_strategy_of); None if that cannot be asked."""
    try:
        return flce._Call(h, w, y, _options(strategy, memory_budget)).strategy_of(op, strategy)
    except Exception:  # noqa: BLE001  (an annotation only)
        return None


def p_flce(memory_budget=None, strategy="auto"):
    def factory(h, w, y, state):
        step = grads_of(lambda a, b, c: flce.linear_cross_entropy(
            a, b, c, ignore_index=IGNORE, memory_budget=memory_budget, strategy=strategy), h, w, y)
        step.strategy = strategy + (f" {memory_budget // MiB}MiB" if memory_budget else "")
        step.auto_choice = auto_choice(h, w, y, flce._lib.FLCE_OP_LOSS_AND_GRAD, strategy, memory_budget)
        return step
    return factory


def p_flce_main_grad(h, w, y, state):
    """flce_loss_and_grad (AUTO) with dW added into an fp32 main_grad, through the binding's ctypes
    layer (the Python API has no main_grad option: its mean/sum path computes the gradients in
    forward, before the upstream gradient is known)."""
    call = flce._Call(h, w, y, _options("auto"))
    _accumulate_dw(call)
    main_grad = torch.zeros(w.shape, dtype=torch.float32, device=h.device)
    op = flce._lib.FLCE_OP_LOSS_AND_GRAD

    def step():
        loss = torch.empty((), dtype=torch.float32, device=h.device)
        dh = torch.empty_like(h)
        call(op, "auto", loss=loss, grad_hidden=dh, grad_weight=main_grad)
        return loss, dh, main_grad
    step.before_check = main_grad.zero_
    step.strategy = "auto"
    step.auto_choice = call.strategy_of(op, "auto")
    step.note = "dW += into fp32 main_grad"
    return step


def p_flce_forward(h, w, y, state):
    def step():
        with torch.no_grad():
            return flce.linear_cross_entropy(h, w, y, ignore_index=IGNORE), None, None
    step.strategy = step.auto_choice = "forward"
    return step


PROVIDERS = [  # name, mode, factory, in the default set
    ("cublas-floor", "fwd+bwd", p_cublas_floor, True),
    ("cublas-logits", "fwd", p_cublas_logits, True),
    ("cublas-role-logits", "role", p_cublas_logits, False),
    ("cublas-role-dh", "role", p_role_dh, False),
    ("cublas-role-dw", "role", p_role_dw, False),
    ("torch-eager", "fwd+bwd", p_torch_eager, True),
    ("torch-compile", "fwd+bwd", p_torch_compile, True),
    ("flce-default", "fwd+bwd", p_flce(), True),
    ("flce-main-grad", "fwd+bwd", p_flce_main_grad, True),
    ("flce-lean", "fwd+bwd", p_flce(memory_budget=LEAN_BUDGET), True),
    ("flce-recompute", "fwd+bwd", p_flce(strategy="recompute"), True),
    ("flce-chunked", "fwd+bwd", p_flce(strategy="chunked"), True),
    ("flce-forward", "fwd", p_flce_forward, True),
]
ALIASES = {"flce-chunked-128MiB": "flce-lean"}  # the old name of the 128 MiB row (which was AUTO)
FLOPS = {"fwd+bwd": 6, "fwd": 2, "role": 2}


# ---- GPU clock and power ---------------------------------------------------------------------

class GpuMonitor:
    """SM clock, board power and clock-event (throttle) reasons of the GPU, read through NVML
    (libnvidia-ml.so.1, which comes with the driver; ctypes, no subprocess) by a background thread
    every `period_s`; a row gets the median clock, mean power and OR of the reasons of the samples
    taken while its timed calls ran, plus one sample taken right after they were queued (so short
    rows get one too). NVML's power on an H100 is a 1 s average. Without NVML: no clock columns."""

    SM = 1  # NVML_CLOCK_SM

    def __init__(self, period_s=0.05):
        import collections
        import ctypes
        import threading
        self.samples = collections.deque(maxlen=200000)
        self.mode = None
        self.max_mhz = self.power_limit_w = None
        self._stop = threading.Event()
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if nvml.nvmlInit_v2() != 0:
                return
            handle = ctypes.c_void_p()
            found = False
            try:
                uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
                uuid = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
                found = nvml.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) == 0
            except Exception:  # noqa: BLE001  (an older torch without .uuid)
                pass
            if not found:
                idx = torch.cuda.current_device()
                visible = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
                if visible and idx < len(visible) and visible[idx].isdigit():
                    idx = int(visible[idx])
                if nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(idx), ctypes.byref(handle)) != 0:
                    return
            self._nvml, self._handle, self._ct = nvml, handle, ctypes
            self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            u = ctypes.c_uint()
            if nvml.nvmlDeviceGetMaxClockInfo(handle, self.SM, ctypes.byref(u)) == 0:
                self.max_mhz = u.value
            if nvml.nvmlDeviceGetEnforcedPowerLimit(handle, ctypes.byref(u)) == 0:
                self.power_limit_w = round(u.value / 1000)
            if self.read() is None:
                return
            self.mode = "NVML"
            threading.Thread(target=self._loop, args=(period_s,), daemon=True).start()
        except Exception:  # noqa: BLE001  (no driver library: no clocks)
            self.mode = None

    def read(self):
        """(time, sm MHz, power W, reasons) now, or None."""
        ct, nvml, h = self._ct, self._nvml, self._handle
        mhz, mw, why = ct.c_uint(), ct.c_uint(), ct.c_ulonglong()
        if nvml.nvmlDeviceGetClockInfo(h, self.SM, ct.byref(mhz)) != 0:
            return None
        power = mw.value / 1000 if nvml.nvmlDeviceGetPowerUsage(h, ct.byref(mw)) == 0 else None
        reasons = why.value if self._reasons is not None and self._reasons(h, ct.byref(why)) == 0 else None
        return (time.time(), mhz.value, power, reasons)

    def _loop(self, period_s):
        while not self._stop.wait(period_s):
            try:
                s = self.read()
            except Exception:  # noqa: BLE001
                return
            if s is not None:
                self.samples.append(s)

    def energy_mj(self):
        """The board's energy counter (mJ since the driver loaded), or None: exact over an interval,
        unlike sampled power (NVML updates it every few ms)."""
        if self.mode is None:
            return None
        try:
            ct = self._ct
            mj = ct.c_ulonglong()
            ok = self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle, ct.byref(mj)) == 0
            return mj.value if ok else None
        except Exception:  # noqa: BLE001  (an older driver: no energy column)
            return None

    def now(self):
        if self.mode is None:
            return None
        try:
            return self.read()
        except Exception:  # noqa: BLE001
            return None

    def summary(self, t0, t1, extra=None):
        """{'sm_mhz', 'power_w', 'clock_reasons', 'gpu_samples'} over [t0, t1] (and `extra`), or {}."""
        if self.mode is None:
            return {}
        got = [s for s in list(self.samples) if t0 <= s[0] <= t1] + ([extra] if extra else [])
        if not got:
            return {}
        powers = [s[2] for s in got if s[2] is not None]
        reasons = [s[3] for s in got if s[3] is not None]
        out = {"sm_mhz": int(statistics.median(s[1] for s in got)), "gpu_samples": len(got),
               "power_w": round(statistics.fmean(powers), 1) if powers else None,
               "clock_reasons": None}
        if reasons:
            acc = 0
            for r in reasons:
                acc |= r
            out["clock_reasons"] = hex(acc)
        return out

    def close(self):
        self._stop.set()


# ---- running one provider --------------------------------------------------------------------

def first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


def new_row(name, mode):
    return {"provider": name, "mode": mode, "ms": None, "ms_min": None, "ms_max": None, "tflops": None,
            "vs_floor": None, "extra_mib": None, "err_loss": None, "err_dh": None, "err_dw": None,
            "strategy": None, "auto_choice": None, "sm_mhz": None, "power_w": None, "clock_reasons": None,
            "gpu_samples": None, "joules": None, "error": None, "note": None}


def run_provider(name, mode, factory, data, ref, state, monitor, args):
    """Warm-up, one call measured for memory and errors, then --iters timed calls. Any failure
    (OOM, compile error, FlceError) becomes the row's "error" and the run goes on."""
    h, w, y = data
    n, d = h.shape
    v = w.shape[0]
    row = new_row(name, mode)
    step = out = None
    try:
        step = factory(h, w, y, state)
        for k in ("strategy", "auto_choice", "note"):
            row[k] = getattr(step, k, None)
        for _ in range(args.warmup):
            out = step()
            out = None
        before_check = getattr(step, "before_check", None)
        if before_check is not None:
            before_check()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = step()
        torch.cuda.synchronize()
        row["extra_mib"] = round((torch.cuda.max_memory_allocated() - base) / MiB, 1)
        if out is not None and ref is not None:
            row.update({k: float(f"{x:.3g}") for k, x in errors(out, ref).items()})
        out = None
        events = []
        e0 = monitor.energy_mj()
        t_loop = time.time()
        for _ in range(args.iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = step()
            end.record()
            out = None
            events.append((start, end))
        queued = monitor.now()  # while the queued calls run
        torch.cuda.synchronize()
        e1 = monitor.energy_mj()
        row.update(monitor.summary(t_loop, time.time(), queued))
        if e0 is not None and e1 is not None and e1 >= e0:
            row["joules"] = round((e1 - e0) / 1000 / args.iters, 3)
        times = [s.elapsed_time(e) for s, e in events]
        ms = statistics.median(times)
        row["ms"], row["ms_min"], row["ms_max"] = round(ms, 3), round(min(times), 3), round(max(times), 3)
        row["tflops"] = round(FLOPS[mode] * n * d * v / (ms * 1e-3) / 1e12, 1)
    except Exception as e:  # noqa: BLE001  (every failure is a result here)
        row["error"] = first_line(e)
        for k in ("ms", "ms_min", "ms_max", "tflops", "extra_mib", "err_loss", "err_dh", "err_dw"):
            row[k] = None
    finally:
        step = out = None
        gc.collect()
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001  (a sticky CUDA error: later rows will say so too)
            row["error"] = row["error"] or first_line(e)
    return row


# ---- flce's role kernels, in-run (flce bench --timeline) -------------------------------------

FLCE_ROLE_OF = {  # (strategy row of flce bench, its timeline name) -> provider
    ("auto", "logits kernel"): "flce-role-logits",
    ("auto", "logits+dz kernel"): "flce-role-logits-dz",
    ("forward", "logits kernel"): "flce-role-logits-stats",
    ("auto", "dz kernel"): "flce-role-dz",
    ("auto", "dH kernel"): "flce-role-dh",
    ("auto", "dW kernel"): "flce-role-dw",
}
CUBLAS_ROLE_OF = {"flce-role-logits": "cublas-role-logits", "flce-role-logits-dz": "cublas-role-logits",
                  "flce-role-logits-stats": "cublas-role-logits", "flce-role-dh": "cublas-role-dh",
                  "flce-role-dw": "cublas-role-dw"}


def flce_bin(args):
    """The flce tool beside the library the binding loaded (build/flce), unless --flce-bin."""
    if args.flce_bin:
        return args.flce_bin
    for cand in (os.path.join(os.path.dirname(flce.library_path() or ""), "flce"),
                 os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "flce")):
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def run_flce_bench(tool, shape, std, args, env, extra=()):
    """`flce bench --strategies auto,forward` of one shape and std in a subprocess (its own data;
    this process has freed its tensors) under the settings `env`: (its JSON rows, the finished
    process). Raises on a failure to run or read, which the callers turn into an error row."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [tool, "bench", "--shapes", shape, "--logit-std", f"{std:g}", "--strategies", "auto,forward",
               "--iters", str(args.iters), "--warmup", str(args.warmup), *extra, "--json", out]
        log(f"{shape} std {std_label(std)}: {' '.join(f'{k}={v}' for k, v in env.items())} {' '.join(cmd[1:])}")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=dict(os.environ, **env))
        with open(out) as f:
            return json.load(f), proc


def flce_role_rows(shape, std, args):
    """flce-role-* rows of one shape and std: `flce bench --timeline` (run_flce_bench), each kernel's
    in-run ms per call."""
    tool = flce_bin(args)
    if tool is None:
        return [dict(new_row("flce-role-logits", "role"), error="no flce tool found (pass --flce-bin)")]
    try:
        # dH and dW one after the other: launched at once (the default) their events overlap and
        # dH's row would span both kernels (bench/NOTES.md v18)
        dev = ",".join(x for x in (os.environ.get("FLCE_DEV", ""), "grad_streams=0") if x)  # the last item wins
        bench, proc = run_flce_bench(tool, shape, std, args, {"FLCE_DEV": dev}, ("--timeline",))
    except Exception as e:  # noqa: BLE001  (a result like any other failure)
        return [dict(new_row("flce-role-logits", "role"), error=f"flce bench: {first_line(e)}")]
    n, d, v = (int(x) for x in shape.split("x"))
    rows = []
    for b in bench:
        for k in b.get("kernels") or []:
            name = FLCE_ROLE_OF.get((b["strategy"], k["name"]))
            if name is None or k.get("ms_per_call") is None:
                continue
            row = new_row(name, "role")
            ms = k["ms_per_call"]
            row.update(ms=round(ms, 3), strategy=b["strategy"], auto_choice=b.get("auto_choice"),
                       tflops=None if name == "flce-role-dz" else round(2 * n * d * v / (ms * 1e-3) / 1e12, 1),
                       note=f"in-run, {k['launches_per_call']:g} launch(es)/call; call {b['ms']:.3f} ms")
            rows.append(row)
    if not rows:
        rows = [dict(new_row("flce-role-logits", "role"),
                     error=f"flce bench gave no kernel times (exit {proc.returncode}): "
                           f"{(proc.stderr.strip().splitlines() or [''])[-1][:300]}")]
    return rows


def cublas_inrun_rows(data, args):
    """cublas-inrun-{logits,dh,dw}: cublas-floor's three GEMMs back to back, --iters times after
    --warmup, with CUDA events between them: each GEMM's median time inside the sequence, the same
    kind of number as flce's in-run role rows (the cublas-role rows time one GEMM in a loop)."""
    h, w, _ = data
    n, d = h.shape
    v = w.shape[0]
    names = ("cublas-inrun-logits", "cublas-inrun-dh", "cublas-inrun-dw")
    try:
        dz = random_dz(h, w)
        gemms = (lambda: torch.matmul(h, w.T), lambda: torch.matmul(dz, w), lambda: torch.matmul(dz.T, h))
        for _ in range(args.warmup):
            for g in gemms:
                g()
        times = [[] for _ in gemms]
        for _ in range(args.iters):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(gemms) + 1)]
            ev[0].record()
            for i, g in enumerate(gemms):
                g()
                ev[i + 1].record()
            torch.cuda.synchronize()
            for i in range(len(gemms)):
                times[i].append(ev[i].elapsed_time(ev[i + 1]))
        dz = None
        rows = []
        for name, t in zip(names, times):
            ms = statistics.median(t)
            rows.append(dict(new_row(name, "role"), ms=round(ms, 3), ms_min=round(min(t), 3), ms_max=round(max(t), 3),
                             tflops=round(2 * n * d * v / (ms * 1e-3) / 1e12, 1),
                             note="in-run: inside cublas-floor's sequence"))
        return rows
    except Exception as e:  # noqa: BLE001
        return [dict(new_row(name, "role"), error=first_line(e)) for name in names]
    finally:
        torch.cuda.empty_cache()


def portable_rows(shape, std, args):
    """flce-portable-{default,forward} of one shape and std (FLCE_PORTABLE=1 is read once per
    process: a subprocess) and, once per run, mma-sync-peak; vs_peak = TFLOP/s / the peak's."""
    tool = flce_bin(args)
    if tool is None:
        return [dict(new_row("flce-portable-default", "fwd+bwd"), error="no flce tool found (pass --flce-bin)")]
    rows = []
    if args.portable_peak is None:
        peak_tool = os.path.join(os.path.dirname(tool), "flce_mma_peak")
        # the mma.sync ceiling (the portable 16-bit path's reference) and the fp32 FFMA one (the
        # fp32 path's, issue 19): one row each, once per run
        for provider, kind in (("mma-sync-peak", "bf16"), ("ffma-peak", "f32")):
            try:
                out = subprocess.run([peak_tool, kind], capture_output=True, text=True, timeout=300).stdout
                m = re.search(r"([0-9.]+) TFLOP/s \(median of \d+, ([0-9.]+) ms\)", out)
                peak = float(m.group(1)) if m else 0.0
                rows.append(dict(new_row(provider, "peak"), tflops=peak or None, ms=float(m.group(2)) if m else None,
                                 note=out.strip().splitlines()[-1][:200] if out else None,
                                 error=None if m else "flce_mma_peak gave no figure"))
            except Exception as e:  # noqa: BLE001
                peak = 0.0
                rows.append(dict(new_row(provider, "peak"), error=first_line(e)))
            if kind == "bf16":
                args.portable_peak = peak
    try:
        bench, _ = run_flce_bench(tool, shape, std, args, {"FLCE_PORTABLE": "1"})
    except Exception as e:  # noqa: BLE001
        return rows + [dict(new_row("flce-portable-default", "fwd+bwd"), error=f"flce bench: {first_line(e)}")]
    for b in bench:
        name, mode = (("flce-portable-forward", "fwd") if b["strategy"] == "forward"
                      else ("flce-portable-default", "fwd+bwd"))
        row = new_row(name, mode)
        row.update({k: b.get(k) for k in ("ms", "ms_min", "ms_max", "tflops", "err_dh", "err_dw", "extra_mib")})
        row.update(strategy=b["strategy"], auto_choice=b.get("auto_choice"), err_loss=b.get("err_loss"))
        if row["tflops"] and args.portable_peak:
            row["vs_peak"] = round(row["tflops"] / args.portable_peak, 3)
            row["note"] = f"{row['vs_peak']:.1%} of the mma.sync peak ({args.portable_peak:.0f} TFLOP/s); flce bench's data"
        else:
            row["note"] = "flce bench's data"
        rows.append(row)
    return rows


def role_ratios(rows):
    """vs_role of each flce-role row: its ms over cuBLAS's time for the same GEMM in-run (the
    cublas-inrun rows), else alone (cublas-role)."""
    by = {r["provider"]: r["ms"] for r in rows}
    for r in rows:
        alone = CUBLAS_ROLE_OF.get(r["provider"])
        base = by.get(alone.replace("cublas-role", "cublas-inrun")) if alone else None
        base = base or by.get(alone)
        r["vs_role"] = round(r["ms"] / base, 3) if r.get("ms") and base else None


# ---- output ----------------------------------------------------------------------------------

def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def std_label(s):
    return f"{s:g}"


def markdown_table(shape, std, rows):
    clocks = any(r.get("sm_mhz") is not None for r in rows)
    lines = [f"### {shape} (N x D x V), logit std {std_label(std)}", "",
             "| provider | ms | TFLOP/s | vs floor | extra MiB | err_loss | err_dh | err_dw | strategy |"
             + (" MHz / W / J |" if clocks else "") + " note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|" + ("---:|" if clocks else "") + "---|"]
    for r in rows:
        strat, choice = r.get("strategy") or "", r.get("auto_choice")
        if choice and (not strat or choice != strat.split()[0]):
            strat = f"{strat} → {choice}" if strat else choice
        note = r["error"] or r.get("note") or ""
        if r["mode"] == "fwd" and not r["error"]:
            note = ("forward only; vs cublas-logits" + (f"; {note}" if note else ""))
        elif r["mode"] == "role" and not r["error"]:
            note = "GEMM role, 2NVD" + (f"; {r['vs_role']:.3f}x its cuBLAS role" if r.get("vs_role") else "") \
                + (f"; {note}" if note else "")
        clk = (f" {fmt(r.get('sm_mhz'), 'd')} / {fmt(r.get('power_w'), '.0f')} / {fmt(r.get('joules'), '.2f')} |"
               if clocks else "")
        lines.append(f"| {r['provider']} | {fmt(r['ms'], '.3f')} | {fmt(r['tflops'], '.1f')} | "
                     f"{fmt(r['vs_floor'], '.3f')} | {fmt(r['extra_mib'], '.0f')} | {fmt(r['err_loss'], '.2e')} | "
                     f"{fmt(r['err_dh'], '.2e')} | {fmt(r['err_dw'], '.2e')} | {strat} |{clk} "
                     f"{note.replace('|', '/')} |")
    return "\n".join(lines)


def summary_tables(rows, shapes, stds, providers):
    """Per logit std: providers down, shapes across, 'ms (x floor)'."""
    out = []
    for std in stds:
        cols = [s for s in shapes if any(r["shape"] == s and r["logit_std"] == std for r in rows)]
        if not cols:
            continue
        out += [f"### Summary, logit std {std_label(std)}: ms (× cublas-floor; forward rows × cublas-logits)", "",
                "| provider | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for p in providers:
            cells = []
            for s in cols:
                r = next((r for r in rows if r["shape"] == s and r["logit_std"] == std and r["provider"] == p), None)
                if r is None:
                    cells.append("")
                elif r["ms"] is None:
                    cells.append("error" if r["error"] else "–")
                else:
                    cells.append(f"{r['ms']:.3f}" + (f" ({r['vs_floor']:.2f}×)" if r["vs_floor"] else ""))
            if any(cells):
                out.append(f"| {p} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def clean(x):  # strict JSON: a NaN or infinite error becomes a string
    return str(x) if isinstance(x, float) and not math.isfinite(x) else x


ROW_KEYS = ["shape", "provider", "mode", "ms", "ms_min", "ms_max", "tflops", "vs_floor", "extra_mib", "err_loss",
            "err_dh", "err_dw", "logit_std", "strategy", "auto_choice", "sm_mhz", "power_w", "clock_reasons",
            "gpu_samples", "joules", "error", "note",
            "device", "date", "commit", "torch"]


def write_results(paths, header, sections, summary, rows):
    md = "\n".join(header) + "\n" + (summary + "\n" if summary else "") + "\n\n".join(sections) + "\n"
    js = json.dumps([{k: clean(r.get(k)) for k in ROW_KEYS} for r in rows], indent=1) + "\n"
    for path_md, path_js in paths:
        for path, text in ((path_md, md), (path_js, js)):
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--shapes", type=lambda s: [parse_shape(x) for x in s.split(",") if x.strip()],
                    help="comma-separated NxDxV (default: the five of ALL_SHAPES)")
    ap.add_argument("--stds", "--logit-std", dest="stds", type=parse_stds, default=None,
                    help="comma-separated logit stds (default 4,0.5)")
    ap.add_argument("--quick", action="store_true", help="two small shapes, 5 iters, 2 warm-ups")
    ap.add_argument("--providers", help="comma-separated subset of: " + ", ".join(p[0] for p in PROVIDERS)
                    + " (default: all but the cublas-role-* rows)")
    ap.add_argument("--roles", action="store_true",
                    help="add the cublas-role-{logits,dh,dw} rows and flce's in-run flce-role-* rows")
    ap.add_argument("--portable", action="store_true",
                    help="add flce-portable-{default,forward} (FLCE_PORTABLE=1, subprocess) and mma-sync-peak")
    ap.add_argument("--flce-bin", default=os.environ.get("FLCE_BIN"),
                    help="the flce tool for the flce-role-* rows (default: beside the loaded libflce)")
    ap.add_argument("--iters", type=int, default=None, help="timed runs per provider (default 10, quick 5)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up runs (default 3, quick 2)")
    ap.add_argument("--samples", type=int, default=64, help="sampled tokens / vocab rows for grad errors")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", "--out-dir", dest="out", default=os.environ.get("OUT") or ".",
                    help="directory of the result files (default: $OUT, else .)")
    ap.add_argument("--tag", default="", help="suffix of the result file names")
    ap.add_argument("--paths", action="store_true",
                    help="the training paths instead (bench/paths.py: mean, none-adv, logprobs-adv, "
                         "logprobs-adv-entropy, mean-main-grad, mean-zloss-lse; flce vs torch.compile) into "
                         "<out>/paths-<device>-<date>.{json,md}")
    ap.add_argument("--path-list", help="with --paths: a comma-separated subset of the paths")
    args = ap.parse_args()
    args.portable_peak = None  # measured once, by the first portable_rows
    shapes = args.shapes or [parse_shape(s) for s in (QUICK_SHAPES if args.quick else ALL_SHAPES)]
    stds = args.stds or list(DEFAULT_STDS)
    args.iters = args.iters or (5 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")
    names = [p[0] for p in PROVIDERS]
    if args.providers:
        wanted = [ALIASES.get(p.strip(), p.strip()) for p in args.providers.split(",") if p.strip()]
        unknown = set(wanted) - set(names)
        if unknown:
            ap.error(f"unknown providers: {', '.join(sorted(unknown))}")
        if args.roles:
            wanted += [p[0] for p in PROVIDERS if p[1] == "role"]
        providers = [p for p in PROVIDERS if p[0] in wanted]
    else:
        providers = [p for p in PROVIDERS if p[3] or (args.roles and p[1] == "role")]
    if not torch.cuda.is_available():
        sys.exit("compare.py needs a CUDA device")

    device_name = torch.cuda.get_device_name()
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    date = datetime.date.today().isoformat()
    meta = {"device": device_name, "date": date, "commit": stamp.commit(REPO), "torch": torch.__version__,
            "cuda": torch.version.cuda, "flce": flce.version(), "flce_library": flce.library_path()}
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    if args.paths:
        import paths as paths_mod  # bench/, the script's own folder
        args.shapes_text = ",".join(f"{n}x{d}x{v}" for n, d, v in args.shapes) if args.shapes else None
        args.paths_list = args.path_list.split(",") if args.path_list else None
        paths_mod.run(args, meta)
        return
    monitor = GpuMonitor()

    suffix = (f"-{args.tag}" if args.tag else
              (f"-std{'_'.join(std_label(s) for s in stds)}" if sorted(stds) != sorted(DEFAULT_STDS) else "")
              + ("-quick" if args.quick else ""))
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"compare-{slug}-{date}{suffix}")
    paths = [(stem + ".md", stem + ".json")]

    gpu = (f"; GPU max SM clock {monitor.max_mhz} MHz, power limit {monitor.power_limit_w} W"
           if monitor.max_mhz else "")
    header = [
        f"# flce compare: {device_name}, {date}", "",
        f"- commit {meta['commit']}; flce {meta['flce']} ({meta['flce_library']})",
        f"- torch {meta['torch']} (CUDA {meta['cuda']}), triton {meta['triton']}{gpu}",
        f"- bf16; hidden ~ N(0,1), weight ~ N(0,(std/sqrt(D))^2): logit std {', '.join(std_label(s) for s in stds)}; "
        f"~5% labels = {IGNORE}; seed {args.seed}",
        f"- ms: median of {args.iters} runs (CUDA events) after {args.warmup} warm-up; fwd+bwd unless "
        f"forward only. TFLOP/s count 6NVD (2NVD forward-only and GEMM-role rows) whatever a provider "
        f"does. vs floor: ms / cublas-floor (forward rows: / cublas-logits)",
        "- extra MiB: peak allocated during one call minus allocated before it (outputs included: "
        "grads, logits; inputs excluded: cublas' preallocated dZ, flce-main-grad's fp32 main_grad)",
        f"- errors: relative to float64 on the GPU: err_loss of the mean loss (all tokens), err_dh L2 over "
        f"{args.samples} sampled valid tokens, err_dw L2 over {args.samples} sampled vocab rows",
        "- strategy: requested → what flce runs (flce_strategy_of); MHz / W / J: median SM clock, mean board "
        "power and the energy counter's joules per call while the timed calls ran "
        + ("(NVML, sampled every 50 ms; clock_reasons in the JSON: NVML clock-event reasons seen, "
           "e.g. 0x4 power cap)" if monitor.mode else "(NVML not available: not measured)"),
        ""]
    log(f"{device_name}: {len(shapes)} shape(s) x stds {', '.join(std_label(s) for s in stds)}, providers "
        f"{', '.join(p[0] for p in providers)}; iters {args.iters}, warm-up {args.warmup}; clocks "
        f"{'via NVML' if monitor.mode else 'not available'}; results {stem}.{{json,md}}")

    def annotate(rows, shape, std):
        by = {r["provider"]: r["ms"] for r in rows}
        for r in rows:
            base = by.get({"fwd+bwd": "cublas-floor", "fwd": "cublas-logits"}.get(r["mode"]))
            r["vs_floor"] = round(r["ms"] / base, 3) if r["ms"] and base else None
            r.update({"shape": shape, "logit_std": std, "device": device_name, "date": date,
                      "commit": meta["commit"], "torch": meta["torch"]})

    all_rows, sections = [], []  # finished shape x std sections

    def save(rows, shape, std, summary=""):
        """Rewrites both files with everything so far (a run cut short keeps what it measured)."""
        annotate(rows, shape, std)
        tables = sections + ([markdown_table(shape, std, rows)] if rows else [])
        return write_results(paths, header, tables, summary, all_rows + rows)

    provider_names = [p[0] for p in providers]
    try:
        for (n, d, v) in shapes:
            shape = f"{n}x{d}x{v}"
            torch._dynamo.reset()  # one compilation per shape, kept for all stds
            state = {}
            for std in stds:
                t0 = time.time()
                where = f"{shape} std {std_label(std)}"
                log(f"{where}: data and float64 reference")
                data = ref = None
                rows = []
                try:
                    data = make_data(n, d, v, std, args.seed)
                except Exception as e:  # noqa: BLE001
                    log(f"{where}: data failed: {first_line(e)}")
                    rows = [dict(new_row(name, mode), error=f"data: {first_line(e)}") for name, mode, _, _ in providers]
                else:
                    try:
                        ref = reference(*data, args.samples, args.seed)
                    except Exception as e:  # noqa: BLE001  (time the providers anyway, without errors)
                        log(f"{where}: reference failed: {first_line(e)}")
                    gc.collect()
                    torch.cuda.empty_cache()
                    log(f"{where}: data and reference {time.time() - t0:.1f} s")
                    for name, mode, factory, _ in providers:
                        t1 = time.time()
                        row = run_provider(name, mode, factory, data, ref, state, monitor, args)
                        if ref is None and not row["error"] and name not in ("cublas-floor", "cublas-logits") \
                                and mode != "role":
                            row["note"] = (row["note"] + "; " if row["note"] else "") + "no reference: errors not measured"
                        log(f"{where} {name}: "
                            + (f"{row['ms']} ms, {row['extra_mib']} MiB" if row["ms"] is not None
                               else f"error {row['error']}")
                            + (f" [{row['auto_choice']}]" if row.get("auto_choice") else "")
                            + (f", {row['sm_mhz']} MHz {row['power_w']} W" if row.get("sm_mhz") is not None else "")
                            + f" ({time.time() - t1:.1f} s)")
                        rows.append(row)
                        save(rows, shape, std)
                    if args.roles:
                        rows += cublas_inrun_rows(data, args)
                        save(rows, shape, std)
                data = ref = None
                gc.collect()
                torch.cuda.empty_cache()
                if args.portable:
                    t1 = time.time()
                    rows += portable_rows(shape, std, args)
                    log(f"{where} portable: " + ", ".join(f"{r['provider']} {r['ms']} ms" for r in rows
                        if r["provider"].startswith(("flce-portable", "mma-sync")) and r["ms"] is not None)
                        + f" ({time.time() - t1:.1f} s)")
                if args.roles:
                    t1 = time.time()
                    rows += flce_role_rows(shape, std, args)
                    role_ratios(rows)
                    log(f"{where} flce roles: " + ", ".join(
                        f"{r['provider']} {r['ms']} ms" + (f" ({r['vs_role']}x)" if r.get("vs_role") else "")
                        for r in rows if r["provider"].startswith("flce-role") and r["ms"] is not None)
                        + f" ({time.time() - t1:.1f} s)")
                save(rows, shape, std)
                table = markdown_table(shape, std, rows)
                print(table + "\n", file=sys.stderr, flush=True)
                sections.append(table)
                all_rows += rows
                log(f"{where}: {time.time() - t0:.1f} s")
            state.clear()
    finally:
        monitor.close()

    shape_names = [f"{n}x{d}x{v}" for (n, d, v) in shapes]
    summary = summary_tables(all_rows, shape_names, stds, provider_names)
    md = write_results(paths, header, sections, summary, all_rows)
    sys.stdout.write(md)
    sys.stdout.flush()
    log(f"done in {time.time() - T_START:.0f} s: {stem}.json, {stem}.md")


if __name__ == "__main__":
    main()
