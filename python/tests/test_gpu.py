"""The Python binding on the GPU, under mpirun, through what users call
(pytest, one phase a job; see conftest.py):

    mpirun -np N python -m pytest python/tests/test_gpu.py -k test_write --store DIR
    mpirun -np N python -m pytest python/tests/test_gpu.py -k test_restart --store DIR   (a new job: byte-exact)

CuPy arrays of every element kind, PyTorch tensors on the GPU and on the
host, an array given by `__cuda_array_interface__` only and one given by
DLPack only, protected where they live; the restart restores them in place,
byte-exact. Skipped without CuPy, PyTorch or a CUDA device.
"""

import sys

import numpy as np
import pytest
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import dckpt  # noqa: E402

DEVICE = rank % torch.cuda.device_count()
torch.cuda.set_device(DEVICE)
cp.cuda.Device(DEVICE).use()
N = 1 << 20
KINDS = [cp.int8, cp.uint16, cp.int32, cp.int64, cp.float16, cp.float32, cp.float64, cp.complex64, cp.bool_]


class CudaInterfaceOnly:
    """A device array known by `__cuda_array_interface__` only."""

    def __init__(self, array):
        self.array = array
        self.__cuda_array_interface__ = array.__cuda_array_interface__


class DLPackOnly:
    """A device array known by DLPack only."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def check(ok, what):
    if not ok:
        # Past pytest's capture: the abort ends the process before it reports.
        print(f"test_gpu: rank {rank}: FAILED: {what}", file=sys.__stderr__, flush=True)
        comm.Abort(1)


def values(v, kind, n):
    """Version `v`'s values for an array of `n` elements of `kind`: mostly
    the same from version to version (a few change), different per rank."""
    x = (np.arange(n) * (rank + 3)) % 251
    x[(v * 7919) % n :: 65537] += v
    return x.astype(np.dtype(kind))


def regions():
    """Every region the phases write, zeroed, protected by `protect(rt)`."""
    cupys = [cp.zeros(N // 4 + 17 * i, dtype=k) for i, k in enumerate(KINDS)]
    big = torch.zeros(N, dtype=torch.float32, device="cuda")
    bf16 = torch.zeros(4099, dtype=torch.bfloat16, device="cuda")
    host = torch.zeros(3000, dtype=torch.float64)
    cai = cp.zeros(5000, dtype=cp.float32)
    dl = cp.zeros(6000, dtype=cp.int32)
    return cupys, big, bf16, host, cai, dl


def protect(rt, r):
    cupys, big, bf16, host, cai, dl = r
    for i, x in enumerate(cupys):
        rt.protect(i, x)
    rt.protect(20, big)
    rt.protect(21, bf16)
    rt.protect(22, host)
    rt.protect(23, CudaInterfaceOnly(cai))
    rt.protect(24, DLPackOnly(dl))


def fill(r, v):
    cupys, big, bf16, host, cai, dl = r
    for x, k in zip(cupys, KINDS):
        x[:] = cp.asarray(values(v, k, x.size))
    big.copy_(torch.from_numpy(values(v, np.float32, N)))
    bf16.copy_(torch.from_numpy(values(v, np.float32, 4099)).to(torch.bfloat16))
    host.copy_(torch.from_numpy(values(v, np.float64, 3000)))
    cai[:] = cp.asarray(values(v, np.float32, 5000))
    dl[:] = cp.asarray(values(v, np.int32, 6000))
    torch.cuda.synchronize()
    cp.cuda.runtime.deviceSynchronize()


def same(r, v):
    cupys, big, bf16, host, cai, dl = r
    for x, k in zip(cupys, KINDS):
        check(np.array_equal(cp.asnumpy(x), values(v, k, x.size)), f"the {np.dtype(k)} CuPy array at version {v}")
    check(np.array_equal(big.cpu().numpy(), values(v, np.float32, N)), f"the torch CUDA tensor at version {v}")
    want = torch.from_numpy(values(v, np.float32, 4099)).to(torch.bfloat16)
    check(torch.equal(bf16.cpu(), want), f"the bfloat16 tensor at version {v}")
    check(np.array_equal(host.numpy(), values(v, np.float64, 3000)), f"the torch host tensor at version {v}")
    check(np.array_equal(cp.asnumpy(cai), values(v, np.float32, 5000)), "the __cuda_array_interface__ array")
    check(np.array_equal(cp.asnumpy(dl), values(v, np.int32, 6000)), "the DLPack-only array")


def settings(d):
    return dict(persistent=f"{d}/persistent", scratch=f"{d}/scratch", host_cache_size="64M")


def test_write(store):
    d = store
    with dckpt.Runtime(comm, **settings(d)) as rt:
        r = regions()
        protect(rt, r)
        for v in (1, 2, 3):
            fill(r, v)
            report = rt.checkpoint("gpu", v)
            check(report["version"] == v, f"the report: {report}")
        rt.wait("gpu", 3)
        for bad in [torch.zeros((8, 8), device="cuda").t(), cp.zeros((8, 8))[:, ::2]]:
            try:
                rt.protect(30, bad)
                check(False, f"a non-contiguous {type(bad).__name__} protected")
            except ValueError:
                pass


def test_restart(store):
    d = store
    with dckpt.Runtime(comm, **settings(d)) as rt:
        r = regions()
        protect(rt, r)
        check(rt.restart_latest("gpu") == 3, "restarted version 3")
        same(r, 3)
        rt.restart("gpu", 1)
        same(r, 1)

