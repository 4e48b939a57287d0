//! The GPU test program: the CUDA backend writes exactly the files the CPU
//! engine writes, on ≥ 100 random version sequences (sparse edits, shifted
//! copies, repeated chunks, reverts, nothing and everything changed,
//! non-power-of-two chunk counts, chunk sizes 32 B – 4 KiB, every method and
//! GPU digest), and restores every version byte-exactly on the GPU.
//!
//! Compiled everywhere; on a machine without a usable CUDA device each test
//! prints `skipped` and passes. `scripts/gpu-check.sh` runs it on the GPU
//! machine.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures
#![allow(unsafe_code)] // DeviceRegion::from_raw is the C ABI's constructor; one test calls it

mod common;

#[path = "gpu/identical.rs"]
mod identical;

use identical::{Rng, sequence};

use common::noise;
use dckpt::backend::budget::{DevicePlan, GpuCache, GpuMemory};
use dckpt::backend::cuda::{self, Gpu, GpuDedup};
use dckpt::backend::{Backend, BackendKind};
use dckpt::dedup::{DedupInput, DedupState};
use dckpt::format::encode_diff;
use dckpt::layout::Layout;
use dckpt::memory::{DeviceRegion, Protected, ProtectedMut};
use dckpt::{Engine, HashAlgo, Method, StoreOptions};
use std::sync::Arc;

fn gpu() -> Option<Arc<Gpu>> {
    if !cuda::available() {
        eprintln!("skipped: no usable CUDA device");
        return None;
    }
    Some(Gpu::open(0).expect("a CUDA device is present but cannot be opened"))
}

/// A device-made file as a store holds it: runs of one repeated source
/// range folded as the CPU's encoder writes them (`Rewrite::folding`, which
/// the backend and the flush apply).
fn folded(file: Vec<u8>) -> Vec<u8> {
    use dckpt::format::diff_file::HEADER_LEN;
    let at = dckpt::format::data_start_of(&file[..HEADER_LEN as usize], file.len() as u64).unwrap() as usize;
    match dckpt::regions::Rewrite::folding(&file[..at]).unwrap() {
        Some(fold) => fold.apply(&file).unwrap(),
        None => file,
    }
}

/// A record at its least (256 slots: 192 entries) on the device: the
/// baseline's 2047 entries do not fit (stored whole), one version of 64
/// changed chunks does (127 entries), a second one would overfill it (the
/// record restarts; that try is dropped, and both backends forget the
/// record). The same files, counts and records as the CPU backend's.
#[test]
fn a_full_device_record_restarts_like_the_cpu_record() {
    let Some(gpu) = gpu() else { return };
    let cs = 64usize;
    let v1 = noise(1024 * cs, 11);
    let mut v2 = v1.clone();
    v2[..64 * cs].copy_from_slice(&noise(64 * cs, 12));
    let mut v3 = v2.clone();
    v3[512 * cs..576 * cs].copy_from_slice(&noise(64 * cs, 13));
    let mut v4 = v3.clone();
    v4.copy_within(512 * cs..576 * cs, 256 * cs); // shifted: found in the restarted record
    let layout = Layout::new(v1.len() as u64, cs as u32).unwrap();
    let budget = GpuMemory::Bytes(DevicePlan::least_bytes(layout) + 12_000);
    let mut dev =
        GpuDedup::with_budget(gpu, layout, HashAlgo::Murmur3, Method::Tree, 0, budget, GpuCache::NONE).unwrap();
    assert_eq!(dev.plan().record_slots, 256, "{:?}", dev.plan());
    let state = DedupState::new(layout, HashAlgo::Murmur3, 0).with_limits(dev.limits());
    let mut cpu = dckpt::backend::cpu::CpuBackend::new(state, Method::Tree);
    let mut hits = Vec::new();
    // Version 3 is tried once and dropped (its write "failed"): the GPU's
    // table was cleared by the restart, and the CPU forgets its record too.
    for (i, v, keep) in [(1u64, &v1, true), (2, &v2, true), (3, &v3, false), (3, &v3, true), (4, &v4, true)] {
        let baseline = i == 1;
        let mut d = cpu.deduplicate(i, Protected::Host(v), baseline).unwrap();
        let want = cpu.serialize(d.as_mut(), v).unwrap().parts().concat();
        let cp = dev.checkpoint(i, Protected::Host(v), baseline).unwrap();
        assert_eq!(dev.file_vec(&cp).unwrap(), want, "version {i}: the GPU file differs");
        let shifts = d.diff.shift.len();
        if keep {
            cpu.commit(d).unwrap();
            dev.commit().unwrap();
        } else {
            cpu.rollback().unwrap();
            dev.rollback().unwrap();
        }
        hits.push((dev.bounds_hit(), shifts));
        assert_eq!(dev.bounds_hit(), cpu.bounds_hit(), "version {i}");
        assert_eq!(dev.record_entries(), cpu.record_entries(), "version {i}");
    }
    // Committed counts: the baseline stored whole, no restart committed
    // (the restarting try was dropped; the record was empty for the retry).
    let b = |record_restarts, stored_whole| dckpt::dedup::BoundsHit { record_restarts, stored_whole };
    let counts: Vec<_> = hits.iter().map(|h| h.0).collect();
    assert_eq!(counts, vec![b(0, 1), b(0, 1), b(0, 1), b(0, 1), b(0, 1)]);
    assert_eq!(hits.iter().map(|h| h.1).collect::<Vec<_>>(), vec![0, 0, 0, 0, 1]);
}

#[test]
fn gpu_engine_stores_match_the_cpu_and_restore_on_the_gpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(77);
    for (case, method) in
        [Method::Tree, Method::List, Method::Basic, Method::Full, Method::Tree].into_iter().enumerate()
    {
        let cs = [64usize, 128, 32, 512, 100][case];
        let versions = sequence(&mut rng, cs);
        let opts = StoreOptions { chunk_size: cs as u32, method, max_chain: Some(4), ..StoreOptions::default() };
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let len = versions[0].len() as u64;
        // Odd cases reopen both engines before every version (the state is
        // rebuilt from the latest version, the same way on both backends);
        // even cases keep them open.
        let reopen = case % 2 == 1;
        let open = |dir: &std::path::Path, kind| Engine::open_with_backend(dir, 0, len, &opts, kind).unwrap();
        let (mut cpu, mut g) = (open(a.path(), BackendKind::Cpu), open(b.path(), BackendKind::Cuda));
        assert_eq!(g.backend(), BackendKind::Cuda);
        for (i, v) in versions.iter().enumerate() {
            if reopen && i > 0 {
                drop((cpu, g));
                (cpu, g) = (open(a.path(), BackendKind::Cpu), open(b.path(), BackendKind::Cuda));
            }
            cpu.checkpoint(i as u64 + 1, v).unwrap();
            g.checkpoint(i as u64 + 1, v).unwrap();
        }
        drop((cpu, g));
        let sa = dckpt::store::Store::open(a.path(), 0).unwrap();
        let sb = dckpt::store::Store::open(b.path(), 0).unwrap();
        for v in 1..=versions.len() as u64 {
            assert!(
                std::fs::read(sa.diff_path(v)).unwrap() == std::fs::read(sb.diff_path(v)).unwrap(),
                "{method} v{v} diff"
            );
        }
        for (i, want) in versions.iter().enumerate() {
            let (dev, stats, _) = cuda::restore_on_gpu(&gpu, b.path(), 0, i as u64 + 1).unwrap();
            let got = gpu.stream_clone_dtoh(&dev).unwrap();
            assert!(got == *want, "{method}: GPU restore of version {} differs", i + 1);
            assert_eq!(stats.data_len, want.len() as u64);
        }
    }
}

/// One collective version over in-process engines (reduce_all instead of MPI).
/// Returns each rank's offered regions.
fn collective_version(
    engines: &mut [Engine],
    version: u64,
    data: &[Vec<u8>],
    level: u32,
) -> Vec<Vec<dckpt::regions::Region>> {
    use dckpt::collective::{reduce_all, step};
    let layouts: Vec<Layout> = engines.iter().map(|e| e.store().layout().unwrap()).collect();
    let offers: Vec<step::Offer> = engines
        .iter_mut()
        .zip(data)
        .map(|(e, d)| step::offer(e, version, Protected::Host(d), level, 1 << 17).unwrap())
        .collect();
    let regions = offers.iter().map(|o| o.regions.clone()).collect();
    let merged = reduce_all(&offers.iter().map(|o| o.set.clone()).collect::<Vec<_>>(), 1 << 17);
    let mut staged = Vec::new();
    for ((e, o), d) in engines.iter_mut().zip(offers).zip(data) {
        staged.push(step::settle(e, o, &merged, &layouts, d).unwrap().0);
    }
    for (e, s) in engines.iter_mut().zip(staged) {
        e.publish(s).unwrap();
    }
    regions
}

#[test]
fn collective_versions_on_the_gpu_match_the_cpu_and_restore() {
    if gpu().is_none() {
        return;
    }
    let mut rng = Rng(99);
    for case in 0..6 {
        let ranks = 2 + case % 3;
        let cs = [64usize, 128, 256][case % 3];
        let base = sequence(&mut rng, cs);
        // Every rank: a shared first half (the sequence) and a private second half.
        let versions: Vec<Vec<Vec<u8>>> = (0..ranks)
            .map(|r| {
                base.iter()
                    .enumerate()
                    .map(|(v, b)| {
                        let mut d = b.clone();
                        let (half, n) = (d.len() / 2, d.len());
                        d[half..].copy_from_slice(&noise(n - half, 1000 * r as u64 + v as u64 + 1));
                        d
                    })
                    .collect()
            })
            .collect();
        let opts = StoreOptions { chunk_size: cs as u32, method: Method::Tree, ..StoreOptions::default() };
        let (tg, tc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let len = versions[0][0].len() as u64;
        let open = |dir: &std::path::Path, b| -> Vec<Engine> {
            (0..ranks).map(|r| Engine::open_with_backend(dir, r as u32, len, &opts, b).unwrap()).collect()
        };
        let (mut gpu_engines, mut cpu_engines) =
            (open(tg.path(), BackendKind::Cuda), open(tc.path(), BackendKind::Cpu));
        let level = dckpt::collective::regions::max_region_level(cs as u32, 4096);
        for v in 0..base.len() {
            if case % 2 == 1 && v % 2 == 1 {
                // Reopen every rank on both backends: the GPU rebuilds its table
                // on the device (table_locate, owners included), the CPU in bulk.
                drop((gpu_engines, cpu_engines));
                (gpu_engines, cpu_engines) = (open(tg.path(), BackendKind::Cuda), open(tc.path(), BackendKind::Cpu));
            }
            let data: Vec<Vec<u8>> = versions.iter().map(|r| r[v].clone()).collect();
            // The GPU reads the regions' digests off its tree; the CPU hashes them.
            let on_gpu = collective_version(&mut gpu_engines, v as u64 + 1, &data, level);
            let on_cpu = collective_version(&mut cpu_engines, v as u64 + 1, &data, level);
            assert_eq!(on_gpu, on_cpu, "case {case}: version {} offers other regions on the GPU", v + 1);
        }
        for (r, rv) in versions.iter().enumerate() {
            for (v, want) in rv.iter().enumerate() {
                let got = dckpt::restore::restore_version(tg.path(), r as u32, v as u64 + 1).unwrap();
                assert!(got == *want, "case {case}: GPU collective rank {r} version {} differs", v + 1);
            }
            // Both backends write the same files.
            for v in 1..=rv.len() {
                let f = |d: &std::path::Path| std::fs::read(d.join(format!("rank-{r:05}/v{v:012}.dckpt"))).unwrap();
                assert!(f(tg.path()) == f(tc.path()), "case {case}: rank {r} version {v} differs from the CPU's");
            }
        }
        let report = dckpt::verify::verify_store(tg.path()).unwrap();
        assert!(report.problems.is_empty(), "case {case}: {:?}", report.problems);
    }
}

/// Versions stored whole (every chunk changed): the GPU hashes their
/// regions on the device from the input (no tree was built), partial last
/// chunks and nodes, regions smaller and larger than a warp's 32 chunks.
#[test]
fn whole_versions_offer_the_regions_the_cpu_offers() {
    if gpu().is_none() {
        return;
    }
    let cases = [
        (1usize << 20, 128u32, 0u32),
        ((1 << 20) + 77, 128, 3),
        (300_001, 64, 5),
        (1_000_003, 128, 11),
        (123_457, 256, 8),
        (40_000, 64, 40),
    ];
    for (case, (len, cs, level)) in cases.into_iter().enumerate() {
        let hash = [HashAlgo::Murmur3, HashAlgo::Xxh3, HashAlgo::Blake3][case % 3];
        let opts = StoreOptions { chunk_size: cs, method: Method::Tree, hash, ..StoreOptions::default() };
        let (tg, tc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let open = |dir: &std::path::Path, b| -> Vec<Engine> {
            (0..2).map(|r| Engine::open_with_backend(dir, r, len as u64, &opts, b).unwrap()).collect()
        };
        let (mut on_gpu, mut on_cpu) = (open(tg.path(), BackendKind::Cuda), open(tc.path(), BackendKind::Cpu));
        for v in 1..=3u64 {
            // Rank 1 repeats rank 0's bytes: its regions are given away.
            let d = noise(len, 10 * case as u64 + v);
            let data = vec![d.clone(), d];
            let g = collective_version(&mut on_gpu, v, &data, level);
            let c = collective_version(&mut on_cpu, v, &data, level);
            assert_eq!(g, c, "case {case}: version {v} offers other regions on the GPU");
            let covered: u64 = g[0].iter().map(|r| r.bytes).sum();
            assert_eq!(covered, len as u64, "case {case}: version {v} offers every byte");
        }
        for r in 0..2u32 {
            for v in 1..=3u64 {
                let want = noise(len, 10 * case as u64 + v);
                assert!(
                    dckpt::restore::restore_version(tg.path(), r, v).unwrap() == want,
                    "case {case}: rank {r} v{v}"
                );
                let f = |d: &std::path::Path| std::fs::read(d.join(format!("rank-{r:05}/v{v:012}.dckpt"))).unwrap();
                assert!(f(tg.path()) == f(tc.path()), "case {case}: rank {r} version {v} differs from the CPU's");
            }
        }
    }
}

#[test]
fn device_regions_are_checked_and_restore_in_place() {
    let Some(gpu) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let o = StoreOptions { chunk_size: 64, method: Method::Tree, hash: HashAlgo::Murmur3, ..StoreOptions::default() };
    let len = 1 << 20;
    let mut host = noise(len, 11);
    let dev = cuda::upload(&gpu, &host).unwrap();
    let mut e = Engine::open_with_backend(dir.path(), 0, len as u64, &o, BackendKind::Cuda).unwrap();
    let region = DeviceRegion::of(&dev).unwrap();
    e.checkpoint(1, region).unwrap();
    // A raw region (what C and Fortran pass) that runs past its allocation,
    // and a host address: clear errors, and the engine goes on.
    let bigger = cuda::upload(&gpu, &vec![0u8; 2 * len]).unwrap();
    let past = DeviceRegion::of(&bigger).unwrap();
    // SAFETY: a span starting half way into a live 2-MiB allocation; the
    // check must refuse it before any kernel reads past its end.
    let tail = unsafe { DeviceRegion::from_raw(past.ptr() + len as u64 + 4096, len) };
    let err = e.checkpoint(2, tail).unwrap_err().to_string();
    assert!(err.contains("not inside one allocation"), "{err}");
    // SAFETY: a host address; the check must refuse it.
    let wild = unsafe { DeviceRegion::from_raw(host.as_ptr() as u64, len) };
    let err = e.checkpoint(2, wild).unwrap_err().to_string();
    assert!(err.contains("not inside one allocation"), "{err}");
    host[100..200].fill(7);
    let dev2 = cuda::upload(&gpu, &host).unwrap();
    e.checkpoint(2, DeviceRegion::of(&dev2).unwrap()).unwrap();
    let mut out = cuda::upload(&gpu, &vec![0u8; len]).unwrap();
    e.restore_into(2, ProtectedMut::Device(DeviceRegion::of_mut(&mut out).unwrap())).unwrap();
    assert!(gpu.stream_clone_dtoh(&out).unwrap() == host, "restored in place on the device");
    let mut back = vec![0u8; len];
    e.restore_into(1, ProtectedMut::Host(&mut back)).unwrap();
    assert!(back == noise(len, 11));
}

#[test]
fn regions_given_away_are_found_at_their_owners_in_later_versions() {
    if gpu().is_none() {
        return;
    }
    // Version 1: a shared half, so the reduction gives most of it to one
    // owner. Version 2: every rank copies an aligned block of that half into
    // its private half. The block is found through the record, which must
    // point at the owner's copy (the device moved the entries when the
    // regions were given away): the GPU's files equal the CPU's.
    let (ranks, len, cs) = (3usize, 1usize << 20, 128usize);
    let shared = noise(len / 2, 7);
    let v1: Vec<Vec<u8>> = (0..ranks)
        .map(|r| {
            let mut d = shared.clone();
            d.extend_from_slice(&noise(len / 2, 100 + r as u64));
            d
        })
        .collect();
    let v2: Vec<Vec<u8>> = v1
        .iter()
        .map(|d| {
            let mut d = d.clone();
            d.copy_within(0..1 << 16, len / 2 + (1 << 17));
            d
        })
        .collect();
    let opts = StoreOptions { chunk_size: cs as u32, method: Method::Tree, ..StoreOptions::default() };
    let (tg, tc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let open = |dir: &std::path::Path, b| -> Vec<Engine> {
        (0..ranks).map(|r| Engine::open_with_backend(dir, r as u32, len as u64, &opts, b).unwrap()).collect()
    };
    let (mut g, mut c) = (open(tg.path(), BackendKind::Cuda), open(tc.path(), BackendKind::Cpu));
    let level = dckpt::collective::regions::max_region_level(cs as u32, 1 << 16);
    for (v, data) in [&v1, &v2].into_iter().enumerate() {
        collective_version(&mut g, v as u64 + 1, data, level);
        collective_version(&mut c, v as u64 + 1, data, level);
    }
    let stats = dckpt::inspect::store_stats(tc.path()).unwrap();
    assert!(stats.total_cross_rank_references > 0, "the shared half was given away");
    for r in 0..ranks {
        for (v, want) in [&v1, &v2].into_iter().enumerate() {
            let f = |d: &std::path::Path| std::fs::read(d.join(format!("rank-{r:05}/v{:012}.dckpt", v + 1))).unwrap();
            assert!(f(tg.path()) == f(tc.path()), "rank {r} version {} differs from the CPU's", v + 1);
            let got = dckpt::restore::restore_version(tg.path(), r as u32, v as u64 + 1).unwrap();
            assert!(got == want[r], "rank {r} version {} restores", v + 1);
        }
    }
}

#[test]
fn tiered_gpu_checkpoints_write_the_cpu_files_on_every_tier() {
    use dckpt::format::Compression;
    use dckpt::tiers::{TierOptions, TieredEngine};
    let Some(gpu) = gpu() else { return };
    // Plain, and compressed on the flush path: the same files either way.
    for how in [None, Some(Compression::Zstd { level: 1 }), Some(Compression::Lz4)] {
        let t = tempfile::tempdir().unwrap();
        let len = 1 << 20;
        let o = StoreOptions { chunk_size: 128, method: Method::Tree, max_chain: Some(3), ..StoreOptions::default() };
        // Half noise, half a smooth ramp (compressible).
        let mut data = noise(len, 21);
        data[len / 2..].iter_mut().enumerate().for_each(|(i, b)| *b = (i / 512) as u8);
        let (mut g, mut c) = {
            let tiers = |name: &str| TierOptions {
                local: Some(t.path().join(name).join("local")),
                shared: Some(t.path().join(name).join("shared")),
                host_cache_bytes: 16 << 20,
                compression: how,
                ..TierOptions::default()
            };
            (
                TieredEngine::open(0, len as u64, &o, &tiers("gpu"), BackendKind::Cuda).unwrap(),
                TieredEngine::open(0, len as u64, &o, &tiers("cpu"), BackendKind::Cpu).unwrap(),
            )
        };
        for v in 1..=6u64 {
            for k in 0..20 {
                let at = (v as usize * 7919 + k * 52_361) % (len - 100);
                data[at..at + 100].copy_from_slice(&noise(100, v * 100 + k as u64));
            }
            let dev = cuda::upload(&gpu, &data).unwrap();
            g.checkpoint(v, DeviceRegion::of(&dev).unwrap()).unwrap();
            c.checkpoint(v, &data).unwrap();
            // At once (likely still in the page-locked cache, handed over
            // unsealed): the right bytes, onto the device.
            let mut back = cuda::upload(&gpu, &vec![0u8; len]).unwrap();
            g.restore_into(v, dckpt::memory::ProtectedMut::Device(DeviceRegion::of_mut(&mut back).unwrap())).unwrap();
            assert!(gpu.stream_clone_dtoh(&back).unwrap() == data, "{how:?}: version {v} restored right after it");
        }
        g.finalize().unwrap();
        c.finalize().unwrap();
        for tier in ["local", "shared"] {
            for v in 1..=6u64 {
                let f = |b: &str| {
                    std::fs::read(t.path().join(b).join(tier).join(format!("rank-00000/v{v:012}.dckpt"))).unwrap()
                };
                assert!(f("gpu") == f("cpu"), "{how:?} {tier} version {v}: the GPU's file differs from the CPU's");
            }
            let got = dckpt::restore::restore_version(&t.path().join("gpu").join(tier), 0, 6).unwrap();
            assert!(got == data, "{how:?} {tier}: version 6 restores");
        }
    }
}

#[test]
fn the_gpu_cache_tier_holds_diffs_while_the_host_cache_is_full() {
    use dckpt::tiers::{TierOptions, TieredEngine};
    use std::time::Duration;
    let Some(gpu) = gpu() else { return };
    let t = tempfile::tempdir().unwrap();
    let len = 2 << 20;
    let o = StoreOptions {
        chunk_size: 128,
        method: Method::Tree,
        max_chain: Some(4),
        gpu_memory: GpuMemory::Bytes(256 << 20),
        ..StoreOptions::default()
    };
    // One 4 MiB host segment: while a file is being flushed (slowed down
    // below), the next one has no room there and waits in the GPU cache.
    let tiers = |name: &str| TierOptions {
        local: Some(t.path().join(name).join("local")),
        shared: Some(t.path().join(name).join("shared")),
        host_cache_bytes: 4 << 20,
        gpu_cache: GpuCache::Bytes(64 << 20),
        ..TierOptions::default()
    };
    let mut g = TieredEngine::open(0, len as u64, &o, &tiers("gpu"), BackendKind::Cuda).unwrap();
    let mut c = TieredEngine::open(0, len as u64, &o, &tiers("cpu"), BackendKind::Cpu).unwrap();
    let mut data = noise(len, 31);
    let (mut held, mut early) = (0, 0);
    dckpt::failpoint::delay("store.temp_written", Duration::from_millis(60));
    for v in 1..=8u64 {
        for k in 0..30 {
            let at = (v as usize * 7919 + k * 40_503) % (len - 200);
            data[at..at + 200].copy_from_slice(&noise(200, v * 100 + k as u64));
        }
        let dev = cuda::upload(&gpu, &data).unwrap();
        let r = g.checkpoint(v, DeviceRegion::of(&dev).unwrap()).unwrap();
        held += usize::from(r.held_on_gpu);
        // Right away: from the host cache, or from the GPU cache tier if
        // the file waits there, without waiting for its flush.
        let mut back = cuda::upload(&gpu, &vec![0u8; len]).unwrap();
        g.restore_into(v, ProtectedMut::Device(DeviceRegion::of_mut(&mut back).unwrap())).unwrap();
        assert!(gpu.stream_clone_dtoh(&back).unwrap() == data, "version {v} restored right after it");
        let durable = g.states(v).is_none_or(|s| s[0] == dckpt::tiers::state::TierState::Durable);
        early += usize::from(r.held_on_gpu && !durable);
        c.checkpoint(v, &data).unwrap();
    }
    // Some of those restores read a file still held on the GPU (not yet in
    // the host cache) instead of waiting for its flush.
    let from_gpu = g.gpu_cache_reads();
    dckpt::failpoint::delay("store.temp_written", Duration::ZERO);
    g.finalize().unwrap();
    c.finalize().unwrap();
    assert!(held >= 2, "{held} of 8 versions waited in the GPU cache");
    assert!(early >= 1, "no version held on the GPU restored before its flush");
    assert!(from_gpu >= 1, "no restore read a file out of the GPU cache tier");
    for tier in ["local", "shared"] {
        for v in 1..=8u64 {
            let f = |b: &str| {
                std::fs::read(t.path().join(b).join(tier).join(format!("rank-00000/v{v:012}.dckpt"))).unwrap()
            };
            assert!(f("gpu") == f("cpu"), "{tier} version {v}: the GPU's file differs from the CPU's");
        }
        let got = dckpt::restore::restore_version(&t.path().join("gpu").join(tier), 0, 8).unwrap();
        assert!(got == data, "{tier}: version 8 restores");
    }
}
