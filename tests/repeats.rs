//! Repeated content (issue #29): a buffer of one repeated chunk or page
//! costs a few SHIFT entries, not one per copy (the encoder folds runs of
//! one source range into repeat entries, format v3), and every version
//! restores byte-exactly. The CUDA backend's files are the same bytes
//! (tests/gpu.rs).
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{assert_restores, checkpoint_all, noise, opts};
use dckpt::Method;

fn shapes(len: usize) -> Vec<(&'static str, Vec<u8>)> {
    common::repeated_shapes(len)
}

#[test]
fn repeated_content_costs_a_few_entries_and_restores_exactly() {
    let len = 8 << 20;
    for (name, first) in shapes(len) {
        // A second version with a few edits, and a third moving the
        // repeated part (new copies of old sources, across versions).
        let mut second = first.clone();
        second[len / 3..len / 3 + 100].copy_from_slice(&noise(100, 10));
        let mut third = second.clone();
        third.copy_within(len / 2..len / 2 + (1 << 20), 4096);
        let versions = vec![first, second, third];
        for method in [Method::Tree, Method::List] {
            let dir = tempfile::tempdir().unwrap();
            let reports = checkpoint_all(dir.path(), &opts(method, 128), &versions);
            assert_restores(dir.path(), &versions);
            let report = dckpt::verify::verify_store(dir.path()).unwrap();
            assert!(report.problems.is_empty(), "{name} {method}: {:?}", report.problems);
            let base = &reports[0];
            // List stores a region per chunk by design (the paper's
            // baseline method): only the restore is checked.
            if method == Method::List {
                continue;
            }
            match name {
                // One FIRST page and one repeat entry, in kilobytes.
                "zeros" | "pattern" => {
                    assert!(base.shift_regions <= 2, "{name} {method}: {} SHIFT entries", base.shift_regions);
                    assert!(base.file_bytes <= 64 << 10, "{name} {method}: {} bytes", base.file_bytes);
                }
                // The noise stored, the zeros nearly free.
                "half" => assert!(
                    base.file_bytes <= (len / 2 + (64 << 10)) as u64,
                    "{name} {method}: {} bytes",
                    base.file_bytes
                ),
                // One entry per 512-byte step (the steps' sources differ):
                // a third of what one entry per chunk took.
                "ramp" => assert!(base.file_bytes <= (len / 8) as u64, "{name} {method}: {} bytes", base.file_bytes),
                _ => {}
            }
        }
    }
}

#[test]
fn a_store_with_repeats_is_refused_by_its_version_not_misread() {
    let dir = tempfile::tempdir().unwrap();
    let (_, zeros) = shapes(1 << 20).swap_remove(0);
    checkpoint_all(dir.path(), &opts(Method::Tree, 128), std::slice::from_ref(&zeros));
    let file = dir.path().join("rank-00000/v000000000001.dckpt");
    let bytes = std::fs::read(&file).unwrap();
    // v3: what a v2 reader refuses with "unsupported format version 3".
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 3);
    // A v2 file of noise alone is unchanged by the fold.
    let other = tempfile::tempdir().unwrap();
    checkpoint_all(other.path(), &opts(Method::Tree, 128), &[noise(1 << 20, 3)]);
    let plain = std::fs::read(other.path().join("rank-00000/v000000000001.dckpt")).unwrap();
    assert_eq!(u16::from_le_bytes([plain[8], plain[9]]), 2);
}

/// The bound on a device's output buffer is taken on the file as the device
/// writes it (every coalesced run of plain roots an entry, and every repeat
/// node), not on the folded file, on the CPU too: a version whose folded
/// file fits but whose device-made file does not is stored whole by both
/// backends alike.
#[test]
fn the_file_bound_counts_the_entries_as_the_device_writes_them() {
    use dckpt::dedup::{DedupInput, DedupState, Limits};
    use dckpt::format::diff_file::{SHIFT_ENTRY_LEN, file_len_of};
    use dckpt::layout::Layout;
    let (_, zeros) = shapes(1 << 20).swap_remove(0);
    let layout = Layout::new(zeros.len() as u64, 128).unwrap();
    let run = |limits: Limits| {
        let state = DedupState::new(layout, dckpt::HashAlgo::Murmur3, 0).with_limits(limits);
        let input = DedupInput { data: &zeros, version: 1, baseline: true };
        Method::Tree.deduplicator().deduplicate(&state, &input).unwrap()
    };
    let prefix = |file_prefix| run(Limits { file_prefix, ..Limits::UNLIMITED });
    let free = prefix(u64::MAX);
    let folded = file_len_of(&free.diff);
    // 2^13 chunks: chunks 0 and 1 are FIRST, and the zero chunks after them
    // are one repeat node on each level 1..=12 (the node at index 1): the
    // device writes 12 entries where the encoder folds them into one.
    assert_eq!(layout.chunks(), 1 << 13);
    let device = folded + 11 * SHIFT_ENTRY_LEN;
    assert!(folded < 1024, "{folded} bytes");
    // Room for the folded file only: stored whole (one FIRST run, dense).
    let tight = prefix(device - 33);
    assert!(tight.diff.dense && tight.diff.shift.is_empty(), "{:?}", tight.diff.first);
    assert_eq!(tight.pending.bounds().stored_whole, 1);
    // Room for the device's entries: de-duplicated.
    assert!(!prefix(device - 32).diff.dense);
    // 13 roots (one FIRST run, 12 repeat nodes), not one per chunk.
    let roots = |roots| run(Limits { roots, ..Limits::UNLIMITED }).diff.dense;
    assert!(!roots(13) && roots(12));
}

/// A damaged repeat entry (its period, its count or its source) is caught
/// by the file's checksum: `verify` reports the file and a restore fails,
/// never returning other bytes.
#[test]
fn a_damaged_repeat_entry_is_caught_not_misread() {
    let (_, zeros) = shapes(1 << 20).swap_remove(0);
    let dir = tempfile::tempdir().unwrap();
    checkpoint_all(dir.path(), &opts(Method::Tree, 128), std::slice::from_ref(&zeros));
    let file = dir.path().join("rank-00000/v000000000001.dckpt");
    let clean = std::fs::read(&file).unwrap();
    let shift_at = 96 + 16 * u64::from_le_bytes(clean[40..48].try_into().unwrap()) as usize;
    assert_eq!(u64::from_le_bytes(clean[48..56].try_into().unwrap()), 1, "one SHIFT entry: the repeat");
    // Count, source start and the period's lowest byte.
    for at in [shift_at + 8, shift_at + 16, shift_at + 37] {
        let mut bad = clean.clone();
        bad[at] ^= 1;
        std::fs::write(&file, &bad).unwrap();
        let report = dckpt::verify::verify_store(dir.path()).unwrap();
        assert!(!report.problems.is_empty(), "byte {at}: verify saw nothing");
        assert!(dckpt::restore::restore_version(dir.path(), 0, 1).is_err(), "byte {at}: restored");
    }
    std::fs::write(&file, &clean).unwrap();
    assert!(dckpt::restore::restore_version(dir.path(), 0, 1).unwrap() == zeros);
}
