//! Repeated content (issue #29): a buffer of one repeated chunk or page
//! costs a few SHIFT entries, not one per copy (the encoder folds runs of
//! one source range into repeat entries, format v3), and every version
//! restores byte-exactly. The CUDA backend's files are the same bytes
//! (tests/gpu.rs).
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{assert_restores, checkpoint_all, noise, opts};
use dckpt::Method;

/// The repeated shapes of `len` bytes (a multiple of 4 KiB): zeros with a
/// few bytes set at the start, a repeated 4 KiB pattern, half noise and half
/// zeros, noise with every seventh page the same.
fn shapes(len: usize) -> Vec<(&'static str, Vec<u8>)> {
    let mut zeros = vec![0u8; len];
    zeros[..5].copy_from_slice(b"hello");
    let page = noise(4096, 7);
    let pattern: Vec<u8> = page.iter().copied().cycle().take(len).collect();
    let mut half = noise(len / 2, 8);
    half.resize(len, 0);
    let mut pages = noise(len, 9);
    for p in (0..len / 4096).step_by(7) {
        pages[p * 4096..(p + 1) * 4096].copy_from_slice(&page);
    }
    vec![("zeros", zeros), ("pattern", pattern), ("half", half), ("pages", pages)]
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
/// writes it (every run an entry), not on the folded file, on the CPU too:
/// a version whose folded file fits but whose runs do not is stored whole
/// by both backends alike.
#[test]
fn the_file_bound_counts_every_run_as_the_device_writes_it() {
    use dckpt::dedup::{DedupInput, DedupState, Limits};
    use dckpt::layout::Layout;
    let (_, zeros) = shapes(1 << 20).swap_remove(0);
    let layout = Layout::new(zeros.len() as u64, 128).unwrap();
    let run = |file_prefix: u64| {
        let limits = Limits { file_prefix, ..Limits::UNLIMITED };
        let state = DedupState::new(layout, dckpt::HashAlgo::Murmur3, 0).with_limits(limits);
        let input = DedupInput { data: &zeros, version: 1, baseline: true };
        Method::Tree.deduplicator().deduplicate(&state, &input).unwrap()
    };
    let free = run(u64::MAX);
    let folded = dckpt::format::diff_file::file_len_of(&free.diff);
    let unfolded = dckpt::format::diff_file::unfolded_file_len(&free.diff);
    assert!(folded < 1024 && unfolded > 300_000, "{folded} / {unfolded} bytes");
    // Room for the folded file only: stored whole (one FIRST run, dense).
    let tight = run(unfolded - 33);
    assert!(tight.diff.dense && tight.diff.shift.is_empty(), "{:?}", tight.diff.first);
    assert_eq!(tight.pending.bounds().stored_whole, 1);
    // Room for every run: de-duplicated.
    assert!(!run(unfolded - 32).diff.dense);
}
