//! Compression on the flush path: a compressed diff file reads block for
//! block like the plain one it came from (both codecs, blocks that do not
//! shrink stored as they are); the tiers write compressed files that restore
//! byte-exactly from every tier, after a reopen too; every flipped byte and
//! every truncation of a compressed file is caught.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{checkpoint_all, noise, opts};
use dckpt::Method;
use dckpt::backend::BackendKind;
use dckpt::format::compress::Codec;
use dckpt::format::{Compression, DiffReader, compress_file};
use dckpt::memory::ProtectedMut;
use dckpt::restore::restore_version;
use dckpt::tiers::{TierOptions, TieredEngine};
use proptest::prelude::*;
use std::path::Path;

const CODECS: [Compression; 3] = [Compression::Lz4, Compression::Zstd { level: 1 }, Compression::Zstd { level: 9 }];

/// A buffer of `len` bytes: runs of a repeated byte (compressible) between
/// stretches of noise (not), in proportions set by `seed`.
fn field(len: usize, seed: u64) -> Vec<u8> {
    let mut v = noise(len, seed);
    let mut at = (seed as usize * 131) % 4096;
    while at < len {
        let run = (4096 + at * 7 % 70_000).min(len - at);
        v[at..at + run].fill((at / 4096) as u8);
        at += run + 8192;
    }
    v
}

fn diff_path(root: &Path, v: u64) -> std::path::PathBuf {
    root.join(format!("rank-00000/v{v:012}.dckpt"))
}

/// Compresses `plain` (a file on disk) into `out` and checks that both read the same.
fn check_round_trip(plain: &Path, out: &Path, how: Compression) -> (u64, u64) {
    let bytes = std::fs::read(plain).unwrap();
    let z = compress_file(&[&bytes], bytes.len() as u64, how).unwrap();
    // A file handed over unsealed (trailer not yet written) compresses the same.
    let mut unsealed = bytes.clone();
    let n = unsealed.len();
    unsealed[n - 32..].fill(0);
    let (a, b) = unsealed.split_at(n / 3);
    assert!(compress_file(&[a, b], n as u64, how).unwrap() == z, "{how}: unsealed input");
    std::fs::write(out, &z).unwrap();
    let (p, c) = (DiffReader::open(plain).unwrap(), DiffReader::open(out).unwrap());
    assert_eq!(c.codec(), Some(how.codec()));
    assert_eq!(p.codec(), None);
    assert_eq!(p.diff, c.diff);
    assert_eq!(p.block_count(), c.block_count());
    let blocks = p.block_count();
    for (lo, hi) in [(0, blocks), (0, 1.min(blocks)), (blocks / 2, blocks), (blocks / 3, (blocks / 3 + 2).min(blocks))]
    {
        assert!(p.read_blocks(lo..hi).unwrap() == c.read_blocks(lo..hi).unwrap(), "{how}: blocks {lo}..{hi}");
    }
    c.verify_data().unwrap();
    assert!(compress_file(&[&z], z.len() as u64, how).is_err(), "a compressed file is not compressed twice");
    (bytes.len() as u64, z.len() as u64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn compressed_files_read_like_the_plain_ones(seed in 1u64..1000, len in 1usize..400_000, cs in prop_oneof![Just(64u32), Just(128), Just(4096)]) {
        let dir = tempfile::tempdir().unwrap();
        let v1 = field(len, seed);
        let mut v2 = v1.clone();
        for k in 0..5 {
            let at = (k * 7919 + seed as usize) % len;
            let end = (at + 3000).min(len);
            v2[at..end].copy_from_slice(&noise(end - at, seed + k as u64));
        }
        checkpoint_all(dir.path(), &opts(Method::Tree, cs), &[v1, v2]);
        for v in 1..=2 {
            for how in CODECS {
                check_round_trip(&diff_path(dir.path(), v), &dir.path().join("z.dckpt"), how);
            }
        }
    }
}

#[test]
fn compressible_data_shrinks_and_noise_is_stored_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    // Every 128-byte chunk distinct (no de-duplication) but mostly zeros.
    let mut sparse = vec![0u8; 1 << 20];
    sparse.chunks_mut(128).enumerate().for_each(|(i, c)| c[..4].copy_from_slice(&(i as u32).to_le_bytes()));
    let random = noise(1 << 20, 5);
    for (name, data) in [("sparse", &sparse), ("noise", &random)] {
        let root = dir.path().join(name);
        checkpoint_all(&root, &opts(Method::Tree, 128), std::slice::from_ref(data));
        for how in CODECS {
            let (plain, z) = check_round_trip(&diff_path(&root, 1), &dir.path().join("z.dckpt"), how);
            if name == "sparse" {
                assert!(z * 8 < plain, "{how}: sparse data shrinks ({z} of {plain} bytes)");
            } else {
                // Every block stored as it is: the frame table (16 blocks) and
                // the tables' stored length are added; the tiny tables may shrink.
                let added = z as i64 - plain as i64;
                assert!((64..=72).contains(&added), "{how}: noise adds {added} bytes");
            }
        }
    }
}

fn tiers(root: &Path, how: Option<Compression>) -> TierOptions {
    TierOptions {
        local: Some(root.join("local")),
        shared: Some(root.join("shared")),
        host_cache_bytes: 8 << 20,
        compression: how,
        ..TierOptions::default()
    }
}

#[test]
fn tiers_write_compressed_files_that_restore_from_every_tier_and_after_a_reopen() {
    let len = 300_000;
    let mut vs = vec![field(len, 3)];
    for i in 1..8u64 {
        let mut v = vs[i as usize - 1].clone();
        let at = (i as usize * 37_561) % (len - 5000);
        v[at..at + 5000].copy_from_slice(&noise(5000, i));
        vs.push(v);
    }
    let o = dckpt::StoreOptions { max_chain: Some(3), ..opts(Method::Tree, 128) };
    for how in [Compression::Lz4, Compression::Zstd { level: 3 }] {
        let dir = tempfile::tempdir().unwrap();
        let (plain_root, z_root) = (dir.path().join("plain"), dir.path().join("z"));
        let mut plain = TieredEngine::open(0, len as u64, &o, &tiers(&plain_root, None), BackendKind::Cpu).unwrap();
        let mut z = TieredEngine::open(0, len as u64, &o, &tiers(&z_root, Some(how)), BackendKind::Cpu).unwrap();
        for (i, v) in vs[..5].iter().enumerate() {
            plain.checkpoint(i as u64 + 1, v).unwrap();
            z.checkpoint(i as u64 + 1, v).unwrap();
        }
        plain.finalize().unwrap();
        z.finalize().unwrap();
        // Reopen the compressed tiers: the history continues from compressed files.
        let mut z = TieredEngine::open(0, len as u64, &o, &tiers(&z_root, Some(how)), BackendKind::Cpu).unwrap();
        assert_eq!(z.latest(), Some(5));
        for (i, v) in vs.iter().enumerate().skip(5) {
            z.checkpoint(i as u64 + 1, v).unwrap();
        }
        z.wait_all().unwrap();
        let mut back = vec![0u8; len];
        z.restore_into(7, ProtectedMut::Host(&mut back)).unwrap();
        assert!(back == vs[6], "{how}: restore_into");
        z.finalize().unwrap();
        for tier in ["local", "shared"] {
            let root = z_root.join(tier);
            for (i, want) in vs.iter().enumerate() {
                assert!(restore_version(&root, 0, i as u64 + 1).unwrap() == *want, "{how} {tier} v{}", i + 1);
                let r = DiffReader::open(&diff_path(&root, i as u64 + 1)).unwrap();
                assert_eq!(r.codec(), Some(how.codec()), "{how} {tier} v{}: compressed", i + 1);
            }
            let report = dckpt::verify::verify_store(&root).unwrap();
            assert!(report.problems.is_empty(), "{how} {tier}: {:?}", report.problems);
            // Compressed files hold the plain files' diffs in fewer bytes.
            for v in 1..=5 {
                let (p, c) = (diff_path(&plain_root.join(tier), v), diff_path(&root, v));
                assert_eq!(DiffReader::open(&p).unwrap().diff, DiffReader::open(&c).unwrap().diff);
                let (pl, cl) = (std::fs::metadata(&p).unwrap().len(), std::fs::metadata(&c).unwrap().len());
                assert!(cl < pl, "{how} {tier} v{v}: {cl} >= {pl} bytes");
            }
        }
    }
}

#[test]
fn every_flipped_byte_and_truncation_of_a_compressed_file_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let len = 4000;
    let mut v1 = vec![7u8; len];
    v1[100..200].copy_from_slice(&noise(100, 1));
    let mut v2 = v1.clone();
    v2[1000..1300].fill(9);
    let mut e = TieredEngine::open(
        0,
        len as u64,
        &opts(Method::Tree, 32),
        &tiers(dir.path(), Some(Compression::Zstd { level: 1 })),
        BackendKind::Cpu,
    )
    .unwrap();
    e.checkpoint(1, &v1).unwrap();
    e.checkpoint(2, &v2).unwrap();
    e.finalize().unwrap();
    let shared = dir.path().join("shared");
    let path = diff_path(&shared, 2);
    let good = std::fs::read(&path).unwrap();
    assert_eq!(DiffReader::open(&path).unwrap().codec(), Some(Codec::Zstd));
    let caught = |what: &str| {
        let report = dckpt::verify::verify_store(&shared).map(|r| r.problems.len()).unwrap_or(1);
        assert!(report > 0, "{what}: verify found nothing");
        assert!(restore_version(&shared, 0, 2).is_err(), "{what}: restored");
    };
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 1 << (i % 8);
        std::fs::write(&path, &bad).unwrap();
        caught(&format!("flip at byte {i}"));
    }
    for n in 0..good.len() {
        std::fs::write(&path, &good[..n]).unwrap();
        caught(&format!("truncation to {n} bytes"));
    }
    std::fs::write(&path, &good).unwrap();
    assert!(restore_version(&shared, 0, 2).unwrap() == v2);
}
