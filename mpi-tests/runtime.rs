//! The application runtime under mpirun: three host regions per rank, of
//! sizes that differ between ranks, checkpointed under one name; a set of
//! regions that differs from the name's is refused; a second runtime (a
//! restart) finds the newest version every rank has, restores it and an
//! older one byte for byte, and a sync-mode name returns durable versions.
// Protecting memory by address is `unsafe` (the runtime reads and writes it
// during later calls), as for a C or Fortran application.
#![allow(unsafe_code)]

use super::World;
use super::common::noise;
use dckpt::config::{Bytes, Config, Mode};
use dckpt::runtime::{Region, Runtime};
use mpi::traits::*;
use std::path::Path;

/// Region `id`'s bytes on `rank` at `version`.
fn content(rank: i32, id: u32, len: usize, version: u64) -> Vec<u8> {
    let mut v = noise(len, 1000 + u64::from(id) * 10 + rank as u64);
    // Each version rewrites a few pieces (the rest de-duplicates).
    for k in 0..4usize {
        let at = (k * 7919 + version as usize * 104_729) % len.saturating_sub(64).max(1);
        let end = (at + 64).min(len);
        v[at..end].copy_from_slice(&noise(end - at, version * 100 + k as u64 + u64::from(id)));
    }
    v
}

fn sizes(rank: i32) -> [usize; 3] {
    [1000 + 37 * rank as usize, 300_000, 65_536 + 4096 * rank as usize]
}

fn sizes_of(rank: i32) -> Vec<usize> {
    sizes(rank).to_vec()
}

fn rt_tables(w: &World, config: &Config) -> Vec<dckpt::runtime::table::RegionTable> {
    let rt = Runtime::init(w.comm, config.clone());
    rt.old_regions("sim").expect("region tables")
}

fn protect_all(rt: &mut Runtime, bufs: &mut [Vec<u8>]) {
    for (id, b) in bufs.iter_mut().enumerate() {
        // SAFETY: the buffers outlive the runtime's calls and are not
        // touched while a call runs (this test is single-threaded).
        unsafe { rt.protect(id as u32, Region::host(b)) }.expect("protect");
    }
}

pub fn runtime(w: &World, root: &Path) {
    let backend = super::test_backend();
    if backend == dckpt::backend::BackendKind::Cuda {
        device_regions(w, root);
    }
    let config = Config {
        scratch: Some(root.join("scratch")),
        persistent: Some(root.join("persistent")),
        host_cache_size: Bytes(16 << 20),
        max_chain: Some(3),
        backend,
        ..Config::default()
    };
    let sizes = sizes(w.rank);
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let mut rt = Runtime::init(w.comm, config.clone());
    protect_all(&mut rt, &mut bufs);
    for v in 1..=4u64 {
        for (id, b) in bufs.iter_mut().enumerate() {
            *b = content(w.rank, id as u32, b.len(), v);
        }
        // Moved buffers: re-protect at their new addresses.
        protect_all(&mut rt, &mut bufs);
        let r = rt.checkpoint("sim", v).expect("runtime checkpoint");
        w.check(r.checkpoint.version == v, "runtime report");
    }
    // Every call's step ran on the thread, or every call's in the call, as
    // `overlap = auto` decides (once, for every rank; one rank has no step
    // to overlap; MPI_THREAD_MULTIPLE is granted here).
    let cpus = dckpt::collective::mpi::cpu_share(w.comm);
    let in_call = w.max(u64::from(!config.overlap.wanted(backend.resolve(), cpus))) == 1 || w.size == 1;
    let overlapped = rt.stats().overlapped_calls;
    w.check(overlapped == if in_call { 0 } else { 4 }, &format!("{overlapped} of 4 calls overlapped ({cpus:?} CPUs)"));
    // A different set of regions under the same name is refused, also when
    // only rank 0 changed it: every rank gets the error, none is left
    // waiting in a collective call.
    if w.rank == 0 {
        rt.unprotect(1).expect("unprotect");
        w.check(
            matches!(rt.unprotect(1), Err(e) if e.kind() == dckpt::ErrorKind::MissingRegion),
            "unprotecting twice is a missing region",
        );
    }
    let e = rt.checkpoint("sim", 5).expect_err("a changed set of regions");
    w.check(e.to_string().contains("regions"), &format!("refusal: {e}"));
    protect_all(&mut rt, &mut bufs);
    rt.finalize().expect("finalize");

    // What a job of another size reads: every rank's table, the committed
    // versions, and any rank's region (a byte range of it) at any version.
    let tables = rt_tables(w, &config);
    w.check(tables.len() == w.size as usize, "one region table per rank");
    let other = (w.rank + 1) % w.size;
    let t = &tables[other as usize];
    w.check(t.regions.iter().map(|e| e.len as usize).collect::<Vec<_>>() == sizes_of(other), "the other rank's sizes");
    let reader = Runtime::init(w.comm, config.clone());
    w.check(reader.committed_versions("sim").expect("versions") == [1, 2, 3, 4], "committed versions");
    let got = reader.read_region("sim", other as u32, 1, 3, 1000..5000).expect("read a region range");
    w.check(got == content(other, 1, sizes_of(other)[1], 3)[1000..5000], "another rank's region range at version 3");
    w.check(
        matches!(reader.read_region("sim", other as u32, 7, 3, 0..1), Err(e) if e.kind() == dckpt::ErrorKind::MissingRegion),
        "an unknown region is a missing region",
    );
    w.check(
        matches!(reader.read_region("sim", other as u32, 0, 3, 0..1 << 30), Err(e) if e.kind() == dckpt::ErrorKind::SizeMismatch),
        "a range past the region is a size mismatch",
    );
    #[allow(clippy::reversed_empty_ranges)] // the reversed range is the point
    let reversed = 10..5;
    w.check(
        matches!(reader.read_region("sim", other as u32, 0, 3, reversed), Err(e) if e.kind() == dckpt::ErrorKind::InvalidOption),
        "a reversed range is an invalid option",
    );
    drop(reader);

    // A restart: a new runtime, the regions zeroed and protected again.
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let mut rt = Runtime::init(w.comm, config.clone());
    protect_all(&mut rt, &mut bufs);
    w.check(rt.latest("sim").expect("latest") == Some(4), "the newest version every rank has");
    w.check(!rt.is_open("sim"), "latest read the manifests only (nothing opened)");
    // Version 0 is C's and Fortran's "none": refused on every rank.
    w.check(
        matches!(rt.checkpoint("sim", 0), Err(e) if e.kind() == dckpt::ErrorKind::InvalidOption),
        "version 0 is refused",
    );
    // A version that does not exist fails on every rank.
    w.check(rt.restart("sim", 9).is_err(), "restarting a version that does not exist");
    for v in [4u64, 2] {
        rt.restart("sim", v).expect("restart");
        for (id, b) in bufs.iter().enumerate() {
            w.check(*b == content(w.rank, id as u32, b.len(), v), &format!("region {id} after restarting {v}"));
        }
    }
    // The same name with other regions, in a new job: refused on every rank.
    let mut other_bufs: Vec<Vec<u8>> = vec![vec![0u8; 10], vec![0u8; 20]];
    let mut wrong = Runtime::init(w.comm, config.clone());
    protect_all(&mut wrong, &mut other_bufs);
    w.check(wrong.latest("sim").is_err(), "a restart with other regions is refused");
    drop(wrong);
    // Another name, synchronous: a checkpoint returns durable everywhere.
    let mut sync = Runtime::init(w.comm, Config { mode: Mode::Sync, ..config.clone() });
    protect_all(&mut sync, &mut bufs);
    sync.checkpoint("sync", 1).expect("sync checkpoint");
    w.check(sync.latest("sync").expect("latest") == Some(1), "sync latest");
    w.check(matches!(sync.latest("Bad/name"), Err(e) if e.kind() == dckpt::ErrorKind::InvalidOption), "bad name");
    sync.finalize().expect("finalize sync");
    rt.finalize().expect("finalize restart");
    in_flight_restart(w, &config);
    for collective in [true, false] {
        larger_than_the_cache(w, &Config { collective, ..config.clone() });
    }
    damaged_newest(w, &config);
    another_rank_count(w, &config);
    disagreeing_configs(w, &config);
}

/// Ranks given different settings that must agree (here `mode`, and the
/// chunk size): the first call fails on every rank, naming them; none
/// waits for the others.
fn disagreeing_configs(w: &World, config: &Config) {
    if w.size < 2 {
        return;
    }
    let odd = Config {
        mode: if w.rank == 1 { Mode::Sync } else { Mode::Async },
        chunk_size: if w.rank == 1 { 256 } else { config.chunk_size },
        ..config.clone()
    };
    let mut bufs = vec![vec![1u8; 8192]];
    let mut rt = Runtime::init(w.comm, odd);
    protect_all(&mut rt, &mut bufs);
    let e = rt.checkpoint("odd", 1).expect_err("ranks that disagree on mode");
    let text = e.to_string();
    w.check(text.contains("mode") && text.contains("chunk_size"), &format!("the disagreement named: {text}"));
    drop(rt);
    w.comm.barrier();
}

/// The newest version damaged on every tier of one rank: `restart_latest`
/// falls back to the newest version that restores everywhere, on every
/// rank, with the right bytes, and the next checkpoint proceeds.
fn damaged_newest(w: &World, config: &Config) {
    let name = "damaged";
    let len = 200_000 + 512 * w.rank as usize;
    let mut bufs = vec![vec![0u8; len]];
    let mut rt = Runtime::init(w.comm, config.clone());
    for v in 1..=3u64 {
        bufs[0] = content(w.rank, 9, len, v);
        protect_all(&mut rt, &mut bufs);
        rt.checkpoint(name, v).expect("checkpoint");
    }
    rt.finalize().expect("finalize");
    // Rank 0's version 3, damaged in place on every tier (same length).
    if w.rank == 0 {
        for tier in [config.scratch.as_ref(), config.persistent.as_ref()].into_iter().flatten() {
            let file = tier.join(name).join("rank-00000").join(dckpt::store::diff_file_name(3));
            let mut bytes = std::fs::read(&file).expect("read the newest diff");
            let mid = bytes.len() / 2;
            bytes[mid..].iter_mut().for_each(|b| *b ^= 0x5a);
            std::fs::write(&file, bytes).expect("damage it");
        }
    }
    w.comm.barrier();
    let mut bufs = vec![vec![0u8; len]];
    let mut rt = Runtime::init(w.comm, config.clone());
    protect_all(&mut rt, &mut bufs);
    w.check(rt.versions(name).expect("versions") == [1, 2, 3], "every rank lists versions 1 to 3");
    w.check(rt.restart("damaged", 3).is_err(), "restarting the damaged version fails on every rank");
    let restored = rt.restart_latest(name).expect("restart_latest");
    w.check(restored == Some(2), &format!("fell back to version 2 everywhere, got {restored:?}"));
    w.check(bufs[0] == content(w.rank, 9, len, 2), "the fallback's bytes");
    // The skipped version left the history everywhere (set aside, not
    // deleted), so the application's next checkpoint, numbered from where
    // it resumed, proceeds and restores.
    w.check(rt.versions(name).expect("versions") == [1, 2], "version 3 is set aside on every rank");
    if w.rank == 0 {
        let aside = config.persistent.as_ref().expect("persistent").join(name).join("rank-00000");
        w.check(aside.join("v000000000003.dckpt.damaged").exists(), "the damaged file is kept aside");
    }
    bufs[0] = content(w.rank, 9, len, 3);
    protect_all(&mut rt, &mut bufs);
    rt.checkpoint(name, 3).expect("the checkpoint after a fallback, numbered from where it resumed");
    rt.wait(name, 3).expect("durable");
    bufs[0] = content(w.rank, 9, len, 4);
    protect_all(&mut rt, &mut bufs);
    rt.checkpoint(name, 4).expect("the next one");
    rt.wait(name, 4).expect("durable");
    w.check(
        matches!(rt.wait(name, 77), Err(e) if e.kind() == dckpt::ErrorKind::MissingVersion),
        "waiting for a version never taken",
    );
    bufs[0].fill(0);
    rt.restart(name, 4).expect("restart the new version");
    w.check(bufs[0] == content(w.rank, 9, len, 4), "the version after a fallback");
    rt.finalize().expect("finalize");
}

/// A store written by this job's ranks, read by a job of fewer ranks: a
/// distinct error on every rank, never "nothing to restart from"; and a
/// checkpoint of the smaller job into it refused the same way.
fn another_rank_count(w: &World, config: &Config) {
    if w.size < 2 {
        return;
    }
    let name = "sized";
    let mut bufs = vec![vec![0u8; 4096]];
    let mut rt = Runtime::init(w.comm, config.clone());
    protect_all(&mut rt, &mut bufs);
    rt.checkpoint(name, 1).expect("checkpoint");
    rt.finalize().expect("finalize");
    let color = if w.rank == 0 { 0 } else { 1 };
    let part = w.comm.split_by_color(mpi::topology::Color::with_value(color)).expect("split");
    let mut rt = Runtime::init(&part, config.clone());
    let mut bufs = vec![vec![0u8; 4096]];
    protect_all(&mut rt, &mut bufs);
    let latest = rt.latest(name);
    w.check(
        matches!(&latest, Err(e) if e.kind() == dckpt::ErrorKind::RankCount),
        &format!("latest on {} of {} ranks: {latest:?}", part.size(), w.size),
    );
    // Nor may it add a version: refused on every rank of the smaller job.
    let taken = rt.checkpoint(name, 2);
    w.check(
        matches!(&taken, Err(e) if e.kind() == dckpt::ErrorKind::RankCount),
        &format!("a checkpoint on {} of {} ranks into their store: {:?}", part.size(), w.size, taken.as_ref().err()),
    );
    drop(rt);
    w.comm.barrier();
}

/// Regions whose diffs are larger than the whole host cache (the defaults
/// with a big buffer): never refused, spilled outside the cache one at a
/// time, and restored byte for byte.
fn larger_than_the_cache(w: &World, config: &Config) {
    let config = Config { host_cache_size: Bytes(4 << 20), ..config.clone() }; // one segment
    let len = (12 << 20) + 4096 * w.rank as usize;
    let name = if config.collective { "big" } else { "big-local" };
    let version = |v: u64| match v {
        3 => noise(len, 77 + w.rank as u64), // rewritten whole: a second large diff
        _ => content(w.rank, 5, len, v),
    };
    let mut bufs = vec![vec![0u8; len]];
    let mut rt = Runtime::init(w.comm, config.clone());
    for v in 1..=4u64 {
        bufs[0] = version(v);
        protect_all(&mut rt, &mut bufs);
        let r = rt.checkpoint(name, v).expect("a checkpoint larger than the host cache");
        if v == 1 || v == 3 {
            w.check(r.checkpoint.spilled, &format!("version {v} spilled outside the cache"));
        }
    }
    rt.finalize().expect("finalize");
    let mut bufs = vec![vec![0u8; len]];
    let mut rt = Runtime::init(w.comm, config.clone());
    protect_all(&mut rt, &mut bufs);
    w.check(rt.latest(name).expect("latest") == Some(4), "the newest large version");
    for v in [4u64, 3, 1] {
        rt.restart(name, v).expect("restart");
        w.check(bufs[0] == version(v), &format!("{name}: a region larger than the cache at version {v}"));
    }
    rt.finalize().expect("finalize");
}

/// A restart of versions still in flight: every rank holds the same
/// region (so ranks reference rank 0's files) while rank 0's flushes lag;
/// restoring right after the checkpoint must wait for what the references
/// need, not fail, and return the right bytes on every rank.
fn in_flight_restart(w: &World, config: &Config) {
    let mut bufs = vec![vec![0u8; 1 << 20]];
    let mut rt = Runtime::init(w.comm, config.clone());
    protect_all(&mut rt, &mut bufs);
    let lagging = w.rank == 0 && w.size > 1;
    if lagging {
        dckpt::failpoint::delay("store.file_durable", std::time::Duration::from_millis(300));
    }
    for v in 1..=2u64 {
        bufs[0].copy_from_slice(&content(0, 9, 1 << 20, v)); // the same on every rank
        rt.checkpoint("inflight", v).expect("checkpoint");
    }
    for v in [2u64, 1] {
        bufs[0].fill(0);
        let restored = rt.restart("inflight", v);
        w.check(
            restored.is_ok() && bufs[0] == content(0, 9, 1 << 20, v),
            &format!("restart of in-flight version {v}: {:?}", restored.err()),
        );
    }
    if lagging {
        dckpt::failpoint::delay("store.file_durable", std::time::Duration::ZERO);
    }
    rt.finalize().expect("finalize in-flight");
}

/// With the CUDA backend: a host region and a device region under one name,
/// the device one gathered and restored device-to-device.
fn device_regions(w: &World, root: &Path) {
    use dckpt::backend::cuda::{self, Gpu};
    use mpi::traits::*;
    let devices = cuda::device_count().max(1);
    let ordinal = w.comm.split_shared(0).rank().max(0) as usize % devices;
    let gpu = Gpu::open(ordinal).expect("gpu");
    let config = Config {
        persistent: Some(root.join("device")),
        host_cache_size: Bytes(16 << 20),
        backend: dckpt::backend::BackendKind::Cuda,
        ..Config::default()
    };
    let n = 1 << 20;
    let mut host = content(w.rank, 0, 5000, 1);
    let mut dev = cuda::upload(&gpu, &content(w.rank, 1, n, 1)).expect("upload");
    let mut rt = Runtime::init(w.comm, config.clone());
    let protect = |rt: &mut Runtime, host: &mut Vec<u8>, dev: &cudarc::driver::CudaSlice<u8>| {
        let ptr = dckpt::memory::DeviceRegion::of(dev).expect("region").ptr();
        // SAFETY: both stay allocated and untouched while the calls run.
        unsafe {
            rt.protect(0, Region::host(host)).expect("protect host");
            rt.protect(1, Region::Device { ptr, len: n }).expect("protect device");
        }
    };
    for v in 1..=3u64 {
        host = content(w.rank, 0, 5000, v);
        cuda::upload_into(&gpu, &content(w.rank, 1, n, v), &mut dev).expect("upload");
        protect(&mut rt, &mut host, &dev);
        rt.checkpoint("gpu", v).expect("checkpoint with a device region");
    }
    rt.finalize().expect("finalize");
    host.fill(0);
    cuda::upload_into(&gpu, &vec![0u8; n], &mut dev).expect("zero");
    let mut rt = Runtime::init(w.comm, config.clone());
    protect(&mut rt, &mut host, &dev);
    rt.restart("gpu", 2).expect("restart");
    w.check(host == content(w.rank, 0, 5000, 2), "the host region after a restart");
    w.check(
        gpu.stream_clone_dtoh(&dev).expect("dtoh") == content(w.rank, 1, n, 2),
        "the device region after a restart",
    );
    rt.finalize().expect("finalize");

    // One device region alone: checkpointed and restored in place (no staging copy).
    let solo = Config { persistent: Some(root.join("solo")), ..config };
    let protect_solo = |rt: &mut Runtime, dev: &cudarc::driver::CudaSlice<u8>| {
        let ptr = dckpt::memory::DeviceRegion::of(dev).expect("region").ptr();
        // SAFETY: the buffer stays allocated and untouched while the calls run.
        unsafe { rt.protect(1, Region::Device { ptr, len: n }) }.expect("protect device");
    };
    let mut rt = Runtime::init(w.comm, solo.clone());
    for v in 1..=3u64 {
        cuda::upload_into(&gpu, &content(w.rank, 2, n, v), &mut dev).expect("upload");
        protect_solo(&mut rt, &dev);
        rt.checkpoint("solo", v).expect("checkpoint of a device region alone");
    }
    rt.finalize().expect("finalize");
    cuda::upload_into(&gpu, &vec![0u8; n], &mut dev).expect("zero");
    let mut rt = Runtime::init(w.comm, solo);
    protect_solo(&mut rt, &dev);
    rt.restart("solo", 2).expect("restart");
    w.check(
        gpu.stream_clone_dtoh(&dev).expect("dtoh") == content(w.rank, 2, n, 2),
        "a device region alone after a restart",
    );
    rt.finalize().expect("finalize");
}
