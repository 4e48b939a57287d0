//! Criterion: one incremental checkpoint (de-duplicate + serialize into one
//! buffer) of each method, 64 MiB, 1% of the bytes changed (clustered and
//! scattered), against the committed state of the previous version.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dckpt::dedup::{DedupInput, DedupState};
use dckpt::format::encode_diff;
#[path = "../src/bin/dckpt/bench/generate.rs"]
#[allow(dead_code)]
mod generate;
use dckpt::layout::Layout;
use dckpt::{HashAlgo, Method};
use generate::{Shape, Workload};
use std::hint::black_box;
use std::time::Duration;

fn methods(c: &mut Criterion) {
    let size = 64 << 20;
    let mut g = c.benchmark_group("incremental-checkpoint");
    g.throughput(Throughput::Bytes(size as u64)).sample_size(10).measurement_time(Duration::from_secs(4));
    for shape in [Shape::Clustered, Shape::Scattered] {
        let mut w = Workload::new(size, 0.01, shape, 1).expect("workload");
        let v1 = w.current().to_vec();
        w.advance();
        let v2 = w.current().to_vec();
        for cs in [64u32, 128, 512] {
            let layout = Layout::new(size as u64, cs).expect("layout");
            for method in Method::ALL {
                let mut state = DedupState::new(layout, HashAlgo::Murmur3, 0);
                let first = DedupInput { data: &v1, version: 1, baseline: true };
                let out = method.deduplicator().deduplicate(&state, &first).expect("dedup");
                state.commit(out.pending);
                let id = BenchmarkId::new(format!("{method}/{shape:?}"), cs);
                g.bench_with_input(id, &cs, |b, _| {
                    b.iter(|| {
                        let input = DedupInput { data: &v2, version: 2, baseline: false };
                        let out = method.deduplicator().deduplicate(&state, &input).expect("dedup");
                        black_box(encode_diff(&out.diff, &v2).len())
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, methods);
criterion_main!(benches);
