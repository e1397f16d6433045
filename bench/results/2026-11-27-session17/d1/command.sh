#!/bin/bash
# session 17 d1 (4 GPUs): nsys probe; compare.py at the tp = 4 and tp = 2 shards (GPU 0); NCCL registration microbench tp = 2 (GPUs 2,3), then tp = 4
cd "$(dirname "$0")"
. bench/device_lib.sh
R=/tmp/d1; rm -rf $R; mkdir -p $R
pack() { (cd /tmp && tar czf $OUT/d1.tgz d1); }
trap pack EXIT
device_env $R/env.txt > /dev/null; nvidia-smi --query-gpu=name,power.limit --format=csv >> $R/env.txt; head -12 $R/env.txt
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
device_build "$R/build.log" || exit 1
echo "built at $(( $(date +%s) - t0 )) s"
( echo "== nsys candidates"; ls /opt/nvidia 2>&1; find / -xdev \( -name 'nsys' -o -name 'QdstrmImporter*' \) -type f 2>/dev/null | head -20
  python3 -c "import nvtx" 2>&1 | tail -1; nvidia-smi topo -m 2>&1 | head -8 ) > $R/nsys_probe.log 2>&1
NS=$(find / -xdev -name nsys -type f -perm -u+x 2>/dev/null | head -1)
if [ -n "$NS" ]; then
  ( cd $R && timeout 90 "$NS" profile -o $R/probe --force-overwrite true --trace cuda python3 -c "import torch; a=torch.randn(4096,4096,device='cuda'); [a@a for _ in range(10)]; torch.cuda.synchronize()" ; echo "profile rc=$?"; ls -la $R/probe* ; timeout 60 "$NS" stats --report cuda_gpu_kern_sum $R/probe.nsys-rep 2>&1 | head -20 ) >> $R/nsys_probe.log 2>&1
fi
cat $R/nsys_probe.log | head -40
(CUDA_VISIBLE_DEVICES=2,3 timeout 200 torchrun --nproc_per_node=2 --master_port=29511 bench/nccl_register.py --out $R > $R/reg2.log 2>&1; echo "reg2 rc=$?" >> $R/reg2.log) &
rg=$!
CUDA_VISIBLE_DEVICES=0 FLCE_CACHE_DIR=/tmp/flce-cache-cmp FLCE_LIBRARY=$PWD/build/libflce.so FLCE_BIN=$PWD/build/flce timeout 400 python3 bench/compare.py --out-dir $R --roles --tag s17-shards --shapes 8192x4096x32064,8192x4096x64128 --stds 4 --providers cublas-floor,flce-default,torch-compile > $R/compare.log 2>&1; echo "compare rc=$? at $(( $(date +%s) - t0 )) s"
grep -h -A30 '^### Summary' $R/*.md | head -40
wait $rg; cat $R/reg2.log | grep -v "^\[\|WARNING\|^W1\|^ *$" | tail -12
timeout 150 torchrun --nproc_per_node=4 --master_port=29512 bench/nccl_register.py --out $R > $R/reg4.log 2>&1; echo "reg4 rc=$?"
grep -v "^\[\|WARNING\|^W1\|^ *$" $R/reg4.log | tail -8
echo "t $(( $(date +%s) - t0 )) s"
