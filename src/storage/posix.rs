//! [`Posix`]: the storage contract on a local or shared POSIX directory.
//! Temporary files are created exclusively, never through a symbolic link;
//! durability is fsync of the file, rename, fsync of the directory; the lock
//! is an advisory `flock` on a file that holds the owner's pid.

use super::{Entry, Fill, LockGuard, ReadAt, Storage, fsio};
use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A POSIX directory tree.
#[derive(Clone, Debug)]
pub struct Posix {
    root: PathBuf,
}

impl Posix {
    /// The tree under `root`, as it is (nothing is created).
    pub fn at(root: &Path) -> Self {
        Posix { root: root.to_path_buf() }
    }

    /// The tree under `root`, created if missing, under its canonical name
    /// (`a/../b` through a missing `a` resolves to the real `b`).
    pub fn create(root: &Path) -> Result<Self> {
        fs::create_dir_all(root).map_err(|e| Error::io(root, e))?;
        let root = root.canonicalize().map_err(|e| Error::io(root, e))?;
        Ok(Posix { root })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Refuses `rel` where a directory on its way below the root (with
    /// `whole`, also its last component) is a symbolic link: nothing is
    /// listed, written, renamed or removed outside the store through one.
    fn inside(&self, rel: &Path, whole: bool) -> Result<PathBuf> {
        let mut at = self.root.clone();
        let parts: Vec<_> = rel.components().collect();
        let checked = if whole { parts.len() } else { parts.len().saturating_sub(1) };
        for part in &parts[..checked] {
            at.push(part);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(Error::UnsafePath {
                        path: at,
                        reason: "a symbolic link inside the store (dckpt does not follow links there)".into(),
                    });
                }
                // Missing: nothing to follow (the operation says what is missing).
                _ => {}
            }
        }
        Ok(self.locate(rel))
    }
}

#[derive(Debug)]
struct PosixFile {
    file: File,
    len: u64,
}

impl ReadAt for PosixFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
}

#[derive(Debug)]
struct PosixLock {
    file: File,
}

impl LockGuard for PosixLock {}

impl Drop for PosixLock {
    fn drop(&mut self) {
        // Unlock explicitly rather than by closing: a child process forked
        // meanwhile (between its fork and exec) shares the open file
        // description and would otherwise keep the lock a moment longer.
        let _ = self.file.unlock();
    }
}

impl Storage for Posix {
    fn locate(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() { self.root.clone() } else { self.root.join(rel) }
    }

    fn create_dir(&self, rel: &Path) -> Result<()> {
        let p = self.inside(rel, true)?;
        fs::create_dir_all(&p).map_err(|e| Error::io(&p, e))
    }

    fn read(&self, rel: &Path) -> Result<Option<Vec<u8>>> {
        let p = self.inside(rel, false)?;
        let mut bytes = Vec::new();
        match fsio::open_regular(&p).and_then(|mut f| f.read_to_end(&mut bytes)) {
            Ok(_) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&p, e)),
        }
    }

    fn open(&self, rel: &Path) -> Result<Box<dyn ReadAt>> {
        let p = self.inside(rel, false)?;
        let file = fsio::open_regular(&p).map_err(|e| Error::io(&p, e))?;
        let len = file.metadata().map_err(|e| Error::io(&p, e))?.len();
        Ok(Box::new(PosixFile { file, len }))
    }

    fn list(&self, rel: &Path) -> Result<Vec<Entry>> {
        let p = self.inside(rel, true)?;
        let entries = match fs::read_dir(&p) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(&p, e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&p, e))?;
            // symlink_metadata: a link is reported as a link, never followed.
            // An entry gone since the directory was read (another process's
            // temporary file renamed, a retired file removed) is not listed.
            let meta = match fs::symlink_metadata(entry.path()) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(entry.path(), e)),
            };
            out.push(Entry {
                name: entry.file_name().to_string_lossy().into_owned(),
                is_dir: meta.is_dir(),
                is_symlink: meta.file_type().is_symlink(),
                len: if meta.is_file() { meta.len() } else { 0 },
            });
        }
        Ok(out)
    }

    fn write_atomic(&self, rel: &Path, fill: Fill<'_>) -> Result<()> {
        fsio::write_atomic_with(&self.inside(rel, false)?, |f| fill(f))
    }

    fn remove(&self, rel: &Path) -> Result<()> {
        let p = self.inside(rel, false)?;
        fs::remove_file(&p).map_err(|e| Error::io(&p, e))
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        let (f, t) = (self.inside(from, false)?, self.inside(to, false)?);
        fs::rename(&f, &t).map_err(|e| Error::io(&f, e))
    }

    fn barrier(&self, rel: &Path) -> Result<()> {
        fsio::sync_dir(&self.locate(rel))
    }

    fn lock(&self, rel: &Path) -> Result<Box<dyn LockGuard>> {
        let path = self.inside(rel, false)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let holder = text.trim().parse::<u32>().map(|p| format!(" (pid {p})")).unwrap_or_default();
                let dir = path.parent().map_or_else(|| path.clone(), Path::to_path_buf);
                return Err(Error::Locked { dir, holder });
            }
            Err(fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
        }
        // The pid is a courtesy for the message above; failing to write it is harmless.
        let _ = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| write!(file, "{}", std::process::id()));
        Ok(Box::new(PosixLock { file }))
    }
}
