#!/usr/bin/env python3
"""Summarizes DCKPT_PROFILE=1 output (stderr lines `dckpt-profile rR vN WHAT MS ms`, `pPID` before
the rank is known; counts end in `count` and are left out; older logs without a unit read too):
the first version (the first call: open and baseline; version 0 is the
opening's) span by span, then each span's median, mean and max over the
later versions, per process (`runtime-call` is the whole call). Usage:
    DCKPT_PROFILE=1 mpirun ... 2> prof.log; scripts/profile-summary.py prof.log
"""
import collections
import statistics
import sys

first = collections.defaultdict(dict)
later = collections.defaultdict(lambda: collections.defaultdict(list))
lines = []
for line in open(sys.argv[1], errors="replace"):
    parts = line.split()
    if len(parts) not in (5, 6) or parts[0] != "dckpt-profile" or (len(parts) == 6 and parts[5] != "ms"):
        continue
    try:  # two ranks' lines can interleave in one stream: skip a torn one
        lines.append((parts[1], int(parts[2][1:]), parts[3], float(parts[4])))
    except ValueError:
        continue
opened = {}
for pid, version, _, _ in lines:
    if version > 0:
        opened[pid] = min(opened.get(pid, version), version)
for pid, version, what, value in lines:
    if version <= opened.get(pid, 0):
        first[pid][what] = first[pid].get(what, 0.0) + value
    else:
        later[pid][what].append(value)
for pid in sorted(set(first) | set(later)):
    print(f"{pid}: first call (v{opened.get(pid, 0)} and opening spans, ms)")
    for what, ms in first[pid].items():
        print(f"  {what:28} {ms:10.2f}")
    print(f"{pid}: later versions (ms: median, mean, max, count)")
    for what, values in later[pid].items():
        print(
            f"  {what:28} {statistics.median(values):10.2f} {statistics.fmean(values):10.2f}"
            f" {max(values):10.2f}  x{len(values)}"
        )
