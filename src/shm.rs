//! Host memory that outlives the process that filled it: segments of files
//! in a shared-memory directory (`/dev/shm`), mapped shared. The host cache
//! lends them when the per-node agent is on (`crate::agent`): a rank killed
//! right after a checkpoint returned leaves its diff's bytes here, and the
//! agent maps the same files again ([`ShmView`]) to finish the flush.
//!
//! The one place that maps memory: `mmap`/`munmap` through `rustix`, each
//! call with its SAFETY argument. A segment's space is reserved with
//! `fallocate` before it is mapped, so a full shared-memory directory is a
//! clear error here, never a `SIGBUS` on a later write.
#![allow(unsafe_code)]

use crate::error::{Error, Result};
use crate::memory::SegmentMemory;
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// A mapping of `len` bytes (never empty) that its owner unmaps.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Mapping` is plain memory owned by one value; access goes
// through `&`/`&mut` of its owner, as for a `Box<[u8]>`.
unsafe impl Send for Mapping {}
// SAFETY: as above: shared access is read-only.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` from offset 0, shared; `write` for read-write.
    fn of(file: &File, len: usize, write: bool) -> std::io::Result<Mapping> {
        use rustix::mm::{MapFlags, ProtFlags};
        if len == 0 {
            return Err(std::io::Error::other("an empty mapping"));
        }
        let prot = if write { ProtFlags::READ | ProtFlags::WRITE } else { ProtFlags::READ };
        let flags = MapFlags::SHARED;
        // SAFETY: a new mapping at an address the kernel picks (no existing
        // memory is replaced) of a file this process opened; the file was
        // sized to at least `len` bytes by the caller, and the mapping is
        // unmapped only in `Drop`, after every borrow of it has ended.
        let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, flags, file, 0) }?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for this value's life.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` writable bytes (only `ShmSegment`, which
        // maps read-write, calls this) and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned, and no
        // borrow of the bytes outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A segment of host memory in a file of a shared-memory directory, mapped
/// shared and read-write; the file is removed when the segment is dropped
/// (a process that dies leaves it for the agent).
pub struct ShmSegment {
    map: Mapping,
    path: PathBuf,
    name: String,
}

impl std::fmt::Debug for ShmSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmSegment").field("path", &self.path).field("len", &self.map.len).finish()
    }
}

impl ShmSegment {
    /// A new file `name` of `len` bytes in `dir` (created, owner-only; an
    /// existing file is an error), its space reserved and every page mapped
    /// writable now, so that no later write pays a fault (a shared mapping's
    /// `MAP_POPULATE` maps pages read-only: the first write would still
    /// fault). A segment larger than the cache's 4 MiB (a spill, made in a
    /// call) is faulted in by every core at once.
    pub fn create(dir: &Path, name: &str, len: usize) -> Result<Self> {
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        let made = rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, len.max(1) as u64)
            .map_err(std::io::Error::from)
            .and_then(|()| Mapping::of(&file, len.max(1), true));
        match made {
            Ok(mut map) => {
                prefault(map.bytes_mut());
                Ok(ShmSegment { map, path, name: name.to_string() })
            }
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(Error::io(&path, e))
            }
        }
    }
}

/// Writes one byte of every page of `bytes` (a zero over reserved zeroed
/// pages: the contents do not change), in parallel past 4 MiB.
fn prefault(bytes: &mut [u8]) {
    use rayon::prelude::*;
    const PAGE: usize = 4096;
    // A zero the compiler cannot see: a store of a known zero into memory
    // it may assume unchanged could be dropped, and the page left unmapped.
    let touch = |page: &mut [u8]| page[0] = std::hint::black_box(0);
    if bytes.len() > 4 << 20 {
        bytes.par_chunks_mut(PAGE).for_each(touch);
    } else {
        bytes.chunks_mut(PAGE).for_each(touch);
    }
}

impl SegmentMemory for ShmSegment {
    fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.map.bytes_mut()
    }

    fn shm_name(&self) -> Option<&str> {
        Some(&self.name)
    }
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A read-only mapping of a segment file another process left (the agent's
/// view of a dead rank's host cache).
pub struct ShmView {
    map: Mapping,
}

impl ShmView {
    /// Maps the first `len` bytes of `path` (an error if the file is shorter).
    pub fn open(path: &Path, len: usize) -> Result<Self> {
        let file = crate::storage::fsio::open_regular(path).map_err(|e| Error::io(path, e))?;
        let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if size < len as u64 {
            return Err(Error::corrupt(path, format!("a cache segment of {size} bytes, {len} expected")));
        }
        let map = Mapping::of(&file, len.max(1), false).map_err(|e| Error::io(path, e))?;
        Ok(ShmView { map })
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }
}
