#!/usr/bin/env python3
"""ncu_summary.py — per-kernel time of one ncu CSV (`ncu --csv --page raw --metrics
gpu__time_duration.sum`): for each kernel name (and grid, with --grid) the launch count, the summed
duration in ms and its share of the total, in launch order of first appearance.
Usage: python3 bench/ncu_summary.py FILE.csv [--grid]"""
import csv
import sys


def main():
    path = sys.argv[1]
    by_grid = "--grid" in sys.argv
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines before the CSV
    rows = list(csv.DictReader(lines))
    order, total = {}, 0.0
    for r in rows:
        dur = r.get("gpu__time_duration.sum", "")
        try:
            ns = float(dur.replace(",", ""))
        except ValueError:
            continue  # the units row
        key = r.get("Kernel Name", "?")
        if by_grid:
            key += " grid " + r.get("Grid Size", "?")
        c = order.setdefault(key, [0, 0.0])
        c[0] += 1
        c[1] += ns
        total += ns
    print(f"| kernel | launches | ms | share |\n|---|---|---|---|")
    for k, (n, ns) in order.items():
        print(f"| {k} | {n} | {ns / 1e6:.3f} | {100 * ns / total:.1f} % |")
    print(f"| total | {sum(c[0] for c in order.values())} | {total / 1e6:.3f} | |")


if __name__ == "__main__":
    main()
