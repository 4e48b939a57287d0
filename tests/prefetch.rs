//! Prefetching restores: with hints, a background thread loads the hinted
//! versions' files into the prefetch cache and restores read them from
//! memory; a cache smaller than the versions evicts (every policy) without
//! wrong bytes or a stuck thread; without hints, a restore reads from disk
//! only what it needs and the files written last restore from memory; each
//! file of a chain comes from the fastest tier holding it; a damaged cached
//! copy is never served twice.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::noise;
use dckpt::backend::BackendKind;
use dckpt::memory::ProtectedMut;
use dckpt::tiers::arena::Policy;
use dckpt::tiers::{TierOptions, TieredEngine};
use dckpt::{Method, StoreOptions};
use std::path::Path;
use std::time::{Duration, Instant};

const LEN: usize = 1 << 18;

fn versions(n: usize) -> Vec<Vec<u8>> {
    let mut v = noise(LEN, 3);
    (0..n)
        .map(|i| {
            for k in 0..6 {
                let at = (i * 7919 + k * 104_729) % (LEN - 4096);
                v[at..at + 4096].copy_from_slice(&noise(4096, 100 + i as u64 * 10 + k as u64));
            }
            v.clone()
        })
        .collect()
}

fn opts() -> StoreOptions {
    StoreOptions { chunk_size: 128, method: Method::Tree, max_chain: Some(4), ..StoreOptions::default() }
}

/// Writes `vs` through the tiers under `root` (forward pass).
fn forward(root: &Path, vs: &[Vec<u8>]) {
    let t =
        TierOptions { local: Some(root.join("local")), shared: Some(root.join("shared")), ..TierOptions::default() };
    let mut e = TieredEngine::open(0, LEN as u64, &opts(), &t, BackendKind::Cpu).unwrap();
    for (i, v) in vs.iter().enumerate() {
        e.checkpoint(i as u64 + 1, v).unwrap();
    }
    e.finalize().unwrap();
}

fn reader(root: &Path, cache: u64, policy: Policy) -> TieredEngine {
    let t = TierOptions {
        local: Some(root.join("local")),
        shared: Some(root.join("shared")),
        prefetch_cache_bytes: cache,
        eviction: policy,
        ..TierOptions::default()
    };
    TieredEngine::open(0, LEN as u64, &opts(), &t, BackendKind::Cpu).unwrap()
}

fn restore(e: &TieredEngine, v: u64) -> Vec<u8> {
    let mut back = vec![0u8; LEN];
    e.restore_into(v, ProtectedMut::Host(&mut back)).unwrap();
    back
}

#[test]
fn hinted_versions_are_restored_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let vs = versions(12);
    forward(dir.path(), &vs);
    let e = reader(dir.path(), 64 << 20, Policy::GapAware);
    for v in (1..=12).rev() {
        e.prefetch_enqueue(v);
    }
    e.prefetch_start();
    // Every file of every version fits: wait until the thread has them all.
    let deadline = Instant::now() + Duration::from_secs(30);
    while e.prefetch_stats().unwrap().prefetched_files < 12 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    for v in (1..=12).rev() {
        assert!(restore(&e, v) == vs[v as usize - 1], "version {v}");
    }
    let s = e.prefetch_stats().unwrap();
    assert_eq!((s.prefetched_files, s.miss_bytes), (12, 0), "{s:?}");
    assert!(s.hit_bytes > 0);
}

#[test]
fn a_small_cache_evicts_without_wrong_bytes_under_every_policy_and_hint_mode() {
    let dir = tempfile::tempdir().unwrap();
    let vs = versions(12);
    forward(dir.path(), &vs);
    // Irregular order, as an adjoint run with checkpoint recomputation reads.
    let order = [12u64, 8, 11, 4, 10, 3, 9, 7, 2, 6, 1, 5];
    for policy in [Policy::Fifo, Policy::Lru, Policy::GapAware] {
        for hints in ["none", "one", "all"] {
            // Room for about two baselines and some increments.
            let e = reader(dir.path(), 3 * LEN as u64, policy);
            if hints == "all" {
                order.iter().for_each(|v| e.prefetch_enqueue(*v));
            }
            e.prefetch_start();
            if hints == "all" {
                // The first hinted version's files are loaded before any restore.
                let deadline = Instant::now() + Duration::from_secs(30);
                while e.prefetch_stats().unwrap().prefetched_files == 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            for (k, &v) in order.iter().enumerate() {
                if hints == "one" {
                    e.prefetch_enqueue(v);
                    if let Some(next) = order.get(k + 1) {
                        e.prefetch_enqueue(*next);
                    }
                }
                assert!(restore(&e, v) == vs[v as usize - 1], "{policy:?} {hints}: version {v}");
            }
            let s = e.prefetch_stats().unwrap();
            if hints == "none" {
                // A reader that wrote nothing and was told nothing caches nothing.
                assert_eq!(s.hit_bytes + s.prefetched_files + s.evicted_files, 0, "{policy:?}: {s:?}");
            } else if hints == "all" {
                // (How much more is prefetched in time depends on the machine's load.)
                assert!(s.hit_bytes > 0, "{policy:?} {hints}: {s:?}");
            }
        }
    }
}

#[test]
fn without_hints_a_restore_reads_from_disk_only_what_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    // Version 2 rewrites the first half: its restore needs half of version 1.
    let mut vs = vec![noise(LEN, 5)];
    let mut second = vs[0].clone();
    second[..LEN / 2].copy_from_slice(&noise(LEN / 2, 6));
    vs.push(second);
    forward(dir.path(), &vs);
    let files: u64 = (1..=2)
        .map(|v| std::fs::metadata(dir.path().join(format!("local/rank-00000/v{v:012}.dckpt"))).unwrap().len())
        .sum();
    let e = reader(dir.path(), 64 << 20, Policy::Lru);
    assert!(restore(&e, 2) == vs[1]);
    let s = e.prefetch_stats().unwrap();
    assert!(s.hit_bytes == 0 && s.miss_bytes > 0, "{s:?}");
    assert!(s.miss_bytes < files * 4 / 5, "the restore read {} of the chain's {files} bytes", s.miss_bytes);
    // A miss is not admitted: the next restore of the chain reads the disk again.
    assert!(restore(&e, 1) == vs[0]);
    let again = e.prefetch_stats().unwrap();
    assert!(again.hit_bytes == 0 && again.miss_bytes > s.miss_bytes, "{again:?}");
    assert_eq!(again.prefetched_files + again.retained_files, 0, "{again:?}");
}

#[test]
fn a_damaged_cached_copy_is_not_served_twice() {
    let dir = tempfile::tempdir().unwrap();
    let vs = versions(3);
    forward(dir.path(), &vs);
    // Damage version 1 on the local tier (the fastest): restores fall back to shared.
    let f = dir.path().join("local/rank-00000/v000000000001.dckpt");
    let mut bytes = std::fs::read(&f).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x40;
    std::fs::write(&f, &bytes).unwrap();
    let e = reader(dir.path(), 64 << 20, Policy::GapAware);
    for v in [3u64, 2, 1, 3] {
        assert!(restore(&e, v) == vs[v as usize - 1], "version {v}");
    }
}

#[test]
fn files_written_last_restore_from_memory_without_hints() {
    let dir = tempfile::tempdir().unwrap();
    let vs = versions(6);
    // One engine writes and restores (an adjoint run): the first tier's
    // flush worker leaves each file it made durable in the restore cache.
    let mut e = reader(dir.path(), 64 << 20, Policy::Fifo);
    for (i, v) in vs.iter().enumerate() {
        e.checkpoint(i as u64 + 1, v).unwrap();
    }
    for v in (1..=6).rev() {
        // No wait: from the host cache while in flight, else from the
        // restore cache once the local tier has it.
        assert!(restore(&e, v) == vs[v as usize - 1], "version {v}");
    }
    e.wait_all().unwrap();
    let s = e.prefetch_stats().unwrap();
    assert_eq!((s.retained_files, s.miss_bytes), (6, 0), "{s:?}");
    assert!(s.hit_bytes + s.inflight_bytes > 0);
    e.finalize().unwrap();
}

#[test]
fn each_file_of_a_chain_is_read_from_the_fastest_tier_holding_it() {
    let dir = tempfile::tempdir().unwrap();
    let vs = versions(4);
    forward(dir.path(), &vs[..3]);
    // Version 4 goes to the shared tier only: listed there alone, its chain
    // (versions 1-3) on both tiers.
    let t = TierOptions { shared: Some(dir.path().join("shared")), ..TierOptions::default() };
    let mut e = TieredEngine::open(0, LEN as u64, &opts(), &t, BackendKind::Cpu).unwrap();
    let report = e.checkpoint(4, &vs[3]).unwrap();
    assert!(!report.baseline, "version 4 continues the chain");
    e.finalize().unwrap();
    // The shared copy of version 1 is damaged; the local one is intact.
    let f = dir.path().join("shared/rank-00000/v000000000001.dckpt");
    let mut bytes = std::fs::read(&f).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x40;
    std::fs::write(&f, &bytes).unwrap();
    for cache in [0, 64 << 20] {
        let e = reader(dir.path(), cache, Policy::GapAware);
        assert!(restore(&e, 4) == vs[3], "cache {cache}: version 4 from shared, version 1 from local");
    }
}
