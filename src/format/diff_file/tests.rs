//! Round trips and refusals of the diff file's tables and header.
use super::super::codec::PutLe;
use super::*;
use crate::diff::{Diff, FirstRun, RegionEncoding, ShiftRun};
use crate::hash::HashAlgo;
use crate::layout::Layout;
use crate::method::Method;
use proptest::prelude::*;

/// The runs of set bits, one bit at a time (the oracle).
fn runs_bit_by_bit(bitmap: &[u8]) -> Vec<FirstRun> {
    let mut runs: Vec<FirstRun> = Vec::new();
    for i in 0..bitmap.len() as u64 * 8 {
        if bitmap[(i / 8) as usize] & (1 << (i % 8)) != 0 {
            match runs.last_mut() {
                Some(r) if r.start + r.count == i => r.count += 1,
                _ => runs.push(FirstRun { start: i, count: 1 }),
            }
        }
    }
    runs
}

proptest! {
    /// Word-wise decoding finds the runs a bit-by-bit scan finds, with
    /// runs across words, whole words of ones and zeros, and a short
    /// last word.
    #[test]
    fn bitmap_runs_match_a_bit_by_bit_scan(
        bytes in proptest::collection::vec(prop_oneof![Just(0u8), Just(0xff), any::<u8>()], 0..80)
    ) {
        prop_assert_eq!(bitmap_runs(&bytes), runs_bit_by_bit(&bytes));
    }
}

/// A diff whose SHIFT runs come from `(count, source)` pieces laid one
/// after another (source `None`: a gap of FIXED chunks).
fn diff_of(pieces: &[(u64, Option<u64>)]) -> Diff {
    let n: u64 = pieces.iter().map(|p| p.0).sum::<u64>() + 8;
    let mut shift = Vec::new();
    let mut at = 8; // chunks 0..8 are FIRST: the sources
    for &(count, src) in pieces {
        if let Some(src_start) = src {
            shift.push(ShiftRun {
                start: at,
                count,
                src_version: 1,
                src_rank: 0,
                src_start,
                reference: None,
                period: 0,
            });
        }
        at += count;
    }
    Diff {
        version: 1,
        rank: 0,
        layout: Layout::new(n * 64, 64).expect("layout"),
        hash: HashAlgo::Murmur3,
        // Runs as given, not coalesced: as List makes them.
        method: Method::List,
        baseline: true,
        dense: false,
        first: vec![FirstRun { start: 0, count: 8 }],
        shift,
        encoding: RegionEncoding::Table,
    }
}

/// Up to 60 pieces of 1–4 chunks, each a gap or a copy of one of three
/// sources: runs in a row that repeat, with shorter tails, between gaps.
fn pieces() -> impl Strategy<Value = Vec<(u64, Option<u64>)>> {
    proptest::collection::vec((1u64..5, prop_oneof![Just(None), (0u64..3).prop_map(Some)]), 0..60)
}

/// `diff`'s metadata with every SHIFT run an entry of its own, as a
/// device writes it.
fn unfolded_meta(diff: &Diff) -> Vec<u8> {
    let mut out = Vec::new();
    header_with(diff, diff.shift.len() as u64, false).encode(&mut out);
    for r in &diff.first {
        out.put_u64(r.start);
        out.put_u64(r.count);
    }
    for s in &diff.shift {
        for v in [s.start, s.count, s.src_start, s.src_version] {
            out.put_u64(v);
        }
        out.put_u32(s.src_rank);
        out.put_u32(0);
    }
    out
}

/// A device-made file's metadata from `segments`, each `(count, source,
/// copies)` laid one after another: a gap (no source), a plain root
/// (one copy; coalesced with the plain root before it where it extends
/// it), or a repeat node (its source of `count` chunks, `copies` ≥ 2
/// times; one entry of its own). Also the diff a CPU makes of the same
/// roots: every copy a run, coalesced.
fn device_meta(segments: &[(u64, Option<u64>, u64)]) -> (Vec<u8>, Diff) {
    let mut entries: Vec<(ShiftRun, u64)> = Vec::new();
    let mut pieces = Vec::new();
    for &(count, src, copies) in segments {
        pieces.extend(std::iter::repeat_n((count, src), copies as usize));
    }
    let mut cpu = Diff { method: Method::Tree, ..diff_of(&pieces) };
    let mut at = 8;
    for &(count, src, copies) in segments {
        if let Some(src_start) = src {
            let run = ShiftRun {
                start: at,
                count: count * copies,
                src_version: 1,
                src_rank: 0,
                src_start,
                reference: None,
                period: 0,
            };
            match entries.last_mut() {
                Some((prev, 0)) if copies == 1 && prev.extended_by(&run) => prev.count += run.count,
                _ => entries.push((run, if copies > 1 { count } else { 0 })),
            }
        }
        at += count * copies;
    }
    cpu.coalesce();
    let mut out = Vec::new();
    let header = header_with(&cpu, entries.len() as u64, entries.iter().any(|e| e.1 > 0));
    header.encode(&mut out);
    for r in &cpu.first {
        out.put_u64(r.start);
        out.put_u64(r.count);
    }
    for (s, period) in &entries {
        for v in [s.start, s.count, s.src_start, s.src_version] {
            out.put_u64(v);
        }
        out.put_u32(s.src_rank);
        out.put_u32(if *period > 0 { SHIFT_FLAG_REPEAT | (*period as u32) << PERIOD_SHIFT } else { 0 });
    }
    (out, cpu)
}

proptest! {
    /// A device's file, with a repeat node an entry of its own that the
    /// encoder would merge with its neighbours, decodes to the runs the
    /// CPU makes of the same roots; the in-place scan flags it, and its
    /// rewrite (decode, encode) is the CPU's file.
    #[test]
    fn a_device_file_with_repeat_nodes_decodes_to_the_cpu_runs(
        segments in proptest::collection::vec(
            (1u64..5, prop_oneof![Just(None), (0u64..4).prop_map(Some)], prop_oneof![Just(1u64), 2u64..9]),
            0..40,
        )
    ) {
        let (device, cpu) = device_meta(&segments);
        let back = decode_meta(&device, cpu.data_bytes()).expect("decodes");
        prop_assert_eq!(&back.shift, &cpu.shift);
        let repeats = segments.iter().any(|s| s.1.is_some() && s.2 > 1);
        if repeats {
            prop_assert!(runs_fold(&device).expect("scans"));
        }
        prop_assert_eq!(encode_meta(&back), encode_meta(&cpu));
        // Kept folded: an entry or two more per repeat at most (its first
        // and last copies merged into neighbours), the same runs expanded,
        // the same file encoded.
        let mut folded = decode_meta_folded(&device, cpu.data_bytes()).expect("decodes folded");
        let entries = DiffHeader::decode(&device[..HEADER_LEN as usize]).expect("header").shift_count;
        prop_assert!(folded.shift.len() as u64 <= 3 * entries, "{} runs for {entries} entries", folded.shift.len());
        prop_assert_eq!(encode_meta(&folded), encode_meta(&cpu));
        prop_assert_eq!(stored_shift_entries(&folded), stored_shift_entries(&cpu));
        prop_assert_eq!(file_len_of(&folded), file_len_of(&cpu));
        folded.expand_repeats();
        prop_assert_eq!(&folded.shift, &cpu.shift);
    }
}

proptest! {
    /// The in-place scan finds a fold exactly where the encoder folds:
    /// in a device-like file (which decodes to the same runs), never in
    /// the encoder's own.
    #[test]
    fn the_in_place_scan_finds_exactly_the_folds(
        pieces in pieces()
    ) {
        let diff = diff_of(&pieces);
        let device = unfolded_meta(&diff);
        prop_assert_eq!(&decode_meta(&device, diff.data_bytes()).expect("decodes").shift, &diff.shift);
        let folds = stored_shift_entries(&diff) < diff.shift.len() as u64;
        prop_assert_eq!(runs_fold(&device).expect("scans"), folds);
        // The encoder's own file: flagged exactly where it holds a repeat entry.
        prop_assert_eq!(runs_fold(&encode_meta(&diff)).expect("scans"), folds);
        prop_assert_eq!(device_file_len(&diff, diff.shift.len() as u64) - file_len_of(&diff),
            (diff.shift.len() as u64 - stored_shift_entries(&diff)) * SHIFT_ENTRY_LEN);
    }

    /// Folding repeats and expanding them gives the runs back exactly,
    /// whatever the mix of repeats, shorter tails, gaps and plain runs;
    /// a file with a fold is v3, one without stays v2.
    #[test]
    fn folded_runs_decode_to_the_runs_encoded(
        pieces in pieces()
    ) {
        let diff = diff_of(&pieces);
        let meta = encode_meta(&diff);
        let back = decode_meta(&meta, diff.data_bytes()).expect("decodes");
        prop_assert_eq!(&back.shift, &diff.shift);
        let header = DiffHeader::decode(&meta[..HEADER_LEN as usize]).expect("header");
        let folds = header.shift_count < diff.shift.len() as u64;
        prop_assert_eq!(header.format_version, if folds { FORMAT_VERSION_REPEATS } else { FORMAT_VERSION });
        // Kept folded: one run per entry, the same file again.
        let mut folded = decode_meta_folded(&meta, diff.data_bytes()).expect("decodes folded");
        prop_assert_eq!(folded.shift.len() as u64, header.shift_count);
        prop_assert_eq!(encode_meta(&folded), meta);
        folded.expand_repeats();
        prop_assert_eq!(&folded.shift, &diff.shift);
    }
}

proptest! {
    /// The entries of runs holding repeats, short last copies included, are
    /// the entries of the same runs expanded one copy at a time.
    #[test]
    fn entries_of_folded_runs_are_the_entries_of_their_copies(
        segments in proptest::collection::vec((1u64..5, 0u64..3, 1u64..6, 0u64..5, any::<bool>()), 0..40)
    ) {
        let mut folded = diff_of(&[]);
        let mut at = 8;
        for (period, src_start, copies, tail, gap) in segments {
            let count = period * copies + tail % period;
            let period = if count > period { period } else { 0 };
            folded.shift.push(ShiftRun { start: at, count, src_version: 1, src_rank: 0, src_start, reference: None, period });
            at += count + u64::from(gap);
        }
        folded.layout = Layout::new((at + 1) * 64, 64).expect("layout");
        let mut expanded = folded.clone();
        expanded.expand_repeats();
        let entries = |d: &Diff| shift_entries(&d.shift).collect::<Vec<_>>();
        prop_assert_eq!(entries(&folded), entries(&expanded));
        prop_assert_eq!(encode_meta(&folded), encode_meta(&expanded));
        // Folding the expanded runs as the file stores them: the same
        // entries again, one run per entry, the same runs once expanded.
        let mut refolded = expanded.clone();
        fold_repeats(&mut refolded);
        prop_assert_eq!(refolded.shift.len(), entries(&expanded).len().min(expanded.shift.len()));
        prop_assert_eq!(entries(&refolded), entries(&expanded));
        refolded.expand_repeats();
        prop_assert_eq!(&refolded.shift, &expanded.shift);
    }
}

#[test]
fn a_repeated_chunk_is_one_entry() {
    // 1000 copies of chunk 3, then 10 of chunks 4..6 (period 2), the last
    // cut short, then one more copy of chunk 3.
    let mut pieces = vec![(1, Some(3)); 1000];
    pieces.extend(vec![(2, Some(4)); 10]);
    pieces.push((1, Some(4)));
    pieces.push((1, Some(3)));
    let diff = diff_of(&pieces);
    assert_eq!(stored_shift_entries(&diff), 3);
    assert_eq!(device_file_len(&diff, 1012), file_len_of(&diff) + (1012 - 3) * SHIFT_ENTRY_LEN);
    let meta = encode_meta(&diff);
    assert_eq!(meta.len() as u64, HEADER_LEN + FIRST_ENTRY_LEN + 3 * SHIFT_ENTRY_LEN);
    assert_eq!(decode_meta(&meta, diff.data_bytes()).expect("decodes").shift, diff.shift);
}

#[test]
fn repeat_entries_that_cannot_be_are_refused() {
    let diff = diff_of(&[(1, Some(3)), (1, Some(3)), (1, Some(3))]);
    let meta = encode_meta(&diff);
    let flags_at = (HEADER_LEN + FIRST_ENTRY_LEN + 36) as usize;
    let with_flags = |flags: u32, version: Option<u16>| {
        let mut m = meta.clone();
        m[flags_at..flags_at + 4].copy_from_slice(&flags.to_le_bytes());
        if let Some(v) = version {
            // The format version follows the magic.
            m[8..10].copy_from_slice(&v.to_le_bytes());
        }
        decode_meta(&m, diff.data_bytes())
    };
    assert!(with_flags(SHIFT_FLAG_REPEAT | (1 << PERIOD_SHIFT), None).is_ok());
    let refused = [
        (SHIFT_FLAG_REPEAT | (1 << PERIOD_SHIFT), Some(2), "unknown flags"),
        (SHIFT_FLAG_REPEAT, None, "period of 0"),
        (SHIFT_FLAG_REPEAT | (3 << PERIOD_SHIFT), None, "period of 3"),
        (1 << PERIOD_SHIFT, None, "no repeat flag"),
        (SHIFT_FLAG_REPEAT | SHIFT_FLAG_REFERENCE | (1 << PERIOD_SHIFT), None, "a reference with flags"),
    ];
    for (flags, version, why) in refused {
        let e = with_flags(flags, version).expect_err(why);
        assert!(e.contains(why), "{flags:#x}: {e}");
    }
}

#[test]
fn bitmap_runs_of_edge_words() {
    assert!(bitmap_runs(&[]).is_empty());
    assert_eq!(bitmap_runs(&[0xff; 16]), vec![FirstRun { start: 0, count: 128 }]);
    let mut b = [0u8; 17];
    b[7] = 0x80; // bit 63
    b[8] = 0x01; // bit 64: one run across the word boundary
    b[16] = 0x80; // bit 135, the last
    assert_eq!(bitmap_runs(&b), vec![FirstRun { start: 63, count: 2 }, FirstRun { start: 135, count: 1 }]);
}
