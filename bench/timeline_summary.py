#!/usr/bin/env python3
"""timeline_summary.py — one flce bench process's kernels as nsys saw them (not serialized, so the
clocks and overlaps are the real run's): per call (a call starts at its flce_prepare launch), the
span from first start to last end, the kernel-busy time, the idle gaps, and each kernel's time.
Usage: nsys stats --report cuda_gpu_trace --format csv --output - X.nsys-rep | timeline_summary.py"""
import csv
import statistics
import sys


def rows(stream):
    lines = [l for l in stream if l.strip()]
    start = next(i for i, l in enumerate(lines) if 'Start' in l and 'Name' in l)
    for r in csv.DictReader(lines[start:]):
        name = r.get('Name', '')
        if not name.startswith('flce_'):
            continue
        s, d = int(float(r['Start (ns)'])), int(float(r['Duration (ns)']))
        yield name.split('(')[0], s, d


def main():
    calls, cur = [], None
    for name, s, d in rows(sys.stdin):
        if name == 'flce_prepare' or cur is None:
            cur = []
            calls.append(cur)
        cur.append((name, s, d))
    names = []
    for c in calls:
        for n, _, _ in c:
            if n not in names:
                names.append(n)
    print('| call | kernels | span ms | busy ms | gaps ms | ' + ' | '.join(names) + ' |')
    print('|' + '---|' * (5 + len(names)))
    spans = []
    for i, c in enumerate(calls):
        t0 = min(s for _, s, _ in c)
        t1 = max(s + d for _, s, d in c)
        busy, end = 0, t0
        for _, s, d in sorted(c, key=lambda x: x[1]):
            busy += max(0, s + d - max(s, end))
            end = max(end, s + d)
        per = {n: 0 for n in names}
        for n, _, d in c:
            per[n] += d
        spans.append((t1 - t0) / 1e6)
        print(f'| {i} | {len(c)} | {(t1 - t0) / 1e6:.3f} | {busy / 1e6:.3f} | {(t1 - t0 - busy) / 1e6:.3f} | '
              + ' | '.join(f'{per[n] / 1e6:.3f}' for n in names) + ' |')
    if spans:
        print(f'\nmedian span {statistics.median(spans):.3f} ms over {len(spans)} calls')


if __name__ == '__main__':
    main()
