//! One rank's de-duplication state on the GPU and the launch sequence of a
//! checkpoint (kernels/dedup.cu explains each stage).

use super::device_cache::{DeviceCache, Staged};
use super::gathered::{DigestPool, GATHER_WORDS, GatheredDigests};
use super::{Gpu, LevelArgs, TableArgs, cuda_err};
use crate::backend::budget::{DevicePlan, GpuCache, GpuMemory, max_file_prefix};
use crate::dedup::{BoundsHit, Limits};
use crate::diff::{Diff, FirstRun, RegionEncoding};
use crate::format::{decode_body, encode_meta, trailer_of};
use crate::hash::Digest;
use crate::layout::{Layout, NodeId};
use crate::memory::Protected;
use crate::{Error, HashAlgo, Method, Result};
use cudarc::driver::{CudaEvent, CudaSlice, DevicePtr, LaunchConfig, PinnedHostSlice, PushKernelArg};
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
    Device(u64, usize),
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

/// Copies `pieces` into the consecutive buffers `bufs` on `st` (device
/// pieces asynchronously: the caller synchronizes before reading `bufs`);
/// zeroes what the pieces leave of `bufs`.
fn emit(st: &Arc<cudarc::driver::CudaStream>, pieces: &[Piece], bufs: &mut [&mut [u8]]) -> Result<()> {
    let (mut b, mut at) = (0usize, 0usize);
    for piece in pieces {
        let len = match piece {
            Piece::Host(v) => v.len(),
            Piece::Device(_, len) => *len,
        };
        let mut done = 0;
        while done < len {
            let buf =
                bufs.get_mut(b).ok_or_else(|| Error::Internal("the host buffers are shorter than the file".into()))?;
            let n = (len - done).min(buf.len() - at);
            let dst = &mut buf[at..at + n];
            match piece {
                Piece::Host(v) => dst.copy_from_slice(&v[done..done + n]),
                // SAFETY: `ptr + done .. ptr + done + n` lies in a device
                // span that stays valid until the stream is synchronized
                // (Piece's contract); `dst` is host memory borrowed for
                // longer than that, and the caller synchronizes the stream
                // before anything reads it.
                Piece::Device(ptr, _) => {
                    unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, *ptr + done as u64, st.cu_stream()) }
                        .map_err(cuda_err)?
                }
            }
            done += n;
            at += n;
            if at == buf.len() {
                (b, at) = (b + 1, 0);
            }
        }
    }
    for (i, buf) in bufs.iter_mut().enumerate().skip(b) {
        let from = if i == b { at } else { 0 };
        buf[from..].fill(0);
    }
    Ok(())
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

    fn args(&self, gpu: &Gpu) -> TableArgs {
        let stats = ptr(&self.stats, gpu);
        TableArgs {
            slots: ptr(&self.slots, gpu),
            mask: self.cap as u64 - 1,
            count: stats,
            overflow: stats + 8,
            limit: self.limit(),
        }
    }
}

fn gpu_oom(e: impl std::fmt::Display) -> Error {
    Error::Gpu(format!("device memory: {e}"))
}

fn ptr<T>(s: &CudaSlice<T>, gpu: &Gpu) -> u64 {
    s.device_ptr(&gpu.stream).0
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

impl GpuDedup {
    /// Allocates the state for a buffer of `layout` on `gpu` within the
    /// default budget.
    pub fn new(gpu: Arc<Gpu>, layout: Layout, hash: HashAlgo, method: Method, rank: u32) -> Result<Self> {
        Self::with_budget(gpu, layout, hash, method, rank, GpuMemory::default(), GpuCache::NONE)
    }

    /// Allocates the state for a buffer of `layout` on `gpu` within `budget`
    /// (all of it at once: a checkpoint allocates no device memory), with a
    /// GPU cache tier's arena as `cache` says (the asynchronous tiers use
    /// it, `GpuDedup::stage`; `GpuCache::NONE` for the synchronous path).
    pub fn with_budget(
        gpu: Arc<Gpu>,
        layout: Layout,
        hash: HashAlgo,
        method: Method,
        rank: u32,
        budget: GpuMemory,
        cache: GpuCache,
    ) -> Result<Self> {
        algo_code(hash)?;
        let plan = DevicePlan::new(layout, budget.bytes_for(layout.data_len()), cache)?;
        let n = layout.chunks();
        let r = plan.root_cap;
        if n >> OWNER_SHIFT != 0 {
            return Err(Error::Gpu(format!("{n} chunks exceed the GPU record's limit of 2^{OWNER_SHIFT}")));
        }
        let mut level_off = Vec::new();
        let mut level_len = Vec::new();
        let mut total = 0u64;
        for k in 0..layout.levels() {
            level_off.push(total);
            level_len.push(layout.level_len(k));
            total += layout.level_len(k);
        }
        let nblocks = n.div_ceil(256);
        let st = gpu.stream.clone();
        let z64 = |len: u64| st.alloc_zeros::<u64>(len.max(1) as usize).map_err(gpu_oom);
        let z8 = |len: u64| st.alloc_zeros::<u8>(len.max(1) as usize).map_err(gpu_oom);
        let s = Scratch {
            changed: z64(n)?,
            root_at: z8(n)?,
            roots: z64(r)?,
            kind: z8(r)?,
            count: z64(r)?,
            src_ver: z64(r)?,
            src_start: z64(r)?,
            first_flag: z64(r)?,
            bytes: z64(r)?,
            first_head: z64(r)?,
            shift_head: z64(r)?,
            first_id: z64(r)?,
            shift_id: z64(r)?,
            first_rank: z64(r)?,
            bytes_off: z64(r)?,
            run_end: z64(r)?,
            fr_start: z64(r)?,
            fr_off: z64(r)?,
            ballots: st.alloc_zeros::<u32>(n.div_ceil(32).max(1) as usize).map_err(gpu_oom)?,
            block_counts: z64(nblocks)?,
            tile_sums: z64(n.div_ceil(1024) + 1)?,
        };
        let max_body = max_file_prefix(layout);
        let table = DeviceTable::new(&gpu, plan.record_slots as usize)?;
        let level_off_dev = st.clone_htod(&level_off).map_err(cuda_err)?;
        let cache = match plan.cache_bytes {
            0 => None,
            bytes => Some(DeviceCache::new(&gpu, bytes)?),
        };
        Ok(GpuDedup {
            cache,
            layout,
            hash,
            method,
            rank,
            nblocks,
            staging: None,
            prev: z64(2 * n)?,
            has_prev: false,
            lab: z8(total)?,
            dig: z64(2 * total)?,
            sver: st.alloc_zeros::<u32>(total.max(1) as usize).map_err(gpu_oom)?,
            snode: z64(total)?,
            level_off_dev,
            s,
            counters: z64(COUNTERS as u64)?,
            out: z8(plan.out_bytes)?,
            pinned: None,
            digest_pool: DigestPool::default(),
            max_body: max_body as usize,
            table,
            plan,
            pending: None,
            pending_dense: false,
            pending_bounds: BoundsHit::default(),
            bounds_hit: BoundsHit::default(),
            table_entries: 0,
            entries_stale: false,
            level_off,
            level_len,
            gpu,
        })
    }

    /// The layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The de-duplication method.
    pub fn method(&self) -> Method {
        self.method
    }

    /// The device this pipeline runs on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Entries in the device record (after a commit, read off the device:
    /// this waits for the stream).
    pub fn record_entries(&self) -> u64 {
        match self.entries_stale.then(|| self.gpu.stream.clone_dtoh(&self.table.stats)) {
            Some(Ok(stats)) => stats[0],
            _ => self.table_entries,
        }
    }

    /// Bytes of device memory the record table occupies.
    pub fn record_bytes(&self) -> u64 {
        self.table.cap as u64 * crate::backend::budget::SLOT_BYTES
    }

    /// Where the budget went.
    pub fn plan(&self) -> DevicePlan {
        self.plan
    }

    /// The bounds every version is checked against (give them to the CPU
    /// engine, [`crate::dedup::DedupState::with_limits`], for the same files).
    pub fn limits(&self) -> Limits {
        self.plan.limits()
    }

    /// What the bounds cost the committed versions so far.
    pub fn bounds_hit(&self) -> BoundsHit {
        self.bounds_hit
    }

    fn levels(&self) -> LevelArgs {
        LevelArgs {
            lab: ptr(&self.lab, &self.gpu),
            dig: ptr(&self.dig, &self.gpu),
            sver: ptr(&self.sver, &self.gpu),
            snode: ptr(&self.snode, &self.gpu),
        }
    }

    fn grid_stride(&self) -> LaunchConfig {
        cfg(self.gpu.sms * 8, 256)
    }

    /// Rebuilds the state after a reopen from `data` (host or device
    /// memory), the restored bytes of committed version `latest`, in two
    /// steps: this one baseline pass of the pipeline without output (the
    /// previous leaves, and the entries a baseline inserts), then
    /// [`GpuDedup::locate_entries`] with where the bytes are stored (which
    /// the caller may work out meanwhile). Returns whether any entry needs
    /// locating. Same record as the CPU's.
    pub fn rebuild_pass(&mut self, latest: u64, data: Protected<'_>) -> Result<bool> {
        if self.method == Method::Full {
            return Ok(false);
        }
        {
            let _span = crate::profile::Span::new("rebuild-pass", latest);
            self.compute_with(latest, data, true, false)?;
            self.commit()?;
        }
        // The upload buffer was for the restored bytes; applications that
        // checkpoint device buffers never need it.
        self.staging = None;
        Ok(self.method.uses_record() && self.record_entries() > 0)
    }

    /// Moves every live entry that `version` inserted to where its node's
    /// bytes are stored per `runs` (this version's chunks `dst..dst + count`
    /// are chunks `src..` of `(rank, version)`, sorted by `dst`, covering
    /// every chunk an entry may name), or drops it when its node is not one
    /// aligned node of the same shape there: the rule of `engine::rebuild`'s
    /// `locate` and of `regions::relocate`, on the device (`table_locate`).
    pub fn locate_entries(&mut self, version: u64, runs: &PackedRuns) -> Result<()> {
        let version32 =
            u32::try_from(version).map_err(|_| Error::InvalidOption(format!("version {version} too large")))?;
        // One upload of the packed runs (table_locate's layout).
        let st = &self.gpu.stream;
        let runs_dev = st.clone_htod(&runs.words).map_err(cuda_err)?;
        let t = self.table.args(&self.gpu);
        let (me, n, nruns) = (self.rank, self.layout.chunks(), runs.len() as u64);
        let mut b = st.launch_builder(&self.gpu.k.table_locate);
        b.arg(&t).arg(&version32).arg(&me).arg(&n).arg(&nruns).arg(&runs_dev);
        // SAFETY: arguments follow table_locate's signature; `runs_dev` holds
        // RUN_WORDS words for each of the `nruns` runs (at least one run's
        // worth) and is freed in stream order after the launch (cudarc's
        // drop waits for its event).
        unsafe { b.launch(self.grid_stride()) }.map_err(cuda_err)?;
        // The count is read when asked for (`record_entries`) or by the next
        // version: the caller does not wait for the stream here.
        self.entries_stale = true;
        Ok(())
    }

    /// Exclusive scan `input` → `output` of `counters[n_slot]` elements (at
    /// most `upper`); the total goes to `counters[total_slot]`.
    fn scan(
        &self,
        input: &CudaSlice<u64>,
        output: &CudaSlice<u64>,
        n_slot: usize,
        upper: u64,
        total_slot: usize,
    ) -> Result<()> {
        let st = &self.gpu.stream;
        let k = &self.gpu.k;
        let n_ptr = self.counters.slice(n_slot..n_slot + 1);
        let total = self.counters.slice(total_slot..total_slot + 1);
        let tiles = blocks(upper, 1024).min(self.gpu.sms * 2);
        let mut b = st.launch_builder(&k.scan_tiles);
        b.arg(input).arg(output).arg(&n_ptr).arg(&self.s.tile_sums);
        // SAFETY: kernel signatures match; all buffers are owned by self.
        unsafe { b.launch(cfg(tiles, 1024)) }.map_err(cuda_err)?;
        let mut b = st.launch_builder(&k.scan_sums);
        b.arg(&self.s.tile_sums).arg(&n_ptr).arg(&total);
        // SAFETY: as above.
        unsafe { b.launch(cfg(1, 1024)) }.map_err(cuda_err)?;
        let mut b = st.launch_builder(&k.scan_add);
        b.arg(output).arg(&n_ptr).arg(&self.s.tile_sums);
        // SAFETY: as above.
        unsafe { b.launch(cfg(tiles, 1024)) }.map_err(cuda_err)?;
        Ok(())
    }

    /// Computes checkpoint `version` of `input` (a baseline ignores history).
    /// The state changes become permanent with [`GpuDedup::commit`] and are
    /// undone by [`GpuDedup::rollback`].
    pub fn checkpoint(&mut self, version: u64, input: Protected<'_>, baseline: bool) -> Result<GpuCheckpoint> {
        let c = self.compute(version, input, baseline)?;
        self.decoded(c)
    }

    /// The checkpoint whose file [`GpuDedup::compute`] left in pinned memory.
    fn decoded(&self, c: Computed) -> Result<GpuCheckpoint> {
        let host = &self.pinned_host()?[..c.prefix_len];
        let data_end = c.data_start + c.data_len;
        let (_, diff, _) =
            decode_body(&host[..data_end]).map_err(|e| Error::Gpu(format!("the GPU produced an invalid diff: {e}")))?;
        let trailer = trailer_of(&host[..c.data_start], &host[data_end..]);
        Ok(GpuCheckpoint {
            diff,
            timings: c.timings,
            d2h_bytes: c.prefix_len as u64,
            data_start: c.data_start,
            file_len: c.prefix_len + 32,
            trailer,
        })
    }

    /// The file of checkpoint `cp` up to its trailer, in pinned memory (the
    /// last computation's; a later one overwrites it).
    pub fn file_prefix(&self, cp: &GpuCheckpoint) -> Result<&[u8]> {
        self.pinned_prefix(cp.file_len)
    }

    /// The last computed file of `file_len` bytes, up to its trailer.
    pub fn pinned_prefix(&self, file_len: usize) -> Result<&[u8]> {
        let host = self.pinned_host()?;
        host.get(..file_len.saturating_sub(32)).ok_or_else(|| Error::Internal("GPU file prefix".into()))
    }

    /// The whole file of checkpoint `cp` as a vector (a copy).
    pub fn file_vec(&self, cp: &GpuCheckpoint) -> Result<Vec<u8>> {
        let mut v = Vec::with_capacity(cp.file_len);
        v.extend_from_slice(self.file_prefix(cp)?);
        v.extend_from_slice(&cp.trailer);
        Ok(v)
    }

    /// Makes the pinned buffer hold at least `len` bytes (growing by half
    /// again, at most to the largest possible file).
    fn ensure_pinned(&mut self, len: usize) -> Result<()> {
        let cap = self.pinned.as_ref().map_or(0, PinnedHostSlice::len);
        if cap >= len {
            return Ok(());
        }
        let want = len.max(cap + cap / 2).min(self.max_body.max(len));
        self.pinned = None; // free before allocating the larger one
        // SAFETY: the allocation is zero-filled below before any slice of it
        // is read (cudarc returns it uninitialized).
        let mut p = unsafe { self.gpu.ctx.alloc_pinned_with_flags::<u8>(want, 0) }.map_err(gpu_oom)?;
        p.as_mut_slice().map_err(cuda_err)?.fill(0);
        self.pinned = Some(p);
        Ok(())
    }

    fn pinned_host(&self) -> Result<&[u8]> {
        match &self.pinned {
            Some(p) => p.as_slice().map_err(cuda_err),
            None => Ok(&[]),
        }
    }

    /// The device address of the protected bytes: the application's region
    /// (checked to lie inside one allocation of this device) or the staging
    /// buffer a host input was uploaded into.
    fn input_ptr(&self, input: Protected<'_>) -> Result<u64> {
        match input {
            Protected::Device(d) => {
                if d.len() as u64 != self.layout.data_len() {
                    return Err(length_error(d.len(), self.layout));
                }
                super::check_region(&self.gpu, &d)?;
                Ok(d.ptr())
            }
            Protected::Host(_) => {
                self.staging.as_ref().map(|s| ptr(s, &self.gpu)).ok_or_else(|| Error::Gpu("no staging buffer".into()))
            }
        }
    }

    /// Launches the block-digest kernel over `len` bytes at device address
    /// `data`, writing `32 * ceil(len / 64 KiB)` bytes at `out`.
    fn launch_block_digests(&self, data: u64, len: u64, out: u64) -> Result<()> {
        let blocks = len.div_ceil(BLOCK_SIZE);
        if blocks == 0 {
            return Ok(());
        }
        let grid = blocks.div_ceil(4).min(u64::from(self.gpu.sms) * 16) as u32;
        let mut b = self.gpu.stream.launch_builder(&self.gpu.k.block_digests);
        b.arg(&data).arg(&len).arg(&out);
        // SAFETY: `data..data + len` and `out..out + 32 * blocks` lie inside
        // device buffers owned by self (or the caller's input) for the launch,
        // which the stream orders before the D2H that reads them.
        unsafe { b.launch(cfg(grid, 128)) }.map(|_| ()).map_err(cuda_err)
    }

    /// Like [`GpuDedup::checkpoint`] but leaves the serialized body in the
    /// pinned host buffer: returns `(body bytes, data start, timings)`.
    /// This is the part a checkpoint blocks the application for.
    pub fn compute(&mut self, version: u64, input: Protected<'_>, baseline: bool) -> Result<Computed> {
        self.compute_with(version, input, baseline, true)
    }

    /// [`GpuDedup::compute`]; without `emit`, stops once the labels and the
    /// record are computed (no digests, no D2H: what a rebuild needs).
    fn compute_with(&mut self, version: u64, input: Protected<'_>, baseline: bool, emit: bool) -> Result<Computed> {
        match self.prepare_with(version, input, baseline, emit)? {
            Step::Done(c) => Ok(c),
            Step::Prepared(p) => self.finish(p, Dest::Pinned),
        }
    }

    /// Computes checkpoint `version` of `input` on the device, up to the
    /// copy of its file to the host: [`GpuDedup::finish`] copies it (into
    /// any host buffers). The version is pending from here.
    pub(crate) fn prepare(&mut self, version: u64, input: Protected<'_>, baseline: bool) -> Result<Prepared> {
        match self.prepare_with(version, input, baseline, true)? {
            Step::Prepared(p) => Ok(p),
            Step::Done(_) => Err(Error::Internal("a prepared version was computed to the end".into())),
        }
    }

    /// The device stages of [`GpuDedup::compute_with`].
    fn prepare_with(&mut self, version: u64, input: Protected<'_>, baseline: bool, emit: bool) -> Result<Step> {
        let version32 = u32::try_from(version).map_err(|_| {
            Error::InvalidOption(format!("version {version} exceeds the supported maximum {}", u32::MAX))
        })?;
        if self.pending.is_some() {
            self.rollback()?;
        }
        let st = self.gpu.stream.clone();
        let ev = |s: &Arc<cudarc::driver::CudaStream>| {
            s.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda_err)
        };
        let e0 = ev(&st)?;
        if let Protected::Host(bytes) = input {
            if bytes.len() as u64 != self.layout.data_len() {
                return Err(length_error(bytes.len(), self.layout));
            }
            if self.staging.is_none() {
                self.staging = Some(st.alloc_zeros::<u8>(bytes.len()).map_err(gpu_oom)?);
            }
            if let Some(stg) = self.staging.as_ref() {
                // The staging buffer is the pipeline's own, read only by the
                // kernels queued after this copy on `st`; the call returns
                // after those kernels, so `bytes` outlives the copy.
                self.gpu.upload_to(&st, bytes, stg.device_ptr(&st).0)?;
            }
        }
        let e1 = ev(&st)?;
        let data_ptr = self.input_ptr(input)?;
        if self.method == Method::Full {
            return self.prepare_whole(version, data_ptr, [e0, e1]).map(Step::Prepared);
        }
        if baseline {
            self.clear_table()?;
            self.has_prev = false;
        }
        self.pending_bounds = BoundsHit::default();
        let counters = loop {
            match self.run_pipeline(version32, data_ptr, baseline, emit)? {
                Run::Ready(counters) => break counters,
                // Most chunks changed (see dedup::is_dense).
                Run::Dense => {}
                Run::Overflow => {
                    // Undo this version's inserts; with older entries, forget
                    // them and label again (dedup::limits), else store whole.
                    self.rollback_table(version32)?;
                    if self.table_entries > 0 {
                        self.clear_table()?;
                        self.pending_bounds.record_restarts += 1;
                        continue;
                    }
                    self.pending_bounds.stored_whole += 1;
                }
                Run::OverBound => self.pending_bounds.stored_whole += 1,
            }
            self.pending = Some(version32);
            self.pending_dense = true;
            if !emit {
                // A rebuild: the record restarts empty; no file, no version to count.
                self.pending_bounds = BoundsHit::default();
                st.synchronize().map_err(cuda_err)?;
                let timings = timings(&e0, &e1, &e1, &e1)?;
                return Ok(Step::Done(Computed { prefix_len: 0, data_start: 0, data_len: 0, timings }));
            }
            return self.prepare_whole(version, data_ptr, [e0, e1]).map(Step::Prepared);
        };
        let e2 = ev(&st)?;
        if !emit {
            st.synchronize().map_err(cuda_err)?;
            self.pending = Some(version32);
            let timings = timings(&e0, &e1, &e2, &e2)?;
            return Ok(Step::Done(Computed { prefix_len: 0, data_start: 0, data_len: 0, timings }));
        }
        let (data_start, data_len) = self.file_extent(&counters);
        let body_len = data_start + data_len;
        let out_ptr = ptr(&self.out, &self.gpu);
        self.launch_block_digests(out_ptr + data_start, data_len, out_ptr + body_len)?;
        let prefix_len = (body_len + 32 * data_len.div_ceil(BLOCK_SIZE)) as usize;
        self.pending = Some(version32);
        Ok(Step::Prepared(Prepared {
            prefix_len,
            data_start: data_start as usize,
            data_len: data_len as usize,
            repeats: counters[C_REPEATS] != 0,
            pieces: vec![Piece::Device(out_ptr, prefix_len)],
            events: [e0, e1, e2],
        }))
    }

    /// A version stored whole: its header and one FIRST run (written by the
    /// host), the data straight from the input, and the block digests of
    /// the input (computed into the otherwise unused output buffer).
    fn prepare_whole(&mut self, version: u64, src: u64, [e0, e1]: [CudaEvent; 2]) -> Result<Prepared> {
        let st = self.gpu.stream.clone();
        let meta = whole_meta(self.rank, self.layout, self.hash, self.method, version);
        let len = self.layout.data_len() as usize;
        let digests = 32 * (len as u64).div_ceil(BLOCK_SIZE) as usize;
        let e2 = st.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda_err)?;
        let out = ptr(&self.out, &self.gpu);
        self.launch_block_digests(src, len as u64, out)?;
        Ok(Prepared {
            prefix_len: meta.len() + len + digests,
            data_start: meta.len(),
            data_len: len,
            repeats: false,
            pieces: vec![Piece::Host(meta), Piece::Device(src, len), Piece::Device(out, digests)],
            events: [e0, e1, e2],
        })
    }

    /// Copies a prepared version's file to the host (into the pinned
    /// buffer, or into `dest`'s buffers, which must hold at least its
    /// prefix; what follows it is zeroed) and waits for the device.
    pub(crate) fn finish(&mut self, p: Prepared, dest: Dest<'_, '_>) -> Result<Computed> {
        let st = self.gpu.stream.clone();
        let copied = match dest {
            Dest::Pinned => {
                self.ensure_pinned(p.prefix_len)?;
                let host = match &mut self.pinned {
                    Some(pinned) => pinned.as_mut_slice().map_err(cuda_err)?,
                    None => return Err(Error::Internal("pinned buffer".into())),
                };
                emit(&st, &p.pieces, &mut [&mut host[..p.prefix_len]])
            }
            Dest::Buffers(bufs) => emit(&st, &p.pieces, bufs),
        };
        if let Err(e) = copied {
            // Copies already queued must end before the buffers go back.
            let _ = st.synchronize();
            return Err(e);
        }
        let e3 = st.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda_err)?;
        st.synchronize().map_err(cuda_err)?;
        let [e0, e1, e2] = &p.events;
        Ok(Computed {
            prefix_len: p.prefix_len,
            data_start: p.data_start,
            data_len: p.data_len,
            timings: timings(e0, e1, e2, &e3)?,
        })
    }

    /// [`GpuDedup::finish`] into host buffers without waiting for the copy,
    /// when the file lies in dckpt's own device memory (the output buffer):
    /// waits for the kernels (the input may change once this returns),
    /// starts the D2H and returns the wait for it, which must run before the
    /// buffers are read or reused (the stream's next launches follow the
    /// copy). A file that reads the input (a version stored whole) is copied
    /// before this returns (`None`).
    pub(crate) fn finish_async(
        &mut self,
        p: Prepared,
        bufs: &mut [&mut [u8]],
    ) -> Result<(Computed, Option<crate::backend::Ready>)> {
        let out = ptr(&self.out, &self.gpu);
        if p.pieces.iter().any(|piece| !matches!(piece, Piece::Device(at, _) if *at == out)) {
            return Ok((self.finish(p, Dest::Buffers(bufs))?, None));
        }
        let st = self.gpu.stream.clone();
        let [e0, e1, e2] = &p.events;
        e2.synchronize().map_err(cuda_err)?;
        let started = emit(&st, &p.pieces, bufs).and_then(|()| {
            st.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC)).map_err(cuda_err)
        });
        let done = match started {
            Ok(done) => done,
            Err(e) => {
                // Nothing may still write into buffers the caller takes back.
                let _ = st.synchronize();
                return Err(e);
            }
        };
        let computed = Computed {
            prefix_len: p.prefix_len,
            data_start: p.data_start,
            data_len: p.data_len,
            // The D2H overlaps the application: not part of the call.
            timings: timings(e0, e1, e2, e2)?,
        };
        Ok((computed, Some(Box::new(move || done.synchronize().map_err(cuda_err)))))
    }

    /// Moves a prepared file into the GPU cache tier's arena (one
    /// device-to-device copy, in the stream's order after the kernels) once
    /// the kernels are done, so that the application's buffer may change
    /// again and the next version may reuse the output buffer at once; its
    /// copy to the host is then [`Staged::copy_out`], on the arena's own
    /// stream. Gives `p` back where there is no arena, no room in it, or the
    /// file is not all in the output buffer (a version stored whole).
    pub(crate) fn stage(&mut self, p: Prepared) -> Result<std::result::Result<(Computed, Staged), Prepared>> {
        let out = ptr(&self.out, &self.gpu);
        let (Some(cache), [Piece::Device(at, len)]) = (&self.cache, p.pieces.as_slice()) else { return Ok(Err(p)) };
        if *at != out || *len as u64 > cache.capacity() {
            return Ok(Err(p));
        }
        let [e0, e1, e2] = &p.events;
        e2.synchronize().map_err(cuda_err)?;
        let Some(staged) = cache.stage(&self.gpu.stream, out, *len)? else { return Ok(Err(p)) };
        let computed = Computed {
            prefix_len: p.prefix_len,
            data_start: p.data_start,
            data_len: p.data_len,
            // The device copy runs after the call returns; the copy to the host overlaps the application.
            timings: timings(e0, e1, e2, e2)?,
        };
        Ok(Ok((computed, staged)))
    }

    /// [`GpuDedup::stage`] for the collective step, which rewrites the diff
    /// on the host: also decodes the file's metadata
    /// ([`GpuDedup::describe`]); the FIRST data and block digests stay in
    /// the arena.
    pub(crate) fn stage_for_collective(
        &mut self,
        p: Prepared,
    ) -> Result<std::result::Result<(Computed, Staged, Diff), Prepared>> {
        // The metadata is read before the output buffer is staged (the next
        // version's kernels are queued only after this call anyway).
        let diff = match p.pieces.as_slice() {
            [Piece::Device(..)] => self.describe(&p)?,
            _ => return Ok(Err(p)),
        };
        Ok(self.stage(p)?.map(|(computed, staged)| (computed, staged, diff)))
    }

    /// The diff a prepared file describes, decoded from its metadata
    /// (header, tables, bitmap: `data_start` bytes, small beside the data),
    /// which is copied to the host where the device wrote it; the data
    /// stays where it is.
    pub(crate) fn describe(&self, p: &Prepared) -> Result<Diff> {
        let copied;
        let meta = match p.pieces.first() {
            Some(Piece::Host(meta)) => meta.as_slice(),
            Some(&Piece::Device(at, _)) if at == ptr(&self.out, &self.gpu) => {
                let st = &self.gpu.stream;
                let mut meta = vec![0u8; p.data_start];
                st.memcpy_dtoh(&self.out.slice(0..p.data_start), &mut meta).map_err(cuda_err)?;
                st.synchronize().map_err(cuda_err)?;
                copied = meta;
                copied.as_slice()
            }
            Some(_) => return Err(Error::Internal("a prepared file of an unknown shape".into())),
            None => return Err(Error::Internal("a prepared file without pieces".into())),
        };
        crate::format::decode_meta(meta, p.data_len as u64)
            .map_err(|e| Error::Gpu(format!("the GPU produced an invalid diff: {e}")))
    }

    /// The device address of a prepared file's FIRST data (concatenated in
    /// run order): in the output buffer, or the input itself for a version
    /// stored whole. Valid until the next version is prepared.
    pub(crate) fn first_data_addr(&self, p: &Prepared) -> Result<u64> {
        match p.pieces.as_slice() {
            [Piece::Device(at, _)] => Ok(at + p.data_start as u64),
            [Piece::Host(_), Piece::Device(src, _), Piece::Device(..)] => Ok(*src),
            _ => Err(Error::Internal("a prepared file of an unknown shape".into())),
        }
    }

    /// Device-side times of a prepared file's computation (waits for its
    /// kernels; the copy out is not part of them).
    pub(crate) fn prepared_timings(&self, p: &Prepared) -> Result<GpuTimings> {
        let [e0, e1, e2] = &p.events;
        e2.synchronize().map_err(cuda_err)?;
        timings(e0, e1, e2, e2)
    }

    /// Merkle digests of byte spans in device memory, on the device: span
    /// `(addr, len)` is cut into chunks of the layout's size (the last may
    /// be short) and folded as [`crate::hash::subtree_digest`] folds them.
    /// The collective step's region digests where no tree holds them (a
    /// version stored whole). The spans must stay valid until this returns
    /// (it waits for the device).
    pub(crate) fn hash_spans(&self, spans: &[(u64, u64)]) -> Result<Vec<Digest>> {
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        let st = &self.gpu.stream;
        let addr: Vec<u64> = spans.iter().map(|s| s.0).collect();
        let len: Vec<u64> = spans.iter().map(|s| s.1).collect();
        let addr_dev = st.clone_htod(&addr).map_err(cuda_err)?;
        let len_dev = st.clone_htod(&len).map_err(cuda_err)?;
        let mut out = st.alloc_zeros::<u64>(2 * spans.len()).map_err(gpu_oom)?;
        let (count, cs, algo) = (spans.len() as u64, self.layout.chunk_size(), algo_code(self.hash)?);
        let mut b = st.launch_builder(&self.gpu.k.region_digests);
        b.arg(&addr_dev).arg(&len_dev).arg(&count).arg(&cs).arg(&algo).arg(&mut out);
        // SAFETY: arguments follow region_digests' signature; `addr_dev` and
        // `len_dev` hold `count` spans of device memory the caller keeps valid
        // until this returns, `out` 2 * count words; the copy below
        // synchronizes the stream. One warp per span.
        unsafe { b.launch(cfg(blocks(32 * count, 256).min(self.gpu.sms * 16), 256)) }.map_err(cuda_err)?;
        let words = st.clone_dtoh(&out).map_err(cuda_err)?;
        Ok(words.chunks_exact(2).map(|w| Digest(u128::from(w[0]) | (u128::from(w[1]) << 64))).collect())
    }

    /// Whether a GPU cache tier's arena exists (the collective path stages
    /// through it only then).
    pub(crate) fn has_device_cache(&self) -> bool {
        self.cache.is_some()
    }

    /// A prepared version's file copied to the pinned buffer, with its
    /// trailer (what the synchronous path writes; the diff it describes is
    /// already known, [`GpuDedup::describe`]).
    pub(crate) fn finish_pinned(&mut self, p: Prepared) -> Result<(Computed, [u8; 32])> {
        let c = self.finish(p, Dest::Pinned)?;
        let host = &self.pinned_host()?[..c.prefix_len];
        let data_end = c.data_start + c.data_len;
        Ok((c, trailer_of(&host[..c.data_start], &host[data_end..])))
    }

    /// The GPU cache tier's arena: its capacity and the bytes it holds now.
    pub fn device_cache_usage(&self) -> Option<(u64, u64)> {
        self.cache.as_ref().map(|c| (c.capacity(), c.in_use()))
    }

    /// Forgets all history (a new method or a fresh start).
    pub fn reset(&mut self, method: Method) -> Result<()> {
        self.pending = None;
        self.method = method;
        self.has_prev = false;
        self.clear_table()
    }

    fn clear_table(&mut self) -> Result<()> {
        let st = self.gpu.stream.clone();
        st.memset_zeros(&mut self.table.slots).map_err(cuda_err)?;
        st.memset_zeros(&mut self.table.stats).map_err(cuda_err)?;
        self.table_entries = 0;
        self.entries_stale = false;
        Ok(())
    }

    fn rollback_table(&mut self, version: u32) -> Result<()> {
        let t = self.table.args(&self.gpu);
        let mut b = self.gpu.stream.launch_builder(&self.gpu.k.table_rollback);
        b.arg(&t).arg(&version);
        // SAFETY: kernel signature matches; the table is owned by self.
        unsafe { b.launch(self.grid_stride()) }.map_err(cuda_err)?;
        // Clear the overflow flag.
        let mut stats = self.gpu.stream.clone_dtoh(&self.table.stats).map_err(cuda_err)?;
        stats[1] = 0;
        self.gpu.stream.memcpy_htod(&stats, &mut self.table.stats).map_err(cuda_err)?;
        self.table_entries = stats[0];
        self.entries_stale = false;
        Ok(())
    }

    /// The digests of `nodes` of pending version `version`'s tree, gathered
    /// on the device and copied back to page-locked memory in stream order
    /// (16 bytes and a flag per node cross the bus); nothing here waits for
    /// the device: [`GatheredDigests::wait`] does, on any thread. `None`
    /// where the device holds no such digests: another method than Tree, a
    /// dense version (its tree is not built), another version. A node that
    /// is not one of this version's FIRST subtrees has no digest in the
    /// result; the caller then hashes the regions' bytes where they lie
    /// ([`GpuDedup::hash_spans`]) or leaves it out; both give the same
    /// digests.
    pub(crate) fn node_digests(&self, version: u64, nodes: &[NodeId]) -> Result<Option<GatheredDigests>> {
        let current = u32::try_from(version).ok().is_some_and(|v| self.pending == Some(v));
        if self.method != Method::Tree || self.pending_dense || !current {
            return Ok(None);
        }
        let mut idx = Vec::with_capacity(nodes.len().max(1));
        for node in nodes {
            let (k, i) = (node.level() as usize, node.index());
            match (self.level_off.get(k), self.level_len.get(k)) {
                (Some(off), Some(&len)) if i < len => idx.push(off + i),
                _ => return Ok(None),
            }
        }
        let words = GATHER_WORDS * nodes.len();
        let mut host = self.digest_pool.take(words, &self.gpu)?;
        if nodes.is_empty() {
            return GatheredDigests::after(&self.gpu.stream, host, 0, self.digest_pool.clone()).map(Some);
        }
        let st = &self.gpu.stream;
        let idx_dev = st.clone_htod(&idx).map_err(cuda_err)?;
        // As long as the page-locked buffer: cudarc's copy moves the
        // destination's length.
        let mut out = st.alloc_zeros::<u64>(host.len()).map_err(gpu_oom)?;
        let count = nodes.len() as u64;
        let mut b = st.launch_builder(&self.gpu.k.gather_digests);
        b.arg(&self.dig).arg(&self.lab).arg(&idx_dev).arg(&count).arg(&mut out);
        // SAFETY: arguments follow gather_digests' signature; `idx_dev` holds
        // `count` indices below the node arrays' length (checked above), `out`
        // at least GATHER_WORDS * count words; `idx_dev` and `out` are freed in stream
        // order after the kernel and the copy (cudarc's drop waits for their
        // events).
        unsafe { b.launch(cfg(blocks(count, 256).min(self.gpu.sms * 8), 256)) }.map_err(cuda_err)?;
        st.memcpy_dtoh(&out, &mut host).map_err(cuda_err)?;
        GatheredDigests::after(st, host, nodes.len(), self.digest_pool.clone()).map(Some)
    }

    /// Where the FIRST data of the file the counters describe starts, and its length.
    fn file_extent(&self, counters: &[u64]) -> (u64, u64) {
        let wft = self.method != Method::Basic;
        let bitmap_len = if wft { 0 } else { self.layout.chunks().div_ceil(8) };
        let data_start =
            96 + if wft { 16 * counters[C_FIRST_RUNS] } else { 0 } + 40 * counters[C_SHIFT_RUNS] + bitmap_len;
        (data_start, counters[C_DATA])
    }

    /// Makes the last checkpoint's state permanent (after its file is durable).
    pub fn commit(&mut self) -> Result<()> {
        let dense = std::mem::take(&mut self.pending_dense);
        let bounds = std::mem::take(&mut self.pending_bounds);
        if self.pending.take().is_none() || self.method == Method::Full {
            return Ok(());
        }
        self.bounds_hit.record_restarts += bounds.record_restarts;
        self.bounds_hit.stored_whole += bounds.stored_whole;
        if dense {
            // A dense version is a baseline that adds nothing: the record restarts empty.
            self.clear_table()?;
        }
        let c = &self.counters;
        let mut b = self.gpu.stream.launch_builder(&self.gpu.k.commit_leaves);
        b.arg(c).arg(&self.s.changed).arg(&self.dig).arg(&self.prev);
        // SAFETY: kernel signature matches; buffers are owned by self.
        unsafe { b.launch(self.grid_stride()) }.map_err(cuda_err)?;
        self.has_prev = true;
        // The count is read when asked for (record_entries) or by the next
        // version: the application does not wait for the stream here (a
        // file may still be on its way to the host).
        self.entries_stale = true;
        Ok(())
    }

    /// Forgets the last checkpoint (its file could not be written).
    pub fn rollback(&mut self) -> Result<()> {
        self.pending_dense = false;
        self.pending_bounds = BoundsHit::default();
        if let Some(v) = self.pending.take() {
            self.rollback_table(v)?;
        }
        Ok(())
    }

    /// Launches one checkpoint's kernels, stopping where the version turns
    /// out dense or over a bound of the plan (checked on the host: one
    /// small read-back after the labels, one after the scans), or (without
    /// `emit`) once the labels and the record are done.
    fn run_pipeline(&mut self, version: u32, data_ptr: u64, baseline: bool, emit: bool) -> Result<Run> {
        let gpu = self.gpu.clone();
        let st = &gpu.stream;
        // DCKPT_GPU_PROFILE=1 prints the time of each stage (CUDA events) to stderr.
        // With DCKPT_GPU_PROFILE=sync, the context is synchronized first (the
        // wait shows whether other work was still running on the device), and
        // each stage's host time and the launching thread's context switches
        // are printed beside the device's.
        let profile_mode = std::env::var("DCKPT_GPU_PROFILE").ok();
        let profile = profile_mode.is_some();
        let mut pre_sync_ms = 0.0;
        if profile_mode.as_deref() == Some("sync") {
            let t = std::time::Instant::now();
            gpu.ctx.synchronize().map_err(cuda_err)?;
            pre_sync_ms = t.elapsed().as_secs_f64() * 1e3;
        }
        let sampler = (profile_mode.as_deref() == Some("threads"))
            .then(|| crate::profile::threads::ThreadSampler::start(crate::profile::threads::current_tid()));
        let mut marks: Vec<(&str, cudarc::driver::CudaEvent, std::time::Instant, [i64; 2])> = Vec::new();
        let mut mark = |name: &'static str| -> Result<()> {
            if profile {
                let e =
                    st.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda_err)?;
                marks.push((name, e, std::time::Instant::now(), thread_switches()));
            }
            Ok(())
        };
        mark("start")?;
        let k = &gpu.k;
        let n = self.layout.chunks();
        let cs = self.layout.chunk_size();
        let data_len = self.layout.data_len();
        let algo = algo_code(self.hash)?;
        let lv = self.levels();
        let t = self.table.args(&gpu);
        let tree = self.method == Method::Tree;
        let use_table = i32::from(self.method != Method::Basic);
        let coalesce = i32::from(self.method != Method::List);
        let wft = i32::from(self.method != Method::Basic);
        let bitmap_len = if wft == 1 { 0u64 } else { n.div_ceil(8) };
        let has_prev = i32::from(self.has_prev && !baseline);
        let mut init = [0u64; COUNTERS];
        init[C_BLOCKS] = self.nblocks;
        st.memcpy_htod(&init, &mut self.counters).map_err(cuda_err)?;
        {
            let mut lab0 = self.lab.slice_mut(0..n as usize);
            st.memset_zeros(&mut lab0).map_err(cuda_err)?;
        }
        st.memset_zeros(&mut self.s.root_at).map_err(cuda_err)?;
        let s = &self.s;
        let c = &self.counters;
        let dense = cfg(blocks(n, 256), 256);
        let gs = self.grid_stride();

        mark("init")?;
        // 1. Leaves: hash, compare, count, compact.
        let mut b = st.launch_builder(&k.leaf_pass[(algo - 1) as usize]);
        b.arg(&data_ptr).arg(&data_len).arg(&cs).arg(&n).arg(&self.prev).arg(&has_prev);
        b.arg(&self.dig).arg(&s.ballots).arg(&s.block_counts);
        // SAFETY (all launches below): arguments follow the kernels' signatures in
        // kernels/dedup.cu, and every buffer is owned by self for the stream's lifetime.
        unsafe { b.launch(dense) }.map_err(cuda_err)?;
        self.scan(&s.block_counts, &s.block_counts, C_BLOCKS, self.nblocks, C_CHANGED)?;
        let mut b = st.launch_builder(&k.compact_flags);
        b.arg(&s.ballots).arg(&s.block_counts).arg(&n).arg(&s.changed);
        unsafe { b.launch(dense) }.map_err(cuda_err)?;
        if has_prev == 1 {
            // One small read-back: whether most chunks changed (the cheap path then
            // skips everything below; costs a sync of ~10 µs otherwise).
            let mut m = [0u64; 1];
            st.memcpy_dtoh(&self.counters.slice(C_CHANGED..C_CHANGED + 1), &mut m).map_err(cuda_err)?;
            st.synchronize().map_err(cuda_err)?;
            if crate::dedup::is_dense(m[0], n) {
                return Ok(Run::Dense);
            }
        }

        mark("leaves")?;
        // 2. Labels.
        if use_table == 1 {
            let mut b = st.launch_builder(&k.insert_leaves);
            b.arg(c).arg(&s.changed).arg(&self.dig).arg(&t).arg(&version);
            unsafe { b.launch(gs) }.map_err(cuda_err)?;
        }
        let root_at_ptr = if tree { 0u64 } else { ptr(&s.root_at, &gpu) };
        let mut b = st.launch_builder(&k.label_leaves);
        b.arg(c).arg(&s.changed).arg(&self.dig).arg(&t).arg(&version).arg(&use_table).arg(&lv).arg(&root_at_ptr);
        unsafe { b.launch(gs) }.map_err(cuda_err)?;

        mark("labels")?;
        // 3. Algorithm 1's level passes.
        if tree {
            let top = self.level_len.len() - 1;
            for lvl in 0..top {
                let (ok, lk, ok1, lk1) =
                    (self.level_off[lvl], self.level_len[lvl], self.level_off[lvl + 1], self.level_len[lvl + 1]);
                let l1 = (lvl + 1) as u32;
                let mut b = st.launch_builder(&k.stage1);
                b.arg(&lv).arg(&ok).arg(&lk).arg(&ok1).arg(&lk1).arg(&l1).arg(&t).arg(&version).arg(&algo);
                unsafe { b.launch(cfg(blocks(lk1, 256), 256)) }.map_err(cuda_err)?;
            }
            for lvl in 0..top {
                let (ok, lk, ok1, lk1) =
                    (self.level_off[lvl], self.level_len[lvl], self.level_off[lvl + 1], self.level_len[lvl + 1]);
                let l0 = lvl as u32;
                let mut b = st.launch_builder(&k.stage2);
                b.arg(&lv).arg(&ok).arg(&lk).arg(&ok1).arg(&lk1).arg(&l0).arg(&t).arg(&algo).arg(&s.root_at).arg(&n);
                unsafe { b.launch(cfg(blocks(lk1, 256), 256)) }.map_err(cuda_err)?;
            }
            let (otop, top32) = (self.level_off[top], top as u32);
            let mut b = st.launch_builder(&k.top_root);
            b.arg(&lv).arg(&otop).arg(&top32).arg(&s.root_at);
            unsafe { b.launch(cfg(1, 32)) }.map_err(cuda_err)?;
        }

        mark("levels")?;
        // 4. Roots in chunk order (counted, then checked against the plan
        // with the record), then runs and tables.
        let mut b = st.launch_builder(&k.flag_ballot);
        b.arg(&s.root_at).arg(&n).arg(&s.ballots).arg(&s.block_counts);
        unsafe { b.launch(dense) }.map_err(cuda_err)?;
        self.scan(&s.block_counts, &s.block_counts, C_BLOCKS, self.nblocks, C_ROOTS)?;
        let limits = self.plan.limits();
        let stats = st.clone_dtoh(&self.table.stats).map_err(cuda_err)?;
        self.table_entries = stats[0];
        self.entries_stale = false;
        if stats[1] as u32 != 0 || limits.record_overflows(stats[0]) {
            return Ok(Run::Overflow);
        }
        if !emit {
            return Ok(Run::Ready([0; COUNTERS]));
        }
        let roots = self.read_counters()?[C_ROOTS];
        if roots > limits.roots {
            return Ok(Run::OverBound);
        }
        let root_cap = self.plan.root_cap;
        let mut b = st.launch_builder(&k.compact_flags);
        b.arg(&s.ballots).arg(&s.block_counts).arg(&n).arg(&s.roots);
        unsafe { b.launch(dense) }.map_err(cuda_err)?;
        let mut b = st.launch_builder(&k.root_info);
        b.arg(c).arg(&s.roots).arg(&s.root_at).arg(&lv).arg(&self.level_off_dev).arg(&n).arg(&cs).arg(&data_len);
        b.arg(&s.kind).arg(&s.count).arg(&s.src_ver).arg(&s.src_start).arg(&s.first_flag).arg(&s.bytes);
        unsafe { b.launch(gs) }.map_err(cuda_err)?;
        let mut b = st.launch_builder(&k.run_heads);
        b.arg(c).arg(&s.roots).arg(&s.kind).arg(&s.count).arg(&s.src_ver).arg(&s.src_start).arg(&coalesce);
        b.arg(&s.first_head).arg(&s.shift_head);
        unsafe { b.launch(gs) }.map_err(cuda_err)?;
        self.scan(&s.first_head, &s.first_id, C_ROOTS, root_cap, C_FIRST_RUNS)?;
        self.scan(&s.shift_head, &s.shift_id, C_ROOTS, root_cap, C_SHIFT_RUNS)?;
        self.scan(&s.bytes, &s.bytes_off, C_ROOTS, root_cap, C_DATA)?;
        self.scan(&s.first_flag, &s.first_rank, C_ROOTS, root_cap, C_FIRST_ROOTS)?;
        let counters = self.read_counters()?;
        let (first_start, first_len) = self.file_extent(&counters);
        if first_start + first_len + 32 * first_len.div_ceil(BLOCK_SIZE) > limits.file_prefix {
            return Ok(Run::OverBound);
        }
        mark("roots")?;
        let rank = self.rank;
        let mut b = st.launch_builder(&k.emit_runs);
        b.arg(c).arg(&s.roots).arg(&s.kind).arg(&s.count).arg(&s.src_ver).arg(&s.src_start);
        b.arg(&s.first_head).arg(&s.shift_head).arg(&s.first_id).arg(&s.shift_id).arg(&s.run_end).arg(&self.out);
        b.arg(&wft).arg(&rank);
        unsafe { b.launch(gs) }.map_err(cuda_err)?;
        let mut b = st.launch_builder(&k.finish_runs);
        b.arg(c).arg(&s.run_end).arg(&self.out).arg(&wft);
        unsafe { b.launch(gs) }.map_err(cuda_err)?;
        let mut b = st.launch_builder(&k.first_roots);
        b.arg(c).arg(&s.roots).arg(&s.kind).arg(&s.bytes_off).arg(&s.first_rank).arg(&s.fr_start).arg(&s.fr_off);
        unsafe { b.launch(gs) }.map_err(cuda_err)?;

        mark("runs")?;
        // 5. Serialize: bitmap, data, header.
        if bitmap_len > 0 {
            let mut b = st.launch_builder(&k.write_bitmap);
            b.arg(&s.ballots).arg(&bitmap_len).arg(&self.out);
            unsafe { b.launch(gs) }.map_err(cuda_err)?;
        }
        let mut b = st.launch_builder(&k.gather);
        b.arg(c).arg(&s.fr_start).arg(&s.fr_off).arg(&data_ptr).arg(&cs).arg(&self.out).arg(&wft).arg(&bitmap_len);
        unsafe { b.launch(gs) }.map_err(cuda_err)?;
        let (method, hash) = (u32::from(self.method.code()), u32::from(self.hash.code()));
        let flags = u32::from(baseline);
        let version64 = u64::from(version);
        let mut b = st.launch_builder(&k.write_header);
        b.arg(c).arg(&self.out).arg(&method).arg(&hash).arg(&flags).arg(&rank).arg(&cs).arg(&version64);
        b.arg(&data_len).arg(&bitmap_len).arg(&wft);
        unsafe { b.launch(cfg(1, 32)) }.map_err(cuda_err)?;
        mark("gather")?;
        if profile {
            st.synchronize().map_err(cuda_err)?;
            let mut line = format!("gpu-profile {} v{version}:", self.method);
            let mut host = String::from(" | host");
            for w in marks.windows(2) {
                line += &format!(" {} {:.3}", w[1].0, w[0].1.elapsed_ms(&w[1].1).map_err(cuda_err)?);
                let (vol, invol) = (w[1].3[0] - w[0].3[0], w[1].3[1] - w[0].3[1]);
                host += &format!(" {} {:.3}/{vol}v{invol}i", w[1].0, (w[1].2 - w[0].2).as_secs_f64() * 1e3);
            }
            eprintln!("{line} ms{host} pre-sync {pre_sync_ms:.3}");
            if let Some(sampler) = sampler {
                let samples = sampler.finish();
                for w in marks.windows(2) {
                    let inside = samples.iter().filter(|b| b.at >= w[0].2 && b.at < w[1].2).count();
                    if inside > 0 {
                        let seen = crate::profile::threads::summary(&samples, w[0].2, w[1].2);
                        eprintln!("gpu-threads v{version} {}: {seen}", w[1].0);
                    }
                }
            }
        }
        Ok(Run::Ready(counters))
    }

    /// The kernels' counters (waits for the stream).
    fn read_counters(&self) -> Result<[u64; COUNTERS]> {
        let mut c = [0u64; COUNTERS];
        self.gpu.stream.memcpy_dtoh(&self.counters, &mut c).map_err(cuda_err)?;
        self.gpu.stream.synchronize().map_err(cuda_err)?;
        Ok(c)
    }
}

/// The calling thread's voluntary and involuntary context switches so far
/// (for DCKPT_GPU_PROFILE; zeros where they cannot be read).
fn thread_switches() -> [i64; 2] {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointer it is given, which
    // points to a zeroed value of that type owned by this frame.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr()) };
    if rc != 0 {
        return [0, 0];
    }
    // SAFETY: zero-initialised and, with rc 0, filled by getrusage.
    let u = unsafe { u.assume_init() };
    [u.ru_nvcsw, u.ru_nivcsw]
}

/// Header and table of a version stored whole: a Full checkpoint, or a
/// dense one of another method (its data is one D2H copy).
fn whole_meta(rank: u32, layout: Layout, hash: HashAlgo, method: Method, version: u64) -> Vec<u8> {
    encode_meta(&Diff {
        version,
        rank,
        layout,
        hash,
        method,
        baseline: true,
        dense: method != Method::Full,
        first: vec![FirstRun { start: 0, count: layout.chunks() }],
        shift: Vec::new(),
        encoding: RegionEncoding::Table,
    })
}

fn timings(
    e0: &cudarc::driver::CudaEvent,
    e1: &cudarc::driver::CudaEvent,
    e2: &cudarc::driver::CudaEvent,
    e3: &cudarc::driver::CudaEvent,
) -> Result<GpuTimings> {
    Ok(GpuTimings {
        h2d_ms: e0.elapsed_ms(e1).map_err(cuda_err)?,
        dedup_ms: e1.elapsed_ms(e2).map_err(cuda_err)?,
        d2h_ms: e2.elapsed_ms(e3).map_err(cuda_err)?,
    })
}

fn length_error(len: usize, layout: Layout) -> Error {
    Error::InvalidOption(format!("buffer is {len} bytes but the store's layout is {} bytes", layout.data_len()))
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
