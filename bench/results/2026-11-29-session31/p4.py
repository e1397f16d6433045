"""p4 (session 31): is the distillation step power-bound? 8192x4096x128256 bf16, 40 steps each back to back of the
cuBLAS floor (the student's 3 GEMMs + the teacher's forward GEMM, torch), flce forward KL, flce reverse KL, the floor
again; nvidia-smi samples the SM clock and power every 50 ms; per phase: step median (CUDA events) and the
samples' mean clock and power."""
import statistics, subprocess, sys, time, torch
sys.path.insert(0, "python")
import flce
torch.manual_seed(0)
n, d, v = 8192, 4096, 128256
hs = torch.randn(n, d, device="cuda").bfloat16(); ht = torch.randn(n, d, device="cuda").bfloat16()
ws = (torch.randn(v, d, device="cuda") * 4 / d ** 0.5).bfloat16(); wt = (torch.randn(v, d, device="cuda") * 4 / d ** 0.5).bfloat16()
y = torch.randint(0, v, (n,), device="cuda")
def floor():
    z = hs @ ws.T; zt = ht @ wt.T; dh = z @ ws; dw = z.T @ hs
    return dh, dw, zt
def distill(div):
    h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
    def step():
        flce.linear_distillation(h, w, ht, wt, y, divergence=div).backward()
        h.grad = w.grad = None
    return step
phases = [("floor", floor), ("forward_kl", distill("forward_kl")), ("reverse_kl", distill("reverse_kl")), ("floor2", floor)]
for _, f in phases: f()
torch.cuda.synchronize()
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits",
                        "-lms", "50"], stdout=subprocess.PIPE, text=True)
time.sleep(1.0)
marks = []
for name, f in phases:
    ts = []
    t0 = time.time()
    for _ in range(40):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); f(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    marks.append((name, t0, time.time(), statistics.median(ts), min(ts)))
    time.sleep(0.5)
smi.terminate(); out = smi.communicate()[0].strip().splitlines()
# samples arrive every 50 ms from the start (time.sleep(1.0) before the first phase)
t_start = marks[0][1] - 1.0
for name, a, b, med, mn in marks:
    i0, i1 = int((a - t_start) / 0.05), int((b - t_start) / 0.05)
    rows = [r.split(",") for r in out[i0 + 2:i1] if r.count(",") == 2]
    clk = [float(r[0]) for r in rows]; pw = [float(r[1]) for r in rows]
    print(f"{name:11s} step median {med:6.2f} ms (min {mn:6.2f}); {len(rows)} samples: SM clock {statistics.mean(clk):6.0f} MHz "
          f"(min {min(clk):.0f}), power {statistics.mean(pw):5.0f} W (max {max(pw):.0f})")
