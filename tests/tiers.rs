//! The asynchronous tiers: checkpoints return once the diff is in the host
//! cache; every version becomes durable on the local and the shared tier
//! with the same bytes a synchronous engine writes; a tier that fails (a
//! full disk) fails only the versions it cannot hold, says so through
//! `wait`, leaves older versions intact, and the next checkpoint is a
//! baseline that heals the tier.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{SmallFs, noise};
use dckpt::backend::BackendKind;
use dckpt::memory::ProtectedMut;
use dckpt::restore::restore_version;
use dckpt::tiers::state::TierState;
use dckpt::tiers::{TierOptions, TieredEngine};
use dckpt::{Engine, ErrorKind, Method, StoreOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

fn versions(n: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    common::edited_versions(n, len, seed)
}

fn opts() -> StoreOptions {
    StoreOptions { chunk_size: 64, method: Method::Tree, max_chain: Some(4), ..StoreOptions::default() }
}

fn tiers(local: Option<PathBuf>, shared: Option<PathBuf>, cache: u64) -> TierOptions {
    common::tier_options(local, shared, cache)
}

/// Opens CPU tiers for the rank-0 buffer of `len` bytes.
fn open(len: usize, local: Option<PathBuf>, shared: Option<PathBuf>, cache: u64) -> TieredEngine {
    TieredEngine::open(0, len as u64, &opts(), &tiers(local, shared, cache), BackendKind::Cpu).unwrap()
}

fn diff_file(root: &Path, v: u64) -> Vec<u8> {
    std::fs::read(root.join(format!("rank-00000/v{v:012}.dckpt"))).unwrap()
}

#[test]
fn every_version_reaches_both_tiers_with_the_synchronous_bytes() {
    let t = tempfile::tempdir().unwrap();
    let (local, shared, sync) = (t.path().join("local"), t.path().join("shared"), t.path().join("sync"));
    let vs = versions(9, 1 << 18, 1);
    let mut e = open(vs[0].len(), Some(local.clone()), Some(shared.clone()), 8 << 20);
    assert_eq!(e.tiers(), ["local", "shared"]);
    for (i, v) in vs.iter().enumerate() {
        let r = e.checkpoint(i as u64 + 1, v).unwrap();
        assert_eq!(r.baseline, i % 4 == 0, "max_chain 4 re-baselines every fourth version");
    }
    e.wait_all().unwrap();
    for v in 1..=vs.len() as u64 {
        assert!(e.is_durable(v, "local") && e.is_durable(v, "shared"));
        assert_eq!(e.states(v).unwrap(), vec![TierState::Durable, TierState::Durable]);
    }
    let mut back = vec![0u8; vs[0].len()];
    e.restore_into(5, ProtectedMut::Host(&mut back)).unwrap();
    assert!(back == vs[4]);
    e.finalize().unwrap();
    // The same files a synchronous engine writes, on both tiers.
    let mut s = Engine::open_or_create(&sync, 0, vs[0].len() as u64, &opts()).unwrap();
    for (i, v) in vs.iter().enumerate() {
        s.checkpoint(i as u64 + 1, v).unwrap();
    }
    for v in 1..=vs.len() as u64 {
        let want = diff_file(&sync, v);
        assert!(diff_file(&local, v) == want && diff_file(&shared, v) == want, "version {v}");
        assert!(restore_version(&shared, 0, v).unwrap() == vs[v as usize - 1]);
    }
}

#[test]
fn a_shared_tier_alone_and_a_small_cache_still_hold_every_version() {
    let t = tempfile::tempdir().unwrap();
    let shared = t.path().join("shared");
    let vs = versions(6, 1 << 20, 2);
    // One 4 MiB segment: each checkpoint may wait for the previous flush.
    let mut e = open(vs[0].len(), None, Some(shared.clone()), 1);
    assert_eq!(e.cache_usage().0, 4 << 20);
    for (i, v) in vs.iter().enumerate() {
        let r = e.checkpoint(i as u64 + 1, v).unwrap();
        assert!(r.total_seconds >= r.backpressure_seconds);
    }
    e.finalize().unwrap();
    for (i, v) in vs.iter().enumerate() {
        assert!(restore_version(&shared, 0, i as u64 + 1).unwrap() == *v);
    }
    // Reopening continues the history from the tier.
    let mut e = open(vs[0].len(), None, Some(shared.clone()), 8 << 20);
    assert!(e.checkpoint(6, &vs[5]).is_err_and(|err| err.kind() == ErrorKind::VersionNotNewer));
    let mut next = vs[5].clone();
    next[10] ^= 1;
    assert!(!e.checkpoint(7, &next).unwrap().baseline, "the chain continues after a reopen");
    e.finalize().unwrap();
    assert!(restore_version(&shared, 0, 7).unwrap() == next);
    assert!(TieredEngine::open(0, 10, &opts(), &tiers(None, None, 1), BackendKind::Cpu).is_err(), "no disk tier");
}

#[test]
fn a_full_shared_tier_fails_its_versions_clearly_and_a_baseline_heals_it() {
    let t = tempfile::tempdir().unwrap();
    let Some(fs) = SmallFs::mount(&t.path().join("mnt"), "4m") else {
        println!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let (local, shared) = (t.path().join("local"), fs.0.join("shared"));
    let len = 1 << 20;
    let vs = versions(4, len, 3);
    let o = StoreOptions { max_chain: None, ..opts() };
    let mut e = TieredEngine::open(
        0,
        len as u64,
        &o,
        &tiers(Some(local.clone()), Some(shared.clone()), 8 << 20),
        BackendKind::Cpu,
    )
    .unwrap();
    e.checkpoint(1, &vs[0]).unwrap();
    e.wait(1).unwrap();
    // Fill the shared tier: version 2 cannot be written there, version 3
    // (its chain broken there) neither; the local tier holds both.
    let filler = fs.0.join("filler");
    std::fs::write(&filler, vec![1u8; 4 * len - dckpt::inspect::bytes_on_disk(&fs.0) as usize - 100_000]).ok();
    let mut big = vs[1].clone();
    big[..300_000].copy_from_slice(&noise(300_000, 99));
    e.checkpoint(2, &big).unwrap();
    let err = e.wait(2).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotDurable, "{err}");
    assert!(err.to_string().contains("shared") && err.to_string().contains("no space"), "{err}");
    assert!(e.is_durable(2, "local") && !e.is_durable(2, "shared"));
    std::fs::remove_file(&filler).unwrap();
    // The failure made this a baseline: both tiers hold it whole.
    let r = e.checkpoint(3, &vs[2]).unwrap();
    assert!(r.baseline, "a failed flush makes the next checkpoint a baseline");
    e.wait(3).unwrap();
    let r = e.checkpoint(4, &vs[3]).unwrap();
    assert!(!r.baseline);
    let err = e.finalize().unwrap_err();
    assert!(err.to_string().contains("version 2 is not durable"), "finalize reports the failed flush: {err}");
    assert!(restore_version(&shared, 0, 1).unwrap() == vs[0], "older versions stay intact");
    assert!(restore_version(&shared, 0, 2).is_err(), "never listed where it is not durable");
    for (v, want) in [(2, &big), (3, &vs[2]), (4, &vs[3])] {
        assert!(restore_version(&local, 0, v).unwrap() == *want);
    }
    for (v, want) in [(3, &vs[2]), (4, &vs[3])] {
        assert!(restore_version(&shared, 0, v).unwrap() == *want);
    }
    assert!(dckpt::verify::verify_store(&shared).unwrap().problems.is_empty());
}

/// Child side of the kill test: checkpoints six versions through both tiers
/// (the parent arms a crash point through `DCKPT_CRASH_AT`).
#[test]
fn crash_child() {
    let Some(root) = std::env::var_os("DCKPT_TIERS_CHILD") else { return };
    let root = PathBuf::from(root);
    let vs = versions(6, 1 << 16, 5);
    let o = opts();
    let tiers = tiers(Some(root.join("local")), Some(root.join("shared")), 1);
    let mut e = TieredEngine::open(0, vs[0].len() as u64, &o, &tiers, BackendKind::Cpu).unwrap();
    for (i, v) in vs.iter().enumerate() {
        e.checkpoint(i as u64 + 1, v).unwrap();
    }
    e.finalize().unwrap();
}

#[test]
fn a_kill_at_every_step_leaves_tiers_that_restore_and_continue() {
    let vs = versions(6, 1 << 16, 5);
    let exe = std::env::current_exe().unwrap();
    let mut killed_at = Vec::new();
    for point in dckpt::failpoint::POINTS {
        for nth in [1, 2, 5] {
            let t = tempfile::tempdir().unwrap();
            let status = Command::new(&exe)
                .args(["--exact", "crash_child", "--test-threads=1", "--nocapture"])
                .env("DCKPT_TIERS_CHILD", t.path())
                .env("DCKPT_CRASH_AT", format!("{point}:{nth}"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            if !status.success() {
                killed_at.push(format!("{point}:{nth}"));
            }
            let (local, shared) = (t.path().join("local"), t.path().join("shared"));
            let mut newest = 0;
            for tier in [&local, &shared] {
                let Ok(store) = dckpt::store::Store::open(tier, 0) else { continue };
                for e in &store.manifest().versions {
                    let got = restore_version(tier, 0, e.version).unwrap();
                    assert!(
                        got == vs[e.version as usize - 1],
                        "{point}:{nth}: {} version {}",
                        tier.display(),
                        e.version
                    );
                    newest = newest.max(e.version);
                }
            }
            // The next checkpoint proceeds on both tiers.
            let mut e = open(vs[0].len(), Some(local.clone()), Some(shared.clone()), 8 << 20);
            let mut next = vs[5].clone();
            next[7] ^= 0x42;
            e.checkpoint(newest + 1, &next).unwrap();
            e.finalize().unwrap_or_else(|err| panic!("{point}:{nth}: {err}"));
            for tier in [&local, &shared] {
                assert!(restore_version(tier, 0, newest + 1).unwrap() == next, "{point}:{nth}");
                let report = dckpt::verify::verify_store(tier).unwrap();
                assert!(report.problems.is_empty(), "{point}:{nth}: {:?}", report.problems);
            }
        }
    }
    for point in dckpt::failpoint::POINTS {
        assert!(killed_at.iter().any(|k| k.starts_with(point)), "no run was killed at {point}: {killed_at:?}");
    }
}

#[test]
fn wait_asks_the_tiers_about_versions_it_does_not_track() {
    let t = tempfile::tempdir().unwrap();
    let (local, shared) = (t.path().join("local"), t.path().join("shared"));
    let vs = versions(3, 1 << 16, 8);
    let mut e = open(vs[0].len(), Some(local.clone()), None, 8 << 20);
    e.checkpoint(1, &vs[0]).unwrap();
    e.checkpoint(2, &vs[1]).unwrap();
    e.finalize().unwrap();
    // A shared tier added later has none of them: waiting on an earlier
    // run's version says where it is not, and the tiers disagree, so the
    // next checkpoint is a baseline that both tiers hold.
    let mut e = open(vs[0].len(), Some(local), Some(shared.clone()), 8 << 20);
    let err = e.wait(2).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotDurable);
    assert!(err.to_string().contains("shared"), "{err}");
    assert!(e.is_durable(2, "local") && !e.is_durable(2, "shared"));
    assert!(e.wait(9).is_err_and(|e| e.kind() == ErrorKind::MissingVersion), "never taken");
    assert!(e.checkpoint(3, &vs[2]).unwrap().baseline);
    e.wait(3).unwrap();
    e.finalize().unwrap();
    assert!(restore_version(&shared, 0, 3).unwrap() == vs[2]);
}

/// Flips one byte in the middle of version `v`'s file on `root`.
fn damage(root: &Path, v: u64) {
    let path = root.join(format!("rank-00000/v{v:012}.dckpt"));
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn a_restart_restores_the_newest_intact_version_from_any_tier() {
    let t = tempfile::tempdir().unwrap();
    let (local, shared) = (t.path().join("local"), t.path().join("shared"));
    let vs = versions(3, 1 << 18, 5);
    let mut e = open(vs[0].len(), Some(local.clone()), Some(shared.clone()), 8 << 20);
    for (i, v) in vs.iter().enumerate() {
        e.checkpoint(i as u64 + 1, v).unwrap();
    }
    e.finalize().unwrap();
    let e = open(vs[0].len(), Some(local.clone()), Some(shared.clone()), 8 << 20);
    let mut back = vec![0u8; vs[0].len()];
    // The newest version damaged on the fastest tier: read from the next.
    damage(&local, 3);
    let r = e.restore_latest(ProtectedMut::Host(&mut back)).unwrap();
    assert_eq!((r.version, r.tier.as_str(), r.skipped.len()), (3, "shared", 1), "{:?}", r.skipped);
    assert_eq!(back, vs[2]);
    let mut one = vec![0u8; vs[0].len()];
    e.restore_into(3, ProtectedMut::Host(&mut one)).unwrap();
    assert_eq!(one, vs[2], "restore_into falls back to the next tier too");
    // Damaged on both tiers: the previous version, with the reasons.
    damage(&shared, 3);
    let r = e.restore_latest(ProtectedMut::Host(&mut back)).unwrap();
    assert_eq!((r.version, r.tier.as_str()), (2, "local"));
    assert_eq!(r.skipped.len(), 2);
    assert!(r.skipped.iter().all(|s| s.contains("version 3")), "{:?}", r.skipped);
    assert_eq!(back, vs[1]);
}
