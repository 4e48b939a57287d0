//! Reading the reduction's result: which of this rank's regions another
//! rank now owns ([`conversions`]). The regions themselves and the rewrite
//! of a diff that gives them away are core functions in [`crate::regions`],
//! re-exported here.

pub use crate::regions::*;

use super::HashFreq;
use crate::layout::Layout;

/// The regions of `me` that the reduction's result `merged` (sorted by
/// digest) gives to another rank. `layouts[r]` is rank `r`'s layout; an entry
/// whose owner node does not match the region's shape there is ignored (the
/// region stays local), so a digest collision or a bad peer cannot produce a
/// reference to the wrong bytes. Sorted by chunk.
pub fn conversions(me: u32, regions: &[Region], merged: &[HashFreq], layouts: &[Layout]) -> Vec<Conversion> {
    let mut out: Vec<Conversion> = regions
        .iter()
        .filter_map(|reg| {
            let i = merged.binary_search_by_key(&reg.digest, |e| e.digest).ok()?;
            let e = merged[i];
            let owner_layout = layouts.get(e.owner as usize)?;
            if e.count < 2 || e.owner == me || e.bytes != reg.bytes || !owner_layout.contains(e.node) {
                return None;
            }
            let c = owner_layout.node_chunks(e.node);
            let b = owner_layout.node_bytes(e.node);
            (c.end - c.start == reg.count && b.end - b.start == reg.bytes).then_some(Conversion {
                region: *reg,
                owner: e.owner,
                owner_start: c.start,
            })
        })
        .collect();
    out.sort_unstable_by_key(|c| c.region.start);
    out
}
