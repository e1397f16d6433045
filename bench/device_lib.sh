# device_lib.sh — the preamble of the device scripts, sourced by bench/device_session.sh and
# bench/device_ci.sh: go to the repository root, make $OUT, and write the run's record, env.txt
# (date, commit, device, cores), which bench/results/README.md keeps beside every recorded run.
# The device's copy of the tree has no .git: bench/stamp-commit.sh, run here before the device call,
# writes the commit into .device-commit.

# device_begin DEFAULT_OUT: cd to the repository root; OUT defaults to $PWD/DEFAULT_OUT; made.
device_begin() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
  OUT=${OUT:-$PWD/$1}
  mkdir -p "$OUT"
}

# The stamp first: a `git archive` export run from inside another checkout (a .dev/ folder) would
# otherwise report the outer checkout's commit. Inside such an export the tree's own .gitignore
# applies, so the device tool does not carry .device-commit there: write device-commit.txt instead.
device_commit() {
  cat .device-commit 2>/dev/null || cat device-commit.txt 2>/dev/null || git describe --always --dirty 2>/dev/null ||
    echo unknown
}

# device_env FILE [LINE...]: writes the record to FILE (and shows it), the caller's LINEs after the
# commit.
device_env() {
  local file=$1
  shift
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(device_commit)"
    [ $# -eq 0 ] || printf '%s\n' "$@"
    echo "device:"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 |
      sed 's/^/  /'
    echo "cores: $(nproc)"
  } | tee "$file"
}

# device_build LOG: the README's build (the default preset) of the tree in the current directory,
# on every core; its output in LOG, whose tail is shown on failure. Returns the build's status.
device_build() {
  (cmake --preset default && cmake --build --preset default -j "$(nproc)") > "$1" 2>&1 ||
    { tail -40 "$1"; return 1; }
}
