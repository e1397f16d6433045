# Session 27 call 2: profile the top-k step, branch (build/ from j1) vs main (tarball built in /tmp/m).
set -u; s=$(date +%s)
mkdir -p /tmp/m && tar xJf .whl/main.tar.xz -C /tmp/m && (cd /tmp/m && cmake --preset default > /dev/null 2>&1 && cmake --build build -j16 --target flce > /tmp/mb.log 2>&1); echo "main build rc=$? $(( $(date +%s)-s )) s"
[ -f build/libflce.so ] || (cmake --preset default >/dev/null && cmake --build build -j16 --target flce > /dev/null 2>&1)
for S in 8192x4096x128256 4096x2048x32000; do
FLCE_LIBRARY=$PWD/build/libflce.so PYTHONPATH=$PWD/python timeout 90 python3 .whl/prof4.py $S sparse 2>&1 | grep -v "Warn\|warn"
FLCE_LIBRARY=/tmp/m/build/libflce.so PYTHONPATH=/tmp/m/python timeout 90 python3 .whl/prof4.py $S main 2>&1 | grep -v "Warn\|warn"
done
echo "done $(( $(date +%s)-s )) s"
