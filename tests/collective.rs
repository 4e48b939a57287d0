//! Collective checkpoints of several in-process ranks, without MPI: each
//! rank's `step::offer`, the reference reduction `reduce_all`, each rank's
//! `step::settle` and publish — the same steps the MPI layer runs around
//! `MPI_Reduce` + `MPI_Bcast`. Random shared, private and shifted updates;
//! every version of every rank must restore byte-exactly and verify clean,
//! also after the stores are reopened mid-sequence. Also: format v1 files
//! still read, and malformed v2 reference tables are rejected.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::noise;
use dckpt::collective::regions::max_region_level;
use dckpt::collective::{reduce_all, step};
use dckpt::format::diff_file::DiffReader;
use dckpt::layout::Layout;
use dckpt::memory::Protected;
use dckpt::{Engine, HashAlgo, Method, StoreOptions};
use proptest::prelude::*;
use std::path::Path;

fn opts(method: Method, chunk_size: u32, hash: HashAlgo) -> StoreOptions {
    StoreOptions { chunk_size, method, hash, ..StoreOptions::default() }
}

/// One collective version over in-process engines; returns the bytes each
/// rank now references on other ranks.
fn collective_version(engines: &mut [Engine], version: u64, data: &[Vec<u8>], max_level: u32, k: usize) -> Vec<u64> {
    let layouts: Vec<Layout> = engines.iter().map(|e| e.store().layout().unwrap()).collect();
    let offers: Vec<step::Offer> = engines
        .iter_mut()
        .zip(data)
        .map(|(e, d)| step::offer(e, version, Protected::Host(d), max_level, k).unwrap())
        .collect();
    let sets: Vec<_> = offers.iter().map(|o| o.set.clone()).collect();
    let merged = reduce_all(&sets, k);
    let mut staged = Vec::new();
    for ((e, o), d) in engines.iter_mut().zip(offers).zip(data) {
        staged.push(step::settle(e, o, &merged, &layouts, d).unwrap());
    }
    // Publish only once every rank has written (as the MPI layer does).
    let mut referenced = Vec::new();
    for (e, (s, conv)) in engines.iter_mut().zip(staged) {
        e.publish(s).unwrap();
        referenced.push(conv.iter().map(|c| c.region.bytes).sum());
    }
    referenced
}

fn open_all(root: &Path, ranks: usize, lens: &[usize], o: &StoreOptions) -> Vec<Engine> {
    (0..ranks).map(|r| Engine::open_or_create(root, r as u32, lens[r] as u64, o).unwrap()).collect()
}

/// An edit applied to some ranks' buffers at one version.
#[derive(Clone, Debug)]
enum Edit {
    /// Rewrite `len` bytes at `at` (fraction of the buffer) with bytes seeded by `seed`.
    Write { at: f64, len: usize, seed: u64 },
    /// Copy a page-aligned block elsewhere (a shifted duplicate).
    Move { from: f64, to: f64, len: usize },
}

fn apply(buf: &mut [u8], e: &Edit) {
    let n = buf.len();
    match *e {
        Edit::Write { at, len, seed } => {
            let len = len.min(n);
            let at = ((at * (n - len) as f64) as usize).min(n - len);
            buf[at..at + len].copy_from_slice(&noise(len, seed));
        }
        Edit::Move { from, to, len } => {
            let len = len.min(n / 2);
            let from = ((from * (n - len) as f64) as usize) & !255;
            let to = ((to * (n - len) as f64) as usize) & !255;
            buf.copy_within(from..from + len, to);
        }
    }
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (0.0..1.0f64, 1usize..3000, any::<u64>()).prop_map(|(at, len, seed)| Edit::Write { at, len, seed }),
        (0.0..1.0f64, 0.0..1.0f64, 256usize..8192).prop_map(|(from, to, len)| Edit::Move { from, to, len }),
    ]
}

/// Per version: edits every rank applies (shared), and edits per rank (private).
type Plan = Vec<(Vec<Edit>, Vec<Vec<Edit>>)>;

fn plan(ranks: usize) -> impl Strategy<Value = Plan> {
    proptest::collection::vec(
        (
            proptest::collection::vec(edit(), 0..4),
            proptest::collection::vec(proptest::collection::vec(edit(), 0..3), ranks..=ranks),
        ),
        1..5,
    )
}

fn run_plan(ranks: usize, shared_part: f64, plan: &Plan, chunk: u32, k: usize, method: Method, reopen_at: usize) {
    let len = 40_000 + 37;
    let dir = tempfile::tempdir().unwrap();
    let o = opts(method, chunk, HashAlgo::Murmur3);
    let lens = vec![len; ranks];
    // Version 1: a shared prefix, private rest.
    let common = noise(len, 1);
    let mut bufs: Vec<Vec<u8>> = (0..ranks)
        .map(|r| {
            let mut b = noise(len, 100 + r as u64);
            let cut = (shared_part * len as f64) as usize;
            b[..cut].copy_from_slice(&common[..cut]);
            b
        })
        .collect();
    let mut history: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut engines = open_all(dir.path(), ranks, &lens, &o);
    let max_level = max_region_level(chunk, 1024);
    for (i, (shared, private)) in plan.iter().enumerate() {
        if i > 0 {
            for (r, b) in bufs.iter_mut().enumerate() {
                shared.iter().for_each(|e| apply(b, e));
                private[r].iter().for_each(|e| apply(b, e));
            }
        }
        if i == reopen_at {
            drop(engines);
            engines = open_all(dir.path(), ranks, &lens, &o);
        }
        let referenced = collective_version(&mut engines, i as u64 + 1, &bufs, max_level, k);
        if i == 0 && ranks > 1 && shared_part > 0.5 && k >= 1000 {
            assert!(referenced.iter().sum::<u64>() > 0, "a shared half must produce references");
        }
        history.push(bufs.clone());
    }
    for (i, bufs) in history.iter().enumerate() {
        for (r, want) in bufs.iter().enumerate() {
            let got = dckpt::restore::restore_version(dir.path(), r as u32, i as u64 + 1).unwrap();
            assert!(got == *want, "rank {r} version {} differs after restore", i + 1);
            // Byte ranges alone read the same bytes (references, SHIFT chains, partial chunks).
            let mut x = (i * 31 + r * 7 + 1) as u64;
            let mut ranges = vec![0..len, len - 1..len, 5..5];
            for _ in 0..3 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let a = (x >> 33) as usize % len;
                let b = a + ((x >> 13) as usize % (len - a)) + 1;
                ranges.push(a..b.min(len));
            }
            for range in ranges {
                let part = dckpt::restore::restore_range(
                    dir.path(),
                    r as u32,
                    i as u64 + 1,
                    range.start as u64..range.end as u64,
                )
                .unwrap();
                assert!(part == want[range.clone()], "rank {r} version {} bytes {range:?} differ", i + 1);
            }
            let past = dckpt::restore::restore_range(dir.path(), r as u32, i as u64 + 1, 0..len as u64 + 1);
            assert!(past.is_err_and(|e| e.to_string().contains("holds")), "a range past the end is refused");
        }
    }
    let report = dckpt::verify::verify_store(dir.path()).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn collective_versions_restore_byte_exactly(
        (ranks, plan) in (1usize..=4).prop_flat_map(|r| (Just(r), plan(r))),
        shared_part in prop_oneof![Just(0.0), Just(0.5), Just(1.0)],
        chunk in prop_oneof![Just(32u32), Just(64), Just(256)],
        k in prop_oneof![Just(4usize), Just(1 << 17)],
        method in prop_oneof![Just(Method::Tree), Just(Method::List)],
        reopen_at in 0usize..5,
    ) {
        run_plan(ranks, shared_part, &plan, chunk, k, method, reopen_at);
    }
}

#[test]
fn identical_ranks_store_about_one_copy_evenly() {
    let len = 1 << 20;
    let ranks = 4;
    let dir = tempfile::tempdir().unwrap();
    let o = opts(Method::Tree, 128, HashAlgo::Murmur3);
    let mut engines = open_all(dir.path(), ranks, &[len; 4], &o);
    let data = vec![noise(len, 3); ranks];
    let level = max_region_level(128, dckpt::collective::auto_region_bytes(len as u64, ranks as u32));
    collective_version(&mut engines, 1, &data, level, 1 << 17);
    let stats = dckpt::inspect::store_stats(dir.path()).unwrap();
    let total: u64 = stats.ranks.iter().map(|r| r.data_bytes).sum();
    assert_eq!(total, len as u64, "exactly one copy of the data");
    assert!(stats.max_over_mean <= 1.05, "max/mean {}", stats.max_over_mean);
    assert!(stats.total_cross_rank_references > 0);
}

#[test]
fn format_v1_files_still_read_and_bad_reference_tables_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(Method::Tree, 64, HashAlgo::Murmur3);
    let mut e = Engine::open_or_create(dir.path(), 0, 5000, &o).unwrap();
    let data = noise(5000, 1);
    e.checkpoint(1, &data).unwrap();
    let path = e.store().diff_path(1);
    let file = std::fs::read(&path).unwrap();
    let reader = DiffReader::open(&path).unwrap();
    let meta_end = file.len() - 32 - 32 * reader.block_count() as usize;
    // Rewrite the header as format 1 (no references) with a fresh trailer.
    let data_start = meta_end - reader.header.data_bytes as usize;
    let reseal = |body: Vec<u8>| dckpt::format::finish_body(body, data_start);
    let mut v1 = file[..meta_end].to_vec();
    v1[8] = 1;
    let v1 = reseal(v1);
    let p1 = dir.path().join("v1.dckpt");
    std::fs::write(&p1, &v1).unwrap();
    assert_eq!(DiffReader::open(&p1).unwrap().diff, reader.diff);
    // A reference count in a v1 header, or an unknown format, is rejected.
    for (at, byte, what) in [(76usize, 1u8, "references"), (8, 4, "format version")] {
        let mut bad = file[..meta_end].to_vec();
        bad[8] = if at == 8 { byte } else { 1 };
        bad[at] = byte;
        let p = dir.path().join("bad.dckpt");
        std::fs::write(&p, reseal(bad)).unwrap();
        let err = DiffReader::open(&p).unwrap_err().to_string();
        assert!(err.contains(what), "{err}");
    }
}

#[test]
fn v2_reference_tables_round_trip_and_malformed_ones_are_rejected() {
    use dckpt::diff::{Diff, FirstRun, RegionEncoding, ShiftRun};
    use dckpt::format::{decode_body, encode_body};
    let layout = Layout::new(64 * 10, 64).unwrap();
    let data = noise(640, 5);
    let reference = |start, src_rank, digest| ShiftRun {
        period: 0,
        start,
        count: 2,
        src_version: 3,
        src_rank,
        src_start: 4,
        reference: Some(dckpt::Digest(digest)),
    };
    let diff = Diff {
        version: 3,
        rank: 1,
        layout,
        hash: HashAlgo::Murmur3,
        method: Method::Tree,
        baseline: false,
        dense: false,
        first: vec![FirstRun { start: 0, count: 2 }],
        shift: vec![
            reference(2, 0, 0xabc),
            ShiftRun { start: 4, count: 1, src_version: 2, src_rank: 1, src_start: 0, reference: None, period: 0 },
            reference(6, 2, 0xdef),
        ],
        encoding: RegionEncoding::Table,
    };
    let body = encode_body(&diff, &data);
    let (header, back, _) = decode_body(&body).unwrap();
    assert_eq!((header.reference_count, back), (2, diff.clone()));
    // SHIFT entry k's flags word is at 96 + 16·F + 40·k + 36.
    let flags_at = |k: usize| 96 + 16 + 40 * k + 36;
    let mut bad = body.clone();
    bad[flags_at(1)] = 2; // an unknown flag bit
    assert!(decode_body(&bad).unwrap_err().contains("unknown flags"));
    let mut bad = body.clone();
    bad[flags_at(1)] = 1; // three flagged runs, two digests
    assert!(decode_body(&bad).is_err());
    // A reference to this very rank is not a cross-rank reference.
    let mut own = diff.clone();
    own.shift[0].src_rank = 1;
    assert!(decode_body(&encode_body(&own, &data)).unwrap_err().contains("another rank"));
}

#[test]
fn a_forced_baseline_references_nothing_older() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(Method::Tree, 64, HashAlgo::Murmur3);
    let mut e = Engine::open_or_create(dir.path(), 0, 4096, &o).unwrap();
    let mut data = noise(4096, 1);
    assert!(e.checkpoint(1, &data).unwrap().baseline);
    data[100] ^= 1;
    assert!(!e.checkpoint(2, &data).unwrap().baseline);
    // What a collective checkpoint does after another rank failed to publish.
    e.force_baseline();
    data[200] ^= 1;
    assert!(e.checkpoint(3, &data).unwrap().baseline);
    data[300] ^= 1;
    assert!(!e.checkpoint(4, &data).unwrap().baseline, "only the next version is forced");
    assert_eq!(dckpt::restore::restore_version(dir.path(), 0, 4).unwrap(), data);
}

/// Reopening every rank before every collective version (the record rebuilt
/// from the latest version, pointing at the owners' bytes) stores about what
/// an uninterrupted run stores, and everything restores.
#[test]
fn reopening_every_version_stores_within_two_percent_of_an_uninterrupted_run() {
    let ranks = 4;
    let len = 64 * 1024;
    let o = opts(Method::Tree, 64, HashAlgo::Murmur3);
    let level = max_region_level(64, 2048);
    // Half of each buffer is replicated on every rank; each version rewrites
    // a shared piece, a private piece and moves a block.
    let versions: Vec<Vec<Vec<u8>>> = {
        let mut cur: Vec<Vec<u8>> = (0..ranks)
            .map(|r| {
                let mut d = noise(len, 1);
                d[len / 2..].copy_from_slice(&noise(len / 2, 10 + r as u64));
                d
            })
            .collect();
        let mut all = vec![cur.clone()];
        for v in 1..10u64 {
            let shared = noise(700, 100 + v);
            for (r, d) in cur.iter_mut().enumerate() {
                let at = (v as usize * 3001) % (len / 2 - 700);
                d[at..at + 700].copy_from_slice(&shared);
                let p = len / 2 + (v as usize * 1777 + r * 97) % (len / 2 - 300);
                d[p..p + 300].copy_from_slice(&noise(300, 1000 * v + r as u64));
                d.copy_within(256 * v as usize..256 * v as usize + 1024, len / 2 - 4096);
            }
            all.push(cur.clone());
        }
        all
    };
    let lens = vec![len; ranks];
    let straight_dir = tempfile::tempdir().unwrap();
    let mut engines = open_all(straight_dir.path(), ranks, &lens, &o);
    for (v, data) in versions.iter().enumerate() {
        collective_version(&mut engines, v as u64 + 1, data, level, 1 << 12);
    }
    drop(engines);
    let reopened_dir = tempfile::tempdir().unwrap();
    for (v, data) in versions.iter().enumerate() {
        let mut engines = open_all(reopened_dir.path(), ranks, &lens, &o);
        collective_version(&mut engines, v as u64 + 1, data, level, 1 << 12);
    }
    let total = |d: &Path| dckpt::inspect::store_stats(d).unwrap().total_stored_bytes;
    let (straight, reopened) = (total(straight_dir.path()), total(reopened_dir.path()));
    let refs = dckpt::inspect::store_stats(reopened_dir.path()).unwrap().total_cross_rank_references;
    println!("stored: {straight} bytes uninterrupted, {reopened} reopened every version; {refs} cross-rank references");
    assert!(refs > 0, "the workload must exercise cross-rank references");
    assert!(reopened as f64 <= straight as f64 * 1.02, "reopened {reopened} bytes vs uninterrupted {straight}");
    for (v, data) in versions.iter().enumerate() {
        for (r, want) in data.iter().enumerate() {
            let got = dckpt::restore::restore_version(reopened_dir.path(), r as u32, v as u64 + 1).unwrap();
            assert!(got == *want, "rank {r} version {}", v + 1);
        }
    }
    assert!(dckpt::verify::verify_store(reopened_dir.path()).unwrap().problems.is_empty());
}

/// An owner's file rewritten whole with other bytes in its FIRST data (a
/// file that checks clean on its own): the owner restores what it now
/// holds, but every rank that references its regions refuses the restore
/// with `BrokenReference` (each reference's digest checked against the
/// bytes it brought), never other bytes.
#[test]
fn a_reference_to_an_owner_whose_bytes_changed_is_refused() {
    let len = 1 << 16;
    let ranks = 3;
    let dir = tempfile::tempdir().unwrap();
    let o = opts(Method::Tree, 64, HashAlgo::Murmur3);
    let mut engines = open_all(dir.path(), ranks, &[len; 3], &o);
    let level = max_region_level(64, dckpt::collective::auto_region_bytes(len as u64, ranks as u32));
    let bufs = vec![noise(len, 9); ranks];
    collective_version(&mut engines, 1, &bufs, level, 1 << 17);
    let referencing: Vec<u32> = (0..ranks as u32).filter(|&r| !owner_of_dir(dir.path(), r).is_empty()).collect();
    assert!(!referencing.is_empty(), "identical buffers: some rank references another");
    let owner = owner_of_dir(dir.path(), referencing[0])[0];
    // The owner's file re-encoded from other bytes: the same tables, a clean file.
    let path = engines[owner as usize].store().diff_path(1);
    let diff = DiffReader::open(&path).unwrap().diff;
    let other = noise(len, 77);
    let file = dckpt::format::encode_diff(&diff, &other);
    std::fs::write(&path, &file).unwrap();
    drop(engines);
    // Its manifest entry follows (as a swapped-in directory's would).
    let manifest_path = path.with_file_name("MANIFEST");
    let mut m = dckpt::format::Manifest::decode(&std::fs::read(&manifest_path).unwrap(), &manifest_path).unwrap();
    let trailer: String = hex::encode(&file[file.len() - 32..]);
    m.versions[0] = dckpt::format::VersionEntry { file_len: file.len() as u64, trailer, ..m.versions[0].clone() };
    std::fs::write(&manifest_path, m.encode()).unwrap();
    let mine = dckpt::restore::restore_version(dir.path(), owner, 1).unwrap();
    assert!(mine != bufs[owner as usize], "the owner holds the new bytes");
    for r in referencing.into_iter().filter(|&r| owner_of_dir(dir.path(), r).contains(&owner)) {
        let e = dckpt::restore::restore_version(dir.path(), r, 1).expect_err("a broken reference restored");
        assert_eq!(e.kind(), dckpt::ErrorKind::BrokenReference, "rank {r}: {e}");
    }
}

/// The owners rank `r`'s version 1 references, read from its file under `root`.
fn owner_of_dir(root: &Path, r: u32) -> Vec<u32> {
    let store = dckpt::store::Store::open(root, r).unwrap();
    let path = store.diff_path(1);
    DiffReader::open(&path).unwrap().diff.shift.iter().filter(|s| s.reference.is_some()).map(|s| s.src_rank).collect()
}

#[test]
fn prune_keeps_the_owners_files_that_kept_versions_reference() {
    let len = 1 << 16;
    let ranks = 3;
    let dir = tempfile::tempdir().unwrap();
    let o = opts(Method::Tree, 64, HashAlgo::Murmur3);
    // Rank 0 re-baselines every second version; the others never do, so
    // their later versions keep referencing rank 0's early files.
    let short = StoreOptions { max_chain: Some(2), ..o.clone() };
    let mut engines: Vec<Engine> = (0..ranks)
        .map(|r| Engine::open_or_create(dir.path(), r as u32, len as u64, if r == 0 { &short } else { &o }).unwrap())
        .collect();
    let level = max_region_level(64, dckpt::collective::auto_region_bytes(len as u64, ranks as u32));
    let mut bufs = vec![noise(len, 3); ranks];
    let mut history = Vec::new();
    for v in 1..=6u64 {
        for (r, b) in bufs.iter_mut().enumerate() {
            let at = (v as usize * 4099 + r * 1031) % (len - 256);
            b[at..at + 256].copy_from_slice(&noise(256, v * 10 + r as u64));
        }
        collective_version(&mut engines, v, &bufs, level, 1 << 17);
        history.push(bufs.clone());
    }
    drop(engines);
    let report = dckpt::prune::prune_store(dir.path(), 1, false).unwrap();
    let refs = dckpt::inspect::store_stats(dir.path()).unwrap();
    assert!(refs.total_cross_rank_references > 0, "the ranks reference each other");
    for r in 0..ranks as u32 {
        let listed: Vec<u64> =
            dckpt::store::Store::open(dir.path(), r).unwrap().manifest().versions.iter().map(|e| e.version).collect();
        for &v in &listed {
            let got = dckpt::restore::restore_version(dir.path(), r, v).unwrap();
            assert!(got == history[v as usize - 1][r as usize], "rank {r} version {v} after prune");
        }
        assert!(listed.contains(&6));
    }
    // Rank 0's chain of version 6 is 5..6; what else of rank 0 stays is what
    // the other ranks' kept versions read.
    assert!(report.deleted.iter().all(|&(r, _)| r == 0), "{:?}", report.deleted);
    assert!(!report.deleted.is_empty(), "rank 0's middle versions go");
    assert!(report.kept.contains(&(0, 1)), "rank 0's baseline stays: the other ranks read it");
    let verify = dckpt::verify::verify_store(dir.path()).unwrap();
    assert!(verify.problems.is_empty(), "{:?}", verify.problems);
}

/// `min_region_bytes`: regions below it never enter the reduction (their
/// rank stores them), larger ones still do; every version restores.
#[test]
fn regions_below_the_smallest_offered_stay_with_their_rank() {
    let len = 64 * 1024 + 77;
    let data = vec![noise(len, 5); 3];
    let max_level = max_region_level(64, 4096);
    for (min, expect_refs) in [(0u64, true), (2048, true), (8192, false)] {
        let dir = tempfile::tempdir().unwrap();
        let mut engines = open_all(dir.path(), 3, &[len; 3], &opts(Method::Tree, 64, HashAlgo::Murmur3));
        let layouts: Vec<Layout> = engines.iter().map(|e| e.store().layout().unwrap()).collect();
        let offers: Vec<step::Offer> = engines
            .iter_mut()
            .zip(&data)
            .map(|(e, d)| {
                let o = step::offer(e, 1, Protected::Host(d), max_level, 1 << 17).unwrap();
                let all = o.regions.len();
                let o = o.without_regions_below(min, 1 << 17);
                assert!(o.regions.iter().all(|r| r.bytes >= min), "min {min}: a smaller region offered");
                assert_eq!(o.set.len(), o.regions.len(), "min {min}: the set follows the regions");
                assert!(min > 0 || o.regions.len() == all);
                o
            })
            .collect();
        let merged = reduce_all(&offers.iter().map(|o| o.set.clone()).collect::<Vec<_>>(), 1 << 17);
        let mut staged = Vec::new();
        for ((e, o), d) in engines.iter_mut().zip(offers).zip(&data) {
            staged.push(step::settle(e, o, &merged, &layouts, d).unwrap());
        }
        let mut referenced = 0;
        for (e, (s, conv)) in engines.iter_mut().zip(staged) {
            assert!(conv.iter().all(|c| c.region.bytes >= min), "min {min}: a small region was given away");
            referenced += conv.iter().map(|c| c.region.bytes).sum::<u64>();
            e.publish(s).unwrap();
        }
        assert_eq!(referenced > 0, expect_refs, "min {min}: {referenced} bytes referenced");
        for r in 0..3 {
            assert!(dckpt::restore::restore_version(dir.path(), r, 1).unwrap() == data[0], "min {min}: rank {r}");
        }
    }
}
