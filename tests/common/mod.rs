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
