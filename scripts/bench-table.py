#!/usr/bin/env python3
"""Summarises the JSON files of scripts/bench-cpu.sh into a Markdown table."""
import json


def rows_of(path):
    """The rows of a `dckpt bench --json` file: a list (before schema 1) or a document's `rows`."""
    doc = json.loads(path.read_text())
    return doc["rows"] if isinstance(doc, dict) else doc

import pathlib
import sys

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/bench-cpu")
print("| workload | chunk | method | ratio | metadata (B) | GB/s | vs zstd-1 | vs hash |")
print("|---|---:|---|---:|---:|---:|---:|---:|")
zstd = {}
for f in sorted(out.glob("*.json")):
    rows = rows_of(f)
    for r in rows:
        if r["name"] == "zstd-1":
            zstd[f.stem.rsplit("-", 1)[0]] = r["throughput_gbs"]
for f in sorted(out.glob("*.json"), key=lambda p: (p.stem.rsplit("-", 1)[0], int(p.stem.rsplit("-", 1)[1]))):
    workload, cs = f.stem.rsplit("-", 1)
    rows = rows_of(f)
    hashed = next((r["throughput_gbs"] for r in rows if r["name"].startswith("hash-")), None)
    for r in rows:
        z = zstd.get(workload)
        vz = f"{r['throughput_gbs'] / z:.1f}x" if z else ""
        vh = f"{r['throughput_gbs'] / hashed:.2f}" if hashed else ""
        print(f"| {workload} | {cs} | {r['name']} | {r['ratio']:.2f} | {r['metadata_bytes']} | {r['throughput_gbs']:.3f} | {vz} | {vh} |")
