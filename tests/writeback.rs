//! Restores of versions still in the host cache: served from the cache's
//! segments at once, before their flush lists them on any tier, whether
//! the whole chain is in flight or it continues a chain already durable;
//! every byte right. The flush is held back with a failpoint delay (global
//! to the process: these tests live in their own binary).
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::edited_versions;
use dckpt::backend::BackendKind;
use dckpt::memory::ProtectedMut;
use dckpt::tiers::state::TierState;
use dckpt::tiers::{TierOptions, TieredEngine};
use dckpt::{Method, StoreOptions};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

const LEN: usize = 1 << 18;

/// One test at a time: the flush delay is global.
static SERIAL: Mutex<()> = Mutex::new(());

fn open(root: &Path) -> TieredEngine {
    let opts = StoreOptions { chunk_size: 128, method: Method::Tree, max_chain: Some(8), ..StoreOptions::default() };
    let t = TierOptions {
        local: Some(root.join("local")),
        shared: Some(root.join("shared")),
        host_cache_bytes: 16 << 20,
        ..TierOptions::default()
    };
    TieredEngine::open(0, LEN as u64, &opts, &t, BackendKind::Cpu).unwrap()
}

fn restore(e: &TieredEngine, v: u64) -> Vec<u8> {
    let mut back = vec![0u8; LEN];
    e.restore_into(v, ProtectedMut::Host(&mut back)).unwrap();
    back
}

fn local_durable(e: &TieredEngine, v: u64) -> bool {
    e.states(v).is_some_and(|s| s[0] == TierState::Durable)
}

#[test]
fn a_chain_entirely_in_flight_restores_before_its_flush() {
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let vs = edited_versions(4, LEN, 11);
    let mut e = open(dir.path());
    // Every write to a tier waits 300 ms before it is listed.
    dckpt::failpoint::delay("store.temp_written", Duration::from_millis(300));
    for (i, v) in vs.iter().enumerate() {
        e.checkpoint(i as u64 + 1, v).unwrap();
    }
    for v in (1..=4u64).rev() {
        assert!(restore(&e, v) == vs[v as usize - 1], "version {v}");
    }
    assert!(!local_durable(&e, 4), "version 4 was restored before the local tier listed it");
    dckpt::failpoint::delay("store.temp_written", Duration::ZERO);
    e.wait_all().unwrap();
    assert!(restore(&e, 4) == vs[3], "and from the tiers afterwards");
    e.finalize().unwrap();
}

#[test]
fn a_version_in_flight_continues_a_chain_already_durable() {
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let vs = edited_versions(5, LEN, 12);
    let mut e = open(dir.path());
    for (i, v) in vs[..2].iter().enumerate() {
        e.checkpoint(i as u64 + 1, v).unwrap();
    }
    e.wait_all().unwrap();
    dckpt::failpoint::delay("store.temp_written", Duration::from_millis(300));
    for (i, v) in vs.iter().enumerate().skip(2) {
        let r = e.checkpoint(i as u64 + 1, v).unwrap();
        assert!(!r.baseline, "version {} continues the chain", i + 1);
    }
    // Versions 3-5 in the host cache, 1-2 on disk: one chain.
    assert!(restore(&e, 5) == vs[4]);
    assert!(!local_durable(&e, 5), "restored before its flush");
    assert!(restore(&e, 3) == vs[2]);
    assert!(restore(&e, 2) == vs[1], "a durable version as before");
    dckpt::failpoint::delay("store.temp_written", Duration::ZERO);
    e.finalize().unwrap();
}

#[test]
fn a_version_chained_on_one_the_local_tier_failed_restores_right_or_from_the_shared_tier() {
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let t = tempfile::tempdir().unwrap();
    let Some(fs) = common::SmallFs::mount(&t.path().join("mnt"), "512k") else {
        println!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let opts = StoreOptions { chunk_size: 128, method: Method::Tree, max_chain: Some(8), ..StoreOptions::default() };
    let tiers = TierOptions {
        local: Some(fs.0.join("local")),
        shared: Some(t.path().join("shared")),
        host_cache_bytes: 16 << 20,
        ..TierOptions::default()
    };
    let mut e = TieredEngine::open(0, LEN as u64, &opts, &tiers, BackendKind::Cpu).unwrap();
    // The local tier (512 KiB) takes the 256 KiB baseline, then fills up:
    // later versions fail there, and those chained on a failed one too,
    // whether their restore finds them in flight or not.
    let vs = edited_versions(6, LEN, 13);
    for (i, v) in vs.iter().enumerate() {
        if i == 1 {
            e.wait(1).unwrap();
            // Leave less room than one more version's file.
            let used = dckpt::inspect::bytes_on_disk(&fs.0) as usize;
            std::fs::write(fs.0.join("filler"), vec![7u8; (512usize << 10).saturating_sub(used + 8192)]).ok();
        }
        e.checkpoint(i as u64 + 1, v).unwrap();
        let v = i as u64 + 1;
        assert!(restore(&e, v) == vs[i], "version {v}, restored at once");
    }
    assert!(e.wait_all().is_err(), "the local tier failed some versions");
    for v in 1..=6u64 {
        assert!(restore(&e, v) == vs[v as usize - 1], "version {v}, once settled");
        assert!(e.is_durable(v, "shared"), "version {v} is on the shared tier");
    }
    let failed = (2..=6u64).filter(|&v| matches!(e.states(v).unwrap()[0], TierState::Failed(_))).count();
    assert!(failed > 0, "some versions failed on the full local tier");
    let _ = e.finalize();
}
