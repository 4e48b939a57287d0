//! Helpers shared by the integration tests.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures
#![allow(dead_code)]

use dckpt::{Engine, HashAlgo, Method, StoreOptions};
use std::path::Path;

/// Checkpoints every version with a fresh store under `root`.
pub fn checkpoint_all(root: &Path, opts: &StoreOptions, versions: &[Vec<u8>]) -> Vec<dckpt::engine::CheckpointReport> {
    let mut engine = Engine::open_or_create(root, 0, versions[0].len() as u64, opts).expect("open store");
    versions.iter().enumerate().map(|(i, v)| engine.checkpoint(i as u64 + 1, v).expect("checkpoint")).collect()
}

/// Restores every version and compares it byte for byte.
pub fn assert_restores(root: &Path, versions: &[Vec<u8>]) {
    for (i, v) in versions.iter().enumerate() {
        let got = dckpt::restore::restore_version(root, 0, i as u64 + 1).expect("restore");
        assert!(got == *v, "version {} differs after restore", i + 1);
    }
}

/// Options for a method and chunk size.
pub fn opts(method: Method, chunk_size: u32) -> StoreOptions {
    StoreOptions { chunk_size, method, hash: HashAlgo::Murmur3, ..StoreOptions::default() }
}

/// Deterministic pseudo-random bytes.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A small tmpfs, unmounted on drop; `None` where mounting is not allowed
/// (it needs root: CI runs as root).
pub struct SmallFs(pub std::path::PathBuf);

impl SmallFs {
    /// Mounts a tmpfs of `size` (`4m`) at `at`.
    pub fn mount(at: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(at).ok()?;
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", at.to_str()?])
            .status();
        st.ok().filter(|s| s.success()).map(|_| SmallFs(at.to_path_buf()))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// `n` versions of a `len`-byte buffer: each rewrites eight 200-byte pieces
/// of the previous one (the asynchronous tiers' tests).
pub fn edited_versions(n: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut v = noise(len, seed);
    (0..n)
        .map(|i| {
            for k in 0..8 {
                let at = (i * 7919 + k * 104_729) % (len - 200);
                v[at..at + 200].copy_from_slice(&noise(200, seed * 100 + i as u64 * 10 + k as u64));
            }
            v.clone()
        })
        .collect()
}

/// Tier options with these directories and host cache, the rest default.
pub fn tier_options(
    local: Option<std::path::PathBuf>,
    shared: Option<std::path::PathBuf>,
    cache: u64,
) -> dckpt::tiers::TierOptions {
    dckpt::tiers::TierOptions { local, shared, host_cache_bytes: cache, ..dckpt::tiers::TierOptions::default() }
}

/// The repeated shapes of `len` bytes (a multiple of 4 KiB) issue #29 names:
/// zeros with a few bytes set at the start, a repeated 4 KiB pattern, half
/// noise and half zeros, noise with every seventh page the same; and a ramp
/// of 512-byte steps (runs of equal chunks whose sources follow one another).
pub fn repeated_shapes(len: usize) -> Vec<(&'static str, Vec<u8>)> {
    let mut zeros = vec![0u8; len];
    zeros[..5].copy_from_slice(b"hello");
    let page = noise(4096, 7);
    let pattern: Vec<u8> = page.iter().copied().cycle().take(len).collect();
    let mut half = noise(len / 2, 8);
    half.resize(len, 0);
    let mut pages = noise(len, 9);
    for p in (0..len / 4096).step_by(7) {
        pages[p * 4096..(p + 1) * 4096].copy_from_slice(&page);
    }
    let ramp: Vec<u8> = (0..len).map(|i| (i / 512) as u8).collect();
    vec![("zeros", zeros), ("pattern", pattern), ("half", half), ("pages", pages), ("ramp", ramp)]
}
