//! File-system primitives every durable write goes through: exclusive,
//! uniquely named temporary files in the target's directory (never following
//! a symbolic link), fsync, rename, directory fsync; and the safe output
//! write of a restore.

use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Suffix of every temporary file dckpt creates.
pub const TEMP_SUFFIX: &str = ".tmp";

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Whether `name` is a temporary file of an unfinished write (ours, or the
/// fixed `*.tmp` names older versions of dckpt used).
pub fn is_temp_name(name: &str) -> bool {
    name.ends_with(TEMP_SUFFIX)
}

/// A fresh temporary path beside `path`: `.<name>.<pid>.<n>.tmp`, unique
/// within this process and across processes.
fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    path.with_file_name(format!(".{name}.{}.{n}.{nanos:08x}{TEMP_SUFFIX}", std::process::id()))
}

/// Opens `path` for reading if it is a regular file, refusing anything
/// else before it can block a reader or lead out of the store: a symbolic
/// link (`O_NOFOLLOW`), a FIFO, a device, a socket or a directory (opened
/// non-blocking, then checked). The refusal is an `InvalidInput` error
/// saying what the path is.
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refused("a symbolic link"),
            _ => e,
        })?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    let what = if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    };
    Err(refused(what))
}

fn refused(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{what}, not a regular file: refused"))
}

/// The whole content of the regular file `path` ([`open_regular`]).
pub fn read_regular(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    open_regular(path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(|e| Error::io(path, e))?;
    Ok(bytes)
}

/// Creates a new file exclusively (`O_CREAT | O_EXCL | O_NOFOLLOW`): a
/// planted file or symbolic link at `path` makes it fail instead of being
/// followed or truncated.
pub fn create_exclusive(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o644)
        .open(path)
        .map_err(|e| Error::io(path, e))
}

/// Writes a file durably and atomically: `fill` writes into an exclusive
/// temporary file beside `path`, which is fsynced and renamed over `path`
/// (the rename replaces a link itself, never its target). The directory is
/// not fsynced: call [`sync_dir`] once after a batch of writes. On error the
/// temporary file is removed and `path` is untouched.
pub fn write_atomic_with(path: &Path, fill: impl FnOnce(&mut File) -> std::io::Result<()>) -> Result<()> {
    let tmp = temp_path(path);
    let mut file = create_exclusive(&tmp)?;
    let result = fill(&mut file).and_then(|()| file.sync_all()).and_then(|()| {
        crate::failpoint::hit("store.temp_written");
        fs::rename(&tmp, path)
    });
    crate::failpoint::hit("store.renamed");
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// [`write_atomic_with`] of one buffer.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

/// fsyncs a directory (makes renames and removals in it durable).
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))
}

/// Writes all of `bytes` to a stream opened non-blocking, waiting (briefly
/// sleeping) while a pipe is full.
fn write_stream(f: &mut File, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match f.write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes restored bytes to `out` without ever damaging what is there by
/// accident: a symbolic link, a block device, a directory, or any path inside
/// the store `store_root` is refused; a character device (`/dev/null`, a
/// pipe's node) is written in place; anything else is written through an
/// exclusive temporary file in `out`'s directory and renamed over it.
pub fn write_output(out: &Path, bytes: &[u8], store_root: &Path) -> Result<()> {
    let refuse = |reason: &str| Error::UnsafePath { path: out.to_path_buf(), reason: format!("not written: {reason}") };
    // A stream (character device, pipe) is written in place, also through a
    // link such as /dev/stdout; a pipe without a reader is an error, not a hang.
    let stream = fs::metadata(out).is_ok_and(|m| m.file_type().is_char_device() || m.file_type().is_fifo());
    if stream {
        let mut f = OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(out).map_err(|e| {
            match e.raw_os_error() {
                Some(libc::ENXIO) => refuse("it is a pipe nobody reads"),
                _ => Error::io(out, e),
            }
        })?;
        return write_stream(&mut f, bytes).map_err(|e| Error::io(out, e));
    }
    match fs::symlink_metadata(out) {
        Ok(m) if m.file_type().is_symlink() => return Err(refuse("it is a symbolic link")),
        Ok(m) if !m.is_file() => return Err(refuse("it is not a regular file")),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(out, e)),
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent = parent.canonicalize().map_err(|e| Error::io(parent, e))?;
    if let Ok(root) = store_root.canonicalize()
        && parent.starts_with(&root)
    {
        return Err(refuse("it lies inside the checkpoint store being read"));
    }
    let name = out.file_name().ok_or_else(|| refuse("it names no file"))?;
    write_atomic(&parent.join(name), bytes)
}

/// Asks the kernel to drop the cached pages of every regular file below
/// `dir` (links not followed; what cannot be opened is skipped), so that
/// the next reads come from the device: a benchmark's cold read. Clean
/// pages only: call it after the files are fsynced. The files advised.
pub fn drop_cached_pages(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut n = 0;
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            n += drop_cached_pages(&e.path());
        } else if t.is_file()
            && let Ok(f) = File::open(e.path())
            && rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).is_ok()
        {
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_never_follows_a_planted_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        fs::write(&victim, b"keep").expect("write");
        let target = dir.path().join("file");
        std::os::unix::fs::symlink(&victim, &target).expect("symlink");
        write_atomic(&target, b"new").expect("write through rename");
        assert_eq!(fs::read(&victim).expect("read"), b"keep", "the link's target is untouched");
        assert_eq!(fs::read(&target).expect("read"), b"new");
        assert!(!fs::symlink_metadata(&target).expect("meta").file_type().is_symlink());
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .expect("ls")
            .flatten()
            .filter(|e| is_temp_name(&e.file_name().to_string_lossy()))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn output_refuses_links_and_store_paths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = dir.path().join("store");
        fs::create_dir_all(store.join("rank-00000")).expect("mkdir");
        let inside = store.join("rank-00000").join("v000000000001.dckpt");
        fs::write(&inside, b"precious").expect("write");
        let e = write_output(&inside, b"x", &store).expect_err("inside the store");
        assert_eq!(e.kind(), crate::error::ErrorKind::UnsafePath);
        assert_eq!(fs::read(&inside).expect("read"), b"precious");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&inside, &link).expect("symlink");
        assert!(write_output(&link, b"x", &store).is_err());
        assert_eq!(fs::read(&inside).expect("read"), b"precious");
        write_output(Path::new("/dev/null"), b"x", &store).expect("character devices are written in place");
        let fine = dir.path().join("out.bin");
        write_output(&fine, b"ok", &store).expect("plain file");
        assert_eq!(fs::read(&fine).expect("read"), b"ok");
    }
}
