"""A 2-D heat (Jacobi) stencil in NumPy over mpi4py that checkpoints through
dckpt and restarts from its newest checkpoint:

    mpirun -np 4 python examples/python/stencil.py [--steps 200] [--every 20]
        [--rows 256] [--cols 1024] [--dir target/stencil] [--crash-at STEP]

Each rank owns `rows` rows of the plate plus a ghost row above and below
(exchanged with its neighbours every step); the top edge is held at 100.
`--crash-at STEP` aborts the last rank at that step (what SIGKILL
leaves); the next run restarts from the newest checkpoint and ends with the
plate of a run never interrupted: rank 0 prints its digest.
"""

import argparse
import hashlib
import os

import numpy as np
from mpi4py import MPI

import dckpt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--rows", type=int, default=256, help="rows a rank")
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--dir", default="target/stencil", help="where the checkpoints go (scratch and persistent)")
    ap.add_argument("--crash-at", type=int, default=None, help="abort the last rank at this step")
    a = ap.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    plate = np.zeros((a.rows + 2, a.cols))
    step = np.zeros(1, dtype=np.int64)
    up = rank - 1 if rank > 0 else MPI.PROC_NULL
    down = rank + 1 if rank < size - 1 else MPI.PROC_NULL

    settings = dict(scratch=os.path.join(a.dir, "scratch"), persistent=os.path.join(a.dir, "persistent"))
    with dckpt.Runtime(comm, **settings) as rt:
        rt.protect(0, plate)
        rt.protect(1, step)
        if rt.restart_latest("stencil") is not None and rank == 0:
            print(f"stencil: restarted from the checkpoint of step {step[0]}", flush=True)
        while step[0] < a.steps:
            if a.crash_at is not None and step[0] == a.crash_at and rank == size - 1:
                print(f"stencil: rank {rank} aborts at step {step[0]} (--crash-at)", flush=True)
                os.abort()
            if rank == 0:
                plate[0, :] = 100.0  # the held edge
            comm.Sendrecv(plate[1], dest=up, recvbuf=plate[-1], source=down)
            comm.Sendrecv(plate[-2], dest=down, recvbuf=plate[0] if rank > 0 else np.empty(a.cols), source=up)
            if rank == 0:
                plate[0, :] = 100.0
            inner = 0.25 * (plate[:-2, 1:-1] + plate[2:, 1:-1] + plate[1:-1, :-2] + plate[1:-1, 2:])
            plate[1:-1, 1:-1] = inner
            step[0] += 1
            if step[0] % a.every == 0:
                rt.checkpoint("stencil", int(step[0]))
        rows = comm.gather(plate[1:-1].tobytes(), root=0)
    if rank == 0:
        digest = hashlib.blake2b(b"".join(rows), digest_size=16).hexdigest()
        print(f"stencil: {size} ranks, {a.steps} steps, plate digest {digest}", flush=True)


if __name__ == "__main__":
    main()
