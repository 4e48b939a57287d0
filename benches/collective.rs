//! Criterion: one step of the collective reduction without MPI — what each
//! inner node of the reduction tree computes: decode the child's K-entry
//! set off the wire and merge it with its own (top-K), worst case (all
//! digests unique, the result is cut to K) and best case (all shared).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dckpt::collective::merge::{Merger, decode_wire_into, encode_wire, local_set, wire_words};
use dckpt::hash::Digest;
use dckpt::layout::NodeId;
use std::hint::black_box;
use std::time::Duration;

fn set(rank: u32, base: u64, k: usize) -> Vec<dckpt::collective::HashFreq> {
    let d = |x: u64| Digest(u128::from(x).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834));
    local_set(rank, (0..k as u64).map(|i| (d(base + i), 4096, NodeId::new(5, i))), k)
}

fn merge_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("collective-merge-step");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    for k in [1usize << 14, 1 << 17] {
        g.throughput(Throughput::Elements(2 * k as u64));
        for (case, base_right) in [("unique", 1u64 << 40), ("shared", 0)] {
            let (l, r) = (set(0, 0, k), set(1, base_right, k));
            let mut wire = vec![0u64; wire_words(k)];
            encode_wire(&r, &mut wire);
            let (mut merger, mut theirs) = (Merger::default(), Vec::new());
            g.bench_with_input(BenchmarkId::new(case, k), &k, |b, &k| {
                b.iter(|| {
                    decode_wire_into(&wire, &mut theirs);
                    black_box(merger.merge_sets(&l, &theirs, k).len())
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, merge_step);
criterion_main!(benches);
