#!/usr/bin/env bash
# python_package.sh — the README's one Python command, `pip install ./python` (python/pyproject.toml:
# scikit-build-core builds the C library and the tool through CMake), offline into a scratch
# site-packages: the package holds libflce.so.0 and flce/bin/flce, the metadata its version, licence,
# platform tag and extras, the `flce` console script runs the tool, the installed flce/_lib.py (no
# torch) loads the library from beside itself and calls it, and `import flce` (where PyTorch is
# installed) gives __version__ from the installed copy. The wheel is built first (`pip wheel`, what
# `pip install ./python` does before installing it) and its tag checked: py3-none-manylinux_2_N_x86_64
# as python/pyproject.toml sets it, no newer than `auditwheel show` finds its binaries allow (without
# auditwheel: their newest GLIBC_ symbol version, from objdump). No GPU.
# Usage: python_package.sh <repository>; exit 77 (skipped) without pip or scikit-build-core (the build
# runs --no-build-isolation: an isolated build would fetch scikit-build-core from the network).
set -euo pipefail
repo=$(realpath "$1")
python3 -m pip --version >/dev/null 2>&1 || { echo "pip missing: skipped"; exit 77; }
python3 -c "import scikit_build_core" 2>/dev/null ||
  { echo "scikit-build-core is not installed (pip install scikit-build-core): skipped"; exit 77; }
tmp=$(mktemp -d /tmp/flce-pip.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
site=$tmp/site-packages
start=$(date +%s)
python3 -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w "$tmp/dist" "$repo/python"
whl=$(echo "$tmp"/dist/flce-*.whl)
test -f "$whl" || { echo "FAIL: pip wheel made no flce wheel"; exit 1; }
python3 -m pip install --quiet --no-deps --no-index --target "$site" "$whl"
echo "pip wheel + install: $(($(date +%s) - start)) s (CMake build of the library and the tool included)"

fail() { echo "FAIL: $*"; exit 1; }
test -f "$site/flce/libflce.so.0" || fail "the library was not installed with the package"
test -x "$site/flce/bin/flce" || fail "the tool was not installed as flce/bin/flce"
test -f "$site/flce/__init__.py" && test -f "$site/flce/_lib.py" && test -f "$site/flce/_cli.py"
test -f "$site/flce/py.typed" || fail "py.typed was not installed (PEP 561: the annotations)"
meta=$(echo "$site"/flce-*.dist-info)
want=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/python/flce/_version.py")
grep -qx "Version: $want" "$meta/METADATA" || fail "the metadata's version is not flce/_version.py's ($want)"
grep -qx "License-Expression: Apache-2.0" "$meta/METADATA" ||
  fail "the metadata does not name the licence (License-Expression: Apache-2.0)"
cmp "$repo/LICENSE" "$meta/licenses/LICENSE" || fail "LICENSE is not in the installed package's dist-info/licenses"
grep -qx 'Requires-Dist: transformers; extra == "hf"' "$meta/METADATA" || fail "no hf extra (transformers)"
# One wheel for every Python 3 (ctypes, no CPython ABI), tagged for the platform its library is for.
grep -qx "Root-Is-Purelib: false" "$meta/WHEEL" || fail "the wheel claims to be pure Python"
tag=$(sed -n 's/^Tag: //p' "$meta/WHEEL")
case $tag in
  py3-none-any) fail "wheel tag $tag: it holds a $(uname -m) library" ;;
  py3-none-*"$(uname -m)") echo "wheel tag $tag" ;;
  *) fail "wheel tag $tag: want py3-none-<platform>" ;;
esac
[ "$(basename "$whl")" = "flce-$want-$tag.whl" ] || fail "wheel file $(basename "$whl") vs its Tag: $tag"
# x86-64 Linux: the manylinux tag python/pyproject.toml sets (wheel.tags), and the binaries inside
# need no newer glibc than it says.
if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
  claimed=$(sed -n 's/^wheel\.tags = \["\(.*\)"\]$/\1/p' "$repo/python/pyproject.toml")
  [ "$tag" = "$claimed" ] || fail "wheel tag $tag, python/pyproject.toml's wheel.tags: $claimed"
  floor=$(sed -n 's/^py3-none-manylinux_\([0-9]*\)_\([0-9]*\)_x86_64$/\1.\2/p' <<<"$tag")
  [ -n "$floor" ] || fail "wheel tag $tag is not manylinux_X_Y_x86_64"
  if python3 -m auditwheel --version >/dev/null 2>&1; then
    found=$(python3 -m auditwheel show --json "$whl" 2>/dev/null |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["overall_tag"])')
    echo "auditwheel show: consistent with $found"
  else
    newest=$(objdump -T "$site/flce/libflce.so.0" "$site/flce/bin/flce" | grep -o 'GLIBC_[0-9][0-9.]*' |
      sed 's/^GLIBC_//' | sort -V | tail -1)
    found=manylinux_${newest//./_}_x86_64
    echo "auditwheel not installed: newest GLIBC_ symbol of the binaries $newest ($found)"
  fi
  fv=$(sed -n 's/^manylinux_\([0-9]*\)_\([0-9]*\)_x86_64$/\1.\2/p' <<<"$found")
  [ -n "$fv" ] || fail "the binaries allow no manylinux tag ($found)"
  # The tag's glibc must be at least the one the binaries need (on this machine, equal).
  [ "$(printf '%s\n%s\n' "$fv" "$floor" | sort -V | tail -1)" = "$floor" ] ||
    fail "wheel tagged manylinux_${floor/./_} but its binaries need glibc $fv ($found)"
  [ "$fv" = "$floor" ] || echo "note: the binaries would allow $found, tagged more strictly: $tag"
fi
objdump -p "$site/flce/libflce.so.0" | grep -q "SONAME *libflce.so.0" || fail "libflce.so.0's SONAME"

# The console script: flce --version and flce info through the packaged tool.
test -x "$site/bin/flce" || fail "no flce console script"
out=$(PYTHONPATH="$site" "$site/bin/flce" --version 2>&1 || true)
grep -q "$want" <<<"$out" || fail "flce --version: $out"
out=$(PYTHONPATH="$site" "$site/bin/flce" info)
grep -q "^flce $want" <<<"$out" || fail "flce info: $out"
echo "console script: $(head -2 <<<"$out" | tr '\n' ' ')"

env -u FLCE_LIBRARY python3 - "$site" <<'PY'
import importlib.util, os, sys
site = sys.argv[1]
spec = importlib.util.spec_from_file_location("flce_lib", os.path.join(site, "flce", "_lib.py"))
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
lib = mod.lib()
want = os.path.join(site, "flce", "libflce.so.0")
assert os.path.samefile(mod._lib_path, want), (mod._lib_path, want)
print("installed package loads", mod._lib_path, "version", lib.flce_version().decode())
PY
# An explicit FLCE_LIBRARY that does not exist is an error naming it, not a silent fallback.
FLCE_LIBRARY=/nonexistent/libflce.so python3 - "$site" <<'PY'
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("flce_lib", os.path.join(sys.argv[1], "flce", "_lib.py"))
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
try:
    mod.lib()
except mod.FlceLibraryNotFound as e:
    assert "/nonexistent/libflce.so" in str(e) and "FLCE_LIBRARY" in str(e), str(e)
    print("missing FLCE_LIBRARY:", str(e)[:100])
else:
    raise SystemExit("FLCE_LIBRARY=/nonexistent loaded something")
PY
# import flce from the installed copy (needs PyTorch; the rest above does not).
if python3 -c "import torch" 2>/dev/null; then
  (cd "$tmp" && env -u FLCE_LIBRARY PYTHONPATH="$site" python3 - "$site" "$want" <<'PY'
import os, sys
import flce
site, want = sys.argv[1], sys.argv[2]
assert os.path.dirname(os.path.abspath(flce.__file__)) == os.path.join(site, "flce"), flce.__file__
assert flce.__version__ == want, (flce.__version__, want)
assert flce.version() == want, flce.version()
print("import flce:", flce.__version__, "from", os.path.dirname(flce.__file__))
PY
  )
else
  echo "PyTorch not installed: import flce not tried (the library and the tool were)"
fi
echo "python package: all checks passed"
