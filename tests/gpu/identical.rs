//! The device writes the CPU's bytes: random sequences of versions (with
//! repeated content, under tight budgets too), and the repeated shapes of
//! issue #29 at 4 and 256 MiB.

use super::*;

/// xorshift64*, deterministic across platforms.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A random sequence of versions in the spirit of tests/properties.rs.
pub(super) fn sequence(rng: &mut Rng, cs: usize) -> Vec<Vec<u8>> {
    let cap = if rng.below(4) == 0 { 400_000 } else { 40_000 };
    let len = 1 + rng.below(cap) as usize;
    let mut first = noise(len, rng.next());
    if rng.below(5) == 0 {
        // Mostly zeros: repeat nodes from the baseline on.
        first.iter_mut().skip(cs + rng.below(len as u64) as usize).for_each(|b| *b = 0);
    }
    let mut history = vec![first];
    let steps = 1 + rng.below(6);
    for _ in 0..steps {
        let mut v = history.last().unwrap().clone();
        let full = len / cs;
        for _ in 0..rng.below(5) {
            match rng.below(10) {
                0..=2 => {
                    let at = rng.below(len as u64) as usize;
                    let end = (at + 1 + rng.below(3 * cs as u64) as usize).min(len);
                    v[at..end].copy_from_slice(&noise(end - at, rng.next()));
                }
                3 | 4 if full > 0 => {
                    let count = 1 + rng.below(full.min(64) as u64) as usize;
                    let count = count.min(full);
                    let f = rng.below((full - count + 1) as u64) as usize;
                    let t = rng.below((full - count + 1) as u64) as usize;
                    v.copy_within(f * cs..(f + count) * cs, t * cs);
                }
                5 if full > 1 => {
                    let at = rng.below(full as u64 - 1) as usize;
                    let byte = rng.next() as u8;
                    for c in at..(at + 4).min(full) {
                        v[c * cs..(c + 1) * cs].fill(byte);
                    }
                }
                // A source of `period` chunks repeated over up to 512 chunks,
                // after `lead` chunks copied from just before that source
                // (so that the repeat's first copy may extend a run).
                8 if full > 8 => {
                    let (period, lead) = (1 + rng.below(4) as usize, rng.below(3) as usize);
                    let count = (2 + rng.below(512) as usize).min(full);
                    let t = rng.below((full - count + 1) as u64) as usize;
                    let f = rng.below((full - period - lead + 1) as u64) as usize;
                    let src = v[f * cs..(f + lead + period) * cs].to_vec();
                    for (j, c) in (t..t + count).enumerate() {
                        let k = if j < lead { j } else { lead + (j - lead) % period };
                        v[c * cs..(c + 1) * cs].copy_from_slice(&src[k * cs..(k + 1) * cs]);
                    }
                }
                // A source range stretched: each of its chunks `k` times (a
                // ramp of constant steps: repeat nodes whose sources follow
                // one another, which must not be coalesced).
                9 if full > 8 => {
                    let k = 2 + rng.below(4) as usize;
                    let m = (1 + rng.below(64) as usize).min(full / k);
                    let f = rng.below((full - m + 1) as u64) as usize;
                    let t = rng.below((full - m * k + 1) as u64) as usize;
                    let src = v[f * cs..(f + m) * cs].to_vec();
                    for j in 0..m * k {
                        let c = t + j;
                        v[c * cs..(c + 1) * cs].copy_from_slice(&src[(j / k) * cs..(j / k + 1) * cs]);
                    }
                }
                6 => v = history[rng.below(history.len() as u64) as usize].clone(),
                7 => v = noise(len, rng.next()),
                _ => {}
            }
        }
        history.push(v);
    }
    history
}

#[test]
pub(super) fn gpu_writes_the_cpu_bytes_on_random_sequences() {
    let Some(gpu) = gpu() else { return };
    let sizes = [32usize, 48, 64, 100, 128, 256, 512, 1000, 4096];
    let hashes = [HashAlgo::Murmur3, HashAlgo::Xxh3, HashAlgo::Blake3];
    let methods = [Method::Tree, Method::List, Method::Basic, Method::Full];
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let (mut cases, mut hits) = (0, dckpt::dedup::BoundsHit::default());
    for case in 0..120 {
        let cs = sizes[case % sizes.len()];
        let hash = hashes[case % hashes.len()];
        let method = methods[case % methods.len()];
        let versions = sequence(&mut rng, cs);
        let layout = Layout::new(versions[0].len() as u64, cs as u32).unwrap();
        // Every third case runs on a budget barely above the least, so that
        // its bounds bind; the CPU engine gets the same bounds.
        let budget = if case % 3 == 1 {
            let least = DevicePlan::least_bytes(layout);
            GpuMemory::Bytes(least + rng.below(least / 2))
        } else {
            GpuMemory::default()
        };
        let mut dev = GpuDedup::with_budget(gpu.clone(), layout, hash, method, 3, budget, GpuCache::NONE).unwrap();
        let mut cpu = DedupState::new(layout, hash, 3).with_limits(dev.limits());
        for (i, v) in versions.iter().enumerate() {
            let version = i as u64 + 1;
            let baseline = i == 0 || (case % 7 == 0 && i == 3);
            let out = method.deduplicator().deduplicate(&cpu, &DedupInput { data: v, version, baseline }).unwrap();
            let want = encode_diff(&out.diff, v);
            let cp = dev.checkpoint(version, Protected::Host(v), baseline).unwrap();
            let got = folded(dev.file_vec(&cp).unwrap());
            if got != want {
                let at = got.iter().zip(&want).position(|(a, b)| a != b);
                panic!(
                    "case {case}: {method} {hash} chunk {cs}, {} bytes, version {version}: GPU file differs \
                     (lengths {} vs {}, first difference at {at:?}); CPU diff {:?}",
                    v.len(),
                    got.len(),
                    want.len(),
                    out.diff
                );
            }
            cpu.commit(out.pending);
            dev.commit().unwrap();
        }
        assert_eq!(dev.bounds_hit(), cpu.bounds_hit, "case {case}: the bounds cost the GPU what they cost the CPU");
        hits.record_restarts += cpu.bounds_hit.record_restarts;
        hits.stored_whole += cpu.bounds_hit.stored_whole;
        cases += 1;
    }
    eprintln!("{cases} sequences: GPU files identical to the CPU's (tight budgets: {hits:?})");
    assert!(cases >= 100);
    assert!(hits.stored_whole > 0, "the tight budgets bound: {hits:?}");
}

/// Repeated content at 256 MiB under the default device budget (issue #29):
/// a repeat node costs one root, so zeros and a repeated 4 KiB page are
/// de-duplicated (a few KiB), and every shape's folded file is the CPU's
/// under the same bounds.
#[test]
pub(super) fn repeated_content_at_256_mib_writes_the_cpu_files_under_the_default_budget() {
    let Some(gpu) = gpu() else { return };
    let len = 256 << 20;
    let layout = Layout::new(len as u64, 128).unwrap();
    for (name, data) in common::repeated_shapes(len) {
        let mut dev = GpuDedup::with_budget(
            gpu.clone(),
            layout,
            HashAlgo::Murmur3,
            Method::Tree,
            0,
            GpuMemory::default(),
            GpuCache::NONE,
        )
        .unwrap();
        let cpu = DedupState::new(layout, HashAlgo::Murmur3, 0).with_limits(dev.limits());
        let out = Method::Tree
            .deduplicator()
            .deduplicate(&cpu, &DedupInput { data: &data, version: 1, baseline: true })
            .unwrap();
        let want = encode_diff(&out.diff, &data);
        let cp = dev.checkpoint(1, Protected::Host(&data), true).unwrap();
        let got = folded(dev.file_vec(&cp).unwrap());
        dev.commit().unwrap();
        assert!(
            got == want,
            "{name}: the GPU file ({} bytes) differs from the CPU's ({} bytes)",
            got.len(),
            want.len()
        );
        assert_eq!(dev.bounds_hit(), out.pending.bounds(), "{name}: the bounds cost both backends alike");
        // Their roots fit: a repeat node is one root. (Half zeros and the
        // repeated pages store more FIRST bytes than the default output
        // buffer holds: stored whole by both, as noise is.)
        if name == "zeros" || name == "pattern" {
            assert_eq!(out.pending.bounds(), dckpt::dedup::BoundsHit::default(), "{name}: a bound was hit");
            assert!(want.len() <= 64 << 10, "{name}: {} bytes", want.len());
        }
        eprintln!("{name}: {} bytes, {} SHIFT runs, {:?}", want.len(), out.diff.shift.len(), out.pending.bounds());
    }
}

/// Repeated content (issue #29): zeros, a repeated 4 KiB pattern, half
/// zeros, noise with repeated pages. The CUDA backend's files, through the
/// synchronous engine and through the tiers from device memory (handed
/// over unsealed, folded by the flush), are the CPU's bytes; they restore.
#[test]
pub(super) fn repeated_content_writes_the_cpu_files_on_both_paths() {
    use dckpt::tiers::{TierOptions, TieredEngine};
    let Some(gpu) = gpu() else { return };
    let len = 4 << 20;
    for (name, first) in common::repeated_shapes(len) {
        let mut second = first.clone();
        second[len / 3..len / 3 + 100].copy_from_slice(&noise(100, 10));
        let mut third = second.clone();
        third.copy_within(len / 2..len / 2 + (1 << 20), 4096);
        let versions = [first, second, third];
        let t = tempfile::tempdir().unwrap();
        let o = StoreOptions { chunk_size: 128, method: Method::Tree, ..StoreOptions::default() };
        let tiers = |who: &str| TierOptions {
            local: Some(t.path().join(who).join("local")),
            host_cache_bytes: 64 << 20,
            ..TierOptions::default()
        };
        let engine = |who: &str, kind| Engine::open_with_backend(&t.path().join(who), 0, len as u64, &o, kind).unwrap();
        let (mut cpu, mut g) = (engine("cpu", BackendKind::Cpu), engine("gpu", BackendKind::Cuda));
        let mut tg = TieredEngine::open(0, len as u64, &o, &tiers("tiered"), BackendKind::Cuda).unwrap();
        for (i, v) in versions.iter().enumerate() {
            let version = i as u64 + 1;
            cpu.checkpoint(version, v).unwrap();
            g.checkpoint(version, v).unwrap();
            let dev = cuda::upload(&gpu, v).unwrap();
            tg.checkpoint(version, DeviceRegion::of(&dev).unwrap()).unwrap();
        }
        drop((cpu, g));
        tg.finalize().unwrap();
        for version in 1..=versions.len() as u64 {
            let f =
                |dir: &str| std::fs::read(t.path().join(dir).join(format!("rank-00000/v{version:012}.dckpt"))).unwrap();
            let want = f("cpu");
            assert!(f("gpu") == want, "{name} v{version}: the GPU engine's file differs from the CPU's");
            assert!(f("tiered/local") == want, "{name} v{version}: the tiered GPU file differs from the CPU's");
            if name == "zeros" || name == "pattern" {
                assert!(want.len() <= 64 << 10, "{name} v{version}: {} bytes", want.len());
            }
        }
        for (i, want) in versions.iter().enumerate() {
            let (dev, _, _) = cuda::restore_on_gpu(&gpu, &t.path().join("gpu"), 0, i as u64 + 1).unwrap();
            assert!(gpu.stream_clone_dtoh(&dev).unwrap() == *want, "{name}: GPU restore of version {}", i + 1);
        }
    }
}
