//! The de-duplication itself: one version's launches on the stream, from
//! the leaf pass to the serialized file in the output buffer.

use super::*;

impl GpuDedup {
    /// Exclusive scan `input` → `output` of `counters[n_slot]` elements (at
    /// most `upper`); the total goes to `counters[total_slot]`.
    pub(super) fn scan(
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
        k.scan_tiles(st, cfg(tiles, 1024), input, output, &n_ptr, &self.s.tile_sums)?;
        k.scan_sums(st, cfg(1, 1024), &self.s.tile_sums, &n_ptr, &total)?;
        k.scan_add(st, cfg(tiles, 1024), output, &n_ptr, &self.s.tile_sums)?;
        Ok(())
    }

    /// The device address of the protected bytes: the application's region
    /// (checked to lie inside one allocation of this device) or the staging
    /// buffer a host input was uploaded into.
    pub(super) fn input_ptr(&self, input: Protected<'_>) -> Result<DevAddr> {
        match input {
            Protected::Device(d) => {
                if d.len() as u64 != self.layout.data_len() {
                    return Err(length_error(d.len(), self.layout));
                }
                DevAddr::of_region(&self.gpu, &d)
            }
            Protected::Host(_) => self
                .staging
                .as_ref()
                .map(|s| DevAddr::of(s, &self.gpu.stream))
                .ok_or_else(|| Error::Gpu("no staging buffer".into())),
        }
    }

    /// Launches the block-digest kernel over `len` bytes at device address
    /// `data`, writing `32 * ceil(len / 64 KiB)` bytes at `out`.
    pub(super) fn launch_block_digests(&self, data: DevAddr, len: u64, out: DevAddr) -> Result<()> {
        let blocks = len.div_ceil(BLOCK_SIZE);
        if blocks == 0 {
            return Ok(());
        }
        let grid = blocks.div_ceil(4).min(u64::from(self.gpu.sms) * 16) as u32;
        let (data, out) = (data.spanning(len)?, out.spanning(32 * blocks)?);
        self.gpu.k.block_digests(&self.gpu.stream, cfg(grid, 128), data, len, out)
    }

    /// Like [`GpuDedup::checkpoint`] but leaves the serialized body in the
    /// pinned host buffer: returns `(body bytes, data start, timings)`.
    /// This is the part a checkpoint blocks the application for.
    pub fn compute(&mut self, version: u64, input: Protected<'_>, baseline: bool) -> Result<Computed> {
        self.compute_with(version, input, baseline, true)
    }

    /// [`GpuDedup::compute`]; without `emit`, stops once the labels and the
    /// record are computed (no digests, no D2H: what a rebuild needs).
    pub(super) fn compute_with(
        &mut self,
        version: u64,
        input: Protected<'_>,
        baseline: bool,
        emit: bool,
    ) -> Result<Computed> {
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
    pub(super) fn prepare_with(
        &mut self,
        version: u64,
        input: Protected<'_>,
        baseline: bool,
        emit: bool,
    ) -> Result<Step> {
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
                self.gpu.upload_to(&st, bytes, DevAddr::of(stg, &st), stg.len())?;
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
        let out_ptr = DevAddr::of(&self.out, &self.gpu.stream);
        self.launch_block_digests(out_ptr.add(data_start)?, data_len, out_ptr.add(body_len)?)?;
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
    pub(super) fn prepare_whole(&mut self, version: u64, src: DevAddr, [e0, e1]: [CudaEvent; 2]) -> Result<Prepared> {
        let st = self.gpu.stream.clone();
        let meta = whole_meta(self.rank, self.layout, self.hash, self.method, version);
        let len = self.layout.data_len() as usize;
        let digests = 32 * (len as u64).div_ceil(BLOCK_SIZE) as usize;
        let e2 = st.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda_err)?;
        let out = DevAddr::of(&self.out, &self.gpu.stream);
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

    /// Merkle digests of byte spans in device memory, on the device: span
    /// `(addr, len)` is cut into chunks of the layout's size (the last may
    /// be short) and folded as [`crate::hash::subtree_digest`] folds them.
    /// The collective step's region digests where no tree holds them (a
    /// version stored whole). The spans must stay valid until this returns
    /// (it waits for the device).
    pub(crate) fn hash_spans(&self, spans: &[(DevAddr, u64)]) -> Result<Vec<Digest>> {
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        let st = &self.gpu.stream;
        let addr: Vec<u64> = spans.iter().map(|s| s.0.get()).collect();
        let len: Vec<u64> = spans.iter().map(|s| s.1).collect();
        let addr_dev = st.clone_htod(&addr).map_err(cuda_err)?;
        let len_dev = st.clone_htod(&len).map_err(cuda_err)?;
        let mut out = st.alloc_zeros::<u64>(2 * spans.len()).map_err(gpu_oom)?;
        let (count, cs, algo) = (spans.len() as u64, self.layout.chunk_size(), algo_code(self.hash)?);
        // One warp per span; the copy below waits for the kernel.
        let grid = cfg(blocks(32 * count, 256).min(self.gpu.sms * 16), 256);
        self.gpu.k.region_digests(st, grid, &addr_dev, &len_dev, count, cs, algo, &mut out)?;
        let words = st.clone_dtoh(&out).map_err(cuda_err)?;
        Ok(words.chunks_exact(2).map(|w| Digest(u128::from(w[0]) | (u128::from(w[1]) << 64))).collect())
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
        self.gpu.k.gather_digests(
            st,
            cfg(blocks(count, 256).min(self.gpu.sms * 8), 256),
            &self.dig,
            &self.lab,
            &idx_dev,
            count,
            &mut out,
        )?;
        st.memcpy_dtoh(&out, &mut host).map_err(cuda_err)?;
        GatheredDigests::after(st, host, nodes.len(), self.digest_pool.clone()).map(Some)
    }

    /// Where the FIRST data of the file the counters describe starts, and its length.
    pub(super) fn file_extent(&self, counters: &[u64]) -> (u64, u64) {
        let wft = self.method != Method::Basic;
        let bitmap_len = if wft { 0 } else { self.layout.chunks().div_ceil(8) };
        let data_start =
            96 + if wft { 16 * counters[C_FIRST_RUNS] } else { 0 } + 40 * counters[C_SHIFT_RUNS] + bitmap_len;
        (data_start, counters[C_DATA])
    }

    /// Launches one checkpoint's kernels, stopping where the version turns
    /// out dense or over a bound of the plan (checked on the host: one
    /// small read-back after the labels, one after the scans), or (without
    /// `emit`) once the labels and the record are done.
    pub(super) fn run_pipeline(&mut self, version: u32, data_ptr: DevAddr, baseline: bool, emit: bool) -> Result<Run> {
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
                marks.push((name, e, std::time::Instant::now(), super::super::driver::thread_switches()));
            }
            Ok(())
        };
        mark("start")?;
        let k = &gpu.k;
        let n = self.layout.chunks();
        let cs = self.layout.chunk_size();
        let data_len = self.layout.data_len();
        let algo = algo_code(self.hash)?;
        let lv = self.levels()?;
        let t = self.table.args(&gpu)?;
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
        k.leaf_pass(
            algo,
            st,
            dense,
            data_ptr,
            data_len,
            cs,
            n,
            &self.prev,
            has_prev,
            &self.dig,
            &s.ballots,
            &s.block_counts,
        )?;
        self.scan(&s.block_counts, &s.block_counts, C_BLOCKS, self.nblocks, C_CHANGED)?;
        k.compact_flags(st, dense, &s.ballots, &s.block_counts, n, &s.changed)?;
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
            k.insert_leaves(st, gs, c, &s.changed, &self.dig, t, version)?;
        }
        let root_at_ptr = if tree { DevAddr::NULL } else { DevAddr::of(&s.root_at, st).spanning(n)? };
        k.label_leaves(st, gs, c, &s.changed, &self.dig, t, version, use_table, lv, root_at_ptr)?;

        mark("labels")?;
        // 3. Algorithm 1's level passes.
        if tree {
            let top = self.level_len.len() - 1;
            for lvl in 0..top {
                let (ok, lk, ok1, lk1) =
                    (self.level_off[lvl], self.level_len[lvl], self.level_off[lvl + 1], self.level_len[lvl + 1]);
                let l1 = (lvl + 1) as u32;
                k.stage1(st, cfg(blocks(lk1, 256), 256), lv, ok, lk, ok1, lk1, l1, t, version, algo)?;
            }
            for lvl in 0..top {
                let (ok, lk, ok1, lk1) =
                    (self.level_off[lvl], self.level_len[lvl], self.level_off[lvl + 1], self.level_len[lvl + 1]);
                let l0 = lvl as u32;
                k.stage2(st, cfg(blocks(lk1, 256), 256), lv, ok, lk, ok1, lk1, l0, t, algo, &s.root_at, n)?;
            }
            let (otop, top32) = (self.level_off[top], top as u32);
            k.top_root(st, cfg(1, 32), lv, otop, top32, &s.root_at)?;
        }

        mark("levels")?;
        // 4. Roots in chunk order (counted, then checked against the plan
        // with the record), then runs and tables.
        k.flag_ballot(st, dense, &s.root_at, n, &s.ballots, &s.block_counts)?;
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
        k.compact_flags(st, dense, &s.ballots, &s.block_counts, n, &s.roots)?;
        k.root_info(
            st,
            gs,
            c,
            &s.roots,
            &s.root_at,
            lv,
            &self.level_off_dev,
            n,
            cs,
            data_len,
            &s.kind,
            &s.count,
            &s.src_ver,
            &s.src_start,
            &s.first_flag,
            &s.bytes,
        )?;
        k.run_heads(
            st,
            gs,
            c,
            &s.roots,
            &s.kind,
            &s.count,
            &s.src_ver,
            &s.src_start,
            coalesce,
            &s.first_head,
            &s.shift_head,
        )?;
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
        k.emit_runs(
            st,
            gs,
            c,
            &s.roots,
            &s.kind,
            &s.count,
            &s.src_ver,
            &s.src_start,
            &s.first_head,
            &s.shift_head,
            &s.first_id,
            &s.shift_id,
            &s.run_end,
            &self.out,
            wft,
            rank,
        )?;
        k.finish_runs(st, gs, c, &s.run_end, &self.out, wft)?;
        k.first_roots(st, gs, c, &s.roots, &s.kind, &s.bytes_off, &s.first_rank, &s.fr_start, &s.fr_off)?;

        mark("runs")?;
        // 5. Serialize: bitmap, data, header.
        if bitmap_len > 0 {
            k.write_bitmap(st, gs, &s.ballots, bitmap_len, &self.out)?;
        }
        k.gather(st, gs, c, &s.fr_start, &s.fr_off, data_ptr.spanning(data_len)?, cs, &self.out, wft, bitmap_len)?;
        let (method, hash) = (u32::from(self.method.code()), u32::from(self.hash.code()));
        let flags = u32::from(baseline);
        let version64 = u64::from(version);
        k.write_header(
            st,
            cfg(1, 32),
            c,
            &self.out,
            method,
            hash,
            flags,
            rank,
            cs,
            version64,
            data_len,
            bitmap_len,
            wft,
        )?;
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
            tracing::info!(target: crate::profile::TARGET, "{line} ms{host} pre-sync {pre_sync_ms:.3}");
            if let Some(sampler) = sampler {
                let samples = sampler.finish();
                for w in marks.windows(2) {
                    let inside = samples.iter().filter(|b| b.at >= w[0].2 && b.at < w[1].2).count();
                    if inside > 0 {
                        let seen = crate::profile::threads::summary(&samples, w[0].2, w[1].2);
                        tracing::info!(target: crate::profile::TARGET, "gpu-threads v{version} {}: {seen}", w[1].0);
                    }
                }
            }
        }
        Ok(Run::Ready(counters))
    }

    /// The kernels' counters (waits for the stream).
    pub(super) fn read_counters(&self) -> Result<[u64; COUNTERS]> {
        let mut c = [0u64; COUNTERS];
        self.gpu.stream.memcpy_dtoh(&self.counters, &mut c).map_err(cuda_err)?;
        self.gpu.stream.synchronize().map_err(cuda_err)?;
        Ok(c)
    }
}

/// Header and table of a version stored whole: a Full checkpoint, or a
/// dense one of another method (its data is one D2H copy).
pub(super) fn whole_meta(rank: u32, layout: Layout, hash: HashAlgo, method: Method, version: u64) -> Vec<u8> {
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

pub(super) fn timings(
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
