#!/usr/bin/env bash
# nvrtc_wheel.sh — NVRTC and NCCL from the NVIDIA pip wheels' layout (runtime/dynload.h, issue 41
# item 3), with the system's copies hidden: in a private mount namespace (unshare -m, or unshare -rm
# as a user) every directory that holds the machine's libnvrtc / libnccl (the ld.so cache's, the
# build's toolkit directory) is covered by an empty tmpfs, and a scratch Python environment gets
# nvidia/cu13/lib/libnvrtc.so.13 (nvidia/cuda_nvrtc/lib/libnvrtc.so.12 for CUDA 12) and
# nvidia/nccl/lib/libnccl.so.2, links to the hidden files (reached through a bind mount taken before
# hiding). Then, with an empty library path and a controlled environment, `flce info`:
#   - with no Python environment holding them: says what it searched (the site-packages directories
#     by name) and which pip package provides each library;
#   - with VIRTUAL_ENV, PYTHONPATH or a python3 in PATH leading to the scratch environment, or the
#     tool itself inside it (site-packages/flce/bin/flce, as pip installs it): loads both from there
#     (the path printed is the wheel's), and `flce gen --compile` compiles a kernel.
# Usage: nvrtc_wheel.sh <flce tool> <toolkit library directory>. Exit 77 (skipped) where no mount
# namespace can be had, where NVRTC is not installed, or where it sits beside the C library (a
# directory that cannot be hidden without hiding libc).
set -euo pipefail
flce=$(realpath "$1") toolkit=$2

if [ "${3:-}" != --inside ]; then
  for how in "-m" "-rm"; do
    if unshare $how true 2>/dev/null; then
      exec unshare $how --propagation private bash "$0" "$flce" "$toolkit" --inside
    fi
  done
  echo "no private mount namespace (unshare -m / -rm refused): cannot hide the system's NVRTC; skipped"
  exit 77
fi

tmp=$(mktemp -d /tmp/flce-wheel.XXXXXX)
# $tmp/real/N are read-only bind mounts of the machine's library directories: unmount them before
# removing $tmp, and never let rm cross into another file system (it would delete the toolkit).
cleanup() {
  local m
  for m in "$tmp"/real/*; do
    if mountpoint -q "$m" 2>/dev/null; then umount "$m" || umount -l "$m" || true; fi
  done
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT

# The machine's copies: where the loader and the build's toolkit directory would find them.
machine_libs() {
  ldconfig -p 2>/dev/null | sed -n 's/.*\(libnvrtc\.so\.[0-9]*\|libnccl\.so\.2\) .*=> \(.*\)$/\2/p'
  local d f
  for d in "$toolkit" ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }}; do
    for f in libnvrtc.so.13 libnvrtc.so.12 libnccl.so.2; do
      if [ -e "$d/$f" ]; then echo "$d/$f"; fi
    done
  done
}
libs=$(machine_libs | sort -u)
nvrtc=$(grep -m1 'libnvrtc\.so\.13$' <<<"$libs" || grep -m1 'libnvrtc\.so\.12$' <<<"$libs" || true)
[ -n "$nvrtc" ] || { echo "no libnvrtc.so.13 or .12 on this machine: skipped"; exit 77; }
nccl=$(grep -m1 'libnccl\.so\.2$' <<<"$libs" || true)
# the files themselves, resolved before their directories disappear
nvrtc=$(realpath "$nvrtc")
[ -n "$nccl" ] && nccl=$(realpath "$nccl")
dirs=$(for f in $libs; do dirname "$(realpath "$f")"; done | sort -u)

# Hide each directory (once, by its real path) after binding it where the links can reach it.
mkdir -p "$tmp/real"
declare -A hidden=()
n=0
for d in $dirs; do
  if ls "$d"/libc.so.6 >/dev/null 2>&1; then
    echo "NVRTC or NCCL sits beside libc ($d): it cannot be hidden from the loader here; skipped"; exit 77
  fi
  mkdir "$tmp/real/$n"
  mount --bind "$d" "$tmp/real/$n"
  mount -o remount,bind,ro "$tmp/real/$n"
  mount -t tmpfs none "$d"
  hidden[$d]=$tmp/real/$n
  n=$((n + 1))
done
real_of() { echo "${hidden[$(dirname "$1")]}/$(basename "$1")"; }

# The scratch environment, laid out as pip lays out the wheels.
site=$tmp/venv/lib/python3.99/site-packages
case $nvrtc in
  *.so.13) wheel=nvidia/cu13/lib; so=libnvrtc.so.13 pkg=nvidia-cuda-nvrtc ;;
  *) wheel=nvidia/cuda_nvrtc/lib; so=libnvrtc.so.12 pkg=nvidia-cuda-nvrtc-cu12 ;;
esac
mkdir -p "$site/$wheel" "$site/nvidia/nccl/lib" "$tmp/empty/lib/python3.99/site-packages" "$tmp/home" "$tmp/nobin" \
  "$tmp/venv/bin" "$tmp/cache"
ln -s "$(real_of "$nvrtc")" "$site/$wheel/$so"
for b in "$(dirname "$(real_of "$nvrtc")")"/libnvrtc-builtins.so.*; do  # NVRTC opens them beside itself
  [ -e "$b" ] && ln -s "$b" "$site/$wheel/$(basename "$b")"
done
[ -n "$nccl" ] && ln -s "$(real_of "$nccl")" "$site/nvidia/nccl/lib/libnccl.so.2"
printf '#!/bin/sh\n' >"$tmp/venv/bin/python3" && chmod +x "$tmp/venv/bin/python3"

failed=0
run() { env -i HOME="$tmp/home" PATH="$tmp/nobin" FLCE_CACHE_DIR="$tmp/cache" "$@"; }
expect() { # expect <what> <output> <substring>...
  local what=$1 out=$2
  shift 2
  for want in "$@"; do
    if ! grep -qF -- "$want" <<<"$out"; then
      echo "FAIL $what: no '$want' in:"; echo "$out"; failed=$((failed + 1)); return
    fi
  done
  echo "ok   $what"
}

# 1. Hidden, and no Python environment has them: what was searched and what to install.
out=$(run VIRTUAL_ENV="$tmp/empty" "$flce" info)
expect "missing NVRTC names the places and the package" "$out" "NVRTC (the CUDA runtime compiler" \
  "could not be loaded" "not on the library path" "$wheel/$so" "$tmp/empty/lib/python3.99/site-packages" \
  "pip install nvidia-cuda-nvrtc (CUDA 13) or nvidia-cuda-nvrtc-cu12 (CUDA 12)" "FLCE_NVRTC_LIBRARY"
if grep -q "^NCCL" <<<"$out" && ! grep -q "built without NCCL" <<<"$out"; then
  expect "missing NCCL names the places and the package" "$out" "NCCL could not be loaded" \
    "nvidia/nccl/lib/libnccl.so.2" "$tmp/empty/lib/python3.99/site-packages" \
    "pip install nvidia-nccl-cu13 (CUDA 13) or nvidia-nccl-cu12 (CUDA 12)" "FLCE_NCCL_LIBRARY"
fi

# 2. The wheels found through each way in, NVRTC (and NCCL) loaded from the scratch environment.
for how in "VIRTUAL_ENV=$tmp/venv" "PYTHONPATH=$tmp/nowhere:$site" "PATH=$tmp/nobin:$tmp/venv/bin"; do
  out=$(run "$how" "$flce" info)
  expect "NVRTC from the wheel ($how)" "$out" "NVRTC 1" "($site/$wheel/$so)"
  if [ -n "$nccl" ] && ! grep -q "built without NCCL" <<<"$out"; then
    expect "NCCL from the wheel ($how)" "$out" "($site/nvidia/nccl/lib/libnccl.so.2)"
  fi
done

# ... and as the pip package lays the tool out (site-packages/flce/bin/flce): from its own
# site-packages, with nothing in the environment pointing there.
mkdir -p "$site/flce/bin" && cp "$flce" "$site/flce/bin/flce"
out=$(run "$site/flce/bin/flce" info)
expect "NVRTC from the wheel beside the packaged tool" "$out" "NVRTC 1" "($site/$wheel/$so)"

# 3. It compiles from there (NVRTC finds its builtins beside itself).
if out=$(run VIRTUAL_ENV="$tmp/venv" "$flce" gen --compile --role rowops --arch sm_80 2>&1); then
  echo "ok   a kernel compiles with the wheel's NVRTC"
else
  echo "FAIL flce gen --compile with the wheel's NVRTC:"; echo "$out"; failed=$((failed + 1))
fi

[ "$failed" = 0 ] || { echo "$failed failed"; exit 1; }
echo "NVRTC and NCCL from the pip wheels' layout: all checks passed"
