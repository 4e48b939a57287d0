#!/usr/bin/env python3
"""The Python binding's cost over the Rust Runtime's, on the same calls
(issue #43, item 6): each `rt.checkpoint` timed from Python, against the
Runtime's own time for that call (`stats()["checkpoint_seconds"]`, kept by
the Rust `Runtime::checkpoint`), and the naive alternative in the same run
(copy the array, write it, fsync).

    mpirun -np 2 target/python-venv/bin/python scripts/python-bench.py \\
        [--size 256M] [--versions 20] [--change 0.01] [--device cpu|cuda] [--dir D]

`--device cuda` protects a torch CUDA tensor (torch needed). Every version
rewrites `change` of the bytes in 64-byte granules scattered over the
array (the same on every rank: a shared base, as `dckpt bench-runtime
--shared-base` does). Prints one table from rank 0.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import dckpt


def size_of(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--change", type=float, default=0.01)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dir", default="target/python-bench")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    nbytes = size_of(a.size)
    rng = np.random.default_rng(42)
    host = rng.random(nbytes // 8)  # float64, the same on every rank
    granules = max(1, int(nbytes * a.change) // 64)
    if a.device == "cuda":
        import torch

        torch.cuda.set_device(rank % torch.cuda.device_count())
        region = torch.from_numpy(host).cuda()
        flat = region.view(torch.uint8)
    else:
        region = host
        flat = host.view(np.uint8)
    settings = dict(scratch=os.path.join(a.dir, "scratch"), persistent=os.path.join(a.dir, "persistent"))
    python_ms, rust_ms, naive_ms = [], [], []
    with dckpt.Runtime(comm, **settings) as rt:
        rt.protect(0, region)
        for v in range(1, a.versions + 1):
            if v > 1:
                at = np.random.default_rng(v).integers(0, nbytes // 64, granules) * 64
                if a.device == "cuda":
                    idx = torch.from_numpy((at[:, None] + np.arange(64)).ravel()).cuda()
                    flat[idx] = flat[idx] + 1
                    torch.cuda.synchronize()
                else:
                    for off in at:
                        flat[off : off + 64] += 1
            comm.Barrier()
            before = rt.stats()["checkpoint_seconds"]
            t = time.perf_counter()
            rt.checkpoint("bench", v)
            python_ms.append((time.perf_counter() - t) * 1e3)
            rust_ms.append((rt.stats()["checkpoint_seconds"] - before) * 1e3)
            # The naive alternative: copy, write, fsync (one file a rank).
            t = time.perf_counter()
            copy = region.cpu().numpy() if a.device == "cuda" else region.copy()
            path = os.path.join(a.dir, f"naive-{rank}.bin")
            with open(path, "wb") as f:
                f.write(memoryview(copy).cast("B"))
                f.flush()
                os.fsync(f.fileno())
            naive_ms.append((time.perf_counter() - t) * 1e3)
    steady = slice(1, None)  # after the first call (the baseline)
    rows = comm.gather((python_ms, rust_ms, naive_ms), root=0)
    if rank == 0:
        worst = lambda i, s: max(statistics.median(r[i][s]) for r in rows)  # noqa: E731
        py, rs, nv = worst(0, steady), worst(1, steady), worst(2, steady)
        diff = max(statistics.median([p - q for p, q in zip(r[0][steady], r[1][steady])]) for r in rows)
        print(f"python-bench: {comm.Get_size()} rank(s), {a.size} {a.device}, change {a.change}, {a.versions} versions")
        print(f"  first call, Python / Rust Runtime (ms)   {rows[0][0][0]:10.3f} / {rows[0][1][0]:.3f}")
        print(f"  call median, Python / Rust Runtime (ms)  {py:10.3f} / {rs:.3f}  (ratio {py / rs:.3f})")
        print(f"  Python's extra a call, median (ms)       {diff:10.3f}")
        print(f"  naive copy + write + fsync, median (ms)  {nv:10.3f}  (call / naive {py / nv:.3f})")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
