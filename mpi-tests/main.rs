//! Collective checkpoints under MPI, with any number of ranks:
//! `mpirun -np P <this test binary>` (scripts/test.sh runs P = 1, 2, 3, 4;
//! `cargo test` runs it as a single rank). Every rank checks its own
//! claims; a failure on any rank aborts the job with a message naming the
//! scenario and the rank.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

#[path = "../tests/common/mod.rs"]
mod common;
mod runtime;

use common::noise;
use dckpt::backend::BackendKind;
use dckpt::collective::{Collective, CollectiveOptions, CollectiveReport, Overlap};
use dckpt::format::diff_file::DiffReader;
use dckpt::{Engine, HashAlgo, Method, StoreOptions};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::path::{Path, PathBuf};

/// Bytes per rank: 2 MiB and a short last chunk, up to 4 ranks; beyond, a
/// buffer growing with P² so that a replicated buffer still yields enough
/// regions per rank for balance while each of its P − 1 references stays
/// small next to the region (see `collective::auto_region_bytes`).
static LEN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn len() -> usize {
    *LEN.get().expect("set in main")
}
const VERSIONS: u64 = 3;

/// Local and shared tiers under `root` with a 64 MiB host cache, keeping
/// `keep` versions on each (local, shared).
fn two_tiers(root: &Path, keep: (Option<u64>, Option<u64>)) -> dckpt::tiers::TierOptions {
    dckpt::tiers::TierOptions {
        local: Some(root.join("local")),
        shared: Some(root.join("shared")),
        host_cache_bytes: 64 << 20,
        keep_local: keep.0,
        keep_shared: keep.1,
        ..dckpt::tiers::TierOptions::default()
    }
}

/// The backend the tests ask for (`DCKPT_MPI_TEST_BACKEND`, default auto).
fn test_backend() -> BackendKind {
    std::env::var("DCKPT_MPI_TEST_BACKEND").ok().and_then(|b| b.parse().ok()).unwrap_or_default()
}

/// The backend the collective store used (reported by rank 0).
static BACKEND: std::sync::OnceLock<BackendKind> = std::sync::OnceLock::new();

fn store_opts() -> StoreOptions {
    StoreOptions { chunk_size: 128, method: Method::Tree, hash: HashAlgo::Murmur3, ..StoreOptions::default() }
}

/// A buffer seeded by `seed` at `version`: random bytes, then per version a
/// few rewritten 300-byte pieces and one 64 KiB block copied elsewhere (a
/// shifted duplicate). Any rank can recompute any rank's buffer.
fn evolve(seed: u64, version: u64) -> Vec<u8> {
    let mut data = noise(len(), seed);
    for v in 2..=version {
        let edits = noise(64, seed ^ (v << 40));
        for k in 0..8 {
            let at = (u32::from_le_bytes(edits[4 * k..4 * k + 4].try_into().unwrap()) as usize) % (len() - 300);
            data[at..at + 300].copy_from_slice(&noise(300, (seed << 24) + v * 1000 + k as u64));
        }
        // Page-aligned, so the moved chunks keep their digests.
        let from = ((v as usize * 333_333) % (len() - 65536)) & !4095;
        let to = ((v as usize * 777_777) % (len() - 65536)) & !4095;
        data.copy_within(from..from + 65536, to);
    }
    data
}

/// What each rank holds in each scenario.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scenario {
    /// The same bytes everywhere.
    Identical,
    /// Nothing shared.
    Disjoint,
    /// The first half shared, the second half private.
    Partial,
}

fn buffer(s: Scenario, rank: i32, version: u64) -> Vec<u8> {
    match s {
        Scenario::Identical => evolve(7, version),
        Scenario::Disjoint => evolve(100 + rank as u64, version),
        Scenario::Partial => {
            let mut d = evolve(7, version);
            let private = evolve(100 + rank as u64, version);
            d[len() / 2..].copy_from_slice(&private[len() / 2..]);
            d
        }
    }
}

struct World<'a> {
    comm: &'a SimpleCommunicator,
    rank: i32,
    size: i32,
}

impl World<'_> {
    fn check(&self, ok: bool, what: &str) {
        if !ok {
            eprintln!("mpi-tests: rank {} of {}: FAILED: {what}", self.rank, self.size);
            self.comm.abort(1);
        }
    }
    fn sum(&self, x: u64) -> u64 {
        let mut s = 0;
        self.comm.all_reduce_into(&x, &mut s, SystemOperation::sum());
        s
    }
    fn max(&self, x: u64) -> u64 {
        let mut s = 0;
        self.comm.all_reduce_into(&x, &mut s, SystemOperation::max());
        s
    }
}

/// Runs a scenario: collective and local-only stores side by side, every
/// version restored by every rank for every rank. Returns the reports.
fn run(w: &World, root: &Path, s: Scenario, threshold: usize) -> Vec<CollectiveReport> {
    let backend = test_backend();
    let opts = CollectiveOptions { threshold, backend, ..CollectiveOptions::default() };
    let dir = root.join("collective");
    let mut c = Collective::open(w.comm, &dir, len() as u64, &store_opts(), &opts).expect("open");
    BACKEND.get_or_init(|| c.engine().backend());
    let mut local = Engine::open_or_create(&root.join("local"), w.rank as u32, len() as u64, &store_opts()).unwrap();
    let mut reports = Vec::new();
    let (mut stored, mut local_stored) = (0u64, 0u64);
    for v in 1..=VERSIONS {
        let data = buffer(s, w.rank, v);
        let r = c.checkpoint(v, &data).expect("collective checkpoint");
        stored += r.checkpoint.file_bytes;
        local_stored += local.checkpoint(v, &data).unwrap().file_bytes;
        reports.push(r);
    }
    w.comm.barrier();
    // Every rank restores every rank's every version.
    for r in 0..w.size {
        for v in 1..=VERSIONS {
            let got = dckpt::restore::restore_version(&dir, r as u32, v);
            w.check(
                got.as_ref().is_ok_and(|g| *g == buffer(s, r, v)),
                &format!("{s:?}: restore of rank {r} version {v}: {:?}", got.err()),
            );
        }
    }
    let total = w.sum(stored);
    let max = w.max(stored);
    let total_local = w.sum(local_stored);
    let mean = total as f64 / f64::from(w.size);
    if w.rank == 0 {
        println!(
            "  {s:?} K={threshold} ({:?}): stored {total} bytes over {} ranks (local-only {total_local}), max/mean {:.3}",
            c.engine().backend(),
            w.size,
            max as f64 / mean
        );
    }
    w.check(total <= total_local, &format!("{s:?}: collective stored more than local-only"));
    if w.rank == 0 {
        let report = dckpt::verify::verify_store(&dir).unwrap();
        w.check(report.problems.is_empty(), &format!("{s:?}: verify: {:?}", report.problems));
    }
    w.comm.barrier();
    reports
}

fn identical(w: &World, root: &Path) {
    let reports = run(w, root, Scenario::Identical, dckpt::collective::DEFAULT_THRESHOLD);
    let stored: u64 = reports.iter().map(|r| r.checkpoint.file_bytes).sum();
    let (total, max) = (w.sum(stored), w.max(stored));
    let one_copy: u64 = {
        // What a single rank stores for the same sequence, local-only.
        let inspect = dckpt::inspect::store_stats(&root.join("local")).unwrap();
        inspect.ranks.iter().find(|r| r.rank == 0).map_or(0, |r| r.stored_bytes)
    };
    w.check(
        (total as f64) <= 1.05 * one_copy as f64,
        &format!("identical data: {total} bytes stored in total, one copy is {one_copy}"),
    );
    let mean = total as f64 / f64::from(w.size);
    w.check(max as f64 <= 1.05 * mean, &format!("identical data: max {max} / mean {mean:.0} > 1.05"));
    let referenced: usize = reports.iter().map(|r| r.regions_referenced).sum();
    w.check((w.size == 1) == (referenced == 0), "identical data: references iff more than one rank");
}

fn disjoint(w: &World, root: &Path) {
    let reports = run(w, root, Scenario::Disjoint, dckpt::collective::DEFAULT_THRESHOLD);
    w.check(reports.iter().all(|r| r.regions_referenced == 0), "disjoint data produced references");
}

fn partial(w: &World, root: &Path) {
    let reports = run(w, root, Scenario::Partial, dckpt::collective::DEFAULT_THRESHOLD);
    let referenced = w.sum(reports.iter().map(|r| r.bytes_referenced).sum());
    // The shared half, less one copy, is referenced in the first version.
    let expect = (w.size as u64 - 1) * (len() as u64 / 2);
    w.check(
        referenced as f64 >= 0.9 * expect as f64,
        &format!("partial sharing: {referenced} bytes referenced, expected about {expect}"),
    );
}

fn small_threshold(w: &World, root: &Path) {
    let k = 8;
    let reports = run(w, root, Scenario::Identical, k);
    for r in &reports {
        w.check(r.merged_entries <= k && r.regions_referenced <= k, "K = 8: more entries than K");
    }
    let referenced: usize = reports.iter().map(|r| r.regions_referenced).sum();
    w.check((w.size == 1) == (w.sum(referenced as u64) == 0), "K = 8: the top entries must still be shared");
}

/// `min_region_bytes` above every region: nothing reaches the reduction,
/// nothing is referenced across ranks (identical ranks!), and every rank's
/// every version restores.
fn min_region(w: &World, root: &Path) {
    let opts = CollectiveOptions { backend: test_backend(), min_region_bytes: 1 << 40, ..CollectiveOptions::default() };
    let dir = root.join("collective");
    let mut c = Collective::open(w.comm, &dir, len() as u64, &store_opts(), &opts).expect("open");
    for v in 1..=3 {
        let r = c.checkpoint(v, &buffer(Scenario::Identical, w.rank, v)).expect("checkpoint");
        w.check(
            r.regions_offered == 0 && r.regions_referenced == 0,
            &format!("min_region_bytes: version {v} offered {} regions", r.regions_offered),
        );
    }
    w.comm.barrier();
    for r in 0..w.size {
        for v in 1..=3 {
            let got = dckpt::restore::restore_version(&dir, r as u32, v);
            w.check(
                got.is_ok_and(|g| g == buffer(Scenario::Identical, r, v)),
                &format!("min_region_bytes: restore of rank {r} version {v}"),
            );
        }
    }
}

/// Later versions point at bytes other ranks stored in earlier versions.
fn temporal(w: &World, root: &Path) {
    let dir = root.join("collective");
    if w.size == 1 {
        return;
    }
    let mut temporal = 0u64;
    for v in 2..=VERSIONS {
        let path = dir.join(format!("rank-{:05}/v{v:012}.dckpt", w.rank));
        let reader = DiffReader::open(&path).unwrap();
        temporal += reader
            .diff
            .shift
            .iter()
            .filter(|s| s.src_rank != w.rank as u32 && s.src_version < v && s.reference.is_none())
            .count() as u64;
    }
    w.check(w.sum(temporal) > 0, "no version references an earlier version of another rank");
}

/// A reference to a missing owner file names the rank, the version and the file.
fn missing_owner(w: &World, root: &Path) {
    if w.size == 1 || w.rank != 0 {
        return;
    }
    let dir = root.join("collective");
    let reader = DiffReader::open(&dir.join("rank-00000/v000000000001.dckpt")).unwrap();
    let Some(owner) = reader.diff.shift.iter().find(|s| s.reference.is_some()).map(|s| s.src_rank) else {
        w.check(false, "rank 0 references nothing in version 1");
        return;
    };
    let broken = root.join("broken");
    copy_dir(&dir, &broken);
    let file = broken.join(format!("rank-{owner:05}/v000000000001.dckpt"));
    std::fs::remove_file(&file).unwrap();
    let err = dckpt::restore::restore_version(&broken, 0, 1).expect_err("restore must fail").to_string();
    let named = err.contains(&format!("rank {owner}"))
        && err.contains("version 1")
        && err.contains(&file.display().to_string());
    w.check(named, &format!("error does not name rank, version and file: {err}"));
    let report = dckpt::verify::verify_store(&broken).unwrap();
    w.check(report.problems.iter().any(|p| p.message.contains(&format!("rank {owner}"))), "verify misses it");
    println!("  missing owner file: {err}");
}

/// Ranks that disagree on a parameter all get the same clear error, and
/// nothing is written.
fn disagreement(w: &World, root: &Path) {
    if w.size == 1 {
        return;
    }
    let mut store = store_opts();
    let mut opts = CollectiveOptions::default();
    if w.rank == w.size - 1 {
        store.chunk_size = 64;
    }
    let err = Collective::open(w.comm, root, len() as u64, &store, &opts).err().map(|e| e.to_string());
    w.check(err.as_deref().is_some_and(|e| e.contains("disagree")), &format!("chunk size mismatch: {err:?}"));
    store.chunk_size = 128;
    if w.rank == 0 {
        opts.threshold = 1000;
    }
    let err = Collective::open(w.comm, root, len() as u64, &store, &opts).err().map(|e| e.to_string());
    w.check(err.as_deref().is_some_and(|e| e.contains("disagree")), &format!("threshold mismatch: {err:?}"));
    let listed = dckpt::store::Store::open(root, w.rank as u32).map(|s| s.manifest().versions.len()).unwrap_or(0);
    w.check(listed == 0, "a version was listed after failed opens");
}

/// The collective step through the asynchronous tiers: rank 0's flush lags
/// (its parts come last), so no version is committed before every rank's
/// files are durable; the tiers hold the same files as the synchronous
/// collective path; every version of every rank restores from every tier,
/// also after reopening.
fn tiered(w: &World, root: &Path) {
    // The collective step on the background thread (where MPI grants
    // MPI_THREAD_MULTIPLE, as here), then in the call.
    tiered_with(w, &root.join("overlap"), true);
    tiered_with(w, &root.join("in-call"), false);
    // auto: the thread, unless some rank of the CPU backend can count on
    // fewer than two CPUs (then every rank keeps the step in the call).
    use dckpt::collective::TieredCollective;
    let opts = CollectiveOptions { backend: test_backend(), ..CollectiveOptions::default() };
    let c = TieredCollective::open(
        w.comm,
        &two_tiers(&root.join("auto"), (None, None)),
        len() as u64,
        &store_opts(),
        &opts,
    )
    .expect("open auto");
    let cpus = dckpt::collective::mpi::cpu_share(w.comm);
    let one_cpu = w.max(u64::from(!opts.overlap.wanted(test_backend().resolve(), cpus))) == 1;
    w.check(
        c.overlapped() == (!one_cpu && w.size > 1),
        &format!("auto with {cpus:?} CPUs: overlapped {}", c.overlapped()),
    );
    if w.rank == 0 {
        eprintln!("mpi-tests: overlap auto, {cpus:?} CPUs on rank 0: overlapped {}", c.overlapped());
    }
}

fn tiered_with(w: &World, root: &Path, overlap: bool) {
    use dckpt::collective::TieredCollective;
    let backend = test_backend();
    let opts = CollectiveOptions { backend, overlap: overlap.into(), ..CollectiveOptions::default() };
    let tiers = two_tiers(root, (None, None));
    let s = Scenario::Partial;
    let mut sync = Collective::open(w.comm, &root.join("sync"), len() as u64, &store_opts(), &opts).expect("open sync");
    let mut c = TieredCollective::open(w.comm, &tiers, len() as u64, &store_opts(), &opts).expect("open tiered");
    w.check(c.overlapped() == (overlap && w.size > 1), &format!("overlap {overlap}: overlapped {}", c.overlapped()));
    let lagging = w.size > 1 && w.rank == 0;
    if lagging {
        dckpt::failpoint::delay("store.file_durable", std::time::Duration::from_millis(1000));
    }
    for v in 1..=VERSIONS {
        let data = buffer(s, w.rank, v);
        let r = c.checkpoint(v, &data).expect("tiered collective checkpoint");
        w.check(r.checkpoint.version == v && r.checkpoint.baseline == (v == 1), "tiered report");
        w.check(r.settled != c.overlapped(), "a report in the background is not settled");
        if v == 1 {
            // Version 1 settles (collective; at once when the step ran in the call).
            c.settle();
        }
        if v == 1 && w.size > 1 && w.rank != 0 {
            // This rank's own files become durable while rank 0 still sleeps
            // before its first part: the version is not committed anywhere.
            let own = loop {
                let st = c.engine().states(1).unwrap_or_default();
                if st.iter().all(dckpt::tiers::state::TierState::settled) {
                    break st;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            };
            w.check(
                own.iter().all(|t| *t == dckpt::tiers::state::TierState::Durable),
                &format!("own flush of version 1: {own:?}"),
            );
            for tier in ["local", "shared"] {
                w.check(!c.is_durable(1, tier), &format!("version 1 committed on {tier} before rank 0 flushed"));
            }
        }
    }
    if lagging {
        dckpt::failpoint::delay("store.file_durable", std::time::Duration::ZERO);
    }
    for v in 1..=VERSIONS {
        sync.checkpoint(v, &buffer(s, w.rank, v)).expect("sync collective checkpoint");
    }
    for v in 1..=VERSIONS {
        c.wait(v).expect("wait");
        for tier in ["local", "shared"] {
            w.check(c.is_durable(v, tier), &format!("version {v} not durable on {tier} after wait"));
        }
    }
    // Every version's settled report, once, in order.
    let settled = c.take_settled();
    w.check(
        settled.iter().map(|r| r.checkpoint.version).eq(1..=VERSIONS) && settled.iter().all(|r| r.settled),
        "settled reports",
    );
    let reported: Vec<u64> = settled.iter().map(|r| r.checkpoint.file_bytes).collect();
    w.comm.barrier();
    for v in 1..=VERSIONS {
        let name = format!("rank-{:05}/v{v:012}.dckpt", w.rank);
        let want = std::fs::read(root.join("sync").join(&name)).unwrap();
        for tier in ["local", "shared"] {
            let got = std::fs::read(root.join(tier).join(&name)).unwrap();
            w.check(got == want, &format!("version {v} on {tier} differs from the synchronous path's file"));
        }
        w.check(
            reported.get(v as usize - 1) == Some(&(want.len() as u64)),
            &format!("version {v}: reported file size"),
        );
        let mut back = vec![0u8; len()];
        c.restore_into(v, dckpt::memory::ProtectedMut::Host(&mut back)).expect("restore_into");
        w.check(back == buffer(s, w.rank, v), &format!("restore_into of version {v}"));
        for r in 0..w.size {
            for tier in ["local", "shared"] {
                let got = dckpt::restore::restore_version(&root.join(tier), r as u32, v);
                w.check(
                    got.as_ref().is_ok_and(|g| *g == buffer(s, r, v)),
                    &format!("tiered: restore of rank {r} version {v} from {tier}: {:?}", got.err()),
                );
            }
        }
    }
    c.finalize().expect("finalize");
    // Reopened: the history continues from the parts.
    let mut c = TieredCollective::open(w.comm, &tiers, len() as u64, &store_opts(), &opts).expect("reopen tiered");
    w.check(c.engine().latest() == Some(VERSIONS), "reopen: latest version");
    let v = VERSIONS + 1;
    let r = c.checkpoint(v, &buffer(s, w.rank, v)).expect("checkpoint after reopen");
    w.check(!r.checkpoint.baseline, "the reopened history continues (no baseline)");
    c.wait(v).expect("wait after reopen");
    w.comm.barrier();
    for r in 0..w.size {
        let got = dckpt::restore::restore_version(&root.join("shared"), r as u32, v);
        w.check(got.is_ok_and(|g| g == buffer(s, r, v)), &format!("tiered: restore of rank {r} after reopen"));
    }
    c.finalize().expect("finalize");
    if w.rank == 0 {
        for tier in ["local", "shared"] {
            let report = dckpt::verify::verify_store(&root.join(tier)).unwrap();
            w.check(report.problems.is_empty(), &format!("tiered: verify {tier}: {:?}", report.problems));
        }
    }
    w.comm.barrier();
}

/// The collective step through the GPU cache tier (CUDA backend only): a
/// host cache of about one file and slow flushes, so later versions wait
/// in the device arena when the call returns, with regions given away
/// (the rewrite applied by the flush worker). Every file equals the CPU
/// backend's, every version restores byte-exactly, also right after it
/// was taken.
fn collective_gpu_cache(w: &World, root: &Path) {
    use dckpt::backend::budget::{GpuCache, GpuMemory};
    use dckpt::collective::TieredCollective;
    use std::time::Duration;
    if test_backend() != BackendKind::Cuda {
        return;
    }
    let s = Scenario::Partial;
    let store = StoreOptions { gpu_memory: GpuMemory::Bytes(256 << 20), max_chain: Some(4), ..store_opts() };
    let tiers = |name: &str| dckpt::tiers::TierOptions {
        host_cache_bytes: 4 << 20,
        gpu_cache: GpuCache::Bytes(64 << 20),
        ..two_tiers(&root.join(name), (None, None))
    };
    let open = |name: &str, backend| {
        let opts = CollectiveOptions { backend, ..CollectiveOptions::default() };
        TieredCollective::open(w.comm, &tiers(name), len() as u64, &store, &opts).expect("open")
    };
    let (mut g, mut c) = (open("gpu", BackendKind::Cuda), open("cpu", BackendKind::Cpu));
    let versions = 8u64;
    dckpt::failpoint::delay("store.temp_written", Duration::from_millis(60));
    let mut held = 0u64;
    for v in 1..=versions {
        let data = buffer(s, w.rank, v);
        held += u64::from(g.checkpoint(v, &data).expect("GPU collective checkpoint").checkpoint.held_on_gpu);
        c.checkpoint(v, &data).expect("CPU collective checkpoint");
        if v % 3 == 0 {
            g.settle_for_restore(v);
            let mut back = vec![0u8; len()];
            let restored = g.restore_into(v, dckpt::memory::ProtectedMut::Host(&mut back));
            w.check(restored.is_ok() && back == data, &format!("GPU cache: version {v} right after it: {restored:?}"));
        }
    }
    dckpt::failpoint::delay("store.temp_written", Duration::ZERO);
    g.finalize().expect("finalize GPU");
    c.finalize().expect("finalize CPU");
    let held = w.sum(held);
    if w.rank == 0 {
        println!(
            "  GPU cache tier, collective: {held} of {} calls returned with the diff on the GPU",
            versions * w.size as u64
        );
    }
    w.check(held >= 1, "no collective version waited in the GPU cache");
    for v in 1..=versions {
        let name = format!("rank-{:05}/v{v:012}.dckpt", w.rank);
        for tier in ["local", "shared"] {
            let file = |b: &str| std::fs::read(root.join(b).join(tier).join(&name)).unwrap_or_default();
            w.check(file("gpu") == file("cpu"), &format!("GPU cache: {tier} version {v} differs from the CPU's"));
        }
    }
    w.comm.barrier();
    for r in 0..w.size {
        for v in 1..=versions {
            let got = dckpt::restore::restore_version(&root.join("gpu").join("shared"), r as u32, v);
            w.check(
                got.as_ref().is_ok_and(|g| *g == buffer(s, r, v)),
                &format!("GPU cache: restore of rank {r} version {v}: {:?}", got.err()),
            );
        }
    }
}

/// Local-only (`local_only`, the config's `collective = false`) through the
/// tiers, Tree and Full: no reduction, so no rank references another's
/// bytes; identical data is stored once per rank (Tree: what rank 0 alone
/// stores); every version restores byte-exactly. A job whose ranks
/// disagree on the setting is refused at open on every rank.
fn local_only(w: &World, root: &Path) {
    use dckpt::collective::TieredCollective;
    let opts = CollectiveOptions { backend: test_backend(), local_only: true, ..CollectiveOptions::default() };
    let mut per_method = Vec::new();
    for method in [Method::Tree, Method::Full] {
        let dir = root.join(method.to_string());
        let tiers = two_tiers(&dir, (None, None));
        let store = StoreOptions { method, ..store_opts() };
        let mut c = TieredCollective::open(w.comm, &tiers, len() as u64, &store, &opts).expect("open local-only");
        let mut stored = 0u64;
        for v in 1..=VERSIONS {
            let data = buffer(Scenario::Identical, w.rank, v);
            let r = c.checkpoint(v, &data).expect("local-only checkpoint");
            w.check(r.regions_referenced == 0 && r.bytes_referenced == 0, "local-only: a region crossed ranks");
            stored += r.checkpoint.file_bytes;
        }
        c.wait(VERSIONS).expect("wait");
        for v in 1..=VERSIONS {
            let mut got = vec![0u8; len()];
            let restored = c.restore_into(v, dckpt::memory::ProtectedMut::Host(&mut got));
            w.check(
                restored.is_ok() && got == buffer(Scenario::Identical, w.rank, v),
                &format!("local-only {method}: restore of version {v}: {:?}", restored.err()),
            );
        }
        // Every rank stored the same bytes: each its own copy.
        w.check(w.max(stored) == stored && w.sum(stored) == stored * w.size as u64, "local-only: unequal ranks");
        if method == Method::Full {
            w.check(stored >= VERSIONS * len() as u64, &format!("local-only full stored {stored} bytes"));
        }
        per_method.push(stored);
        c.finalize().expect("finalize");
    }
    w.check(per_method[0] < per_method[1], &format!("local-only: tree stored no less than full: {per_method:?}"));
    // A rank that asks for the reduction among ranks that do not: refused everywhere.
    if w.size > 1 {
        let mixed = CollectiveOptions { local_only: w.rank != 0, ..opts.clone() };
        let tiers = two_tiers(&root.join("mixed"), (None, None));
        let opened = TieredCollective::open(w.comm, &tiers, len() as u64, &store_opts(), &mixed);
        w.check(
            opened.as_ref().err().is_some_and(|e| e.to_string().contains("local-only")),
            &format!("mixed local-only settings: {:?}", opened.err()),
        );
    }
}

/// Retention on collective tiers: the shared tier keeps the newest 2
/// versions (chains of 2, so up to 3 versions stay), the local tier 1;
/// every rank deletes only its own older files and parts, every version
/// still committed restores on every rank, the deleted ones are gone, and
/// `verify` passes.
fn retention(w: &World, root: &Path) {
    use dckpt::collective::TieredCollective;
    use dckpt::store::commits::CommitLog;
    let backend = test_backend();
    // The step on its thread (where `auto` would keep it in the call: CI's
    // ranks have one CPU each), so retention meets versions settled late.
    let opts = CollectiveOptions { backend, overlap: Overlap::On, ..CollectiveOptions::default() };
    let tiers = two_tiers(root, (Some(1), Some(2)));
    let store = StoreOptions { max_chain: Some(2), ..store_opts() };
    let s = Scenario::Partial;
    let versions = 7;
    let mut c = TieredCollective::open(w.comm, &tiers, len() as u64, &store, &opts).expect("open");
    for v in 1..=versions {
        c.checkpoint(v, &buffer(s, w.rank, v)).expect("checkpoint");
        c.wait(v).expect("wait");
    }
    c.finalize().expect("finalize");
    w.comm.barrier();
    for (tier, keep) in [("local", 1usize), ("shared", 2)] {
        let at = root.join(tier);
        let log = CommitLog::load(&at).unwrap();
        let committed: Vec<u64> = log.records().map(|r| r.version).collect();
        // Chains of two (1-2, 3-4, 5-6, 7): keeping the newest `keep` keeps their chains.
        let want: Vec<u64> = if keep == 1 { vec![7] } else { vec![5, 6, 7] };
        w.check(committed == want, &format!("retention on {tier}: committed {committed:?}, want {want:?}"));
        for v in 1..=versions {
            let file = at.join(format!("rank-{:05}/v{v:012}.dckpt", w.rank));
            w.check(file.exists() == want.contains(&v), &format!("retention on {tier}: file of version {v}"));
        }
        for &v in &want {
            for r in 0..w.size {
                let got = dckpt::restore::restore_version(&at, r as u32, v);
                w.check(
                    got.as_ref().is_ok_and(|g| *g == buffer(s, r, v)),
                    &format!("retention: rank {r} version {v} from {tier}: {:?}", got.err()),
                );
            }
        }
        if w.rank == 0 {
            let report = dckpt::verify::verify_store(&at).unwrap();
            w.check(report.problems.is_empty(), &format!("retention: verify {tier}: {:?}", report.problems));
        }
    }
    w.comm.barrier();
    retention_with_dense_versions(w, &root.join("dense"), &opts);
}

/// Retention when each rank's chain restarts at its own version: rank r's
/// buffer changes entirely at version 2 + r (stored dense: a baseline on
/// that rank only), so other ranks' parts of that version still need their
/// predecessors. Keeping one version must keep every chain the newest
/// version's parts need, on every rank.
fn retention_with_dense_versions(w: &World, root: &Path, opts: &CollectiveOptions) {
    use dckpt::collective::TieredCollective;
    use dckpt::store::commits::CommitLog;
    let tiers = two_tiers(root, (Some(1), Some(1)));
    let buf = |r: i32, v: u64| if v >= 2 + r as u64 { evolve(1000 + r as u64, v) } else { evolve(r as u64, v) };
    let versions = 6;
    let mut c = TieredCollective::open(w.comm, &tiers, len() as u64, &store_opts(), opts).expect("open");
    for v in 1..=versions {
        let r = c.checkpoint(v, &buf(w.rank, v)).expect("checkpoint");
        let dense = v == 2 + w.rank as u64;
        w.check(r.checkpoint.baseline == (v == 1 || dense), &format!("dense retention: version {v} baseline"));
    }
    c.finalize().expect("finalize");
    w.comm.barrier();
    for tier in ["local", "shared"] {
        let at = root.join(tier);
        let committed: Vec<u64> = CommitLog::load(&at).unwrap().records().map(|r| r.version).collect();
        w.check(committed.last() == Some(&versions), &format!("dense retention on {tier}: committed {committed:?}"));
        // One rank: its chain restarts at 2, so version 1 goes; more ranks:
        // some rank's chain still starts at 1, so every version stays.
        let want: Vec<u64> = if w.size == 1 { (2..=versions).collect() } else { (1..=versions).collect() };
        w.check(committed == want, &format!("dense retention on {tier}: committed {committed:?}, want {want:?}"));
        for &v in &committed {
            for r in 0..w.size {
                let got = dckpt::restore::restore_version(&at, r as u32, v);
                w.check(
                    got.as_ref().is_ok_and(|g| *g == buf(r, v)),
                    &format!("dense retention: rank {r} version {v} from {tier}: {:?}", got.err()),
                );
            }
        }
    }
    w.comm.barrier();
}

/// The collective step on its background thread fails on one rank after
/// every call returned: that version is abandoned on every rank (`wait`
/// says why), the next version continues the chain before it, and every
/// other version restores byte-exactly on every rank.
fn background_failure(w: &World, root: &Path) {
    use dckpt::collective::TieredCollective;
    // On: `auto` keeps the step in the call for a CPU rank with one CPU.
    let opts = CollectiveOptions { backend: test_backend(), overlap: Overlap::On, ..CollectiveOptions::default() };
    let mut c = TieredCollective::open(w.comm, &two_tiers(root, (None, None)), len() as u64, &store_opts(), &opts)
        .expect("open");
    if !c.overlapped() {
        return; // one rank, or no MPI_THREAD_MULTIPLE: no background step
    }
    let s = Scenario::Partial;
    for v in 1..=4u64 {
        if v == 2 {
            // Version 1's step is over everywhere: the failure hits version 2's.
            c.settle();
            if w.rank == w.size - 1 {
                dckpt::failpoint::fail_next("collective.reduced");
            }
        }
        c.checkpoint(v, &buffer(s, w.rank, v)).expect("every call returns");
    }
    let waited = c.wait(2);
    w.check(
        waited
            .as_ref()
            .is_err_and(|e| e.kind() == dckpt::ErrorKind::NotDurable && e.to_string().contains("collective step")),
        &format!("the abandoned version: wait says {waited:?}"),
    );
    for v in [1, 3, 4] {
        c.wait(v).expect("the other versions are durable");
    }
    let settled: Vec<u64> = c.take_settled().iter().map(|r| r.checkpoint.version).collect();
    w.check(settled == [1, 3, 4], &format!("settled reports {settled:?}"));
    // Finalizing reports the abandoned version, and nothing else.
    if let Err(e) = c.finalize() {
        w.check(e.to_string().contains("collective step"), &format!("finalize: {e}"));
    }
    w.comm.barrier();
    for r in 0..w.size {
        for v in [1, 3, 4] {
            let got = dckpt::restore::restore_version(&root.join("shared"), r as u32, v);
            w.check(got.is_ok_and(|g| g == buffer(s, r, v)), &format!("rank {r} version {v} after the failure"));
        }
        let gone = dckpt::restore::restore_version(&root.join("shared"), r as u32, 2);
        w.check(gone.is_err(), &format!("rank {r}: the abandoned version 2 restores"));
    }
}

/// Faults on collective tiers: a second writer on the same tiers is refused
/// on every rank while the first goes on; a shared tier too small for any
/// version (a tmpfs, where mounting is allowed) fails every version there,
/// `wait` names the tier, yet every checkpoint call returns, every version
/// is committed and restores from the local tier, and the next
/// checkpoint always proceeds. On the CUDA backend both run through a GPU
/// cache tier.
fn tier_faults(w: &World, root: &Path) {
    use dckpt::backend::budget::{GpuCache, GpuMemory};
    use dckpt::collective::TieredCollective;
    use dckpt::tiers::TierOptions;
    // On the CUDA backend, through a GPU cache tier and a small host cache
    // (diffs wait on the GPU while the host cache is full).
    let cuda = test_backend() == BackendKind::Cuda;
    // The step on its thread, also where `auto` would keep it in the call.
    let opts = CollectiveOptions { backend: test_backend(), overlap: Overlap::On, ..CollectiveOptions::default() };
    let store = match cuda {
        true => StoreOptions { gpu_memory: GpuMemory::Bytes(256 << 20), ..store_opts() },
        false => store_opts(),
    };
    let with_cache = |t: TierOptions| match cuda {
        true => TierOptions { host_cache_bytes: 4 << 20, gpu_cache: GpuCache::Bytes(64 << 20), ..t },
        false => t,
    };
    let tiers = with_cache(two_tiers(root, (None, None)));
    let s = Scenario::Partial;
    let mut c = TieredCollective::open(w.comm, &tiers, len() as u64, &store, &opts).expect("open");
    c.checkpoint(1, &buffer(s, w.rank, 1)).expect("checkpoint");
    let second = TieredCollective::open(w.comm, &tiers, len() as u64, &store, &opts);
    w.check(
        second.as_ref().err().is_some_and(|e| e.kind() == dckpt::ErrorKind::Locked || e.to_string().contains("in use")),
        &format!("a second writer on the same tiers: {:?}", second.as_ref().err().map(ToString::to_string)),
    );
    drop(second);
    c.checkpoint(2, &buffer(s, w.rank, 2)).expect("the first writer goes on");
    c.wait(2).expect("wait");
    c.finalize().expect("finalize");

    // A full shared tier: rank 0 mounts a tmpfs smaller than one baseline.
    let small = root.join("small");
    let mut mounted = [0u8];
    let fs = if w.rank == 0 { common::SmallFs::mount(&small, "256k") } else { None };
    if w.rank == 0 {
        mounted[0] = u8::from(fs.is_some());
    }
    w.comm.process_at_rank(0).broadcast_into(&mut mounted[..]);
    if mounted[0] == 0 {
        if w.rank == 0 {
            println!("mpi-tests: tier-faults: full disk skipped (cannot mount a tmpfs here; needs root)");
        }
        return;
    }
    let tiers = with_cache(TierOptions { local: Some(root.join("local2")), shared: Some(small.clone()), ..tiers });
    let mut c = TieredCollective::open(w.comm, &tiers, len() as u64, &store, &opts).expect("open on a full disk");
    for v in 1..=3 {
        c.checkpoint(v, &buffer(s, w.rank, v)).expect("a checkpoint returns although the shared tier is full");
        let waited = c.wait(v);
        w.check(
            waited.as_ref().err().is_some_and(|e| e.to_string().contains("shared")),
            &format!("full shared tier: wait({v}) = {:?}", waited.as_ref().err().map(ToString::to_string)),
        );
        w.check(
            c.is_durable(v, "local") && !c.is_durable(v, "shared"),
            &format!("full disk: version {v} on local only"),
        );
        let mut back = vec![0u8; len()];
        c.restore_into(v, dckpt::memory::ProtectedMut::Host(&mut back)).expect("restore from local");
        w.check(back == buffer(s, w.rank, v), &format!("full disk: restore of version {v}"));
    }
    let end = c.finalize();
    w.check(end.is_err(), "finalize reports the shared tier's failures");
    w.comm.barrier();
    for v in 1..=3 {
        for r in 0..w.size {
            let got = dckpt::restore::restore_version(&root.join("local2"), r as u32, v);
            w.check(got.is_ok_and(|g| g == buffer(s, r, v)), &format!("full disk: rank {r} version {v} from local"));
        }
    }
    w.comm.barrier();
    drop(fs);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A directory every rank sees (rank 0 names it).
fn shared_dir(w: &World) -> PathBuf {
    let mut name = [0u8; 256];
    if w.rank == 0 {
        let base = std::env::var_os("DCKPT_MPI_TEST_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let p = base.join(format!("dckpt-mpi-{}-{stamp}", std::process::id()));
        let s = p.to_string_lossy();
        name[..s.len()].copy_from_slice(s.as_bytes());
    }
    w.comm.process_at_rank(0).broadcast_into(&mut name[..]);
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    PathBuf::from(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// A scenario: the world and its directory.
type Test = fn(&World, &Path);

/// The reduction tree computes what the reference reduction does (the same
/// set on every rank, pairing the ranks as `reduce_all`), with a reducer
/// reused across thresholds and set sizes, and a malformed set on one rank
/// fails the reduction on every rank.
fn reduction(w: &World, _: &Path) {
    use dckpt::collective::HashFreq;
    use dckpt::collective::merge::{local_set, reduce_all};
    use dckpt::collective::mpi::{Reduction, reduce_sets};
    use dckpt::hash::Digest;
    use dckpt::layout::NodeId;
    let digest = |x: u64| Digest(u128::from(x).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834));
    // Rank r holds the shared digests 0..40 (sizes vary), every third of
    // 100..160 shared with rank r + 1, and 30 + 7r of its own.
    let set_of = |r: u32, k: usize| -> Vec<HashFreq> {
        let shared = (0..40u64).map(|i| (digest(i), 512 * (1 + i % 5), NodeId::new(2, i)));
        let pairs = (0..60u64)
            .filter(|i| (i + u64::from(r)) % 3 == 0)
            .map(|i| (digest(100 + i + 60 * u64::from(r / 2)), 4096, NodeId::new(3, i)));
        let own = (0..30 + 7 * u64::from(r))
            .map(|i| (digest(1_000_000 * (u64::from(r) + 1) + i), 1024 + i, NodeId::new(1, i)));
        local_set(r, shared.chain(pairs).chain(own), k)
    };
    let sets = |k: usize| (0..w.size as u32).map(|r| set_of(r, k)).collect::<Vec<_>>();
    let mut reduction = Reduction::new(w.comm);
    for k in [1usize << 17, 64, 7, 1 << 17] {
        let expected = reduce_all(&sets(k), k);
        let mine = set_of(w.rank as u32, k);
        let reused = reduction.reduce(&mine, k).map(<[HashFreq]>::to_vec);
        w.check(reused.as_ref().is_ok_and(|m| *m == expected), &format!("reused reducer, K = {k}"));
        let fresh = reduce_sets(w.comm, &mine, k);
        w.check(fresh.is_ok_and(|m| m == expected), &format!("fresh reducer, K = {k}"));
    }
    // An owner beyond the communicator on the last rank, then on rank 0
    // (the root, whose own set no merge received): no rank gets a set, and
    // the next reduction proceeds.
    let k = 1 << 17;
    for culprit in [w.size - 1, 0] {
        let mut bad = set_of(w.rank as u32, k);
        if w.rank == culprit {
            bad[0].owner = w.size as u32 + 3;
        }
        let failed = reduction.reduce(&bad, k).is_err();
        w.check(failed, &format!("a malformed set on rank {culprit} fails the reduction everywhere"));
        let again = reduction.reduce(&set_of(w.rank as u32, k), k).map(<[HashFreq]>::to_vec);
        w.check(again.is_ok_and(|m| m == reduce_all(&sets(k), k)), "a reduction after a failed one");
    }
}

fn main() {
    // MPI_THREAD_MULTIPLE: the collective step may run on a background thread.
    let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Multiple).expect("MPI init");
    let comm = universe.world();
    let w = World { comm: &comm, rank: comm.rank(), size: comm.size() };
    let p = w.size as usize;
    LEN.get_or_init(|| (2 << 20) * (p * p).div_ceil(16).max(1) + 100);
    let root = shared_dir(&w);
    if w.rank == 0 {
        println!("mpi-tests: {} ranks, {} bytes each, in {}", w.size, len(), root.display());
    }
    if w.rank == 0 {
        println!("mpi-tests: backend auto (set DCKPT_MPI_TEST_BACKEND=cpu|cuda to choose)");
    }
    let tests: [(&str, Test); 14] = [
        ("reduction", reduction),
        ("identical", |w, r| {
            identical(w, r);
            temporal(w, r);
            missing_owner(w, r);
        }),
        ("disjoint", disjoint),
        ("partial", partial),
        ("small-threshold", small_threshold),
        ("min-region", min_region),
        ("disagreement", disagreement),
        ("tiered", tiered),
        ("local-only", local_only),
        ("gpu-cache", collective_gpu_cache),
        ("retention", retention),
        ("tier-faults", tier_faults),
        ("background-failure", background_failure),
        ("runtime", runtime::runtime),
    ];
    for (name, test) in tests {
        test(&w, &root.join(name));
        comm.barrier();
        if w.rank == 0 {
            println!("mpi-tests: {name} ok ({} ranks)", w.size);
        }
    }
    if w.rank == 0 {
        let _ = std::fs::remove_dir_all(&root);
    }
}
