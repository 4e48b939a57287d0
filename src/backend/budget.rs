//! The CUDA backend's one device-memory budget: how much device memory a
//! rank's de-duplication may hold ([`GpuMemory`], 1.5× the protected buffer
//! by default), and where it goes ([`DevicePlan`]): the per-chunk state
//! every checkpoint needs, then the record table, the output buffer and the
//! per-region scratch, each bounded, and the GPU cache tier's arena
//! ([`GpuCache`]: a size taken first, or what the rest leaves spare). The
//! bounds become [`Limits`], which
//! the GPU pipeline and the CPU engine apply the same way
//! (`crate::dedup::limits`): a bound costs de-duplication, never bytes.
//!
//! Pure arithmetic, no device: the plan is tested on any machine, and
//! `GpuDedup` allocates exactly what it says.

use crate::dedup::Limits;
use crate::error::{Error, Result};
use crate::layout::Layout;
pub use crate::sizes::{GpuCache, GpuMemory, MIN_BUDGET, MIN_GPU_CACHE};
use serde::Serialize;

/// Bytes per tree node: label (1), digest (16), source version (4), source node (8).
pub const NODE_BYTES: u64 = 29;
/// Bytes per chunk outside the tree: previous leaf digest (16), changed index (8), root flag (1).
pub const CHUNK_BYTES: u64 = 25;
/// Bytes per region of the per-region scratch: fifteen `u64` arrays and a kind byte.
pub const ROOT_BYTES: u64 = 121;
/// Bytes per record slot.
pub const SLOT_BYTES: u64 = 32;
/// Slots of the smallest record table.
const MIN_SLOTS: u64 = 256;
/// Bytes of data per block digest (docs/FORMAT.md).
const BLOCK_SIZE: u64 = 65536;

/// Where a budget goes, in bytes of device memory (a rank's whole
/// de-duplication footprint but the staging copy of a host input, which
/// is the protected buffer itself moved to the device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DevicePlan {
    /// The budget.
    pub budget: u64,
    /// Tree nodes, previous leaves, per-chunk scratch and small arrays.
    pub fixed_bytes: u64,
    /// Slots of the record table (a power of two).
    pub record_slots: u64,
    /// Regions the per-region scratch holds.
    pub root_cap: u64,
    /// Bytes of the output buffer (a version's file up to its trailer).
    pub out_bytes: u64,
    /// Bytes of the GPU cache tier's arena (0: none).
    pub cache_bytes: u64,
}

/// Nodes of `layout`'s tree, all levels.
pub fn tree_nodes(layout: Layout) -> u64 {
    (0..layout.levels()).map(|k| layout.level_len(k)).sum()
}

/// The largest file a version of `layout` can produce, up to its trailer:
/// header, both tables (≤ 40 B per chunk), bitmap, all data, block digests.
pub fn max_file_prefix(layout: Layout) -> u64 {
    let n = layout.chunks();
    96 + 40 * n + n.div_ceil(8) + layout.data_len() + 16 + 32 * layout.data_len().div_ceil(BLOCK_SIZE)
}

/// Bytes of the state every version needs, whatever the budget.
fn fixed_bytes(layout: Layout) -> u64 {
    let n = layout.chunks();
    NODE_BYTES * tree_nodes(layout)
        + CHUNK_BYTES * n
        + 4 * n.div_ceil(32)             // ballots
        + 8 * n.div_ceil(256)            // block counts
        + 8 * (n.div_ceil(1024) + 1)     // scan tile sums
        + 8 * u64::from(layout.levels()) // level offsets
        + 64 + 16 // counters, table statistics
}

impl DevicePlan {
    /// Splits `budget` bytes for `layout`: the fixed state, then the least
    /// record, scratch and output a version needs, then an explicit GPU
    /// cache (`cache`; refused if it does not fit), then what is left: 35%
    /// to the record (rounded down to a power of two of slots), then 5/8 of
    /// the rest to the output buffer and 3/8 to the per-region scratch, each
    /// at most what the buffer can ever use; the remainder is spare. A full
    /// record costs least (it restarts; the output and the scratch, when
    /// short, store a version whole), hence the smallest share. An `Auto`
    /// cache gets the remainder.
    pub fn new(layout: Layout, budget: u64, cache: GpuCache) -> Result<DevicePlan> {
        let n = layout.chunks().max(1);
        let fixed = fixed_bytes(layout);
        let max_slots = (6 * n.max(MIN_SLOTS)).next_power_of_two();
        let max_out = max_file_prefix(layout);
        let (min_roots, min_out) = least_parts(layout);
        let least = Self::least_bytes(layout);
        if budget < least {
            return Err(Error::InvalidOption(format!(
                "gpu_memory: {budget} bytes is less than the {least} bytes the CUDA backend needs at least for \
                 {n} chunks of {} B ({} B per chunk of tree and scratch); raise gpu_memory or the chunk size",
                layout.chunk_size(),
                fixed / n
            )));
        }
        let asked = match cache {
            GpuCache::Bytes(b) => b,
            GpuCache::Auto => 0,
        };
        let extra = (budget - least).checked_sub(asked).ok_or_else(|| {
            Error::InvalidOption(format!(
                "gpu_cache_size: {asked} bytes do not fit the {budget}-byte gpu_memory budget, which leaves {} \
                 bytes beyond the {least} the de-duplication needs at least; raise gpu_memory or lower \
                 gpu_cache_size",
                budget - least
            ))
        })?;
        let want = (MIN_SLOTS * SLOT_BYTES + extra / 20 * 7) / SLOT_BYTES;
        let record_slots = prev_power_of_two(want).clamp(MIN_SLOTS, max_slots);
        let mut left = extra - (record_slots - MIN_SLOTS) * SLOT_BYTES;
        let out_bytes = (min_out + left / 8 * 5).min(max_out);
        left -= out_bytes - min_out;
        let root_cap = (min_roots + left / ROOT_BYTES).min(n);
        left -= (root_cap - min_roots) * ROOT_BYTES;
        // What the scratch could not use goes to the output buffer.
        let out_bytes = (out_bytes + left).min(max_out);
        let mut plan = DevicePlan { budget, fixed_bytes: fixed, record_slots, root_cap, out_bytes, cache_bytes: asked };
        if cache == GpuCache::Auto {
            let spare = budget - plan.device_bytes();
            plan.cache_bytes = if spare >= MIN_GPU_CACHE { spare } else { 0 };
        }
        Ok(plan)
    }

    /// The smallest budget a plan for `layout` accepts: the fixed state, a
    /// record of 256 slots, scratch for 1024 regions and an output buffer
    /// for a whole version's block digests.
    pub fn least_bytes(layout: Layout) -> u64 {
        let (min_roots, min_out) = least_parts(layout);
        fixed_bytes(layout) + MIN_SLOTS * SLOT_BYTES + min_roots * ROOT_BYTES + min_out
    }

    /// Device memory the plan allocates.
    pub fn device_bytes(&self) -> u64 {
        self.fixed_bytes
            + self.record_slots * SLOT_BYTES
            + self.root_cap * ROOT_BYTES
            + self.out_bytes
            + self.cache_bytes
    }

    /// The bounds a version is checked against.
    pub fn limits(&self) -> Limits {
        Limits { record_entries: self.record_slots / 4 * 3, roots: self.root_cap, file_prefix: self.out_bytes }
    }
}

/// The least regions and output bytes a plan gives: a version stored whole
/// needs its block digests in the output buffer.
fn least_parts(layout: Layout) -> (u64, u64) {
    let min_out = (32 * layout.data_len().div_ceil(BLOCK_SIZE) + 4096).min(max_file_prefix(layout));
    (layout.chunks().clamp(1, 1024), min_out)
}

/// The largest power of two at most `x` (1 for 0).
fn prev_power_of_two(x: u64) -> u64 {
    if x <= 1 { 1 } else { 1 << (63 - x.leading_zeros()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(len: u64, cs: u32) -> Layout {
        Layout::new(len, cs).unwrap()
    }

    #[test]
    fn the_default_budget_at_4_gib_and_128_b_chunks_stays_within_one_and_a_half_buffers() {
        let l = layout(4 << 30, 128);
        let budget = GpuMemory::default().bytes_for(l.data_len());
        assert_eq!(budget, 6 << 30);
        let p = DevicePlan::new(l, budget, GpuCache::Auto).unwrap();
        assert!(p.device_bytes() <= budget, "{p:?}");
        assert_eq!(p.cache_bytes, 0, "nothing is spare at the reference point: {p:?}");
        assert!(p.device_bytes() > budget / 10 * 9, "most of the budget is used: {p:?}");
        let lim = p.limits();
        // A 10% change of scattered 8-byte granules fits (measured on the
        // H100: ~0.15 n FIRST runs, ~860 MB of file a version), and one
        // such version's record entries (~0.46 n).
        assert!(lim.roots >= l.chunks() / 5, "{lim:?}");
        assert!(lim.file_prefix >= l.data_len() / 3, "{lim:?}");
        assert!(lim.record_entries >= l.chunks() / 2, "{lim:?}");
    }

    #[test]
    fn a_large_budget_gives_each_part_what_it_can_use_and_no_more() {
        let l = layout(1 << 20, 4096);
        let p = DevicePlan::new(l, 1 << 30, GpuCache::NONE).unwrap();
        assert_eq!(p.record_slots, (6 * 256u64).next_power_of_two());
        assert_eq!(p.root_cap, l.chunks());
        assert_eq!(p.out_bytes, max_file_prefix(l));
        assert!(p.device_bytes() < 1 << 30);
    }

    #[test]
    fn every_plan_stays_within_its_budget() {
        for (len, cs) in [(1u64 << 16, 32u32), (1 << 24, 128), (12345, 64), (1 << 26, 512), (1 << 22, 65536)] {
            let l = layout(len, cs);
            let refused = DevicePlan::new(l, DevicePlan::least_bytes(l) - 1, GpuCache::NONE).unwrap_err();
            assert!(refused.to_string().contains("gpu_memory"), "{refused}");
            assert!(DevicePlan::new(l, DevicePlan::least_bytes(l), GpuCache::NONE).is_ok());
            for budget in [1u64 << 20, 3 << 20, 64 << 20, len * 2, len * 7, 1 << 34] {
                for cache in [GpuCache::NONE, GpuCache::Auto, GpuCache::Bytes(budget / 4)] {
                    let Ok(p) = DevicePlan::new(l, budget, cache) else { continue };
                    assert!(p.device_bytes() <= budget, "{len} {cs} {budget} {cache}: {p:?}");
                    match cache {
                        GpuCache::Bytes(b) => assert_eq!(p.cache_bytes, b),
                        GpuCache::Auto => assert!(p.cache_bytes == 0 || p.cache_bytes >= MIN_GPU_CACHE),
                    }
                    assert!(p.record_slots.is_power_of_two() && p.root_cap >= 1 && p.out_bytes > 0);
                    assert!(p.root_cap <= l.chunks() && p.out_bytes <= max_file_prefix(l));
                }
            }
        }
    }

    #[test]
    fn the_gpu_cache_takes_an_explicit_size_first_or_what_the_rest_leaves_spare() {
        // Large chunks need little tree and record: most of half a buffer is spare.
        let l = layout(1 << 30, 4096);
        let budget = GpuMemory::default().bytes_for(l.data_len());
        let auto = DevicePlan::new(l, budget, GpuCache::Auto).unwrap();
        assert!(auto.cache_bytes > (1 << 30) / 4, "{auto:?}");
        assert!(auto.device_bytes() <= budget && budget - auto.device_bytes() < MIN_GPU_CACHE, "{auto:?}");
        let none = DevicePlan::new(l, budget, GpuCache::NONE).unwrap();
        assert_eq!(none.cache_bytes, 0);
        assert_eq!(
            (none.record_slots, none.root_cap, none.out_bytes),
            (auto.record_slots, auto.root_cap, auto.out_bytes)
        );
        // An explicit size comes off the top; too much is refused, naming the key.
        let asked = DevicePlan::new(l, budget, GpuCache::Bytes(256 << 20)).unwrap();
        assert_eq!(asked.cache_bytes, 256 << 20);
        let refused = DevicePlan::new(l, budget, GpuCache::Bytes(budget)).unwrap_err().to_string();
        assert!(refused.contains("gpu_cache_size") && refused.contains("gpu_memory"), "{refused}");
        for (text, want) in [("auto", GpuCache::Auto), ("0", GpuCache::NONE), ("512M", GpuCache::Bytes(512 << 20))] {
            let got: GpuCache = text.parse().unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string().parse::<GpuCache>().unwrap(), got);
        }
        assert!("lots".parse::<GpuCache>().is_err());
    }

    #[test]
    fn budgets_parse_as_multiples_or_sizes_and_print_back() {
        for (text, want) in [
            ("1.5x", GpuMemory::Times(1500)),
            ("2X", GpuMemory::Times(2000)),
            ("0.25x", GpuMemory::Times(250)),
            ("6G", GpuMemory::Bytes(6 << 30)),
            ("4096", GpuMemory::Bytes(4096)),
        ] {
            let got: GpuMemory = text.parse().unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string().parse::<GpuMemory>().unwrap(), got);
        }
        for bad in ["", "x", "-1x", "1.5y", "nanx", "ten"] {
            assert!(bad.parse::<GpuMemory>().is_err(), "{bad}");
        }
        assert_eq!(GpuMemory::Times(1500).bytes_for(1 << 30), 3 << 29);
        assert_eq!(GpuMemory::Times(1500).bytes_for(1 << 10), MIN_BUDGET);
    }
}
