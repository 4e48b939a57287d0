//! [`CudaBackend`]: the [`Backend`] contract over a [`GpuDedup`]. A
//! version's file stays where the device made it until it is needed on the
//! host: in the GPU cache tier's arena (the collective path, with room
//! there), or in the output buffer or, for a version stored whole, the
//! input itself; only its metadata crosses to the host at once. The tiers'
//! hand-over copies it from there straight into their page-locked cache;
//! the synchronous path copies it to the pipeline's pinned buffer. The
//! collective step's region digests come off the device: off the tree it
//! just built, or hashed from the FIRST bytes where they lie.

use super::device_cache::Staged;
use super::{GpuDedup, PackedRuns, StoredRun, cuda_err};
use crate::backend::{
    Backend, BackendKind, Deduplicated, Described, DiffBytes, GivenAway, PendingVersion, Sink, StepDiff, VersionMut,
};
use crate::diff::Diff;
use crate::error::{Error, Result};
use crate::layout::{Layout, NodeId};
use crate::memory::{Protected, ProtectedMut};
use crate::regions::{self, Conversion, FirstBytes, FirstIndex, Region, Rewrite};
use std::sync::Arc;

/// De-duplication on a CUDA device.
pub struct CudaBackend {
    dev: GpuDedup,
    /// Record moves a settled collective step asked for
    /// ([`Backend::settle_step`]), run on the device's stream before the
    /// next version is prepared (inside that call's quiet from the host
    /// cache's allocation, with no wait of their own).
    moves: Option<(u64, PackedRuns)>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend").field("plan", &self.dev.plan()).finish()
    }
}

impl CudaBackend {
    /// The backend over a device pipeline (fresh or rebuilt).
    pub fn new(dev: GpuDedup) -> Self {
        CudaBackend { dev, moves: None }
    }

    /// Runs the record moves a settled step left, if any (before the
    /// next version's lookups, on the same stream).
    fn apply_moves(&mut self) -> Result<()> {
        match self.moves.take() {
            Some((version, runs)) => self.dev.locate_entries(version, &runs),
            None => Ok(()),
        }
    }

    /// The regions of `nodes` hashed from `version`'s FIRST bytes where they
    /// lie: on the device (the output buffer, the input of a version stored
    /// whole, the arena), or on the host for a file already in pinned
    /// memory.
    fn hashed_regions(&self, diff: &Diff, p: &GpuPending, nodes: &[NodeId], max_level: u32) -> Result<Vec<Region>> {
        let base = match &p.file {
            GpuFile::OnDevice { prepared: Some(prepared), .. } => self.dev.first_data_addr(prepared)?,
            GpuFile::Pinned { file_len, .. } => {
                let data_end = p.data_start + diff.data_bytes() as usize;
                let first = self.dev.pinned_prefix(*file_len)?.get(p.data_start..data_end);
                let bytes = FirstBytes::gathered(diff, first.ok_or_else(|| Error::Internal("GPU diff data".into()))?);
                return Ok(regions::first_regions(diff, &bytes, max_level));
            }
            _ => return Err(pinned_here()),
        };
        let index = FirstIndex::gathered(diff);
        let spans: Vec<(super::DevAddr, u64)> = nodes
            .iter()
            .map(|&node| {
                let at = index.locate(diff.layout.node_chunks(node));
                Ok((base.add(at.start)?.spanning(at.end - at.start)?, at.end - at.start))
            })
            .collect::<Result<_>>()?;
        let digests = self.dev.hash_spans(&spans)?;
        Ok(regions::regions_of(&diff.layout, nodes, &digests))
    }

    /// Moves the device record's entries of regions given away, and gives
    /// back the rewrite the file's bytes still need (if any): the one for
    /// regions given away, or else, where the device wrote runs of one
    /// repeated source range one by one, the one that folds them as the
    /// CPU's encoder does (so that both write the same file).
    fn settle_given(&mut self, diff: &Diff, p: &mut GpuPending) -> Result<Option<Rewrite>> {
        if let Some(runs) = p.given.take() {
            self.dev.locate_entries(diff.version, &runs)?;
        }
        Ok(p.rewrite.take().or_else(|| {
            let unfolded = p.repeats || crate::format::diff_file::stored_shift_entries(diff) < diff.shift.len() as u64;
            unfolded.then(|| Rewrite::new(diff.clone(), diff.clone(), p.data_start))
        }))
    }
}

/// Where a GPU diff file's bytes are.
#[derive(Debug)]
enum GpuFile {
    /// Still in the pipeline's pinned output buffer: the whole file's length
    /// and its trailer.
    Pinned { file_len: usize, trailer: [u8; 32] },
    /// Handed over to the host cache before its metadata was decoded
    /// (the collective step's thread described it from there).
    Handed,
    /// Not copied yet: where the device made it, the output buffer or, for
    /// a version stored whole, the input itself (valid until the next
    /// version is prepared; the input for as long as the `LocalCheckpoint`
    /// borrows it). [`Backend::serialize_deferred`] copies it into the
    /// pinned buffer.
    OnDevice { prepared: Option<super::pipeline::Prepared> },
}

/// A GPU version: its file, FIRST data at `data_start`; the device holds the
/// pending record. `given` maps every chunk to where it is stored once
/// regions were given away (the owners' copies, or this rank's own): the
/// device moves the pending entries by it before the version is written.
#[derive(Debug)]
pub struct GpuPending {
    file: GpuFile,
    data_start: usize,
    dense: bool,
    given: Option<PackedRuns>,
    /// Once regions were given away: the rewrite of the file as the device
    /// made it into the diff's (built where the give-away runs, the
    /// collective step's thread; applied when serializing, or deferred).
    rewrite: Option<Rewrite>,
    /// The device wrote repeat nodes' entries as they are, not as the
    /// encoder merges them ([`super::pipeline::Prepared::repeats`]).
    repeats: bool,
}

/// The device's form of the record moves of `version` after giving `conv`
/// away ([`crate::backend::PackMoves`]): [`stored_runs`], packed.
pub(crate) fn pack_moves(
    version: u64,
    me: u32,
    layout: &Layout,
    conv: &[Conversion],
    layouts: &[Layout],
) -> Result<PackedRuns> {
    PackedRuns::of(&stored_runs(version, me, layout, conv, layouts)?)
}

/// Where each chunk of `version` is stored after giving `conv` away: the
/// converted regions at their owners', the gaps between them at home.
/// Host work proportional to the conversions, not to the data.
fn stored_runs(
    version: u64,
    me: u32,
    layout: &Layout,
    conv: &[Conversion],
    layouts: &[Layout],
) -> Result<Vec<StoredRun>> {
    let version = u32::try_from(version).map_err(|_| Error::InvalidOption(format!("version {version} too large")))?;
    let n = layout.chunks();
    let home = |dst: u64, count: u64| StoredRun { dst, count, src: dst, rank: me, version, owner_chunks: n };
    let mut runs = Vec::with_capacity(2 * conv.len() + 1);
    let mut at = 0;
    for c in conv {
        let owner = layouts.get(c.owner as usize).ok_or_else(|| Error::Internal("owner layout".into()))?;
        if c.region.start > at {
            runs.push(home(at, c.region.start - at));
        }
        runs.push(StoredRun {
            dst: c.region.start,
            count: c.region.count,
            src: c.owner_start,
            rank: c.owner,
            version,
            owner_chunks: owner.chunks(),
        });
        at = c.region.start + c.region.count;
    }
    if at < n {
        runs.push(home(at, n - at));
    }
    Ok(runs)
}

/// A file left in the GPU cache tier's arena for the host cache to take
/// later ([`crate::backend::FileSink::defer`]): the flusher's fill moves it
/// out; until then a restore's peek copies it where it is (the lock keeps
/// the two from meeting).
fn deferred(staged: Staged) -> crate::backend::Deferred {
    let held = Arc::new(std::sync::Mutex::new(Some(staged)));
    let kept = Arc::clone(&held);
    crate::backend::Deferred {
        fill: Box::new(move |bufs| {
            let staged = crate::sync::lock(&held).take();
            staged.ok_or_else(taken_twice)?.copy_out(bufs).map(Some)
        }),
        peek: Box::new(move |buf| match crate::sync::lock(&kept).as_ref() {
            Some(staged) => staged.read_into(buf).map(|()| true),
            None => Ok(false),
        }),
    }
}

fn taken_twice() -> Error {
    Error::Internal("a GPU file was handed over or serialized twice".into())
}

fn pinned_here() -> Error {
    Error::Internal("the FIRST bytes of a GPU diff still in pinned or device memory are not read on the host".into())
}

impl PendingVersion for GpuPending {
    /// Never on the host: [`Backend::regions`] hashes a GPU file's FIRST
    /// bytes where they are (the output buffer, the input, the GPU cache's
    /// arena, or pinned memory).
    fn first_bytes<'a>(&'a self, _: &'a Diff, _: &'a [u8]) -> Result<FirstBytes<'a>> {
        Err(pinned_here())
    }

    /// Rewrites the tables at once; the file's bytes follow when it is
    /// serialized ([`Rewrite`]), so that the tiers can do that off the
    /// application's path.
    fn give_away(&mut self, diff: &mut Diff, conv: &[Conversion], layouts: &[Layout]) -> Result<()> {
        if conv.is_empty() {
            return Ok(());
        }
        let (me, layout) = (diff.rank, diff.layout);
        if !self.dense {
            // The entries the device inserted for this version move as the
            // CPU's pending record moves (regions::relocate).
            self.given = Some(PackedRuns::of(&stored_runs(diff.version, me, &layout, conv, layouts)?)?);
        }
        if let Some(before) = regions::apply(diff, conv) {
            // The first give-away's diff is the file as the device made it.
            let made = self.rewrite.take().map_or(before, Rewrite::into_before);
            self.rewrite = Some(Rewrite::new(made, diff.clone(), self.data_start));
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    type Pending = GpuPending;

    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn record_entries(&self) -> u64 {
        self.dev.record_entries()
    }

    fn bounds_hit(&self) -> crate::dedup::BoundsHit {
        self.dev.bounds_hit()
    }

    fn device_plan(&self) -> Option<crate::backend::budget::DevicePlan> {
        Some(self.dev.plan())
    }

    fn deduplicate(&mut self, version: u64, input: Protected<'_>, baseline: bool) -> Result<Deduplicated<GpuPending>> {
        self.apply_moves()?;
        let prepared = {
            let _span = crate::profile::Span::new("cuda-prepare", version);
            self.dev.prepare(version, input, baseline)?
        };
        let repeats = prepared.repeats;
        // The file stays where the device made it (the output buffer, or
        // the input itself for a version stored whole) until it is
        // serialized; only its metadata crosses now.
        let diff = self.dev.describe(&prepared)?;
        let timings = self.dev.prepared_timings(&prepared)?;
        let data_start = prepared.data_start;
        let file = GpuFile::OnDevice { prepared: Some(prepared) };
        let pending = GpuPending { file, data_start, dense: diff.dense, given: None, rewrite: None, repeats };
        Ok(Deduplicated { diff, pending, gpu: Some(timings) })
    }

    /// Off the device's tree where it has one; otherwise hashed on the
    /// device from the FIRST bytes where they lie (the output buffer, the
    /// input of a version stored whole, the arena); from pinned memory for
    /// a file already copied there.
    fn regions(&mut self, diff: &Diff, pending: &GpuPending, _: &[u8], max_level: u32) -> Result<Vec<Region>> {
        let _span = crate::profile::Span::new("cuda-regions", diff.version);
        let nodes = regions::region_nodes(diff, max_level);
        if let Some(gathered) = self.dev.node_digests(diff.version, &nodes)? {
            let digests: Option<Vec<_>> = gathered.wait()?.into_iter().collect();
            if let Some(digests) = digests {
                return Ok(regions::regions_of(&diff.layout, &nodes, &digests));
            }
        }
        self.hashed_regions(diff, pending, &nodes, max_level)
    }

    fn serialize_deferred<'a>(
        &'a mut self,
        version: VersionMut<'_, GpuPending>,
        _: &[u8],
    ) -> Result<(DiffBytes<'a>, Option<Rewrite>)> {
        let VersionMut { diff, pending: p, gpu } = version;
        let rewrite = self.settle_given(diff, p)?;
        if let GpuFile::OnDevice { prepared, .. } = &mut p.file {
            // The synchronous path: the file is copied to the pinned buffer now.
            let prepared = prepared.take().ok_or_else(taken_twice)?;
            let (computed, trailer) = self.dev.finish_pinned(prepared)?;
            *gpu = Some(computed.timings);
            p.file = GpuFile::Pinned { file_len: computed.prefix_len + 32, trailer };
        }
        match &mut p.file {
            GpuFile::Pinned { file_len, trailer } => {
                let file = DiffBytes::Borrowed { prefix: self.dev.pinned_prefix(*file_len)?, trailer: *trailer };
                Ok((file, rewrite))
            }
            GpuFile::OnDevice { .. } | GpuFile::Handed => Err(taken_twice()),
        }
    }

    fn commit(&mut self, version: Deduplicated<GpuPending>) -> Result<()> {
        let Deduplicated { diff, pending, .. } = version;
        // The decoded diff's lists are freed off the call.
        crate::memory::drop_later((diff, pending));
        self.dev.commit()
    }

    fn rollback(&mut self) -> Result<()> {
        self.dev.rollback()
    }

    /// Hands the file over unsealed (no decoding of its tables and no
    /// trailer on the host before it returns), copied by the device
    /// straight into the sink's buffers (the tiers' page-locked cache):
    /// through the GPU cache tier's arena where there is one with room (the
    /// copy to the host on its own stream, deferred while the sink is
    /// full), otherwise from the output buffer. The device's record keeps
    /// the version pending until [`Backend::commit_before_step`].
    fn hand_over_new(
        &mut self,
        version: u64,
        input: Protected<'_>,
        baseline: bool,
        sink: Sink<'_>,
    ) -> Result<crate::backend::Handed<GpuPending>> {
        self.apply_moves()?;
        let prepared = {
            let _span = crate::profile::Span::new("cuda-prepare", version);
            self.dev.prepare(version, input, baseline)?
        };
        let _span = crate::profile::Span::new("cuda-hand-over", version);
        let len = prepared.prefix_len + 32; // the trailer, zero until sealed
        let baseline = baseline || prepared.stored_whole();
        let (data_start, data_len, repeats) = (prepared.data_start, prepared.data_len, prepared.repeats);
        let mut timings = None;
        let handed = match self.dev.stage(prepared) {
            Err(e) => Err(e),
            // In the GPU cache: copied out now if the host cache has room,
            // otherwise when the flusher needs the bytes.
            Ok(Ok((computed, staged))) => {
                timings = Some(computed.timings);
                if sink.has_room(len) {
                    let mut slot = Some(staged);
                    sink.fill(len, false, &mut |bufs| {
                        let staged = slot.take().ok_or_else(|| Error::Internal("a file was filled twice".into()))?;
                        staged.copy_out(bufs).map(Some)
                    })
                } else {
                    sink.defer(len, false, deferred(staged))
                }
            }
            Ok(Err(prepared)) => {
                let mut slot = Some(prepared);
                let dev = &mut self.dev;
                sink.fill(len, false, &mut |bufs| {
                    let p = slot.take().ok_or_else(|| Error::Internal("a file was filled twice".into()))?;
                    let (computed, ready) = dev.finish_async(p, bufs)?;
                    timings = Some(computed.timings);
                    Ok(ready)
                })
            }
        };
        if let Err(e) = handed {
            self.dev.rollback()?;
            return Err(e);
        }
        let describe: crate::backend::Describe<GpuPending> = Box::new(move |read| {
            let mut meta = vec![0u8; data_start];
            read(0, &mut meta)?;
            let diff = crate::format::decode_meta_folded(&meta, data_len as u64)
                .map_err(|e| Error::Gpu(format!("the GPU produced an invalid diff: {e}")))?;
            let dense = diff.dense;
            let pending = GpuPending { file: GpuFile::Handed, data_start, dense, given: None, rewrite: None, repeats };
            Ok((Deduplicated { diff, pending, gpu: timings }, data_start))
        });
        Ok(crate::backend::Handed { pending: None, baseline, describe: Some(describe), gpu: timings })
    }

    /// The device's record keeps the version's entries (tagged with its
    /// number) where the device made them; the step decodes the diff from
    /// the handed-over file.
    fn commit_before_step(&mut self, handed: crate::backend::Handed<GpuPending>) -> Result<StepDiff> {
        let describe =
            handed.describe.ok_or_else(|| Error::Internal("a handed-over GPU version without its describer".into()))?;
        self.dev.commit()?;
        Ok(StepDiff::Later(Box::new(move |read| {
            let (d, start) = describe(read)?;
            // Runs the device wrote one by one that the encoder folds
            // (what `settle_given` rewrites on the other paths).
            let unfolded = d.pending.repeats
                || crate::format::diff_file::stored_shift_entries(&d.diff) < d.diff.shift.len() as u64;
            Ok(Described { diff: d.diff, data_start: start, unfolded, pack_moves: Some(pack_moves) })
        })))
    }

    /// The entries the device inserted for `version` move as the CPU's
    /// held entries do (`regions::relocate`), on the device's stream when
    /// the next version is prepared.
    fn settle_step(&mut self, version: u64, given: GivenAway<'_>) -> Result<()> {
        let GivenAway { conv, layouts, dense, packed } = given;
        if conv.is_empty() || dense {
            return Ok(());
        }
        // Moves of an earlier version not run yet go first (each moves
        // only its own version's entries).
        self.apply_moves()?;
        let runs = match packed {
            Some(runs) => runs,
            None => pack_moves(version, self.dev.rank(), &self.dev.layout(), conv, layouts)?,
        };
        self.moves = Some((version, runs));
        Ok(())
    }

    fn host_segments(&self, base: Option<crate::memory::SegmentAlloc>) -> Option<crate::memory::SegmentAlloc> {
        let ctx = Arc::clone(&self.dev.gpu().ctx);
        Some(Box::new(move |len| {
            let pinned = match &base {
                Some(base) => super::driver::RegisteredSegment::pin(&ctx, base(len)?),
                None => super::driver::RegisteredSegment::new(&ctx, len),
            };
            pinned.map(|s| Box::new(s) as crate::memory::Segment)
        }))
    }

    fn rebuild_from(&mut self, version: u64, data: Protected<'_>, map: crate::restore::PendingMap) -> Result<()> {
        // The table is rebuilt: moves left for it are moot.
        self.moves = None;
        self.dev.rollback()?;
        // The map is made and its runs packed on the host while the device
        // makes its pass.
        let dev = &mut self.dev;
        std::thread::scope(|s| {
            let packing = s.spawn(move || {
                let map = {
                    let _span = crate::profile::Span::new("restore-map", version);
                    map.make()
                };
                let _span = crate::profile::Span::new("rebuild-runs", version);
                let runs = runs_of(&map);
                crate::memory::drop_later(map);
                runs
            });
            let locate = dev.rebuild_pass(version, data)?;
            let runs = packing.join().map_err(|_| Error::Internal("packing the rebuild's runs".into()))??;
            match locate {
                true => {
                    let _span = crate::profile::Span::new("rebuild-locate", version);
                    dev.locate_entries(version, &runs)
                }
                false => Ok(()),
            }
        })
    }

    fn place(&self, bytes: &[u8], dst: ProtectedMut<'_>) -> Result<()> {
        if bytes.len() != dst.len() {
            return Err(Error::size_mismatch("restored bytes for their buffer", dst.len() as u64, bytes.len() as u64));
        }
        match dst {
            ProtectedMut::Host(out) => {
                out.copy_from_slice(bytes);
                Ok(())
            }
            ProtectedMut::Device(region) => {
                let gpu = self.dev.gpu();
                // The region is checked to lie inside one allocation of this
                // device, and its constructor's contract gives dckpt exclusive
                // use of it; `bytes` outlives the copy, which the synchronize
                // below completes.
                let dst = super::DevAddr::of_region(gpu, &region)?;
                gpu.upload_to(&gpu.stream, bytes, dst, region.len())?;
                gpu.stream.synchronize().map_err(cuda_err)
            }
        }
    }
}

/// A restore's map as the device rebuild takes it (`table_locate`'s runs).
fn runs_of(map: &crate::restore::StoredMap) -> Result<PackedRuns> {
    PackedRuns::pack(map.runs.len(), |i| {
        let s = &map.runs[i];
        Ok(StoredRun {
            dst: s.dst,
            count: s.count,
            src: s.src,
            rank: s.rank,
            version: u32::try_from(s.version)
                .map_err(|_| Error::InvalidOption(format!("version {} too large", s.version)))?,
            owner_chunks: map.layouts.get(&s.rank).map_or(0, crate::layout::Layout::chunks),
        })
    })
}
