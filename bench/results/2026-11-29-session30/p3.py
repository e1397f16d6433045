"""p3 (session 30): how much of a distillation step's time (8192x4096x128256 bf16, forward KL) is the host's
before the GPU starts. (a) the step timed as the benches do (queue empty at the start event); (b) the same
step with the GPU kept busy by a ~8 ms sleep kernel enqueued before the start event, so the host's enqueue
overlaps the sleep; (c) host time of the step, and of each C call (flce_distill_workspace_size,
flce_distill_loss_and_grad) through the binding; the same for linear_cross_entropy (mean) and the floor."""
import statistics, sys, time, torch
sys.path.insert(0, "python")
import flce
from flce import _distill_lib as dl
torch.manual_seed(0)
n, d, v = 8192, 4096, 128256
dev = "cuda"
hs = torch.randn(n, d, device=dev).bfloat16()
ht = torch.randn(n, d, device=dev).bfloat16()
ws = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
wt = (torch.randn(v, d, device=dev) * 4 / d ** 0.5).bfloat16()
y = torch.randint(0, v, (n,), device=dev)
host = {}
def timed(name, f):
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); host.setdefault(name, []).append(1e3 * (time.perf_counter() - t0)); return r
    return g
dl.loss_and_grad = timed("loss_and_grad", dl.loss_and_grad)
dl.workspace_size = timed("workspace_size", dl.workspace_size)
h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
def distill():
    h.grad = w.grad = None
    flce.linear_distillation(h, w, ht, wt, y).backward()
def ce():
    h.grad = w.grad = None
    flce.linear_cross_entropy(h, w, y).backward()
def floor():
    z = hs @ wt.t(); z2 = hs @ ws.t(); a = z2 @ ws; b = z2.t() @ hs
for name, step in (("distill fkl", distill), ("ce mean", ce), ("floor 4 GEMMs", floor)):
    for _ in range(3): step()
    torch.cuda.synchronize(); host.clear()
    for busy in (False, True):
        ts = []
        for _ in range(10):
            if busy: torch.cuda._sleep(int(8e6 * 1.98))  # ~8 ms at ~1.98 GHz
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); t0 = time.perf_counter(); step(); hh = time.perf_counter() - t0; e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
            host.setdefault("step host", []).append(1e3 * hh)
        print(f"{name}: {'GPU busy at the start' if busy else 'queue empty'}: median {statistics.median(ts):.2f} ms (min {min(ts):.2f})")
    print("   host ms (median): " + ", ".join(f"{k} {statistics.median(x):.3f}" for k, x in host.items()))
    sys.stdout.flush()
