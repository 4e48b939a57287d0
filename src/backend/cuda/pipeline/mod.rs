//! One rank's de-duplication state on the GPU and the launch sequence of a
//! checkpoint (kernels/dedup.cu explains each stage).

mod exits;
mod stages;
mod state;

use stages::*;

use super::device_cache::{DeviceCache, Staged};
use super::gathered::{DigestPool, GATHER_WORDS, GatheredDigests};
use super::{DevAddr, Gpu, LevelArgs, TableArgs, cuda_err};
use crate::backend::budget::{DevicePlan, GpuCache, GpuMemory, max_file_prefix};
use crate::dedup::{BoundsHit, Limits};
use crate::diff::{Diff, FirstRun, RegionEncoding};
use crate::error::{Error, Result};
use crate::format::{decode_body, encode_meta, trailer_of};
use crate::hash::Digest;
use crate::hash::HashAlgo;
use crate::layout::{Layout, NodeId};
use crate::memory::Protected;
use crate::method::Method;
use cudarc::driver::{CudaEvent, CudaSlice, LaunchConfig, PinnedHostSlice};
use std::sync::Arc;

/// Device-side times of one checkpoint, from CUDA events, in milliseconds.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct GpuTimings {
    /// H2D copy of a host input (0 for device input).
    pub h2d_ms: f32,
    /// De-duplication and serialization into the device buffer.
    pub dedup_ms: f32,
    /// The D2H copy of the serialized diff into pinned memory.
    pub d2h_ms: f32,
}

/// A checkpoint computed on the GPU: the diff file's bytes up to its
/// trailer wait in pinned host memory ([`GpuDedup::file_prefix`], valid until
/// the next computation); the trailer is here.
pub struct GpuCheckpoint {
    /// The decoded diff.
    pub diff: Diff,
    /// Device-side times.
    pub timings: GpuTimings,
    /// Bytes copied device-to-host.
    pub d2h_bytes: u64,
    /// Offset of the FIRST data in the file.
    pub data_start: usize,
    /// Length of the whole file, trailer included.
    pub file_len: usize,
    /// The file's trailer (BLAKE3-256 of its metadata and block digests).
    pub trailer: [u8; 32],
}

/// A piece of a restored version (its chunks `dst..dst + count`) and the
/// stored chunks `src..` of `(rank, version)` that hold it, with the owner's
/// chunk count: the input of [`GpuDedup::locate_entries`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredRun {
    /// First chunk in the restored version.
    pub dst: u64,
    /// Chunks.
    pub count: u64,
    /// First chunk in the holding file's numbering.
    pub src: u64,
    /// Rank of the holding file.
    pub rank: u32,
    /// Version of the holding file.
    pub version: u32,
    /// Chunks of that rank's buffer.
    pub owner_chunks: u64,
}

/// Words per run in `table_locate`'s packed run array.
const RUN_WORDS: usize = 5;

/// Runs packed as `table_locate` reads them, five words each (at
/// least one run's worth): made where the runs are found (the collective
/// step's thread, a restart's rebuild), so that moving the record's
/// entries is one upload and one launch.
#[derive(Debug, Default)]
pub struct PackedRuns {
    words: Vec<u64>,
    runs: usize,
}

impl PackedRuns {
    /// `n` runs, the i-th `run(i)`, packed by every core (no intermediate
    /// list: a restart's map may hold tens of millions of runs).
    pub fn pack(n: usize, run: impl Fn(usize) -> Result<StoredRun> + Sync) -> Result<Self> {
        use rayon::prelude::*;
        // Zeroed lazily by the allocator: the pages are first touched by
        // the cores writing them.
        let mut words = vec![0u64; n.max(1) * RUN_WORDS];
        words.par_chunks_mut(RUN_WORDS).take(n).enumerate().try_for_each(|(i, w)| {
            let r = run(i)?;
            if u64::from(r.rank) + 1 >= 1 << (58 - OWNER_SHIFT) {
                return Err(Error::Gpu(format!("rank {} exceeds what the GPU record can name", r.rank)));
            }
            w.copy_from_slice(&[
                r.dst,
                r.count,
                r.src,
                r.owner_chunks,
                u64::from(r.rank) | (u64::from(r.version) << 32),
            ]);
            Ok(())
        })?;
        Ok(PackedRuns { words, runs: n })
    }

    /// `runs`, packed.
    pub fn of(runs: &[StoredRun]) -> Result<Self> {
        Self::pack(runs.len(), |i| Ok(runs[i]))
    }

    /// How many runs.
    pub fn len(&self) -> usize {
        self.runs
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.runs == 0
    }
}

/// Where [`GpuDedup::compute`] left a file in pinned memory.
#[derive(Clone, Copy, Debug)]
pub struct Computed {
    /// Bytes of header, tables, bitmap, data and block digests.
    pub prefix_len: usize,
    /// Offset of the FIRST data.
    pub data_start: usize,
    /// Bytes of FIRST data.
    pub data_len: usize,
    /// Device-side times.
    pub timings: GpuTimings,
}

/// A version computed on the device whose file has not crossed to the host
/// yet ([`GpuDedup::prepare`], [`GpuDedup::finish`], which must follow
/// before the input changes: a version stored whole is copied from it).
pub(crate) struct Prepared {
    /// Bytes of the file up to its trailer.
    pub prefix_len: usize,
    /// Offset of the FIRST data.
    pub data_start: usize,
    /// Bytes of FIRST data.
    pub data_len: usize,
    /// The device wrote a repeat node's entry without merging its first or
    /// last copy into a neighbouring run as the CPU's encoder does: the
    /// file must be folded (`regions::Rewrite::folding`) to be the CPU's.
    pub repeats: bool,
    /// The file's pieces, in order.
    pieces: Vec<Piece>,
    /// Recorded at the start, after the H2D, after the de-duplication.
    events: [CudaEvent; 3],
}

impl Prepared {
    /// Whether the version is stored whole (dense, or over a bound): a
    /// baseline, its data the input itself.
    pub(crate) fn stored_whole(&self) -> bool {
        matches!(self.pieces.as_slice(), [Piece::Host(_), Piece::Device(..), Piece::Device(..)])
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").field("prefix_len", &self.prefix_len).field("data_len", &self.data_len).finish()
    }
}

/// A piece of a prepared file: bytes the host wrote, or a span of device
/// memory (the output buffer, or the input of a version stored whole) that
/// stays valid until the stream is synchronized.
enum Piece {
    Host(Vec<u8>),
    Device(DevAddr, usize),
}

/// Where [`GpuDedup::finish`] copies a file.
pub(crate) enum Dest<'a, 'b> {
    /// The dedup's own pinned buffer ([`GpuDedup::pinned_prefix`]).
    Pinned,
    /// Consecutive host buffers (a page-locked cache's segments).
    Buffers(&'a mut [&'b mut [u8]]),
}

/// How [`GpuDedup::run_pipeline`] ended.
enum Run {
    /// Most chunks changed: the version is stored whole (only the leaf pass ran).
    Dense,
    /// The record would overfill (only the label stages ran).
    Overflow,
    /// Too many regions, or a file larger than the output buffer.
    OverBound,
    /// Labels and record done, and (with `emit`) the file is in the output
    /// buffer; the counters as they ended.
    Ready([u64; COUNTERS]),
}

/// What [`GpuDedup::prepare_with`] got to.
enum Step {
    /// Stopped before the file (no emit).
    Done(Computed),
    /// The file is ready on the device.
    Prepared(Prepared),
}

/// Bytes of data per integrity block digest (docs/FORMAT.md).
const BLOCK_SIZE: u64 = 65536;

/// Bits of a node index in a device record slot; the bits above it (below
/// the level) hold the owner rank + 1 of entries that point at another
/// rank's copy (kernels/dedup.cu, `node_owner_plus1`).
const OWNER_SHIFT: u32 = 40;

/// Kernel codes of the digest algorithms.
fn algo_code(hash: HashAlgo) -> Result<i32> {
    match hash {
        HashAlgo::Murmur3 => Ok(1),
        HashAlgo::Xxh3 => Ok(2),
        HashAlgo::Blake3 => Ok(3),
        HashAlgo::Sha1 => Err(Error::Gpu("the CUDA backend supports murmur3, xxh3 and blake3, not sha1".into())),
    }
}

/// Counter slots shared by the kernels.
const C_CHANGED: usize = 0;
const C_ROOTS: usize = 1;
const C_FIRST_RUNS: usize = 2;
const C_SHIFT_RUNS: usize = 3;
const C_DATA: usize = 4;
const C_FIRST_ROOTS: usize = 5;
const C_BLOCKS: usize = 6;
/// Set when some root is a repeat node (`root_info`; the file is v3).
const C_REPEATS: usize = 7;
const COUNTERS: usize = 8;

struct DeviceTable {
    /// `struct Slot` of dedup.cu: klo, khi, node, (ver | flags << 32); 4 words a slot.
    slots: CudaSlice<u64>,
    /// [live entries, overflow flag (low 32 bits)].
    stats: CudaSlice<u64>,
    cap: usize,
}

impl DeviceTable {
    fn new(gpu: &Gpu, cap: usize) -> Result<Self> {
        let s = &gpu.stream;
        Ok(DeviceTable {
            slots: s.alloc_zeros(4 * cap).map_err(gpu_oom)?,
            stats: s.alloc_zeros(2).map_err(gpu_oom)?,
            cap,
        })
    }

    fn limit(&self) -> u64 {
        (self.cap as u64 / 4) * 3
    }

    fn args(&self, gpu: &Gpu) -> Result<TableArgs> {
        TableArgs::new(&self.slots, &self.stats, self.cap, self.limit(), &gpu.stream)
    }
}

fn gpu_oom(e: impl std::fmt::Display) -> Error {
    Error::Gpu(format!("device memory: {e}"))
}

fn blocks(n: u64, per: u64) -> u32 {
    n.div_ceil(per).max(1) as u32
}

fn cfg(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

/// Per-chunk scratch (`changed`, `root_at`, `ballots`, `block_counts`,
/// `tile_sums`) and per-region scratch (the rest: one entry per region or
/// run, [`DevicePlan::root_cap`] of them).
struct Scratch {
    changed: CudaSlice<u64>,
    root_at: CudaSlice<u8>,
    roots: CudaSlice<u64>,
    kind: CudaSlice<u8>,
    count: CudaSlice<u64>,
    src_ver: CudaSlice<u64>,
    src_start: CudaSlice<u64>,
    first_flag: CudaSlice<u64>,
    bytes: CudaSlice<u64>,
    first_head: CudaSlice<u64>,
    shift_head: CudaSlice<u64>,
    first_id: CudaSlice<u64>,
    shift_id: CudaSlice<u64>,
    first_rank: CudaSlice<u64>,
    bytes_off: CudaSlice<u64>,
    run_end: CudaSlice<u64>,
    fr_start: CudaSlice<u64>,
    fr_off: CudaSlice<u64>,
    ballots: CudaSlice<u32>,
    block_counts: CudaSlice<u64>,
    tile_sums: CudaSlice<u64>,
}

/// A rank's de-duplication state on the GPU: the previous version's leaf
/// digests, the record as an open-addressing table, and reusable buffers
/// (device output buffer, pinned host buffer), all sized once by a
/// [`DevicePlan`] within one budget ([`GpuMemory`]); a version that would
/// exceed a part of it restarts the record or is stored whole
/// (`crate::dedup::limits`, the CPU engine's rule). The pinned buffer grows
/// on demand (pinned allocation is slow: ~1.8 GB/s on the H100 host), so
/// opening an engine does not pay for a whole-buffer copy that incremental
/// versions never need; once grown, checkpoints allocate nothing.
pub struct GpuDedup {
    gpu: Arc<Gpu>,
    layout: Layout,
    hash: HashAlgo,
    method: Method,
    rank: u32,
    level_off: Vec<u64>,
    level_len: Vec<u64>,
    nblocks: u64,
    staging: Option<CudaSlice<u8>>,
    prev: CudaSlice<u64>,
    has_prev: bool,
    lab: CudaSlice<u8>,
    dig: CudaSlice<u64>,
    sver: CudaSlice<u32>,
    snode: CudaSlice<u64>,
    level_off_dev: CudaSlice<u64>,
    s: Scratch,
    counters: CudaSlice<u64>,
    out: CudaSlice<u8>,
    pinned: Option<PinnedHostSlice<u8>>,
    /// Page-locked buffers the region digests are copied back into.
    digest_pool: DigestPool,
    /// The largest file a version can produce (the pinned buffer's cap).
    max_body: usize,
    table: DeviceTable,
    plan: DevicePlan,
    pending: Option<u32>,
    pending_dense: bool,
    /// What the bounds cost the pending version, and the committed ones.
    pending_bounds: BoundsHit,
    bounds_hit: BoundsHit,
    table_entries: u64,
    /// `table_entries` predates a commit whose count is still on the
    /// device (commit does not wait for the stream).
    entries_stale: bool,
    /// The GPU cache tier's arena, if the plan gives it room.
    cache: Option<Arc<DeviceCache>>,
}

fn length_error(len: usize, layout: Layout) -> Error {
    Error::size_mismatch("the buffer to checkpoint (the store's data length)", layout.data_len(), len as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(i: u64) -> StoredRun {
        StoredRun { dst: 10 * i, count: i + 1, src: 7 * i, rank: (i % 3) as u32, version: 4, owner_chunks: 1000 }
    }

    #[test]
    fn runs_pack_in_table_locates_layout() {
        let runs: Vec<StoredRun> = (0..1000).map(run).collect();
        let packed = PackedRuns::of(&runs).expect("pack");
        assert_eq!(packed.len(), 1000);
        for (r, w) in runs.iter().zip(packed.words.chunks(RUN_WORDS)) {
            assert_eq!(w, [r.dst, r.count, r.src, r.owner_chunks, u64::from(r.rank) | (4 << 32)]);
        }
        // None: one run's worth of zeros, so the upload is never empty.
        let none = PackedRuns::of(&[]).expect("pack");
        assert!(none.is_empty() && none.words == vec![0; RUN_WORDS]);
    }

    #[test]
    fn a_rank_the_record_cannot_name_is_refused() {
        let mut far = run(1);
        far.rank = u32::MAX;
        let err = PackedRuns::of(&[run(0), far]).expect_err("refused");
        assert!(err.to_string().contains("exceeds what the GPU record can name"), "{err}");
        let err = PackedRuns::pack(2, |i| match i {
            0 => Ok(run(0)),
            _ => Err(Error::InvalidOption("version 5000000000 too large".into())),
        })
        .expect_err("refused");
        assert!(err.to_string().contains("too large"), "{err}");
    }
}
