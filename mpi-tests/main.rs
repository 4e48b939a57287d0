//! Collective checkpoints under MPI, with any number of ranks:
//! `mpirun -np P <this test binary>` (scripts/test.sh runs P = 1, 2, 3, 4;
//! `cargo test` runs it as a single rank). Every rank checks its own
//! claims; a failure on any rank aborts the job with a message naming the
//! scenario and the rank.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed setup step is a failed test

#[path = "../tests/common/mod.rs"]
mod common;
mod never_wedged;
mod node_loss;
mod runtime;
mod stopping;

mod tiered;

use tiered::*;

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
    let tests: [(&str, Test); 18] = [
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
        ("step-beside-the-call", step_beside_the_call),
        ("runtime", runtime::runtime),
        ("node-loss", node_loss::node_loss),
        ("never-wedged", never_wedged::never_wedged),
        // Last: the signal it raises stays watched for the process.
        ("should-exit", stopping::stopping),
    ];
    // DCKPT_MPI_TEST_ONLY=name runs one scenario (while working on it).
    let only = std::env::var("DCKPT_MPI_TEST_ONLY").ok();
    for (name, test) in tests {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
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
