//! The per-node agent (issue #44) across a real process death: a child
//! process checkpoints through the tiers with the journal on, its flush held
//! back, and aborts as soon as its last call returns; the agent's sweep
//! then finishes every version the child returned, on every tier, byte for
//! byte. Without the journal the same death loses them (the test can fail).
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use dckpt::backend::BackendKind;
use dckpt::restore::restore_version;
use dckpt::tiers::TieredEngine;
use dckpt::{Method, StoreOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const VERSIONS: usize = 4;
const LEN: usize = 1 << 16;

fn opts() -> StoreOptions {
    StoreOptions { chunk_size: 64, method: Method::Tree, max_chain: Some(8), ..StoreOptions::default() }
}

/// Child side: checkpoints every version (each tier's write held back 2 s,
/// so the flush lags the calls) and aborts as the last call returns.
#[test]
fn agent_child() {
    let Some(root) = std::env::var_os("DCKPT_AGENT_CHILD") else { return };
    let root = PathBuf::from(root);
    let journal = std::env::var_os("DCKPT_AGENT_CHILD_JOURNAL").map(PathBuf::from);
    let vs = common::edited_versions(VERSIONS, LEN, 9);
    let mut tiers = common::tier_options(Some(root.join("local")), Some(root.join("shared")), 8 << 20);
    tiers.journal = journal;
    let mut e = TieredEngine::open(0, LEN as u64, &opts(), &tiers, BackendKind::Cpu).unwrap();
    dckpt::failpoint::delay("store.file_durable", Duration::from_secs(2));
    for (i, v) in vs.iter().enumerate() {
        e.checkpoint(i as u64 + 1, v).unwrap();
    }
    std::process::abort();
}

/// Runs the child; the root of its tiers.
fn run_child(dir: &Path, journal: Option<&Path>) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "agent_child", "--test-threads=1", "--nocapture"])
        .env("DCKPT_AGENT_CHILD", dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if let Some(j) = journal {
        cmd.env("DCKPT_AGENT_CHILD_JOURNAL", j);
    }
    let status = cmd.status().unwrap();
    assert!(!status.success(), "the child was meant to die");
}

/// The versions listed on `tier` for rank 0.
fn listed(tier: &Path) -> Vec<u64> {
    dckpt::store::Store::open(tier, 0)
        .map(|s| s.manifest().versions.iter().map(|e| e.version).collect())
        .unwrap_or_default()
}

#[test]
fn the_agent_finishes_every_returned_version_of_a_dead_process() {
    let t = tempfile::tempdir().unwrap();
    let journals = t.path().join("agent");
    run_child(&t.path().join("run"), Some(&journals));
    let (local, shared) = (t.path().join("run/local"), t.path().join("run/shared"));
    // Held back: the child died with versions still to flush.
    assert!(listed(&shared).len() < VERSIONS, "the flush was meant to lag: {:?}", listed(&shared));
    let status = dckpt::agent::status(&journals);
    assert_eq!(status.journals.len(), 1);
    assert!(!status.journals[0].alive && !status.journals[0].pending.is_empty(), "{status:?}");

    let sweep = dckpt::agent::sweep(&journals);
    assert_eq!(sweep.finished.len(), 1);
    let finished = sweep.finished[0].1.as_ref().unwrap();
    assert!(finished.failed.is_empty(), "{:?}", finished.failed);
    assert!(dckpt::agent::status(&journals).journals.is_empty(), "the journal is removed once finished");

    let vs = common::edited_versions(VERSIONS, LEN, 9);
    for tier in [&local, &shared] {
        assert_eq!(listed(tier), (1..=VERSIONS as u64).collect::<Vec<_>>(), "{}", tier.display());
        for v in 1..=VERSIONS as u64 {
            assert!(restore_version(tier, 0, v).unwrap() == vs[v as usize - 1], "{} version {v}", tier.display());
        }
        assert!(dckpt::verify::verify_store(tier).unwrap().problems.is_empty());
    }
    // The stores go on: a new engine opens them and checkpoints the next version.
    let tiers = common::tier_options(Some(local.clone()), Some(shared.clone()), 8 << 20);
    let mut e = TieredEngine::open(0, LEN as u64, &opts(), &tiers, BackendKind::Cpu).unwrap();
    e.checkpoint(VERSIONS as u64 + 1, &vs[0]).unwrap();
    e.finalize().unwrap();
    assert!(restore_version(&shared, 0, VERSIONS as u64 + 1).unwrap() == vs[0]);
}

#[test]
fn without_the_journal_the_same_death_loses_returned_versions() {
    let t = tempfile::tempdir().unwrap();
    run_child(&t.path().join("run"), None);
    let newest = listed(&t.path().join("run/shared")).last().copied().unwrap_or(0);
    assert!(newest < VERSIONS as u64, "version {VERSIONS} returned and was lost without the agent (newest {newest})");
}

#[test]
fn a_sweep_leaves_a_live_process_s_journal_alone() {
    let t = tempfile::tempdir().unwrap();
    let journals = t.path().join("agent");
    let vs = common::edited_versions(2, LEN, 9);
    let mut tiers = common::tier_options(Some(t.path().join("local")), None, 8 << 20);
    tiers.journal = Some(journals.clone());
    let mut e = TieredEngine::open(0, LEN as u64, &opts(), &tiers, BackendKind::Cpu).unwrap();
    e.checkpoint(1, &vs[0]).unwrap();
    let sweep = dckpt::agent::sweep(&journals);
    assert!(sweep.finished.is_empty() && sweep.live == 1, "{sweep:?}");
    e.checkpoint(2, &vs[1]).unwrap();
    e.finalize().unwrap();
    // A process that ends normally leaves nothing behind.
    assert!(dckpt::agent::status(&journals).journals.is_empty());
    assert!(restore_version(&t.path().join("local"), 0, 2).unwrap() == vs[1]);
}
