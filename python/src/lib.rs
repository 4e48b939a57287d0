//! `dckpt._dckpt`: the Rust side of the Python package `dckpt`.
//!
//! A thin layer over [`dckpt::runtime::Runtime`]: the Python package
//! (`python/dckpt/__init__.py`) turns arrays and tensors into addresses and
//! lengths, configuration into key–value pairs, and this module's
//! `DckptError(code, kind, message)` into the exception class of its kind.
//! Every call that may wait (any collective call, a restore, a read)
//! releases the interpreter's lock while it runs.
#![allow(unsafe_code)] // a Python-owned buffer's address, and the runtime kept on its thread

use dckpt::config::Config;
use dckpt::runtime::Region;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::collections::HashMap;
use std::path::Path;

create_exception!(
    _dckpt,
    DckptError,
    PyException,
    "An error of dckpt: `args` are (code, kind, message); the package raises the subclass of its kind."
);

/// The Python exception of a dckpt error: its stable code (the C ABI's),
/// its kind's name and its message.
fn raised(e: dckpt::Error) -> PyErr {
    DckptError::new_err((e.code(), format!("{:?}", e.kind()), e.to_string()))
}

/// The runtime, lent to a section that runs without the interpreter's lock.
struct Lent<'a>(&'a mut dckpt::runtime::Runtime);

// SAFETY: `Python::detach` runs its closure on the calling thread, in place;
// the runtime is never used from another thread (its class is `unsendable`,
// which pyo3 checks at every call), it only crosses the `Send` bound that
// the section asks of what it carries.
unsafe impl Send for Lent<'_> {}

impl Lent<'_> {
    fn get(&mut self) -> &mut dckpt::runtime::Runtime {
        self.0
    }
}

/// One old rank's region as Python sees it: (id, bytes, offset, on the device).
type OldRegion = (u32, u64, u64, bool);

/// A dckpt runtime: collective over the communicator it was made on.
#[pyclass(unsendable, module = "dckpt._dckpt", name = "Runtime")]
struct PyRuntime {
    rt: Option<dckpt::runtime::Runtime>,
    /// The objects whose memory is protected, kept alive until unprotected.
    held: HashMap<u32, Py<PyAny>>,
}

impl PyRuntime {
    fn open(&mut self) -> PyResult<&mut dckpt::runtime::Runtime> {
        self.rt.as_mut().ok_or_else(|| PyRuntimeError::new_err("the runtime is finalized"))
    }

    /// Runs `f` on the runtime with the interpreter's lock released.
    fn detached<T: Send>(
        &mut self,
        py: Python<'_>,
        f: impl FnOnce(&mut dckpt::runtime::Runtime) -> dckpt::Result<T> + Send,
    ) -> PyResult<T> {
        let mut lent = Lent(self.open()?);
        py.detach(move || f(lent.get())).map_err(raised)
    }
}

#[pymethods]
impl PyRuntime {
    /// Makes a runtime over a duplicate of the communicator whose Fortran
    /// handle is `fcomm` (mpi4py's `comm.py2f()`). The configuration: the
    /// TOML file `config_path` if any, then `settings` (key, value) in
    /// order, then the `DCKPT_*` environment variables. Collective.
    #[new]
    #[pyo3(signature = (fcomm, config_path=None, settings=Vec::new()))]
    fn new(py: Python<'_>, fcomm: i32, config_path: Option<String>, settings: Vec<(String, String)>) -> PyResult<Self> {
        let config = settings
            .iter()
            .fold(Config::builder().file(config_path.as_deref().map(Path::new)), |b, (key, value)| {
                b.set(key, value, &format!("Runtime({key}=...)"))
            })
            .environment()
            .build();
        let mut made = None;
        let mut slot = LentOwned(&mut made);
        // SAFETY: mpi4py initialized MPI when it was imported, and `fcomm`
        // is the handle of one of its live communicators (the package
        // passes `comm.py2f()`).
        py.detach(move || unsafe { dckpt::ffi::runtime_on_fortran_comm(fcomm, config) }.map(|rt| slot.put(rt)))
            .map_err(raised)?;
        Ok(PyRuntime { rt: made, held: HashMap::new() })
    }

    /// This rank in the runtime's communicator.
    #[getter]
    fn rank(&mut self) -> PyResult<u32> {
        Ok(self.open()?.rank())
    }

    /// Protects `nbytes` at address `ptr` (host, or device memory on the
    /// runtime's GPU) as region `id`; `owner` is kept alive until the
    /// region is unprotected or the runtime finalized.
    fn protect(&mut self, id: u32, ptr: u64, nbytes: usize, device: bool, owner: Py<PyAny>) -> PyResult<()> {
        let region = if device {
            Region::Device { ptr, len: nbytes }
        } else {
            Region::Host { ptr: ptr as usize as *mut u8, len: nbytes }
        };
        // SAFETY: `owner` (kept in `held` until the region is unprotected,
        // replaced or the runtime finalized) owns the `nbytes` at `ptr`: the
        // package took them from its buffer, tensor or array interface, and
        // checked them contiguous and writable. The runtime reads and writes
        // them only during its calls, which hold the Python thread that
        // would otherwise touch them.
        unsafe { self.open()?.protect(id, region) }.map_err(raised)?;
        self.held.insert(id, owner);
        Ok(())
    }

    /// Stops protecting region `id`.
    fn unprotect(&mut self, id: u32) -> PyResult<()> {
        self.open()?.unprotect(id).map_err(raised)?;
        self.held.remove(&id);
        Ok(())
    }

    /// Checkpoints every protected region as `version` of `name`; the
    /// report as a dict. Collective.
    fn checkpoint<'py>(&mut self, py: Python<'py>, name: &str, version: u64) -> PyResult<Bound<'py, PyDict>> {
        let report = self.detached(py, |rt| rt.checkpoint(name, version))?;
        let d = PyDict::new(py);
        d.set_item("version", report.checkpoint.version)?;
        d.set_item("baseline", report.checkpoint.baseline)?;
        d.set_item("seconds", report.total_seconds)?;
        d.set_item("stored_bytes", report.checkpoint.file_bytes)?;
        d.set_item("referenced_bytes", report.bytes_referenced)?;
        d.set_item("regions_referenced", report.regions_referenced)?;
        d.set_item("rank", report.rank)?;
        d.set_item("ranks", report.ranks)?;
        Ok(d)
    }

    /// Blocks until `version` of `name` is durable on every tier of every
    /// rank. Collective.
    fn wait(&mut self, py: Python<'_>, name: &str, version: u64) -> PyResult<()> {
        self.detached(py, |rt| rt.wait(name, version))
    }

    /// Whether the job should take a last checkpoint and stop, the same on
    /// every rank: a termination signal reached a rank, or the walltime is
    /// nearly spent. Collective.
    fn should_exit(&mut self, py: Python<'_>) -> PyResult<bool> {
        self.detached(py, |rt| rt.should_exit())
    }

    /// Why the last `should_exit` said stop, or None.
    fn halt_reason(&self) -> Option<String> {
        self.rt.as_ref().and_then(|rt| rt.halt_reason().map(ToString::to_string))
    }

    /// The newest version of `name` every rank has, or None. Collective.
    fn latest(&mut self, py: Python<'_>, name: &str) -> PyResult<Option<u64>> {
        self.detached(py, |rt| rt.latest(name))
    }

    /// The versions of `name` every rank lists, oldest first. Collective.
    fn versions(&mut self, py: Python<'_>, name: &str) -> PyResult<Vec<u64>> {
        self.detached(py, |rt| rt.versions(name))
    }

    /// Restores `version` of `name` into the protected regions. Collective.
    fn restart(&mut self, py: Python<'_>, name: &str, version: u64) -> PyResult<()> {
        self.detached(py, |rt| rt.restart(name, version))
    }

    /// Restores the newest version every rank restores (older ones where
    /// the newest are damaged); the version, or None (start from the
    /// beginning). Collective.
    fn restart_latest(&mut self, py: Python<'_>, name: &str) -> PyResult<Option<u64>> {
        self.detached(py, |rt| rt.restart_latest(name))
    }

    /// Every old rank's regions of `name`: a list of (rank, [(id, nbytes,
    /// offset, device)]). Collective.
    fn old_regions(&mut self, py: Python<'_>, name: &str) -> PyResult<Vec<(u32, Vec<OldRegion>)>> {
        let tables = self.detached(py, |rt| rt.old_regions(name))?;
        Ok(tables
            .into_iter()
            .map(|t| (t.rank, t.regions.iter().map(|e| (e.id, e.len, e.offset, e.device)).collect()))
            .collect())
    }

    /// The versions of `name` committed by the job that wrote it.
    fn committed_versions(&mut self, py: Python<'_>, name: &str) -> PyResult<Vec<u64>> {
        self.detached(py, |rt| rt.committed_versions(name))
    }

    /// Bytes `start..end` of region `id` of old rank `rank` at `version`
    /// of `name`, verified. Not collective.
    #[allow(clippy::too_many_arguments)]
    fn read_region<'py>(
        &mut self,
        py: Python<'py>,
        name: &str,
        rank: u32,
        id: u32,
        version: u64,
        start: u64,
        end: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.detached(py, |rt| rt.read_region(name, rank, id, version, start..end))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// What this process's calls cost so far, as a dict.
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.open()?.stats();
        let d = PyDict::new(py);
        d.set_item("checkpoints", s.checkpoints)?;
        d.set_item("checkpoint_seconds", s.checkpoint_seconds)?;
        d.set_item("stored_bytes", s.stored_bytes)?;
        d.set_item("protected_bytes", s.protected_bytes)?;
        d.set_item("referenced_bytes", s.referenced_bytes)?;
        d.set_item("max_copy_lag_seen", s.max_copy_lag_seen)?;
        d.set_item("copy_waits", s.copy_waits)?;
        Ok(d)
    }

    /// Waits for every version to be durable everywhere and frees the
    /// runtime (later calls raise). Collective; a second call does nothing.
    fn finalize(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(rt) = self.rt.take() else { return Ok(()) };
        let mut rt = Some(rt);
        let mut lent = LentOwned(&mut rt);
        let done = py.detach(move || lent.take().map_or(Ok(()), dckpt::runtime::Runtime::finalize));
        self.held.clear();
        done.map_err(raised)
    }

    /// Whether the runtime is finalized.
    #[getter]
    fn finalized(&self) -> bool {
        self.rt.is_none()
    }
}

/// The runtime's place, handed to a section without the interpreter's
/// lock: made there, or taken there to be finalized.
struct LentOwned<'a>(&'a mut Option<dckpt::runtime::Runtime>);

// SAFETY: as for `Lent`: the section runs on the calling thread, in place.
unsafe impl Send for LentOwned<'_> {}

impl LentOwned<'_> {
    fn take(&mut self) -> Option<dckpt::runtime::Runtime> {
        self.0.take()
    }

    fn put(&mut self, rt: dckpt::runtime::Runtime) {
        *self.0 = Some(rt);
    }
}

/// The extension module.
#[pymodule]
fn _dckpt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRuntime>()?;
    m.add("DckptError", m.py().get_type::<DckptError>())?;
    Ok(())
}
