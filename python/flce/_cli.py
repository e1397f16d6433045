"""_cli.py — the `flce` console script: runs the C tool the package ships as flce/bin/flce (built
with the library by `pip install ./python`; `flce --help` lists its commands). Imports nothing but
os and sys, so the command starts without PyTorch."""
import os
import sys


def tool_path() -> str:
    """The path of the packaged tool (flce/bin/flce beside this file)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "flce")


def main() -> None:
    path = tool_path()
    if not os.access(path, os.X_OK):
        sys.stderr.write(
            f"flce: the command-line tool is not in this installation ({path} is missing): install the "
            "package with `pip install ./python` from the repository, which builds it, or build the "
            "CMake target flce_tool and run build/flce\n")
        sys.exit(127)
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
