"""dckpt: frequent, small, collective checkpoints of GPU and host memory
for MPI simulations.

    from mpi4py import MPI
    import numpy as np
    import dckpt

    u = np.zeros((1024, 1024))
    with dckpt.Runtime(MPI.COMM_WORLD, persistent="ckpt") as rt:
        rt.protect(0, u)
        step = rt.restart_latest("sim") or 0     # None: start from the beginning
        while step < 1000:
            ...                                  # compute on u
            step += 1
            if step % 100 == 0:
                rt.checkpoint("sim", step)

Every method but `protect`, `unprotect`, `read_region` and `stats` is
collective: every rank of the communicator calls it, in the same order; it
succeeds on every rank or raises the same error on every rank. Calls that
wait release the GIL.
"""

import ctypes
import os
from math import prod

from . import _dckpt

__all__ = [
    "Runtime",
    "Error",
    "ConfigurationError",
    "NotFoundError",
    "CorruptError",
    "RankCountError",
    "NotDurableError",
    "CollectiveError",
    "GpuError",
    "StorageError",
]


class Error(Exception):
    """An error of dckpt. `code` is its stable number (the C ABI's
    `DCKPT_ERR_*`), `kind` its kind's name, `str(e)` what happened."""

    def __init__(self, code, kind, message):
        super().__init__(message)
        self.code = code
        self.kind = kind


class ConfigurationError(Error, ValueError):
    """A setting, a name or an argument that cannot be used (code 7)."""


class NotFoundError(Error, LookupError):
    """No such store, version or region (codes 3, 4, 19)."""


class CorruptError(Error):
    """Damaged or foreign files: a checksum, a reference, a manifest (codes 2, 11, 14)."""


class RankCountError(Error):
    """The store was written by another number of ranks (code 17): read it
    with `old_regions` and `read_region`, or run on that many ranks."""


class NotDurableError(Error):
    """A version is not durable where it was asked to be (code 16)."""


class CollectiveError(Error):
    """The ranks disagree, or a collective step failed (codes 5, 6, 9, 10)."""


class GpuError(Error):
    """The GPU failed or is missing (code 8)."""


class StorageError(Error, OSError):
    """The file system refused (codes 1, 12, 13, 15)."""


_BY_CODE = {
    1: StorageError,
    2: CorruptError,
    3: NotFoundError,
    4: NotFoundError,
    5: CollectiveError,
    6: CollectiveError,
    7: ConfigurationError,
    8: GpuError,
    9: CollectiveError,
    10: CollectiveError,
    11: CorruptError,
    12: StorageError,
    13: StorageError,
    14: CorruptError,
    15: StorageError,
    16: NotDurableError,
    17: RankCountError,
    19: NotFoundError,
}


def _raise_as_kind(e):
    code, kind, message = e.args
    raise _BY_CODE.get(code, Error)(code, kind, message) from None


def _setting(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# DLPack's device types: host memory (CPU, CUDA pinned host) and CUDA device memory.
_DL_HOST = (1, 3)
_DL_CUDA = 2


def _dlpack_region(obj):
    """(address, bytes, on the device) of an object that only speaks DLPack
    (`__dlpack__`): its unversioned capsule read in place (the capsule is
    not consumed; the object, kept alive while protected, owns the
    memory)."""
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    try:
        address = get(capsule, b"dltensor")
    except ValueError:
        raise TypeError("the object's DLPack capsule is not a 'dltensor' one") from None
    t = _DLTensor.from_address(address)  # DLManagedTensor starts with its DLTensor
    if t.device.device_type not in _DL_HOST + (_DL_CUDA,):
        raise TypeError(f"DLPack device type {t.device.device_type}: only host and CUDA memory")
    shape = [t.shape[i] for i in range(t.ndim)]
    itemsize = t.dtype.bits * t.dtype.lanes // 8
    if t.strides:
        step = 1
        for i in reversed(range(t.ndim)):
            if shape[i] > 1 and t.strides[i] != step:
                raise ValueError("the DLPack tensor is not C-contiguous")
            step *= shape[i]
    return (t.data or 0) + t.byte_offset, prod(shape) * itemsize, t.device.device_type == _DL_CUDA


def _region(obj):
    """(address, bytes, on the device) of `obj`'s memory: a PyTorch tensor,
    anything with `__cuda_array_interface__` (CuPy, Numba), anything with
    the buffer protocol (NumPy, bytearray, array.array), or anything that
    speaks DLPack (`__dlpack__`); contiguous and writable."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous") and hasattr(obj, "element_size"):
        if not obj.is_contiguous():
            raise ValueError("the tensor is not contiguous: protect t.contiguous() and keep that tensor")
        return obj.data_ptr(), obj.numel() * obj.element_size(), bool(getattr(obj, "is_cuda", False))
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        ptr, readonly = cai["data"]
        if readonly:
            raise ValueError("the device array is read-only")
        itemsize = int(cai["typestr"][2:])
        shape = tuple(cai["shape"])
        strides = cai.get("strides")
        if strides is not None:
            want, step = [], itemsize
            for n in reversed(shape):
                want.append(step)
                step *= n
            if tuple(reversed(want)) != tuple(strides) and prod(shape) > 1:
                raise ValueError("the device array is not C-contiguous")
        return ptr, prod(shape) * itemsize, True
    try:
        view = memoryview(obj)
    except TypeError:
        if hasattr(obj, "__dlpack__"):
            return _dlpack_region(obj)
        raise TypeError(
            f"cannot protect a {type(obj).__name__}: give a NumPy array, a PyTorch tensor, a CuPy array "
            "or another object with the buffer protocol, __cuda_array_interface__ or __dlpack__"
        ) from None
    if view.readonly:
        raise ValueError("the buffer is read-only")
    if not view.c_contiguous:
        raise ValueError("the buffer is not C-contiguous: protect a contiguous copy and keep it")
    if view.nbytes == 0:
        return 0, 0, False
    flat = view.cast("B")
    return ctypes.addressof(ctypes.c_char.from_buffer(flat)), view.nbytes, False


class Runtime:
    """A dckpt runtime over an mpi4py communicator (`None`: this process
    alone, `MPI.COMM_SELF`).

    `config` is a TOML file's path or a dict of settings; `overrides` are
    settings too (`persistent="..."`, `scratch="..."`, `mode="async"`,
    `redundancy="partner"`, ...), over `config`. The `DCKPT_*` environment
    variables come last (the job script's word over the program's). A key
    or a value that is not valid raises `ConfigurationError`, with the
    message the same variable would get. Collective.

    A context manager: `finalize()` on exit.
    """

    def __init__(self, comm=None, config=None, **overrides):
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_SELF
        path, settings = None, {}
        if isinstance(config, dict):
            settings.update(config)
        elif config is not None:
            path = os.fspath(config)
        settings.update(overrides)
        pairs = [(str(k), _setting(v)) for k, v in settings.items()]
        try:
            self._rt = _dckpt.Runtime(comm.py2f(), path, pairs)
        except _dckpt.DckptError as e:
            _raise_as_kind(e)

    def _call(self, method, *args):
        try:
            return getattr(self._rt, method)(*args)
        except _dckpt.DckptError as e:
            _raise_as_kind(e)

    @property
    def rank(self):
        """This rank in the runtime's communicator."""
        return self._rt.rank

    def protect(self, id, array):
        """Protects `array`'s memory as region `id` (replacing what `id`
        protected): a NumPy array, a PyTorch tensor (CPU or CUDA), a CuPy
        array, or any contiguous, writable object with the buffer protocol
        or `__cuda_array_interface__`. The object is kept alive while
        protected. Device memory must be on the runtime's GPU."""
        ptr, nbytes, device = _region(array)
        self._call("protect", int(id), int(ptr), int(nbytes), bool(device), array)

    def unprotect(self, id):
        """Stops protecting region `id`."""
        self._call("unprotect", int(id))

    def checkpoint(self, name, version):
        """Checkpoints every protected region as `version` (> 0, rising) of
        `name`. Returns a dict: version, baseline, seconds, stored_bytes,
        referenced_bytes, regions_referenced, rank, ranks. Collective."""
        return self._call("checkpoint", name, int(version))

    def wait(self, name, version):
        """Blocks until `version` of `name` is durable on every tier of
        every rank. Collective."""
        self._call("wait", name, int(version))

    def should_exit(self):
        """Whether the job should take a last checkpoint and stop, the same
        answer on every rank: True once SIGTERM, SIGUSR1 or SIGINT reached
        any rank (from the first call on; a second signal of a kind ends the
        process), or once the scheduler's walltime left (SLURM, PBS) is
        shorter than `halt_seconds` plus what the last checkpoint took to
        become durable. Collective."""
        return self._call("should_exit")

    def halt_reason(self):
        """Why the last `should_exit` said stop (a sentence), or None."""
        return self._call("halt_reason")

    def latest(self, name):
        """The newest version of `name` every rank has, or None. Collective."""
        return self._call("latest", name)

    def versions(self, name):
        """The versions of `name` every rank lists, oldest first. Collective."""
        return self._call("versions", name)

    def restart(self, name, version):
        """Restores `version` of `name` into the protected regions. Collective."""
        self._call("restart", name, int(version))

    def restart_latest(self, name):
        """Restores the newest version every rank restores (an older one
        where the newest is damaged everywhere); returns it, or None: start
        from the beginning (any old versions set aside). Collective."""
        return self._call("restart_latest", name)

    def old_regions(self, name):
        """Every old rank's regions of `name`, for a restart on another rank
        count: a list, by old rank, of lists of (id, nbytes, offset, device).
        Collective."""
        return [regions for _, regions in self._call("old_regions", name)]

    def committed_versions(self, name):
        """The versions of `name` the job that wrote it committed."""
        return self._call("committed_versions", name)

    def read_region(self, name, rank, id, version, start=0, end=None):
        """Bytes `start:end` of region `id` of old rank `rank` at `version`
        of `name`, verified (`end` None: to the region's end)."""
        if end is None:
            tables = self.old_regions(name)
            try:
                end = next(n for i, n, _, _ in tables[rank] if i == id)
            except (IndexError, StopIteration):
                raise NotFoundError(19, "MissingRegion", f"rank {rank} of '{name}' has no region {id}") from None
        return self._call("read_region", name, int(rank), int(id), int(version), int(start), int(end))

    def stats(self):
        """What this process's calls cost so far (a dict)."""
        return self._call("stats")

    def finalize(self):
        """Waits until every version is durable everywhere, then frees the
        runtime; later calls raise. Collective; a second call does nothing."""
        self._call("finalize")

    @property
    def finalized(self):
        """Whether `finalize` ran."""
        return self._rt.finalized

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.finalize()
        else:
            # The exception in flight is the one to see; finalize still runs
            # (every rank leaves the block the same way in an SPMD program).
            try:
                self.finalize()
            except Error:
                pass
        return False
