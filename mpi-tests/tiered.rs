//! The collective step through the asynchronous tiers: overlap, the GPU
//! cache tier, local-only runs, retention, failures in the background and
//! faults on a tier.

use super::*;

/// The collective step through the asynchronous tiers: rank 0's flush lags
/// (its parts come last), so no version is committed before every rank's
/// files are durable; the tiers hold the same files as the synchronous
/// collective path; every version of every rank restores from every tier,
/// also after reopening.
pub(super) fn tiered(w: &World, root: &Path) {
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

pub(super) fn tiered_with(w: &World, root: &Path, overlap: bool) {
    use dckpt::collective::TieredCollective;
    let backend = test_backend();
    // Waiting for every late step: the same bytes as the synchronous path
    // whatever the timing (`step_beside_the_call` keeps a late version's).
    let late_step = dckpt::collective::LateStep::Wait;
    let opts = CollectiveOptions { backend, overlap: overlap.into(), late_step, ..CollectiveOptions::default() };
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
pub(super) fn collective_gpu_cache(w: &World, root: &Path) {
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
pub(super) fn local_only(w: &World, root: &Path) {
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
pub(super) fn retention(w: &World, root: &Path) {
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
pub(super) fn retention_with_dense_versions(w: &World, root: &Path, opts: &CollectiveOptions) {
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
/// every call returned: that rank keeps version 2's regions (its file as
/// cached), nothing is abandoned, and every version is durable and
/// restores byte-exactly on every rank.
pub(super) fn background_failure(w: &World, root: &Path) {
    use dckpt::collective::TieredCollective;
    // On: `auto` keeps the step in the call for a CPU rank with one CPU.
    let opts = CollectiveOptions { backend: test_backend(), overlap: Overlap::On, ..CollectiveOptions::default() };
    let mut c = TieredCollective::open(w.comm, &two_tiers(root, (None, None)), len() as u64, &store_opts(), &opts)
        .expect("open");
    if !c.overlapped() {
        return; // one rank, or no MPI_THREAD_MULTIPLE: no background step
    }
    let s = Scenario::Partial;
    let failing = w.rank == w.size - 1;
    for v in 1..=4u64 {
        if v == 2 {
            // Version 1's step is over: the failure hits version 2's.
            c.settle();
            if failing {
                dckpt::failpoint::fail_next("collective.reduced");
            }
        }
        c.checkpoint(v, &buffer(s, w.rank, v)).expect("every call returns");
    }
    for v in 1..=4 {
        c.wait(v).expect("every version is durable, the failed step's too");
    }
    let settled = c.take_settled();
    let versions: Vec<u64> = settled.iter().map(|r| r.checkpoint.version).collect();
    w.check(versions == [1, 2, 3, 4], &format!("settled reports {versions:?}"));
    if failing {
        let two = settled.iter().find(|r| r.checkpoint.version == 2);
        w.check(two.is_some_and(|r| r.regions_referenced == 0), "the failed step gave regions away");
    }
    c.finalize().expect("finalize");
    w.comm.barrier();
    for r in 0..w.size {
        for v in 1..=4 {
            let got = dckpt::restore::restore_version(&root.join("shared"), r as u32, v);
            w.check(got.is_ok_and(|g| g == buffer(s, r, v)), &format!("rank {r} version {v} after the failure"));
        }
    }
}

/// The collective step runs beside the call: with one rank's step slowed
/// down (each reduction on its thread pauses), the next calls return
/// without waiting for it — that rank settles version 2 as late, keeping
/// its regions — and a version whose call returned becomes durable on
/// every tier with no later collective call. Every version restores
/// byte-exactly, on every rank, the kept one too.
pub(super) fn step_beside_the_call(w: &World, root: &Path) {
    use dckpt::collective::{LateStep, TieredCollective};
    use std::time::{Duration, Instant};
    let opts = CollectiveOptions {
        backend: test_backend(),
        overlap: Overlap::On,
        late_step: LateStep::Keep,
        ..CollectiveOptions::default()
    };
    let mut c = TieredCollective::open(w.comm, &two_tiers(root, (None, None)), len() as u64, &store_opts(), &opts)
        .expect("open");
    if w.size == 1 {
        return; // one rank: no collective step
    }
    w.check(c.overlapped(), "overlap on, MPI_THREAD_MULTIPLE granted: the step is not on its thread");
    let s = Scenario::Partial;
    let slow = w.rank == w.size - 1;
    c.checkpoint(1, &buffer(s, w.rank, 1)).expect("checkpoint 1");
    c.settle();
    if slow {
        // Every later reduction on this rank's step thread pauses.
        dckpt::failpoint::delay("collective.reduced", Duration::from_secs(2));
    }
    c.checkpoint(2, &buffer(s, w.rank, 2)).expect("checkpoint 2");
    c.checkpoint(3, &buffer(s, w.rank, 3)).expect("checkpoint 3");
    if slow {
        dckpt::failpoint::delay("collective.reduced", Duration::ZERO);
    }
    let late: Vec<u64> = c.take_settled().iter().filter(|r| r.late).map(|r| r.checkpoint.version).collect();
    w.check(
        !slow || late == [2],
        &format!("the slow rank's call for version 3 waited for version 2's step (late: {late:?})"),
    );
    // No collective call from here until version 3 is committed everywhere.
    let deadline = Instant::now() + Duration::from_secs(120);
    let durable = |c: &TieredCollective| ["local", "shared"].iter().all(|t| c.is_durable(3, t));
    while !durable(&c) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    w.check(durable(&c), "version 3 was not committed on every tier without a later call");
    w.comm.barrier();
    c.finalize().expect("finalize");
    w.comm.barrier();
    for tier in ["local", "shared"] {
        for r in 0..w.size {
            for v in 1..=3 {
                let got = dckpt::restore::restore_version(&root.join(tier), r as u32, v);
                w.check(
                    got.as_ref().is_ok_and(|g| *g == buffer(s, r, v)),
                    &format!("rank {r} version {v} from {tier}: {:?}", got.err()),
                );
            }
        }
    }
}

/// Faults on collective tiers: a second writer on the same tiers is refused
/// on every rank while the first goes on; a shared tier too small for any
/// version (a tmpfs, where mounting is allowed) fails every version there,
/// `wait` names the tier, yet every checkpoint call returns, every version
/// is committed and restores from the local tier, and the next
/// checkpoint always proceeds. On the CUDA backend both run through a GPU
/// cache tier.
pub(super) fn tier_faults(w: &World, root: &Path) {
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

pub(super) fn copy_dir(from: &Path, to: &Path) {
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
pub(super) fn shared_dir(w: &World) -> PathBuf {
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
