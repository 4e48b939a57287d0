//! The pipeline's state: allocation within the budget, the record table's
//! life (commit, rollback, reset, rebuild), and what it reports.

use super::*;

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

    /// The rank whose buffer this pipeline de-duplicates.
    pub fn rank(&self) -> u32 {
        self.rank
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

    pub(super) fn levels(&self) -> Result<LevelArgs> {
        LevelArgs::new(&self.lab, &self.dig, &self.sver, &self.snode, &self.gpu.stream)
    }

    pub(super) fn grid_stride(&self) -> LaunchConfig {
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
        let t = self.table.args(&self.gpu)?;
        let (me, n, nruns) = (self.rank, self.layout.chunks(), runs.len() as u64);
        self.gpu.k.table_locate(st, self.grid_stride(), t, version32, me, n, nruns, &runs_dev)?;
        // The count is read when asked for (`record_entries`) or by the next
        // version: the caller does not wait for the stream here.
        self.entries_stale = true;
        Ok(())
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

    pub(super) fn clear_table(&mut self) -> Result<()> {
        let st = self.gpu.stream.clone();
        st.memset_zeros(&mut self.table.slots).map_err(cuda_err)?;
        st.memset_zeros(&mut self.table.stats).map_err(cuda_err)?;
        self.table_entries = 0;
        self.entries_stale = false;
        Ok(())
    }

    pub(super) fn rollback_table(&mut self, version: u32) -> Result<()> {
        let t = self.table.args(&self.gpu)?;
        self.gpu.k.table_rollback(&self.gpu.stream, self.grid_stride(), t, version)?;
        // Clear the overflow flag.
        let mut stats = self.gpu.stream.clone_dtoh(&self.table.stats).map_err(cuda_err)?;
        stats[1] = 0;
        self.gpu.stream.memcpy_htod(&stats, &mut self.table.stats).map_err(cuda_err)?;
        self.table_entries = stats[0];
        self.entries_stale = false;
        Ok(())
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
        self.gpu.k.commit_leaves(&self.gpu.stream, self.grid_stride(), c, &self.s.changed, &self.dig, &self.prev)?;
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
}
