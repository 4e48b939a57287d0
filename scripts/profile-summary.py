#!/usr/bin/env python3
"""Summarizes DCKPT_PROFILE=1 output (stderr lines `dckpt-profile PID vN WHAT MS`):
version 1 (the first call: open and baseline) span by span, then the median
of each span over the later versions, per process. Usage:
    DCKPT_PROFILE=1 mpirun ... 2> prof.log; scripts/profile-summary.py prof.log
"""
import collections
import statistics
import sys

first = collections.defaultdict(dict)
later = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1], errors="replace"):
    parts = line.split()
    if len(parts) != 5 or parts[0] != "dckpt-profile":
        continue
    try:  # two ranks' lines can interleave in one stream: skip a torn one
        pid, version, what, value = parts[1], int(parts[2][1:]), parts[3], float(parts[4])
    except ValueError:
        continue
    if version <= 1:
        first[pid][what] = first[pid].get(what, 0.0) + value
    else:
        later[pid][what].append(value)
for pid in sorted(set(first) | set(later)):
    print(f"process {pid}: first call (v0/v1 spans, ms)")
    for what, ms in first[pid].items():
        print(f"  {what:28} {ms:10.2f}")
    print(f"process {pid}: later versions (median ms, count)")
    for what, values in later[pid].items():
        print(f"  {what:28} {statistics.median(values):10.2f}  x{len(values)}")
