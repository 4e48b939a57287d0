//! `dckpt prune`: the versions the last N need stay and restore byte-exactly,
//! everything else is deleted (manifest entries and files), and the next
//! checkpoint proceeds.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::noise;
use dckpt::prune::prune_store;
use dckpt::restore::restore_version;
use dckpt::store::Store;
use dckpt::{Engine, Method, StoreOptions};

fn versions(n: usize, len: usize) -> Vec<Vec<u8>> {
    let mut v = noise(len, 1);
    (0..n)
        .map(|i| {
            let at = (i * 997) % (len - 64);
            v[at..at + 64].copy_from_slice(&noise(64, i as u64 + 10));
            v.clone()
        })
        .collect()
}

fn listed(root: &std::path::Path) -> Vec<u64> {
    Store::open(root, 0).unwrap().manifest().versions.iter().map(|e| e.version).collect()
}

#[test]
fn prune_keeps_the_chains_of_the_last_versions_and_deletes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let o = StoreOptions { chunk_size: 64, method: Method::Tree, max_chain: Some(3), ..StoreOptions::default() };
    let vs = versions(9, 1 << 16);
    {
        let mut e = Engine::open_or_create(dir.path(), 0, vs[0].len() as u64, &o).unwrap();
        for (i, v) in vs.iter().enumerate() {
            e.checkpoint(i as u64 + 1, v).unwrap();
        }
    }
    // Baselines at 1, 4, 7: keeping 8 and 9 needs 7, 8, 9.
    let dry = prune_store(dir.path(), 2, true).unwrap();
    assert_eq!(dry.deleted, (1..=6).map(|v| (0, v)).collect::<Vec<_>>());
    assert_eq!(listed(dir.path()), (1..=9).collect::<Vec<_>>(), "a dry run changes nothing");
    let before = dckpt::inspect::bytes_on_disk(dir.path());
    let report = prune_store(dir.path(), 2, false).unwrap();
    assert_eq!(report.deleted, dry.deleted);
    assert_eq!(listed(dir.path()), vec![7, 8, 9]);
    let store = Store::open(dir.path(), 0).unwrap();
    for v in 1..=6 {
        assert!(!store.diff_path(v).exists(), "version {v}'s file is removed");
    }
    let after = dckpt::inspect::bytes_on_disk(dir.path());
    assert!(before - after >= report.bytes_removed, "the files and their manifest entries are gone");
    for v in 7..=9u64 {
        assert_eq!(restore_version(dir.path(), 0, v).unwrap(), vs[v as usize - 1], "version {v}");
    }
    assert!(restore_version(dir.path(), 0, 3).is_err(), "a deleted version is a clear error");
    assert!(dckpt::verify::verify_store(dir.path()).unwrap().problems.is_empty());
    // The next checkpoint proceeds from the kept history.
    let mut e = Engine::open_or_create(dir.path(), 0, vs[0].len() as u64, &o).unwrap();
    let mut next = vs[8].clone();
    next[5] ^= 0xff;
    e.checkpoint(10, &next).unwrap();
    assert_eq!(restore_version(dir.path(), 0, 10).unwrap(), next);
}

#[test]
fn prune_without_a_later_baseline_deletes_nothing_and_refuses_keep_zero() {
    let dir = tempfile::tempdir().unwrap();
    let vs = versions(4, 1 << 14);
    common::checkpoint_all(dir.path(), &common::opts(Method::Tree, 64), &vs);
    let report = prune_store(dir.path(), 1, false).unwrap();
    assert!(report.deleted.is_empty(), "version 4's chain needs every version");
    common::assert_restores(dir.path(), &vs);
    assert!(prune_store(dir.path(), 0, false).is_err());
}

#[test]
fn prune_waits_for_no_writer() {
    let dir = tempfile::tempdir().unwrap();
    let vs = versions(2, 1 << 14);
    let o = common::opts(Method::Tree, 64);
    let mut e = Engine::open_or_create(dir.path(), 0, vs[0].len() as u64, &o).unwrap();
    e.checkpoint(1, &vs[0]).unwrap();
    let err = prune_store(dir.path(), 1, false).unwrap_err();
    assert_eq!(err.kind(), dckpt::ErrorKind::Locked, "{err}");
}
