//! Retention on the asynchronous tiers: each tier keeps its newest N
//! versions and what their chains need, deletes the rest as new versions
//! become durable, never deletes a file a slower tier still copies, and a
//! version retired from one tier restores from the next.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use dckpt::backend::BackendKind;
use dckpt::memory::ProtectedMut;
use dckpt::restore::restore_version;
use dckpt::tiers::state::TierState;
use dckpt::tiers::{TierOptions, TieredEngine};
use dckpt::{ErrorKind, Method, StoreOptions};
use std::path::PathBuf;
use std::time::Duration;

fn versions(n: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    common::edited_versions(n, len, seed)
}

fn opts() -> StoreOptions {
    StoreOptions { chunk_size: 64, method: Method::Tree, max_chain: Some(4), ..StoreOptions::default() }
}

fn tiers(local: Option<PathBuf>, shared: Option<PathBuf>, cache: u64) -> TierOptions {
    common::tier_options(local, shared, cache)
}

#[test]
fn retention_keeps_the_newest_versions_of_each_tier_and_what_their_chains_need() {
    let t = tempfile::tempdir().unwrap();
    let (local, shared) = (t.path().join("local"), t.path().join("shared"));
    let vs = versions(11, 1 << 16, 7);
    let tiers = TierOptions {
        keep_local: Some(1),
        keep_shared: Some(5),
        ..tiers(Some(local.clone()), Some(shared.clone()), 4 << 20)
    };
    // max_chain 4: chains 1-4, 5-8, 9-11.
    let mut e = TieredEngine::open(0, vs[0].len() as u64, &opts(), &tiers, BackendKind::Cpu).unwrap();
    for (i, v) in vs.iter().enumerate() {
        e.checkpoint(i as u64 + 1, v).unwrap();
    }
    e.wait_all().unwrap();
    // Local keeps version 11 and its chain (9-11); shared the newest 5 (7-11) and their chains (5-11).
    for (root, kept, tier) in [(&local, 9..=11u64, 0usize), (&shared, 5..=11, 1)] {
        // The last retention pass runs in the background once every tier has settled.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while (1..*kept.start()).any(|v| e.states(v).unwrap()[tier] != TierState::Retired)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let store = dckpt::store::Store::open(root, 0).unwrap();
        let listed: Vec<u64> = store.manifest().versions.iter().map(|e| e.version).collect();
        assert_eq!(listed, kept.clone().collect::<Vec<_>>(), "{}", root.display());
        for v in 1..=11u64 {
            let present = root.join(format!("rank-00000/v{v:012}.dckpt")).exists();
            assert_eq!(present, kept.contains(&v), "{} version {v}", root.display());
            let state = e.states(v).unwrap()[tier].clone();
            assert_eq!(state == TierState::Retired, !kept.contains(&v), "{} version {v}: {state:?}", root.display());
            if kept.contains(&v) {
                assert!(restore_version(root, 0, v).unwrap() == vs[v as usize - 1]);
            }
        }
        assert!(dckpt::verify::verify_store(root).unwrap().problems.is_empty());
    }
    // A version retired from the local tier restores from the shared one.
    let mut back = vec![0u8; vs[0].len()];
    assert!(!e.is_durable(6, "local") && e.is_durable(6, "shared"));
    e.restore_into(6, ProtectedMut::Host(&mut back)).unwrap();
    assert!(back == vs[5]);
    e.finalize().unwrap();
    // Reopened, the history continues from what is kept.
    let mut e = TieredEngine::open(0, vs[0].len() as u64, &opts(), &tiers, BackendKind::Cpu).unwrap();
    assert_eq!(e.latest(), Some(11));
    e.checkpoint(12, &vs[0]).unwrap();
    e.finalize().unwrap();
    assert!(restore_version(&local, 0, 12).unwrap() == vs[0]);
    let zero = TierOptions { keep_local: Some(0), ..tiers.clone() };
    let err = TieredEngine::open(0, vs[0].len() as u64, &opts(), &zero, BackendKind::Cpu).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidOption, "{err}");
}

#[test]
fn the_first_tier_keeps_what_a_slower_tier_has_not_copied_yet() {
    let t = tempfile::tempdir().unwrap();
    let (local, shared) = (t.path().join("local"), t.path().join("shared"));
    let vs = versions(6, 1 << 16, 9);
    // Every version a baseline; the local tier keeps one; every write is slow,
    // so the shared tier lags the local one by several versions.
    let o = StoreOptions { max_chain: Some(1), ..opts() };
    let tiers = TierOptions { keep_local: Some(1), ..tiers(Some(local.clone()), Some(shared.clone()), 4 << 20) };
    dckpt::failpoint::delay("store.file_durable", Duration::from_millis(60));
    let mut e = TieredEngine::open(0, vs[0].len() as u64, &o, &tiers, BackendKind::Cpu).unwrap();
    for (i, v) in vs.iter().enumerate() {
        e.checkpoint(i as u64 + 1, v).unwrap();
    }
    let drained = e.wait_all();
    dckpt::failpoint::delay("store.file_durable", Duration::ZERO);
    drained.unwrap();
    for (i, want) in vs.iter().enumerate() {
        assert!(restore_version(&shared, 0, i as u64 + 1).unwrap() == *want, "shared version {}", i + 1);
    }
    e.finalize().unwrap();
    let kept: Vec<u64> =
        dckpt::store::Store::open(&local, 0).unwrap().manifest().versions.iter().map(|e| e.version).collect();
    assert_eq!(kept, vec![6]);
}
