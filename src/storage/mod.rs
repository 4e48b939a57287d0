//! The storage contract: what the store, restore, verify and inspect need
//! from wherever diff files live, and its POSIX implementation ([`Posix`]).
//!
//! Paths are relative to the storage's root (`rank-00003/MANIFEST`). The
//! contract, which every implementation keeps and the store's commit
//! protocol relies on:
//!
//! - [`Storage::write_atomic`] either leaves `rel` holding exactly the bytes
//!   written, durable, or leaves it as it was (a crash may leave a temporary
//!   file, whose name [`is_temp_name`] recognizes; nothing else). The new
//!   *name* is durable only after [`Storage::barrier`] on its directory.
//! - [`Storage::remove`] and [`Storage::rename`] are durable after a barrier.
//! - [`Storage::lock`] is exclusive across processes and returns at once
//!   ([`Error::Locked`](crate::error::Error::Locked) when held).
//! - Reads never follow a write that has not returned; a [`ReadAt`] sees the
//!   file as it was when opened (or fails).
//!
//! Synchronous by design: the asynchronous tiers run these calls on their
//! own threads. Decorators (fault injection in tests, a throttle) wrap an
//! `Arc<dyn Storage>`.

pub mod fsio;
mod posix;

pub use fsio::is_temp_name;
pub use posix::Posix;

use crate::error::Result;
use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// One name in a listed directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The file name.
    pub name: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Whether it is a symbolic link (never followed).
    pub is_symlink: bool,
    /// Bytes (0 for directories).
    pub len: u64,
}

/// A file open for positioned reads.
pub trait ReadAt: fmt::Debug + Send + Sync {
    /// The file's length when it was opened.
    fn len(&self) -> u64;

    /// Whether the file is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` from `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// The bytes `offset..offset + len`, borrowed without a copy, where the
    /// file lives in memory in one piece there; `None` (the default) when
    /// they must be read with [`ReadAt::read_exact_at`].
    fn borrow_at(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let _ = (offset, len);
        None
    }
}

/// Held while a writer lock is taken; dropping it releases the lock.
pub trait LockGuard: fmt::Debug + Send + Sync {}

/// Fills a file being written.
pub type Fill<'a> = &'a mut dyn FnMut(&mut dyn Write) -> io::Result<()>;

/// Where diff files, manifests and commit records live (see the module
/// documentation for the contract).
pub trait Storage: fmt::Debug + Send + Sync {
    /// Where `rel` is, for messages (a path for [`Posix`]).
    fn locate(&self, rel: &Path) -> PathBuf;

    /// Creates directory `rel` and its parents (durable after a barrier on
    /// the parent).
    fn create_dir(&self, rel: &Path) -> Result<()>;

    /// The whole of a small file; `None` when it does not exist.
    fn read(&self, rel: &Path) -> Result<Option<Vec<u8>>>;

    /// Opens `rel` for positioned reads.
    fn open(&self, rel: &Path) -> Result<Box<dyn ReadAt>>;

    /// The names in directory `rel` (empty when it does not exist).
    fn list(&self, rel: &Path) -> Result<Vec<Entry>>;

    /// Writes `rel` atomically and durably through a uniquely named
    /// temporary file beside it; `fill` writes the bytes.
    fn write_atomic(&self, rel: &Path, fill: Fill<'_>) -> Result<()>;

    /// Removes file `rel`.
    fn remove(&self, rel: &Path) -> Result<()>;

    /// Renames file `from` to `to` (replacing `to`).
    fn rename(&self, from: &Path, to: &Path) -> Result<()>;

    /// Makes the names in directory `rel` durable (new, renamed, removed).
    fn barrier(&self, rel: &Path) -> Result<()>;

    /// Takes the exclusive lock `rel` (created if needed).
    fn lock(&self, rel: &Path) -> Result<Box<dyn LockGuard>>;
}

/// [`Storage::write_atomic`] of one buffer.
pub fn write_bytes(storage: &dyn Storage, rel: &Path, bytes: &[u8]) -> Result<()> {
    storage.write_atomic(rel, &mut |w| w.write_all(bytes))
}
