"""The Python binding under mpirun, through what users call (pytest, one
phase a job; see conftest.py):

    mpirun -np N python -m pytest python/tests/test_runtime.py -k test_write --store DIR
    mpirun -np N python -m pytest python/tests/test_runtime.py -k test_restart --store DIR   (a new job: byte-exact)
    mpirun -np 1 python -m pytest python/tests/test_runtime.py -k test_resize --store DIR --old-ranks N
"""

import array
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import dckpt

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
N = 50_000


def plate(r, v):
    x = np.arange(N, dtype=np.float64) * (r + 1)
    x[(v * 7919) % N] = -v  # one value changes per version
    return x


def counter(v):
    return bytearray(v.to_bytes(8, "little"))


# Every NumPy kind of element, and array.array: region ids 10, 11, ...
DTYPES = [np.int8, np.uint16, np.int32, np.int64, np.float16, np.float32, np.complex128, np.bool_]


def typed(r, v, dtype):
    return ((np.arange(1000) * (r + 1) + v) % 127).astype(dtype)


class OnlyDLPack:
    """An array that speaks DLPack only (no buffer protocol): a NumPy array's."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def protect_all(rt):
    """Protects every region the tests write: the plate (0), the counter
    (1), one array of every element kind (10, ...) and an array given by
    DLPack only (30). Returns them, zeroed."""
    u, c = np.zeros(N), bytearray(8)
    arrays = [np.zeros(1000, dtype=dt) for dt in DTYPES] + [array.array("d", bytes(8000))]
    dl = np.zeros(777, dtype=np.float32)
    rt.protect(0, u)
    rt.protect(1, c)
    for i, x in enumerate(arrays):
        rt.protect(10 + i, x)
    rt.protect(30, OnlyDLPack(dl))
    return u, c, arrays, dl


def check(ok, what):
    if not ok:
        # Past pytest's capture: the abort ends the process before it reports.
        print(f"test_runtime: rank {rank}: FAILED: {what}", file=sys.__stderr__, flush=True)
        comm.Abort(1)


def same_everywhere(x):
    return all(y == x for y in comm.allgather(x))


def settings(d):
    return dict(persistent=f"{d}/persistent", scratch=f"{d}/scratch", host_cache_size="16M")


def test_write(store):
    d = store
    with dckpt.Runtime(comm, **settings(d)) as rt:
        try:
            rt.restart_latest("sim")
            check(False, "a restart with nothing protected")
        except dckpt.ConfigurationError as e:
            check("no region is protected" in str(e), f"the message says why: {e}")
        u, c, arrays, dl = protect_all(rt)
        check(rt.restart_latest("sim") is None, "a new store restarts nothing")
        for v in (1, 2, 3):
            u[:] = plate(rank, v)
            c[:] = counter(v)
            for x, dt in zip(arrays, DTYPES):
                x[:] = typed(rank, v, dt)
            arrays[-1][:] = array.array("d", typed(rank, v, np.float64).tobytes())
            dl[:] = typed(rank, v, np.float32)[:777]
            report = rt.checkpoint("sim", v)
            check(report["version"] == v and report["ranks"] == size, f"the report: {report}")
            check(report["baseline"] == (v == 1), f"baseline only first: {report}")
        rt.wait("sim", 3)  # async by default: durable everywhere now
        check(rt.versions("sim") == [1, 2, 3], f"versions: {rt.versions('sim')}")
        check(rt.latest("sim") == 3, "latest")
        # Errors: the kind's class, a code, the same on every rank.
        try:
            rt.checkpoint("sim", 2)
            check(False, "an older version accepted")
        except dckpt.Error as e:
            check(e.code > 0 and same_everywhere(e.code), f"the same code everywhere: {e.code} {e}")
        fortran = np.asfortranarray(np.zeros((4, 3)))
        for bad, kind in [(np.arange(4.0)[::2], ValueError), (fortran, ValueError), (object(), TypeError)]:
            try:
                rt.protect(9, bad)
                check(False, f"{type(bad).__name__} protected")
            except kind:
                pass
        frozen = np.zeros(4)
        frozen.flags.writeable = False
        try:
            rt.protect(9, frozen)
            check(False, "a read-only array protected")
        except ValueError:
            pass
        check(rt.stats()["checkpoints"] == 3, f"stats: {rt.stats()}")
        # Nothing asks the job to stop (no signal, no scheduler in CI), then
        # SIGUSR1 on the last rank only: every rank says stop, and why.
        if "SLURM_JOB_ID" not in os.environ and "PBS_JOBID" not in os.environ:
            check(rt.should_exit() is False and rt.halt_reason() is None, "should_exit with nothing asking")
            comm.Barrier()
            if rank == size - 1:
                signal.raise_signal(signal.SIGUSR1)
            check(rt.should_exit() is True, "should_exit after SIGUSR1 on one rank")
            check("SIGUSR1" in (rt.halt_reason() or ""), f"the reason: {rt.halt_reason()}")
    check(rt.finalized, "the context manager finalizes")
    try:
        dckpt.Runtime(comm, chunk_sise=128, **settings(d))
        check(False, "a misspelled key accepted")
    except dckpt.ConfigurationError as e:
        check("chunk_sise" in str(e) and e.code == 7, f"the message names the key: {e}")


def test_restart(store):
    d = store
    rt = dckpt.Runtime(comm, settings(d))
    u, c, arrays, dl = protect_all(rt)
    v = rt.restart_latest("sim")
    check(v == 3, f"restarted version {v}")
    check(np.array_equal(u, plate(rank, 3)) and c == counter(3), "the restored bytes")
    for x, dt in zip(arrays, DTYPES):
        check(np.array_equal(x, typed(rank, 3, dt)), f"the {np.dtype(dt)} array")
    check(arrays[-1].tobytes() == typed(rank, 3, np.float64).tobytes(), "the array.array")
    check(np.array_equal(dl, typed(rank, 3, np.float32)[:777]), "the array given by DLPack only")
    rt.restart("sim", 1)
    check(np.array_equal(u, plate(rank, 1)) and c == counter(1), "version 1's bytes")
    rt.finalize()
    rt.finalize()  # a second call does nothing
    try:
        rt.latest("sim")
        check(False, "a finalized runtime answered")
    except RuntimeError:
        pass


def test_resize(store, old_ranks):
    d, old_size = store, old_ranks
    rt = dckpt.Runtime(comm, **settings(d))
    old = rt.old_regions("sim")
    check(len(old) == old_size, f"{len(old)} old ranks")
    check(rt.committed_versions("sim") == [1, 2, 3], "committed versions")
    for r in range(old_size):
        got = np.frombuffer(rt.read_region("sim", r, 0, 3), dtype=np.float64)
        check(np.array_equal(got, plate(r, 3)), f"old rank {r}'s region at version 3")
        part = rt.read_region("sim", r, 0, 2, 8 * 10, 8 * 20)
        check(part == plate(r, 2)[10:20].tobytes(), f"a range of old rank {r}'s region")
    protect_all(rt)
    if old_size != size:
        try:
            rt.restart_latest("sim")
            check(False, "a store of another rank count restarted")
        except dckpt.RankCountError as e:
            check(e.code == 17, f"RankCountError: {e}")
    rt.finalize()

