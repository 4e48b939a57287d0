//! Figure 2 of Tan et al. (ICPP'23): 8 chunks; in the second checkpoint
//! chunks 0–3 are new, chunk 4 is unchanged, chunk 5 repeats an older chunk,
//! and chunks 6–7 repeat the new chunks 0–1. Tree stores 3 metadata entries,
//! List 7.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{assert_restores, checkpoint_all, opts};
use dckpt::Method;

const CS: usize = 32;

fn chunk(tag: u8) -> Vec<u8> {
    (0..CS as u8).map(|i| tag.wrapping_mul(31).wrapping_add(i)).collect()
}

fn versions() -> Vec<Vec<u8>> {
    let v1: Vec<u8> = (0..8).flat_map(chunk).collect();
    // I, J, K, L new; chunk 4 fixed; chunk 5 = old chunk 0 (shifted); 6,7 = I, J.
    let tags = [100u8, 101, 102, 103];
    let mut v2 = Vec::new();
    for t in tags {
        v2.extend(chunk(t));
    }
    v2.extend(chunk(4));
    v2.extend(chunk(0));
    v2.extend(chunk(100));
    v2.extend(chunk(101));
    vec![v1, v2]
}

#[test]
fn tree_stores_three_entries_and_list_seven() {
    let vs = versions();
    for (method, entries) in [(Method::Tree, 3), (Method::List, 7)] {
        let dir = tempfile::tempdir().unwrap();
        let reports = checkpoint_all(dir.path(), &opts(method, CS as u32), &vs);
        let r = &reports[1];
        assert_eq!(r.first_regions + r.shift_regions, entries, "{method}");
        assert_eq!((r.counts.first, r.counts.shift, r.counts.fixed), (4, 3, 1), "{method}");
        assert_restores(dir.path(), &vs);
    }
}

#[test]
fn tree_regions_are_the_paper_nodes() {
    let vs = versions();
    let dir = tempfile::tempdir().unwrap();
    checkpoint_all(dir.path(), &opts(Method::Tree, CS as u32), &vs);
    let store = dckpt::store::Store::open(dir.path(), 0).unwrap();
    let reader = dckpt::format::DiffReader::open(&store.diff_path(2)).unwrap();
    let d = &reader.diff;
    // Region 1 (chunks 0..4) is FIRST.
    assert_eq!(d.first.iter().map(|r| (r.start, r.count)).collect::<Vec<_>>(), vec![(0, 4)]);
    // Region 12 (chunk 5) points at version 1's chunk 0; region 6 (chunks 6..8) at version 2's region 3.
    let shifts: Vec<_> = d.shift.iter().map(|s| (s.start, s.count, s.src_version, s.src_start)).collect();
    assert_eq!(shifts, vec![(5, 1, 1, 0), (6, 2, 2, 0)]);
}
