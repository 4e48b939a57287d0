//! Criterion: leaf hashing throughput of each digest algorithm at the chunk
//! sizes the paper uses, over a 64 MiB buffer (all cores, as in a checkpoint).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dckpt::HashAlgo;
use dckpt::dedup::hash_leaves;
#[path = "../src/bin/dckpt/bench/generate.rs"]
#[allow(dead_code)]
mod generate;
use dckpt::layout::Layout;
use generate::{Shape, Workload};
use std::hint::black_box;
use std::time::Duration;

fn hashing(c: &mut Criterion) {
    let size = 64 << 20;
    let w = Workload::new(size, 0.0, Shape::Clustered, 1).expect("workload");
    let data = w.current();
    let mut g = c.benchmark_group("leaf-hashing");
    g.throughput(Throughput::Bytes(size as u64)).sample_size(10).measurement_time(Duration::from_secs(3));
    for algo in HashAlgo::ALL {
        for cs in [64u32, 128, 512, 4096] {
            let layout = Layout::new(size as u64, cs).expect("layout");
            g.bench_with_input(BenchmarkId::new(algo.name(), cs), &cs, |b, _| {
                b.iter(|| black_box(hash_leaves(black_box(data), layout, algo, None).len()))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, hashing);
criterion_main!(benches);
