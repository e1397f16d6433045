#!/bin/bash
# session 11 d15 (2 GPUs): test_tp at the final commit, tp_compare at tp = 2, and a cProfile of the binding's step (issue 20's host time)
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d15; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d15.tgz d15); }
device_env $R/env.txt > /dev/null
cat device-commit.txt >> $R/env.txt
t0=$(date +%s)
device_build "$R/build.log" || { echo build failed; tail -20 $R/build.log; pack; exit 1; }
export FLCE_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 FLCE_CACHE_DIR=/tmp/flce-cache
(cd build && timeout 240 ctest -R '^test_tp' --output-on-failure) > $R/test_tp.log 2>&1; grep -E "Test #|tests passed" $R/test_tp.log
echo "tests $(( $(date +%s) - t0 )) s"
pack
L=$PWD/build/libflce.so
FLCE_LIBRARY=$L PYTHONPATH=$PWD/python timeout 90 python3 - > $R/host_profile.log 2>&1 <<'PY'
import cProfile, pstats, io, runpy, sys, time, torch
sys.argv = ["host_latency.py"]
import flce
n, d, v = 8192, 4096, 32064
g = torch.Generator(device="cuda").manual_seed(1)
h0 = torch.randn(n, d, device="cuda", dtype=torch.bfloat16, generator=g)
w0 = torch.randn(v, d, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
y = torch.randint(0, v, (n,), device="cuda", generator=g)
def step():
    h = h0.detach().requires_grad_(); w = w0.detach().requires_grad_()
    flce.linear_cross_entropy(h, w, y).backward()
for _ in range(5): step()
torch.cuda.synchronize()
pr = cProfile.Profile()
t0 = time.perf_counter(); pr.enable()
for _ in range(50): step()
pr.disable(); t1 = time.perf_counter(); torch.cuda.synchronize()
print(f"host per step {(t1 - t0) / 50 * 1e3:.3f} ms under cProfile")
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); print(s.getvalue())
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(30); print(s.getvalue())
PY
echo "profile rc=$?"; head -3 $R/host_profile.log
pack
NCCL_DEBUG=WARN FLCE_LIBRARY=$L timeout 170 torchrun --nproc_per_node=2 bench/tp_compare.py --out "$R" --tag s11 > "$R/tpc-2.log" 2>&1
echo "status $?" >> "$R/tpc-2.log"
grep -h '^| [mf]\|status' "$R/tpc-2.log" | grep -v provider | cut -c1-150
echo "t $(( $(date +%s) - t0 )) s"
pack
