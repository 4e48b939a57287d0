//! Tests of [`super::generate`], apart so that `benches/` can include
//! `generate.rs` alone.

use super::generate::*;

#[test]
fn same_seed_same_bytes_and_change_is_bounded() {
    let mut a = Workload::new(1 << 20, 0.01, Shape::Scattered, 7).unwrap();
    let mut b = Workload::new(1 << 20, 0.01, Shape::Scattered, 7).unwrap();
    let base = a.current().to_vec();
    a.advance();
    b.advance();
    assert_eq!(a.current(), b.current());
    let diff = base.iter().zip(a.current()).filter(|(x, y)| x != y).count();
    assert!(diff > 0 && diff <= (1 << 20) / 100 + GRANULE, "{diff}");
}
