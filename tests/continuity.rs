//! A store reopened by a new process continues de-duplicating from its
//! latest version (the state is rebuilt, not stored); re-baselining bounds
//! the chains; a failed commit changes nothing.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{assert_restores, checkpoint_all, noise, opts};
use dckpt::{Engine, Method, StoreOptions};

fn evolving(n: usize, len: usize) -> Vec<Vec<u8>> {
    let mut vs = vec![noise(len, 1)];
    for k in 1..n {
        let mut v = vs[k - 1].clone();
        let at = (k * 997) % (len - 300);
        v[at..at + 300].copy_from_slice(&noise(300, k as u64 + 10));
        // move a page-aligned block so SHIFT regions appear
        v.copy_within(0..512, 1024 * (k % 3 + 1));
        vs.push(v);
    }
    vs
}

#[test]
fn reopening_after_every_version_restores_exactly_and_stores_about_the_same() {
    let vs = evolving(8, 40_000);
    for method in Method::ALL {
        for chunk in [32, 64, 256] {
            let o = opts(method, chunk);
            let a = tempfile::tempdir().unwrap();
            let straight: u64 = checkpoint_all(a.path(), &o, &vs).iter().map(|r| r.file_bytes).sum();
            let b = tempfile::tempdir().unwrap();
            let mut reopened = 0;
            for (i, v) in vs.iter().enumerate() {
                let mut e = Engine::open_or_create(b.path(), 0, v.len() as u64, &o).unwrap();
                assert!(e.open_report().warnings.is_empty(), "{:?}", e.open_report().warnings);
                reopened += e.checkpoint(i as u64 + 1, v).unwrap().file_bytes;
            }
            assert_restores(b.path(), &vs);
            if !method.uses_record() {
                // Full and Basic keep no record: the rebuilt state is the whole state.
                assert_eq!(reopened, straight, "{method}/{chunk}");
            }
            // What a rebuilt record cannot find costs little (docs: engine::rebuild).
            assert!(
                reopened as f64 <= straight as f64 * 1.02,
                "{method}/{chunk}: {reopened} bytes reopened vs {straight} uninterrupted"
            );
        }
    }
}

#[test]
fn max_chain_rebaselines_and_bounds_restore_reads() {
    let vs = evolving(8, 20_000);
    let dir = tempfile::tempdir().unwrap();
    let o = StoreOptions { max_chain: Some(3), ..opts(Method::Tree, 64) };
    let reports = checkpoint_all(dir.path(), &o, &vs);
    let baselines: Vec<u64> = reports.iter().filter(|r| r.baseline).map(|r| r.version).collect();
    assert_eq!(baselines, vec![1, 4, 7]);
    assert_restores(dir.path(), &vs);
    for v in 1..=8u64 {
        let (_, stats) = dckpt::restore::restore_with_stats(dir.path(), 0, v).unwrap();
        assert!(stats.files_opened <= 3, "version {v} opened {} files", stats.files_opened);
    }
}

#[test]
fn a_failed_commit_leaves_store_and_state_unchanged() {
    let vs = evolving(3, 10_000);
    let dir = tempfile::tempdir().unwrap();
    let o = opts(Method::Tree, 64);
    let mut e = Engine::open_or_create(dir.path(), 0, vs[0].len() as u64, &o).unwrap();
    e.checkpoint(1, &vs[0]).unwrap();
    // A directory where the file must go makes the write of version 2 fail.
    let blocker = e.store().diff_path(2);
    std::fs::create_dir_all(blocker.join("x")).unwrap();
    let err = e.checkpoint(2, &vs[1]).unwrap_err();
    assert!(err.to_string().contains("v000000000002"), "{err}");
    assert_eq!(e.store().manifest().versions.len(), 1);
    assert!(dckpt::restore::restore_version(dir.path(), 0, 2).is_err());
    std::fs::remove_dir_all(&blocker).unwrap();
    e.checkpoint(2, &vs[1]).unwrap();
    e.checkpoint(3, &vs[2]).unwrap();
    assert_restores(dir.path(), &vs);
    // Same bytes as a run that never failed.
    let clean = tempfile::tempdir().unwrap();
    checkpoint_all(clean.path(), &o, &vs);
    for v in 1..=3u64 {
        let a = std::fs::read(e.store().diff_path(v)).unwrap();
        let b = std::fs::read(dckpt::store::Store::open(clean.path(), 0).unwrap().diff_path(v)).unwrap();
        assert!(a == b, "version {v}");
    }
}

#[test]
fn parameters_of_an_existing_store_are_enforced() {
    let vs = evolving(2, 5_000);
    let dir = tempfile::tempdir().unwrap();
    checkpoint_all(dir.path(), &opts(Method::Tree, 64), &vs[..1]);
    let bad = [
        (opts(Method::Tree, 128), vs[0].len() as u64, "chunk size"),
        (opts(Method::List, 64), vs[0].len() as u64, "method"),
        (opts(Method::Tree, 64), 4_000, "data length"),
        (StoreOptions { hash: dckpt::HashAlgo::Xxh3, ..opts(Method::Tree, 64) }, vs[0].len() as u64, "hash"),
    ];
    for (o, len, what) in bad {
        let err = Engine::open_or_create(dir.path(), 0, len, &o).err().expect("mismatch must fail");
        assert!(err.to_string().starts_with(what), "{err}");
    }
    let mut e = Engine::open_or_create(dir.path(), 0, vs[0].len() as u64, &opts(Method::Tree, 64)).unwrap();
    assert!(matches!(e.checkpoint(1, &vs[1]), Err(dckpt::Error::VersionNotNewer { .. })));
    // A store opened but never checkpointed takes the parameters of its first checkpoint.
    let fresh = tempfile::tempdir().unwrap();
    drop(Engine::open_or_create(fresh.path(), 0, 4_000, &opts(Method::List, 32)).unwrap());
    checkpoint_all(fresh.path(), &opts(Method::Tree, 64), &vs[..1]);
    assert_eq!(dckpt::store::Store::open(fresh.path(), 0).unwrap().manifest().chunk_size, 64);
    assert!(e.checkpoint(2, &vs[1][..100]).is_err());
    assert_eq!(e.store().manifest().versions.len(), 1);
}

#[test]
fn a_version_that_mostly_changed_is_stored_dense_and_restarts_the_record() {
    let mut vs = evolving(2, 40_000);
    vs.push(noise(40_000, 99)); // everything changes
    let mut v4 = vs[2].clone();
    v4[100..200].copy_from_slice(&noise(100, 5));
    v4.copy_within(0..1024, 4096); // a shift inside the dense version's bytes
    vs.push(v4);
    for method in [Method::Basic, Method::List, Method::Tree] {
        let dir = tempfile::tempdir().unwrap();
        let reports = checkpoint_all(dir.path(), &opts(method, 64), &vs);
        let r = &reports[2];
        assert!(r.baseline, "{method}: a dense version is a baseline");
        assert_eq!((r.first_regions, r.shift_regions, r.counts.first), (1, 0, 625), "{method}");
        assert!(!reports[3].baseline);
        assert_restores(dir.path(), &vs);
        let (_, stats) = dckpt::restore::restore_with_stats(dir.path(), 0, 4).unwrap();
        assert!(stats.files_opened <= 2, "{method}: the chain restarts at the dense version");
        let reader =
            dckpt::format::DiffReader::open(&dckpt::store::Store::open(dir.path(), 0).unwrap().diff_path(3)).unwrap();
        assert!(reader.diff.dense && reader.header.dense);
    }
}
