"""stamp.py — the commit a benchmark result belongs to, for bench/compare.py and bench/tp_compare.py:
$FLCE_COMMIT, else the device stamp (bench/stamp-commit.sh writes .device-commit; a `git archive`
export carried as .dev/ gets device-commit.txt, bench/device_lib.sh), else the checkout's git HEAD.
The stamp comes before git because an export inside another checkout would report the outer one."""
import os
import subprocess


def commit(repo):
    if os.environ.get("FLCE_COMMIT"):
        return os.environ["FLCE_COMMIT"]
    for name in (".device-commit", "device-commit.txt"):
        try:
            with open(os.path.join(repo, name)) as f:
                return f.read().strip()
        except OSError:
            pass
    try:
        return subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
