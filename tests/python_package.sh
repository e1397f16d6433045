#!/usr/bin/env bash
# python_package.sh — `pip install` of the Python binding (python/pyproject.toml) with libflce.so
# shipped inside the package, into a scratch target directory, then the installed flce/_lib.py
# (which needs no torch) loads the library from beside itself and calls it. No GPU, no torch.
# Usage: python_package.sh <libflce.so.0> <repository>; exit 77 (skipped) without pip, setuptools or wheel.
set -euo pipefail
lib=$1 repo=$2
{ python3 -c "import setuptools" && python3 -c "import wheel" && python3 -m pip --version; } >/dev/null 2>&1 ||
  { echo "pip, setuptools or wheel missing (a PEP 517 build needs all three): skipped"; exit 77; }
# pyproject.toml's SPDX `license` and `license-files` (PEP 639) need setuptools 77
python3 -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" ||
  { echo "setuptools $(python3 -c 'import setuptools; print(setuptools.__version__)') < 77: skipped"; exit 77; }
tmp=$(mktemp -d /tmp/flce-pip.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp -rL "$repo/python" "$tmp/src"  # -L: python/LICENSE is a link to the repository's
rm -rf "$tmp/src/flce/__pycache__"
cp "$lib" "$tmp/src/flce/libflce.so.0"
python3 -m pip install --quiet --no-deps --no-build-isolation --no-index --target "$tmp/site" "$tmp/src"
test -f "$tmp/site/flce/libflce.so.0" || { echo "the library was not installed with the package"; exit 1; }
test -f "$tmp/site/flce/__init__.py" && test -f "$tmp/site/flce/_lib.py"
test -f "$tmp/site/flce/py.typed" || { echo "py.typed was not installed (PEP 561: the annotations)"; exit 1; }
want=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/python/flce/_version.py")
grep -qx "Version: $want" "$tmp"/site/flce-*.dist-info/METADATA ||
  { echo "the metadata's version is not flce/_version.py's ($want)"; exit 1; }
grep -qx "License-Expression: Apache-2.0" "$tmp"/site/flce-*.dist-info/METADATA ||
  { echo "the metadata does not name the licence (License-Expression: Apache-2.0)"; exit 1; }
cmp "$repo/LICENSE" "$tmp"/site/flce-*.dist-info/licenses/LICENSE ||
  { echo "LICENSE is not in the installed package's dist-info/licenses"; exit 1; }
env -u FLCE_LIBRARY python3 - "$tmp/site" <<'PY'
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
FLCE_LIBRARY=/nonexistent/libflce.so python3 - "$tmp/site" <<'PY'
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
