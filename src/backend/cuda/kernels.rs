//! Where the device's kernels come from, fastest first:
//!
//! 1. **Built ahead of time** and embedded in the library: machine code
//!    (cubin) for the architectures under `kernels/prebuilt/`, made from
//!    this very source (`dckpt kernels --emit kernels/prebuilt` on a GPU
//!    machine; `build.rs` embeds what it finds). A blob made from another
//!    version of the source is never used.
//! 2. **The node's kernel cache** (`$DCKPT_KERNEL_CACHE`, else
//!    `$XDG_CACHE_HOME/dckpt/kernels`, else `~/.cache/dckpt/kernels`):
//!    machine code NVRTC made here before, keyed by the source, the
//!    options and the architecture.
//! 3. **NVRTC, once per node**: the first rank takes an exclusive lock on
//!    the cache entry, compiles to machine code and writes it; the node's
//!    other ranks wait on the lock and load what it wrote, instead of each
//!    compiling the same kernels at once.

use super::SOURCE;
use crate::error::{Error, Result};
use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::Ptx;
use std::path::{Path, PathBuf};
use std::sync::Arc;

// The kernels `build.rs` found under kernels/prebuilt/: (file name, bytes).
include!(concat!(env!("OUT_DIR"), "/prebuilt_kernels.rs"));

/// NVRTC's options besides the architecture (part of every key).
const OPTIONS: [&str; 2] = ["-std=c++17", "-default-device"];

/// Where a module's code came from (for `DCKPT_PROFILE` and the bench).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// Embedded in the library, built ahead of time.
    Prebuilt,
    /// The node's kernel cache.
    Cached,
    /// Compiled by NVRTC in this process.
    Compiled,
}

/// The key of the kernels for `arch` (`sm_90`): a hash of the source and
/// the options, its first 16 hex digits.
pub fn key(arch: &str) -> String {
    let h = blake3::hash(format!("{arch}\n{}\n{SOURCE}", OPTIONS.join(" ")).as_bytes()).to_hex();
    h.as_str()[..16].to_string()
}

/// The file name of the machine code for `arch`.
pub fn cubin_name(arch: &str) -> String {
    format!("dedup-{arch}-{}.cubin", key(arch))
}

/// The node's kernel cache directory.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("DCKPT_KERNEL_CACHE") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("dckpt").join("kernels")
}

/// The kernels for `arch` loaded into `ctx`, and where they came from.
pub(super) fn load(ctx: &Arc<CudaContext>, arch: &str) -> Result<(Arc<CudaModule>, KernelSource)> {
    let name = cubin_name(arch);
    if let Some((_, bytes)) = PREBUILT.iter().find(|(n, _)| *n == name) {
        match load_image(ctx, bytes.to_vec()) {
            Ok(m) => return Ok((m, KernelSource::Prebuilt)),
            Err(e) => tracing::warn!("the prebuilt kernels {name} do not load ({e}); compiling them"),
        }
    }
    let dir = cache_dir();
    let path = dir.join(&name);
    if let Some(m) = read_cached(ctx, &path) {
        return Ok((m, KernelSource::Cached));
    }
    // One compiler per node: the others wait here, then read its file.
    let _lock = lock(&dir, &name);
    if let Some(m) = read_cached(ctx, &path) {
        return Ok((m, KernelSource::Cached));
    }
    let cubin = compile(arch)?;
    write_cached(&path, &cubin);
    Ok((load_image(ctx, cubin)?, KernelSource::Compiled))
}

/// The machine code of the kernels for `arch`, compiled by NVRTC now.
pub fn compile(arch: &str) -> Result<Vec<u8>> {
    let mut options: Vec<String> = OPTIONS.iter().map(|o| o.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    super::driver::nvrtc_cubin(SOURCE, &options)
        .map_err(|(what, e)| Error::Gpu(format!("NVRTC {what} kernels/dedup.cu + files.cu: {e}")))
}

fn load_image(ctx: &Arc<CudaContext>, image: Vec<u8>) -> Result<Arc<CudaModule>> {
    ctx.load_module(Ptx::from_binary(image)).map_err(|e| Error::Gpu(format!("loading kernels: {e}")))
}

/// The module in the cache file `path`, if it is there and loads.
fn read_cached(ctx: &Arc<CudaContext>, path: &Path) -> Option<Arc<CudaModule>> {
    let bytes = std::fs::read(path).ok()?;
    match load_image(ctx, bytes) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!("the cached kernels {} do not load ({e}); compiling them again", path.display());
            None
        }
    }
}

/// Writes `cubin` to the cache through a temporary file and a rename (a
/// failure only costs a compilation next time).
fn write_cached(path: &Path, cubin: &[u8]) {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    if std::fs::write(&tmp, cubin).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The node-wide lock on compiling `name` (`None` where the cache
/// directory cannot hold one: every rank then compiles, as before).
fn lock(dir: &Path, name: &str) -> Option<std::fs::File> {
    std::fs::create_dir_all(dir).ok()?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!("{name}.lock")))
        .ok()?;
    file.lock().ok()?;
    Some(file)
}

/// The architectures `dckpt kernels --emit` builds ahead of time by
/// default: Ampere (A100), Ada (L40) and Hopper (H100, H200).
pub const PREBUILT_ARCHS: [&str; 3] = ["sm_80", "sm_89", "sm_90"];

/// Compiles the kernels for each of `archs` and writes their machine code
/// into `dir` (what `build.rs` embeds from `kernels/prebuilt/`); the paths
/// written.
pub fn emit(dir: &Path, archs: &[&str]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    archs
        .iter()
        .map(|arch| {
            let path = dir.join(cubin_name(arch));
            std::fs::write(&path, compile(arch)?).map_err(|e| Error::io(&path, e))?;
            Ok(path)
        })
        .collect()
}

/// The prebuilt kernels embedded in this build: file name and bytes.
pub fn prebuilt() -> &'static [(&'static str, &'static [u8])] {
    PREBUILT
}
