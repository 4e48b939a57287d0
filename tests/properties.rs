//! Property tests: random version sequences with sparse edits, shifted
//! copies, repeated chunks, reverts, nothing changed and everything changed,
//! at chunk sizes that leave short last chunks and non-power-of-two chunk
//! counts. Every version of every method restores byte-exactly, the store
//! verifies clean, and the diff bytes do not depend on the thread count.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{assert_restores, checkpoint_all, noise, opts};
use dckpt::dedup::{DedupInput, DedupState};
use dckpt::format::encode_diff;
use dckpt::layout::Layout;
use dckpt::{HashAlgo, Method};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// Rewrite `len` bytes at `at` (fractions of the buffer).
    Edit(f64, usize, u64),
    /// Copy `count` chunks from chunk `from` to chunk `to` (fractions).
    Shift(f64, f64, usize),
    /// Make `count` chunks from `at` identical.
    Repeat(f64, usize, u8),
    /// Tile the `period` chunks from `at` over the next `copies` periods
    /// (zeroed fields, halos, a repeated page: runs the encoder folds).
    Tile(f64, usize, usize, bool),
    /// Go back to an earlier version's bytes.
    Revert(usize),
    /// Change nothing.
    Nothing,
    /// Rewrite everything.
    Everything(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0.0..1.0f64, 1usize..200, any::<u64>()).prop_map(|(a, l, s)| Op::Edit(a, l, s)),
        2 => (0.0..1.0f64, 0.0..1.0f64, 1usize..9).prop_map(|(f, t, c)| Op::Shift(f, t, c)),
        1 => (0.0..1.0f64, 2usize..6, any::<u8>()).prop_map(|(a, c, b)| Op::Repeat(a, c, b)),
        1 => (0.0..1.0f64, 1usize..5, 2usize..40, any::<bool>()).prop_map(|(a, p, c, z)| Op::Tile(a, p, c, z)),
        1 => (0usize..8).prop_map(Op::Revert),
        1 => Just(Op::Nothing),
        1 => any::<u64>().prop_map(Op::Everything),
    ]
}

fn apply(history: &[Vec<u8>], cs: usize, ops: &[Op]) -> Vec<u8> {
    let mut v = history.last().cloned().unwrap_or_default();
    let len = v.len();
    let chunks = len.div_ceil(cs);
    for op in ops {
        match *op {
            Op::Edit(at, l, seed) => {
                let at = ((at * len as f64) as usize).min(len - 1);
                let end = (at + l).min(len);
                v[at..end].copy_from_slice(&noise(end - at, seed));
            }
            Op::Shift(from, to, count) => {
                let count = count.min(chunks);
                let full = len / cs; // only whole chunks move
                if full >= count {
                    let f = (from * (full - count + 1) as f64) as usize;
                    let t = (to * (full - count + 1) as f64) as usize;
                    v.copy_within(f * cs..(f + count) * cs, t * cs);
                }
            }
            Op::Repeat(at, count, byte) => {
                let full = len / cs;
                let start = ((at * full as f64) as usize).min(full.saturating_sub(1));
                for c in start..(start + count).min(full) {
                    v[c * cs..(c + 1) * cs].fill(byte);
                }
            }
            Op::Tile(at, period, copies, zero) => {
                let full = len / cs;
                let start = ((at * full as f64) as usize).min(full.saturating_sub(period));
                if full >= period {
                    if zero {
                        v[start * cs..(start + period) * cs].fill(0);
                    }
                    let end = (start + period * copies).min(full);
                    for c in start + period..end {
                        v.copy_within((c - period) * cs..(c - period + 1) * cs, c * cs);
                    }
                }
            }
            Op::Revert(k) => v = history[k % history.len()].clone(),
            Op::Nothing => {}
            Op::Everything(seed) => v = noise(len, seed),
        }
    }
    v
}

fn sequence() -> impl Strategy<Value = (usize, Vec<Vec<u8>>)> {
    let sizes = prop_oneof![Just(32usize), Just(33), Just(48), Just(64), Just(100), Just(128)];
    (sizes, 1usize..4000, any::<u64>(), prop::collection::vec(prop::collection::vec(op(), 0..4), 0..8)).prop_map(
        |(cs, len, seed, steps)| {
            let mut history = vec![noise(len, seed)];
            for ops in steps {
                let next = apply(&history, cs, &ops);
                history.push(next);
            }
            (cs, history)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_version_of_every_method_restores_exactly((cs, versions) in sequence()) {
        for method in Method::ALL {
            let dir = tempfile::tempdir().unwrap();
            checkpoint_all(dir.path(), &opts(method, cs as u32), &versions);
            assert_restores(dir.path(), &versions);
            let report = dckpt::verify::verify_store(dir.path()).unwrap();
            prop_assert!(report.problems.is_empty(), "{method}: {:?}", report.problems);
        }
    }

    #[test]
    fn diff_bytes_do_not_depend_on_thread_count((cs, versions) in sequence(), hash in prop_oneof![Just(HashAlgo::Murmur3), Just(HashAlgo::Xxh3), Just(HashAlgo::Blake3), Just(HashAlgo::Sha1)]) {
        let encode_all = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let layout = Layout::new(versions[0].len() as u64, cs as u32).unwrap();
                let mut files = Vec::new();
                for method in [Method::Basic, Method::List, Method::Tree] {
                    let mut state = DedupState::new(layout, hash, 0);
                    for (i, v) in versions.iter().enumerate() {
                        let input = DedupInput { data: v, version: i as u64 + 1, baseline: i == 0 };
                        let out = method.deduplicator().deduplicate(&state, &input).unwrap();
                        files.push(encode_diff(&out.diff, v));
                        state.commit(out.pending);
                    }
                }
                files
            })
        };
        let one = encode_all(1);
        prop_assert_eq!(&one, &encode_all(2));
        prop_assert_eq!(&one, &encode_all(3));
        // Sealing a file handed over in pieces without its trailer (the
        // asynchronous tiers' GPU path) gives the trailer it was written with.
        for f in &one {
            let n = f.len();
            let cut = (n / 3, 2 * n / 3);
            let mut unsealed = f.clone();
            unsealed[n - 32..].fill(0);
            let pieces = [&unsealed[..cut.0], &unsealed[cut.0..cut.1], &unsealed[cut.1..]];
            let sealed = dckpt::format::seal(&pieces, n as u64).unwrap();
            prop_assert_eq!(&sealed[..], &f[n - 32..]);
            // A file whose length disagrees with its header is refused.
            prop_assert!(dckpt::format::seal(&pieces, n as u64 + 1).is_err());
        }
    }
}

/// A SHIFT run of an older version that a newer version partly overwrites:
/// the restore must take the rest of the run from the right offset.
#[test]
fn partly_overwritten_shift_runs_restore_from_the_right_offset() {
    let cs = 32;
    let v1 = noise(100 * cs, 3);
    let mut v2 = v1.clone();
    v2.copy_within(10 * cs..20 * cs, 40 * cs);
    let mut v3 = v2.clone();
    v3[45 * cs..46 * cs].copy_from_slice(&noise(cs, 4));
    let versions = vec![v1, v2, v3];
    for method in [Method::List, Method::Tree] {
        let dir = tempfile::tempdir().unwrap();
        let reports = checkpoint_all(dir.path(), &opts(method, cs as u32), &versions);
        assert_eq!(reports[1].counts.shift, 10, "{method}");
        assert_restores(dir.path(), &versions);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The record entries recomputed from a diff alone (what the GPU path
    /// persists) equal the ones the CPU engine inserted.
    #[test]
    fn record_entries_follow_from_the_diff((cs, versions) in sequence()) {
        let layout = Layout::new(versions[0].len() as u64, cs as u32).unwrap();
        for method in [Method::List, Method::Tree] {
            let mut state = DedupState::new(layout, HashAlgo::Murmur3, 0);
            for (i, v) in versions.iter().enumerate() {
                let input = DedupInput { data: v, version: i as u64 + 1, baseline: i == 0 };
                let out = method.deduplicator().deduplicate(&state, &input).unwrap();
                let body = dckpt::format::encode_body(&out.diff, v);
                let data = &body[body.len() - out.diff.data_bytes() as usize..];
                let derived = dckpt::dedup::record_entries(&out.diff, data);
                prop_assert_eq!(derived, out.pending_entries(), "{} version {}", method, i + 1);
                state.commit(out.pending);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// A diff read from its metadata alone (what the GPU's collective path
    /// copies to the host while the data stays on the device) is the diff
    /// the whole body decodes to; metadata of another length, or a wrong
    /// data length, is refused.
    #[test]
    fn metadata_alone_decodes_to_the_same_diff((cs, versions) in sequence()) {
        let layout = Layout::new(versions[0].len() as u64, cs as u32).unwrap();
        let mut state = DedupState::new(layout, HashAlgo::Murmur3, 0);
        for (i, v) in versions.iter().enumerate() {
            let input = DedupInput { data: v, version: i as u64 + 1, baseline: i == 0 };
            let out = Method::Tree.deduplicator().deduplicate(&state, &input).unwrap();
            let body = dckpt::format::encode_body(&out.diff, v);
            let (_, whole, data_start) = dckpt::format::decode_body(&body).unwrap();
            let data = out.diff.data_bytes();
            let alone = dckpt::format::decode_meta(&body[..data_start], data).unwrap();
            prop_assert_eq!(&alone, &whole);
            prop_assert!(dckpt::format::decode_meta(&body[..data_start - 1], data).is_err());
            prop_assert!(dckpt::format::decode_meta(&body[..data_start], data + 1).is_err());
            state.commit(out.pending);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Every version restores exactly, reading each stored byte at most
    /// once: no more than the data of the files its chain holds, and every
    /// piece it resolved to accounted for.
    #[test]
    fn restores_read_each_stored_byte_at_most_once((cs, versions) in sequence()) {
        let dir = tempfile::tempdir().unwrap();
        checkpoint_all(dir.path(), &opts(Method::Tree, cs as u32), &versions);
        let stats = dckpt::inspect::inspect_store(dir.path()).unwrap();
        for (i, want) in versions.iter().enumerate() {
            let (got, st) = dckpt::restore::restore_with_stats(dir.path(), 0, i as u64 + 1).unwrap();
            prop_assert!(&got == want, "version {}", i + 1);
            let stored: u64 = stats.iter().filter(|s| s.version <= i as u64 + 1).map(|s| s.data_bytes).sum();
            prop_assert!(st.bytes_read <= stored, "version {}: read {} of {} stored", i + 1, st.bytes_read, stored);
            prop_assert!(st.pieces >= 1 && st.files_opened >= 1);
        }
    }
}

/// Rebuilds a version from its diff alone: the previous version's bytes
/// (zeros for a baseline), FIRST runs from `data` (what the file stores),
/// SHIFT runs from the versions they name (this one's after its FIRST runs).
fn rebuild(diff: &dckpt::diff::Diff, data: &[u8], history: &[Vec<u8>]) -> Vec<u8> {
    let cs = diff.layout.chunk_size() as usize;
    let len = data.len();
    let span = |start: u64, count: u64| (start as usize * cs, ((start + count) as usize * cs).min(len));
    let mut cur = match history.last() {
        Some(prev) if !diff.baseline => prev.clone(),
        _ => vec![0u8; len],
    };
    for r in &diff.first {
        let (a, b) = span(r.start, r.count);
        cur[a..b].copy_from_slice(&data[a..b]);
    }
    for r in &diff.shift {
        let (a, b) = span(r.start, r.count);
        let (sa, _) = span(r.src_start, r.count);
        let src = if r.src_version == diff.version { cur.clone() } else { history[r.src_version as usize - 1].clone() };
        cur[a..b].copy_from_slice(&src[sa..sa + (b - a)]);
    }
    cur
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Under bounds on the record, the regions and the file (the GPU
    /// budget's, dedup::limits), every version still describes its bytes
    /// exactly; the record never holds more than its bound; and a file over
    /// its bound is stored whole.
    #[test]
    fn bounded_state_costs_dedup_never_bytes(
        (cs, versions) in sequence(),
        record in 1u64..64,
        roots in 1u64..16,
        file in 200u64..4000,
    ) {
        let layout = Layout::new(versions[0].len() as u64, cs as u32).unwrap();
        let limits = dckpt::dedup::Limits { record_entries: record, roots, file_prefix: file };
        for method in [Method::Basic, Method::List, Method::Tree] {
            let mut state = DedupState::new(layout, HashAlgo::Murmur3, 0).with_limits(limits);
            let mut history: Vec<Vec<u8>> = Vec::new();
            for (i, v) in versions.iter().enumerate() {
                let input = DedupInput { data: v, version: i as u64 + 1, baseline: i == 0 };
                let out = method.deduplicator().deduplicate(&state, &input).unwrap();
                let got = rebuild(&out.diff, v, &history);
                prop_assert!(&got == v, "{} version {}", method, i + 1);
                let file_len = dckpt::format::diff_file::file_len_of(&out.diff);
                prop_assert!(out.diff.dense || file_len - 32 <= file, "{} version {}: {} bytes", method, i + 1, file_len);
                state.commit(out.pending);
                prop_assert!(state.record.len() as u64 <= record, "{} version {}", method, i + 1);
                history.push(got);
            }
        }
    }
}

/// Three versions of 64 chunks of 64 B (version 2 rewrites 8 chunks,
/// version 3 rewrites 8 others) and a state whose record has room for one
/// incremental version's entries (8 leaves + 7 inner nodes of Tree) but not
/// for two, nor for a baseline's 127.
fn bounded_versions() -> (usize, [Vec<u8>; 3], DedupState) {
    let cs = 64;
    let v1 = noise(64 * cs, 1);
    let mut v2 = v1.clone();
    v2[..8 * cs].copy_from_slice(&noise(8 * cs, 2));
    let mut v3 = v2.clone();
    v3[32 * cs..40 * cs].copy_from_slice(&noise(8 * cs, 3));
    let layout = Layout::new(v1.len() as u64, cs as u32).unwrap();
    let limits = dckpt::dedup::Limits { record_entries: 20, ..dckpt::dedup::Limits::UNLIMITED };
    (cs, [v1, v2, v3], DedupState::new(layout, HashAlgo::Murmur3, 0).with_limits(limits))
}

/// The bounds' two answers, each hit on purpose: a record that would
/// overfill restarts (the version still de-duplicates against itself), and
/// a version whose own entries exceed the bound is stored whole.
#[test]
fn a_full_record_restarts_and_an_oversized_version_is_stored_whole() {
    let (cs, [v1, v2, v3], state) = bounded_versions();
    let mut state = state;
    let mut kinds = Vec::new();
    for (i, v) in [&v1, &v2, &v3].into_iter().enumerate() {
        let input = DedupInput { data: v, version: i as u64 + 1, baseline: i == 0 };
        let out = Method::Tree.deduplicator().deduplicate(&state, &input).unwrap();
        kinds.push((out.diff.dense, out.pending.bounds(), out.diff.data_bytes()));
        state.commit(out.pending);
    }
    let b = |restarts, whole| dckpt::dedup::BoundsHit { record_restarts: restarts, stored_whole: whole };
    assert_eq!(kinds[0], (true, b(0, 1), v1.len() as u64), "the baseline's 127 entries do not fit: stored whole");
    assert_eq!(kinds[1], (false, b(0, 0), 8 * cs as u64), "8 changed chunks fit an empty record");
    assert_eq!(kinds[2], (false, b(1, 0), 8 * cs as u64), "15 more would not: the record restarts");
    assert_eq!(state.bounds_hit, b(1, 1));
    assert_eq!(state.record.len(), 15);
}

/// A version that restarted the record and is then dropped (its write
/// failed) leaves the CPU backend without a record, as the GPU's table is
/// (cleared at the restart): both backends keep writing the same files.
#[test]
fn a_dropped_record_restart_forgets_the_record() {
    use dckpt::backend::Backend;
    use dckpt::memory::Protected;
    let (cs, [v1, v2, v3], state) = bounded_versions();
    let mut cpu = dckpt::backend::cpu::CpuBackend::new(state, Method::Tree);
    for (i, v) in [(1u64, &v1), (2, &v2)] {
        let d = cpu.deduplicate(i, Protected::Host(v), i == 1).unwrap();
        cpu.commit(d).unwrap();
    }
    assert_eq!(cpu.record_entries(), 15);
    let d = cpu.deduplicate(3, Protected::Host(&v3), false).unwrap();
    assert!(!d.diff.dense);
    cpu.rollback().unwrap();
    assert_eq!(cpu.record_entries(), 0, "the dropped restart took the record with it");
    // A version that did not restart keeps the record when it is dropped.
    let d = cpu.deduplicate(3, Protected::Host(&v3), false).unwrap();
    cpu.commit(d).unwrap();
    assert_eq!(cpu.record_entries(), 15);
    let mut v4 = v3.clone();
    v4[48 * cs..50 * cs].copy_from_slice(&noise(2 * cs, 4)); // 3 more entries: they fit
    let _ = cpu.deduplicate(4, Protected::Host(&v4), false).unwrap();
    cpu.rollback().unwrap();
    assert_eq!(cpu.record_entries(), 15);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Locating chunk ranges from a hint (`DiffReader::locate_each_near`, the
    /// restore plan's way) finds the same pieces as a search from the start,
    /// for ranges asked in any order, and refuses the same ranges.
    #[test]
    fn locating_from_a_hint_finds_what_a_search_finds((cs, versions) in sequence(), picks in proptest::collection::vec((0.0..1.0f64, 1u64..40), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        checkpoint_all(dir.path(), &opts(Method::Tree, cs as u32), &versions);
        let store = dckpt::store::Store::open(dir.path(), 0).unwrap();
        for v in 1..=versions.len() as u64 {
            let reader = dckpt::format::DiffReader::open(&store.diff_path(v)).unwrap();
            let chunks = reader.diff.layout.chunks();
            // Ranges inside FIRST runs (found), and arbitrary ones (often refused).
            let runs: Vec<_> = reader.diff.first.iter().map(|r| r.start..r.start + r.count).collect();
            let mut near = 0;
            for (i, &(at, len)) in picks.iter().enumerate() {
                let range = match runs.get(i % runs.len().max(1)) {
                    Some(r) if i % 3 != 0 => {
                        let start = r.start + ((at * (r.end - r.start) as f64) as u64).min(r.end - r.start - 1);
                        start..(start + len).min(r.end)
                    }
                    _ => {
                        let start = ((at * chunks as f64) as u64).min(chunks.saturating_sub(1));
                        start..(start + len).min(chunks)
                    }
                };
                let (mut a, mut b) = (Vec::new(), Vec::new());
                let found = reader.locate_each(range.clone(), |o, l| a.push((o, l))).is_ok();
                let near_found = reader.locate_each_near(range.clone(), &mut near, |o, l| b.push((o, l))).is_ok();
                prop_assert_eq!(found, near_found, "version {} range {:?}", v, range);
                if found {
                    prop_assert_eq!(&a, &b, "version {} range {:?}", v, range);
                }
            }
        }
    }
}
