//! The C ABI over [`Runtime`], for C, C++ and Fortran simulations
//! (feature `mpi`; built into `libdckpt.so` and `libdckpt.a`).
//!
//! - The header `src/ffi/dckpt.h` is generated from this module by cbindgen
//!   (`DCKPT_BLESS=1 cargo test --test ffi_header` writes it; the test fails
//!   while it is not current). The Fortran module `src/ffi/dckpt.f90` binds
//!   the same functions with `iso_c_binding`.
//! - A runtime is an opaque handle ([`DckptRuntime`]) made by
//!   [`dckpt_init`] (a C `MPI_Comm`) or [`dckpt_init_f`] (a Fortran
//!   communicator, converted with `MPI_Comm_f2c`) and freed by
//!   [`dckpt_finalize`].
//! - Every function returns [`DCKPT_OK`] or the stable code of the error's
//!   kind (`crate::error::ErrorKind`: `DCKPT_ERR_*`); [`dckpt_last_error`] gives
//!   the calling thread's last message. A bad argument (a NULL pointer,
//!   text that is not UTF-8) is [`DCKPT_ERR_INVALID_OPTION`]; a panic is
//!   caught at the boundary and returned as [`DCKPT_ERR_INTERNAL`].
//! - The collective functions (init, checkpoint, latest, restart, wait,
//!   finalize) must be called by every rank of the communicator, in the
//!   same order; each succeeds on every rank or fails on every rank.
#![allow(unsafe_code)] // the C boundary: raw pointers in, checked before use

use crate::config::Config;
use crate::error::{Error, Result};
use crate::runtime::{Region, Runtime};
use mpi::raw::FromRaw;
use mpi::topology::SimpleCommunicator;
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

/// A runtime: what [`dckpt_init`] returns and [`dckpt_finalize`] frees.
pub struct DckptRuntime {
    rt: Runtime,
}

/// Success.
pub const DCKPT_OK: c_int = 0;
/// An I/O error (the message names the path).
pub const DCKPT_ERR_IO: c_int = 1;
/// A damaged file.
pub const DCKPT_ERR_CORRUPT: c_int = 2;
/// The version does not exist.
pub const DCKPT_ERR_MISSING_VERSION: c_int = 3;
/// No checkpoint store where one was expected.
pub const DCKPT_ERR_NO_STORE: c_int = 4;
/// The regions or the layout differ from what the checkpoint holds.
pub const DCKPT_ERR_MISMATCH: c_int = 5;
/// A version not newer than the latest.
pub const DCKPT_ERR_VERSION_NOT_NEWER: c_int = 6;
/// A bad option, configuration or argument.
pub const DCKPT_ERR_INVALID_OPTION: c_int = 7;
/// A CUDA error.
pub const DCKPT_ERR_GPU: c_int = 8;
/// A collective step failed (on this or another rank).
pub const DCKPT_ERR_COLLECTIVE: c_int = 9;
/// A region's owner rank cannot provide it.
pub const DCKPT_ERR_OWNER_UNAVAILABLE: c_int = 10;
/// A reference to another rank's file is broken.
pub const DCKPT_ERR_BROKEN_REFERENCE: c_int = 11;
/// Another writer holds the store.
pub const DCKPT_ERR_LOCKED: c_int = 12;
/// A path that leaves the store (a planted symlink).
pub const DCKPT_ERR_UNSAFE_PATH: c_int = 13;
/// The store needs `dckpt repair`.
pub const DCKPT_ERR_NEEDS_REPAIR: c_int = 14;
/// A full disk.
pub const DCKPT_ERR_NO_SPACE: c_int = 15;
/// The version is not durable yet.
pub const DCKPT_ERR_NOT_DURABLE: c_int = 16;
/// A checkpoint written by a job of another rank count (read its ranks'
/// regions instead; see `dckpt_latest`).
pub const DCKPT_ERR_RANK_COUNT: c_int = 17;
/// Bytes of the wrong size (a restored region longer than its buffer, a
/// buffer that is not the store's length).
pub const DCKPT_ERR_SIZE_MISMATCH: c_int = 18;
/// A region that is not protected, or not in the checkpoint's region table.
pub const DCKPT_ERR_MISSING_REGION: c_int = 19;
/// The machine refused a thread or memory dckpt needs.
pub const DCKPT_ERR_RESOURCES_EXHAUSTED: c_int = 20;
/// A bug, or a panic caught at the boundary.
pub const DCKPT_ERR_INTERNAL: c_int = 99;

/// A region in host memory ([`dckpt_protect`]).
pub const DCKPT_HOST: c_int = 0;
/// A region in device memory (a CUDA device pointer on the runtime's GPU).
pub const DCKPT_DEVICE: c_int = 1;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Runs `f`, turning its error or panic into a code and the thread's last message.
fn status(f: impl FnOnce() -> Result<()>) -> c_int {
    let (code, message) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return DCKPT_OK,
        Ok(Err(e)) => (e.code(), e.to_string()),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            (DCKPT_ERR_INTERNAL, format!("internal error (a panic stopped at the C boundary): {what}"))
        }
    };
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
    code
}

/// `p` as text.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that outlives `'a`.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::InvalidOption(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| Error::InvalidOption(format!("{what} is not UTF-8")))
}

/// The runtime behind `h`.
///
/// # Safety
/// `h` is NULL or a handle from [`dckpt_init`] not finalized yet, used by
/// one thread at a time.
unsafe fn runtime<'a>(h: *mut DckptRuntime) -> Result<&'a mut Runtime> {
    // SAFETY: per the caller's contract, a live handle used by this thread only.
    unsafe { h.as_mut() }.map(|h| &mut h.rt).ok_or_else(|| Error::InvalidOption("the runtime handle is NULL".into()))
}

/// The settings [`dckpt_config`] gave, for the next [`dckpt_init`] of this process.
static SETTINGS: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// The configuration a `dckpt_init` makes: the defaults, the file (if any),
/// the `DCKPT_<KEY>` environment, then the settings [`dckpt_config`] gave
/// (the program's explicit calls win), checked against the machine.
fn load_config(path: Option<&Path>) -> Result<Config> {
    let settings = crate::sync::lock(&SETTINGS).clone();
    let mut builder = Config::builder().file(path).environment();
    for (key, value) in &settings {
        builder = builder.set(key, value, &format!("dckpt_config(\"{key} = {value}\")"));
    }
    let config = builder.build()?;
    config.check_machine()?;
    Ok(config)
}

/// Sets one configuration key for the next [`dckpt_init`] of this process,
/// as `"key = value"` (the TOML key and a value as in the file or a
/// `DCKPT_<KEY>` variable: `"persistent = /gpfs/run/ckpt"`,
/// `"mode = sync"`, `"host_cache_size = 2G"`); over the file and the
/// environment. Call it on every rank before `dckpt_init` (SCR's
/// `SCR_Config`). An unknown key is refused at once, naming the closest.
///
/// # Safety
/// `setting` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_config(setting: *const c_char) -> c_int {
    status(|| {
        // SAFETY: a NUL-terminated string per the contract.
        let text = unsafe { text(setting, "the setting") }?;
        let (key, value) = text
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .filter(|(k, v)| !k.is_empty() && !v.is_empty())
            .ok_or_else(|| Error::InvalidOption(format!("dckpt_config(\"{text}\"): write \"key = value\"")))?;
        let value = value.trim_matches('"');
        // Checked now, alone, so that the call that set it is the one that fails.
        crate::config::ConfigBuilder::check_setting(key, value, &format!("dckpt_config(\"{text}\")"))?;
        crate::sync::lock(&SETTINGS).push((key.to_string(), value.to_string()));
        Ok(())
    })
}

/// Makes a runtime over a duplicate of `raw` (which stays the caller's):
/// the duplicate first (collective), then the configuration, agreed by
/// every rank, so that a file missing on one node fails every rank.
///
/// # Safety
/// As for [`dckpt_init`].
unsafe fn init_with(raw: mpi::ffi::MPI_Comm, config: *const c_char, out: *mut *mut DckptRuntime) -> c_int {
    status(|| {
        if out.is_null() {
            return Err(Error::InvalidOption("the output handle pointer is NULL".into()));
        }
        let config = if config.is_null() {
            load_config(None)
        } else {
            // SAFETY: a NUL-terminated string per dckpt_init's contract.
            unsafe { text(config, "the configuration path") }.and_then(|path| load_config(Some(Path::new(path))))
        };
        // SAFETY: the caller's contract is dckpt_init's, which is runtime_on's.
        let rt = unsafe { runtime_on(raw, config) }?;
        // SAFETY: `out` is non-NULL and writable per the caller's contract.
        unsafe { *out = Box::into_raw(Box::new(DckptRuntime { rt })) };
        Ok(())
    })
}

/// A runtime over a duplicate of the Fortran communicator handle `comm`
/// (which stays the caller's; `MPI_Comm_f2c` converts it), with `config`
/// agreed by every rank first: what [`dckpt_init_f`] makes, for bindings
/// written in Rust (the Python module passes mpi4py's `comm.py2f()`).
/// Collective.
///
/// # Safety
/// MPI is initialized and `comm` is a live communicator handle of this
/// process (or `MPI_COMM_NULL`, refused).
pub unsafe fn runtime_on_fortran_comm(comm: c_int, config: Result<Config>) -> Result<Runtime> {
    // SAFETY: MPI_Comm_f2c only converts the handle (MPI_COMM_NULL stays
    // null, checked in runtime_on).
    let raw = unsafe { mpi::ffi::RSMPI_Comm_f2c(comm) };
    // SAFETY: the caller's contract is runtime_on's.
    unsafe { runtime_on(raw, config) }
}

/// A runtime over a duplicate of `raw`, `config` agreed by every rank.
///
/// # Safety
/// As for [`dckpt_init`]: `raw` is a live communicator (or MPI_COMM_NULL).
unsafe fn runtime_on(raw: mpi::ffi::MPI_Comm, config: Result<Config>) -> Result<Runtime> {
    // SAFETY: reading the value of a constant MPI handle.
    let (null, mut dup) = unsafe { (mpi::ffi::RSMPI_COMM_NULL, mpi::ffi::RSMPI_COMM_NULL) };
    if raw == null {
        return Err(Error::InvalidOption("the communicator is MPI_COMM_NULL".into()));
    }
    let mut inter: c_int = 0;
    // SAFETY: `raw` is a live communicator per the caller's contract
    // (under MPI's default error handler a bad one aborts the job);
    // `inter` and `dup` receive plain values.
    let rc = unsafe { mpi::ffi::MPI_Comm_test_inter(raw, &mut inter) };
    if rc != mpi::ffi::MPI_SUCCESS as c_int || inter != 0 {
        return Err(Error::InvalidOption("the communicator is not an intra-communicator".into()));
    }
    // SAFETY: as above.
    let rc = unsafe { mpi::ffi::MPI_Comm_dup(raw, &mut dup) };
    if rc != mpi::ffi::MPI_SUCCESS as c_int {
        return Err(Error::Collective(format!("MPI_Comm_dup of the given communicator failed (code {rc})")));
    }
    // SAFETY: `dup` is a live intra-communicator (checked above) this
    // function owns (a duplicate: neither MPI_COMM_WORLD nor
    // MPI_COMM_SELF), freed when `comm` drops; the runtime keeps a
    // duplicate of its own.
    let comm = unsafe { SimpleCommunicator::from_raw(dup) };
    let config = crate::collective::mpi::all_agree(&comm, "loading the configuration", 0, config)?;
    Ok(Runtime::init(&comm, config))
}

/// Makes a runtime over a duplicate of `comm` (collective over it) with the
/// configuration in the TOML file `config_path`, or, if it is NULL, the
/// defaults; `DCKPT_<KEY>` environment variables override either. Writes
/// the handle to `*out`.
///
/// # Safety
/// `comm` is a live intra-communicator; `config_path` is NULL or a
/// NUL-terminated string; `out` points to writable memory for a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_init(
    comm: mpi::ffi::MPI_Comm,
    config_path: *const c_char,
    out: *mut *mut DckptRuntime,
) -> c_int {
    // SAFETY: the caller's contract is init_with's.
    unsafe { init_with(comm, config_path, out) }
}

/// [`dckpt_init`] for Fortran: `comm` is a Fortran communicator handle
/// (`MPI_COMM_WORLD` of `use mpi`, or `%MPI_VAL` of `mpi_f08`).
///
/// # Safety
/// As for [`dckpt_init`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_init_f(comm: c_int, config_path: *const c_char, out: *mut *mut DckptRuntime) -> c_int {
    // SAFETY: MPI_Comm_f2c only converts the handle (MPI_COMM_NULL stays
    // null, checked in init_with); a handle that names no communicator is
    // outside dckpt_init's contract.
    let raw = unsafe { mpi::ffi::RSMPI_Comm_f2c(comm) };
    // SAFETY: the caller's contract is init_with's.
    unsafe { init_with(raw, config_path, out) }
}

/// Protects `len` bytes at `ptr` as region `id`: `kind` is [`DCKPT_HOST`]
/// or [`DCKPT_DEVICE`]. Protecting an id again replaces its region (it may
/// move; its length and kind may not, once a checkpoint name holds it).
///
/// # Safety
/// `h` is a live handle. Until `id` is unprotected or protected again, or
/// the runtime is finalized, the region stays allocated (device memory on
/// the runtime's GPU, in its primary context), and while a dckpt call runs
/// nothing else reads or writes it (the application's device work on it is
/// complete).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_protect(
    h: *mut DckptRuntime,
    id: u32,
    ptr: *mut c_void,
    len: usize,
    kind: c_int,
) -> c_int {
    status(|| {
        // SAFETY: a live handle per the contract.
        let rt = unsafe { runtime(h) }?;
        if ptr.is_null() && len > 0 {
            return Err(Error::InvalidOption(format!("region {id}: the pointer is NULL")));
        }
        let region = match kind {
            DCKPT_HOST => Region::Host { ptr: ptr.cast(), len },
            DCKPT_DEVICE => Region::Device { ptr: ptr as u64, len },
            other => return Err(Error::InvalidOption(format!("region {id}: kind {other} is neither host nor device"))),
        };
        // SAFETY: the caller's contract is `Runtime::protect`'s.
        unsafe { rt.protect(id, region) }
    })
}

/// Stops protecting region `id`.
///
/// # Safety
/// `h` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_unprotect(h: *mut DckptRuntime, id: u32) -> c_int {
    // SAFETY: a live handle per the contract.
    status(|| unsafe { runtime(h) }?.unprotect(id))
}

/// Takes version `version` of checkpoint `name`: every protected region of
/// every rank (collective). Returns once the regions may change again
/// (`mode = "async"`) or once the version is durable everywhere (`"sync"`).
///
/// # Safety
/// `h` is a live handle; `name` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_checkpoint(h: *mut DckptRuntime, name: *const c_char, version: u64) -> c_int {
    status(|| {
        // SAFETY: per the contract.
        let (rt, name) = unsafe { (runtime(h)?, text(name, "the checkpoint name")?) };
        rt.checkpoint(name, version).map(|_| ())
    })
}

/// Writes to `*version` the newest version of `name` every rank can
/// restart from, or 0 if there is none (collective). `*version` is 0 after
/// an error too.
///
/// # Safety
/// `h` is a live handle; `name` a NUL-terminated string; `version` points
/// to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_latest(h: *mut DckptRuntime, name: *const c_char, version: *mut u64) -> c_int {
    // SAFETY: NULL or writable per the contract: 0 unless a version is found.
    unsafe { zero(version) };
    status(|| {
        // SAFETY: per the contract.
        let (rt, name) = unsafe { (runtime(h)?, text(name, "the checkpoint name")?) };
        if version.is_null() {
            return Err(Error::InvalidOption("the version pointer is NULL".into()));
        }
        let newest = rt.latest(name)?.unwrap_or(0);
        // SAFETY: non-NULL and writable per the contract.
        unsafe { *version = newest };
        Ok(())
    })
}

/// Restores version `version` of `name` into every protected region
/// (collective: it succeeds on every rank or fails on every rank).
///
/// # Safety
/// `h` is a live handle; `name` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_restart(h: *mut DckptRuntime, name: *const c_char, version: u64) -> c_int {
    status(|| {
        // SAFETY: per the contract.
        let (rt, name) = unsafe { (runtime(h)?, text(name, "the checkpoint name")?) };
        rt.restart(name, version)
    })
}

/// Restarts from the newest version of `name` that restores on every rank
/// (older ones where the newest is damaged everywhere; one warning names
/// what was skipped) and writes it to `*version`, or 0 if there is none
/// (start from the beginning; also after an error). Collective.
///
/// # Safety
/// `h` is a live handle; `name` a NUL-terminated string; `version` points
/// to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_restart_latest(h: *mut DckptRuntime, name: *const c_char, version: *mut u64) -> c_int {
    // SAFETY: NULL or writable per the contract: 0 unless a version is restored.
    unsafe { zero(version) };
    status(|| {
        // SAFETY: per the contract.
        let (rt, name) = unsafe { (runtime(h)?, text(name, "the checkpoint name")?) };
        if version.is_null() {
            return Err(Error::InvalidOption("the version pointer is NULL".into()));
        }
        let restored = rt.restart_latest(name)?.unwrap_or(0);
        // SAFETY: non-NULL and writable per the contract.
        unsafe { *version = restored };
        Ok(())
    })
}

/// Writes the first `min(all.len(), capacity)` items of `all` to `out` and
/// their number to `*count`: the count-then-fill calls (`dckpt_versions`,
/// `dckpt_committed_versions`, `dckpt_old_regions`).
///
/// # Safety
/// `out` points to `capacity` writable `T` (or is NULL with `capacity` 0);
/// `count` points to writable memory (checked for NULL here).
unsafe fn fill_counted<T: Copy>(all: &[T], out: *mut T, capacity: usize, count: *mut usize, what: &str) -> Result<()> {
    if count.is_null() || (out.is_null() && capacity > 0) {
        return Err(Error::InvalidOption(format!("the {what} or count pointer is NULL")));
    }
    let n = all.len().min(capacity);
    if n > 0 {
        // SAFETY: `out` holds `capacity` >= n writable elements per the contract.
        unsafe { std::slice::from_raw_parts_mut(out, n) }.copy_from_slice(&all[..n]);
    }
    // SAFETY: non-NULL (checked) and writable per the contract.
    unsafe { *count = all.len() };
    Ok(())
}

/// The versions of `name` every rank can be restarted from, oldest first
/// (collective): `*count` gets how many there are, and the first
/// `min(count, capacity)` of them go to `versions` (which may be NULL when
/// `capacity` is 0: ask for the count first).
///
/// # Safety
/// `h` is a live handle; `name` a NUL-terminated string; `versions` points
/// to `capacity` writable `uint64_t` (or is NULL with `capacity` 0);
/// `count` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_versions(
    h: *mut DckptRuntime,
    name: *const c_char,
    versions: *mut u64,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    status(|| {
        // SAFETY: per the contract.
        let (rt, name) = unsafe { (runtime(h)?, text(name, "the checkpoint name")?) };
        // Pointers checked after the collective call: every rank takes part.
        let all = rt.versions(name)?;
        // SAFETY: per the contract.
        unsafe { fill_counted(&all, versions, capacity, count, "versions") }
    })
}

/// One region of one rank of the job that wrote a checkpoint, as
/// [`dckpt_old_regions`] lists it: what a job of another rank count reads
/// with [`dckpt_read_region`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DckptOldRegion {
    /// The old job's rank.
    pub rank: u32,
    /// The id it protected the region under.
    pub id: u32,
    /// The region's length in bytes.
    pub len: u64,
    /// 1 if it was device memory, 0 if host memory.
    pub device: c_int,
}

/// Every region of every rank of the job that wrote `name`, rank by rank
/// and in id order within a rank (collective): `*count` gets how many
/// there are, and the first `min(count, capacity)` go to `regions` (NULL
/// with `capacity` 0: ask for the count first). With the old job's ranks
/// and regions known, a job of any rank count reads what it needs with
/// [`dckpt_read_region`] and checkpoints under a new name.
///
/// # Safety
/// `h` is a live handle; `name` a NUL-terminated string; `regions` points
/// to `capacity` writable `DckptOldRegion` (or is NULL with `capacity` 0);
/// `count` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_old_regions(
    h: *mut DckptRuntime,
    name: *const c_char,
    regions: *mut DckptOldRegion,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    status(|| {
        // SAFETY: per the contract.
        let (rt, name) = unsafe { (runtime(h)?, text(name, "the checkpoint name")?) };
        // Pointers checked after the collective call: every rank takes part.
        let all: Vec<DckptOldRegion> = rt
            .old_regions(name)?
            .iter()
            .flat_map(|t| {
                t.regions.iter().map(|r| DckptOldRegion {
                    rank: t.rank,
                    id: r.id,
                    len: r.len,
                    device: c_int::from(r.device),
                })
            })
            .collect();
        // SAFETY: per the contract.
        unsafe { fill_counted(&all, regions, capacity, count, "regions") }
    })
}

/// The versions of `name` the job that wrote it committed (restorable on
/// every old rank), oldest first: for a job of another rank count, which
/// [`dckpt_read_region`] reads (not collective). `*count` gets how many
/// there are, and the first `min(count, capacity)` go to `versions` (NULL
/// with `capacity` 0: ask for the count first).
///
/// # Safety
/// `h` is a live handle; `name` a NUL-terminated string; `versions` points
/// to `capacity` writable `uint64_t` (or is NULL with `capacity` 0);
/// `count` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_committed_versions(
    h: *mut DckptRuntime,
    name: *const c_char,
    versions: *mut u64,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    status(|| {
        // SAFETY: per the contract.
        let (rt, name) = unsafe { (runtime(h)?, text(name, "the checkpoint name")?) };
        let all = rt.committed_versions(name)?;
        // SAFETY: per the contract.
        unsafe { fill_counted(&all, versions, capacity, count, "versions") }
    })
}

/// Reads bytes `offset .. offset + len` of region `id` of the old job's
/// rank `rank` at committed version `version` of `name` into `buf` (host
/// memory; not collective: each rank reads what it needs).
///
/// # Safety
/// `h` is a live handle; `name` a NUL-terminated string; `buf` points to
/// `len` writable bytes (or is NULL with `len` 0).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn dckpt_read_region(
    h: *mut DckptRuntime,
    name: *const c_char,
    rank: u32,
    id: u32,
    version: u64,
    offset: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    status(|| {
        // SAFETY: per the contract.
        let (rt, name) = unsafe { (runtime(h)?, text(name, "the checkpoint name")?) };
        if buf.is_null() && len > 0 {
            return Err(Error::InvalidOption("the buffer is NULL".into()));
        }
        let end = offset
            .checked_add(len as u64)
            .ok_or_else(|| Error::InvalidOption(format!("bytes {offset} + {len}: past 2^64")))?;
        let bytes = rt.read_region(name, rank, id, version, offset..end)?;
        if bytes.len() != len {
            return Err(Error::Internal(format!("read {} bytes of {len}", bytes.len())));
        }
        if len > 0 {
            // SAFETY: `buf` holds `len` writable bytes per the contract.
            unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) }.copy_from_slice(&bytes);
        }
        Ok(())
    })
}

/// Waits until version `version` of `name` is durable on every tier of
/// every rank (collective).
///
/// # Safety
/// `h` is a live handle; `name` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_wait(h: *mut DckptRuntime, name: *const c_char, version: u64) -> c_int {
    status(|| {
        // SAFETY: per the contract.
        let (rt, name) = unsafe { (runtime(h)?, text(name, "the checkpoint name")?) };
        rt.wait(name, version)
    })
}

/// Whether the job should take a last checkpoint and stop (collective:
/// every rank calls it at the same point): `*flag` is 1 on every rank
/// once SIGTERM, SIGUSR1 or SIGINT reached any rank, or once the
/// scheduler's walltime left is shorter than `halt_seconds` plus what the
/// last checkpoint took to become durable; 0 otherwise (also on error).
/// The first call starts watching the signals (a second signal of a kind
/// then ends the process).
///
/// # Safety
/// `h` is a live handle; `flag` points to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_should_exit(h: *mut DckptRuntime, flag: *mut c_int) -> c_int {
    if flag.is_null() {
        return status(|| Err(Error::InvalidOption("dckpt_should_exit: flag is NULL".into())));
    }
    // SAFETY: non-NULL and writable per the contract; written before anything can fail.
    unsafe { *flag = 0 };
    status(|| {
        // SAFETY: per the contract.
        let rt = unsafe { runtime(h)? };
        let stop = rt.should_exit()?;
        // SAFETY: as above.
        unsafe { *flag = c_int::from(stop) };
        Ok(())
    })
}

/// Waits for every checkpoint to be durable and frees the runtime
/// (collective). NULL is accepted and does nothing.
///
/// # Safety
/// `h` is NULL or a live handle, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dckpt_finalize(h: *mut DckptRuntime) -> c_int {
    status(|| {
        if h.is_null() {
            return Ok(());
        }
        // SAFETY: a live handle made by Box::into_raw in init, given back once.
        let owned = unsafe { Box::from_raw(h) };
        owned.rt.finalize()
    })
}

/// The message of the calling thread's last error ("" if none), valid
/// until the thread's next dckpt call.
#[unsafe(no_mangle)]
pub extern "C" fn dckpt_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Sets `*out` to 0 where `out` is not NULL: what a `*version` holds
/// when a call fails before it knows one.
///
/// # Safety
/// `out` is NULL or points to writable memory.
unsafe fn zero(out: *mut u64) {
    if !out.is_null() {
        // SAFETY: non-NULL and writable per the contract.
        unsafe { *out = 0 };
    }
}

#[cfg(test)]
mod tests;
