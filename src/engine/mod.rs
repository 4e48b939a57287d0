//! The single-rank checkpoint engine: de-duplicate (on the CPU or the GPU),
//! serialize, commit, and only then remember. Reopening a store continues
//! its history. `staged` splits a checkpoint into steps for the collective
//! layer.

mod rebuild;
mod staged;

pub use crate::restore::StoredMap;
pub use rebuild::{Rebuilt, rebuild_state, rebuilt_from};
pub use staged::{LocalCheckpoint, StagedCheckpoint};

use crate::backend::budget::GpuCache;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, Gpu, GpuDedup, GpuTimings};
use crate::backend::{AnyBackend, Backend, BackendKind};
use crate::dedup::DedupState;
use crate::diff::{ChunkCounts, Diff};
use crate::error::{Error, Result};
use crate::memory::{Protected, ProtectedMut};
use crate::store::{OpenNotes, StoreOptions, StoreWriter};
use std::path::Path;
use std::time::Instant;

/// What one checkpoint did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CheckpointReport {
    /// Version written.
    pub version: u64,
    /// Whether it is a baseline.
    pub baseline: bool,
    /// Chunks by label.
    pub counts: ChunkCounts,
    /// FIRST table entries (or bitmap runs).
    pub first_regions: usize,
    /// SHIFT table entries.
    pub shift_regions: usize,
    /// Bytes of the protected buffer.
    pub logical_bytes: u64,
    /// Bytes of the diff file.
    pub file_bytes: u64,
    /// Bytes of the file that are not FIRST data.
    pub metadata_bytes: u64,
    /// Entries now in the record.
    pub record_entries: u64,
    /// Seconds spent de-duplicating and serializing.
    pub dedup_seconds: f64,
    /// Seconds spent writing and committing.
    pub write_seconds: f64,
    /// Device-side times, for the CUDA backend.
    pub gpu: Option<GpuTimings>,
}

/// What opening an engine found and cost (a restart's view).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct OpenReport {
    /// The latest committed version the state was rebuilt from.
    pub latest: Option<u64>,
    /// Seconds restoring (and verifying) it.
    pub restore_seconds: f64,
    /// Seconds rebuilding the de-duplication state from it (and loading it
    /// onto the GPU).
    pub rebuild_seconds: f64,
    /// Seconds of the whole open.
    pub total_seconds: f64,
    /// Record entries after the rebuild.
    pub record_entries: u64,
    /// Files of unfinished writes removed.
    pub removed_files: usize,
    /// Collective versions rolled forward into the manifest.
    pub rolled_forward: Vec<u64>,
    /// One line each: what the application should know (a damaged latest
    /// version that makes the next checkpoint a baseline, ...).
    pub warnings: Vec<String>,
}

/// A rank's checkpointing engine over a [`StoreWriter`]: the one writer of the
/// rank's directory (it holds the store's lock while it lives).
pub struct Engine {
    store: StoreWriter,
    backend: AnyBackend,
    opts: StoreOptions,
    record_len: u64,
    /// The next version must be a baseline (no history could be rebuilt).
    force_baseline: bool,
    /// The committed version whose state is still to be rebuilt (an
    /// engine opened with [`RebuildAt::Later`] that has not restarted yet).
    rebuild_pending: Option<u64>,
    opened: OpenReport,
}

impl Engine {
    /// Opens (or creates) the store of `rank` under `root` for a buffer of
    /// `data_len` bytes, de-duplicating on the CPU. An existing store
    /// continues its history: the state is rebuilt from a restore of the
    /// latest committed version ([`rebuild_state`]); if that version cannot
    /// be restored, the next checkpoint is a baseline and
    /// [`OpenReport::warnings`] says why.
    pub fn open_or_create(root: &Path, rank: u32, data_len: u64, opts: &StoreOptions) -> Result<Self> {
        Self::open_with_backend(root, rank, data_len, opts, BackendKind::Cpu)
    }

    /// As [`Engine::open_or_create`], on the chosen backend (`Auto` picks CUDA
    /// when a device is usable).
    pub fn open_with_backend(
        root: &Path,
        rank: u32,
        data_len: u64,
        opts: &StoreOptions,
        backend: BackendKind,
    ) -> Result<Self> {
        Self::open_on_device(root, rank, data_len, opts, backend, 0)
    }

    /// As [`Engine::open_with_backend`], on CUDA device `device` (several
    /// ranks of a node spread over its GPUs).
    pub fn open_on_device(
        root: &Path,
        rank: u32,
        data_len: u64,
        opts: &StoreOptions,
        backend: BackendKind,
        device: usize,
    ) -> Result<Self> {
        Self::open_with_cache(
            root,
            rank,
            data_len,
            opts,
            backend,
            OpenWith { device, gpu_cache: GpuCache::NONE, rebuild: RebuildAt::Open },
        )
    }

    /// As [`Engine::open_on_device`], giving the CUDA backend a GPU cache
    /// tier's arena as `gpu_cache` says (within the same budget; the
    /// asynchronous tiers use it).
    pub(crate) fn open_with_cache(
        root: &Path,
        rank: u32,
        data_len: u64,
        opts: &StoreOptions,
        backend: BackendKind,
        with: OpenWith,
    ) -> Result<Self> {
        let OpenWith { device, gpu_cache, rebuild } = with;
        let t0 = Instant::now();
        let (store, notes) = StoreWriter::open(root, rank, data_len, opts)?;
        let OpenNotes { removed, rolled_forward, damaged_records, .. } = notes;
        let layout = store.layout()?;
        let latest = store.manifest().latest().map(|v| v.version);
        let mut opened = OpenReport { latest, removed_files: removed.len(), rolled_forward, ..OpenReport::default() };
        for (path, why) in damaged_records {
            opened.warnings.push(format!(
                "{}: {why}; the version it commits stays invisible until `dckpt repair` sets it aside",
                path.display()
            ));
        }
        // `auto` keeps SHA-1 stores on the CPU (the GPU has no SHA-1 kernel);
        // an explicit `cuda` gets the GPU backend's clear refusal instead.
        let resolved = match backend {
            BackendKind::Auto if opts.hash == crate::hash::HashAlgo::Sha1 => BackendKind::Cpu,
            other => other.resolve(),
        };
        let mut backend: AnyBackend = match resolved {
            BackendKind::Cuda => {
                let gpu = Gpu::open(device)?;
                let dev = GpuDedup::with_budget(gpu, layout, opts.hash, opts.method, rank, opts.gpu_memory, gpu_cache)?;
                CudaBackend::new(dev).into()
            }
            _ => CpuBackend::new(DedupState::new(layout, opts.hash, rank), opts.method).into(),
        };
        // Full keeps no state: nothing to restore.
        let mut rebuild_pending = latest.filter(|_| opts.method.uses_previous());
        let mut force_baseline = false;
        if rebuild == RebuildAt::Open
            && let Some(v) = rebuild_pending.take()
        {
            force_baseline = !rebuild_from_disk(&mut backend, store.root(), rank, v, &mut opened);
        }
        let record_len = backend.record_entries();
        opened.record_entries = record_len;
        opened.total_seconds = t0.elapsed().as_secs_f64();
        Ok(Engine { store, backend, opts: opts.clone(), record_len, force_baseline, rebuild_pending, opened })
    }

    /// Takes the engine apart for the asynchronous tiers, which drive the
    /// backend themselves and hand the store to their first disk tier.
    pub(crate) fn into_parts(self) -> EngineParts {
        EngineParts {
            store: self.store,
            backend: self.backend,
            opts: self.opts,
            force_baseline: self.force_baseline,
            rebuild_pending: self.rebuild_pending,
            opened: self.opened,
        }
    }

    /// What opening found and cost (timings, clean-up, warnings).
    pub fn open_report(&self) -> &OpenReport {
        &self.opened
    }

    /// The underlying store.
    pub fn store(&self) -> &StoreWriter {
        &self.store
    }

    /// The backend in use (`Cpu` or `Cuda`).
    pub fn backend(&self) -> BackendKind {
        self.backend.kind()
    }

    /// Whether the next checkpoint must be a baseline.
    fn next_is_baseline(&self) -> bool {
        if self.force_baseline {
            return true;
        }
        let m = self.store.manifest();
        let Some(latest) = m.latest() else { return true };
        let chain_len = m.chain(latest.version).map_or(0, <[_]>::len) as u64;
        self.opts.max_chain.is_some_and(|max| chain_len >= max.max(1))
            || self.opts.max_record_entries.is_some_and(|max| self.record_len > max)
    }

    fn check_version(&self, version: u64) -> Result<()> {
        crate::error::check_version_number(version)?;
        match self.store.manifest().latest() {
            Some(latest) if latest.version >= version => {
                Err(Error::VersionNotNewer { latest: latest.version, requested: version })
            }
            _ => Ok(()),
        }
    }

    /// Takes checkpoint `version` of the protected memory: host bytes
    /// (`&[u8]`, `&Vec<u8>`) or a [`DeviceRegion`](crate::memory::DeviceRegion)
    /// (CUDA backend). On error nothing is committed and the engine's state
    /// is unchanged.
    pub fn checkpoint<'a>(&mut self, version: u64, data: impl Into<Protected<'a>>) -> Result<CheckpointReport> {
        let input = data.into();
        let local = self.deduplicate(version, input)?;
        let staged = match self.stage(local, input.host_bytes()) {
            Ok(s) => s,
            Err(e) => {
                // The files are not listed; the backend's pending state goes too.
                self.abandon()?;
                return Err(e);
            }
        };
        self.publish(staged)
    }

    /// Restores committed `version` of this rank into `dst` (host memory, or
    /// device memory on the CUDA backend): every byte verified, cross-rank
    /// references checked.
    pub fn restore_into(&self, version: u64, dst: ProtectedMut<'_>) -> Result<()> {
        let bytes = crate::restore::restore_version(self.store.root(), self.store.manifest().rank, version)?;
        self.backend.place(&bytes, dst)
    }

    /// Makes the next version a baseline: it references nothing older and
    /// the record restarts.
    pub fn force_baseline(&mut self) {
        self.force_baseline = true;
    }

    /// The engine's options.
    pub fn options(&self) -> &StoreOptions {
        &self.opts
    }
}

/// An engine's parts ([`Engine::into_parts`]).
pub(crate) struct EngineParts {
    pub store: StoreWriter,
    pub backend: AnyBackend,
    pub opts: StoreOptions,
    pub force_baseline: bool,
    pub rebuild_pending: Option<u64>,
    pub opened: OpenReport,
}

/// How [`Engine::open_with_cache`] opens the backend.
pub(crate) struct OpenWith {
    /// The CUDA device.
    pub device: usize,
    /// The GPU cache tier's arena.
    pub gpu_cache: GpuCache,
    /// When the de-duplication state is rebuilt.
    pub rebuild: RebuildAt,
}

/// When opening an engine rebuilds its de-duplication state from the
/// newest committed version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RebuildAt {
    /// At once (a restore of that version in the open).
    Open,
    /// From a restart's own restore, or else at the first checkpoint
    /// ([`rebuild_from_disk`]): opening reads manifests only.
    Later,
}

/// Restores committed `version` of `rank` from the store under `root` and
/// rebuilds `backend`'s state from it. A version that cannot be restored
/// leaves a warning in `opened` and `false` (the next checkpoint must be a
/// baseline; older versions stay restorable).
pub(crate) fn rebuild_from_disk(
    backend: &mut AnyBackend,
    root: &Path,
    rank: u32,
    version: u64,
    opened: &mut OpenReport,
) -> bool {
    let _span = crate::profile::Span::new("rebuild", version);
    let rebuilt = rebuild::restore_latest(root, rank, version).and_then(|restored| {
        opened.restore_seconds = restored.seconds;
        let t = Instant::now();
        backend.rebuild_from(version, Protected::Host(&restored.data), restored.map)?;
        opened.rebuild_seconds = t.elapsed().as_secs_f64();
        Ok(())
    });
    match rebuilt {
        Ok(()) => true,
        Err(e) => {
            opened.warnings.push(format!(
                "rank {rank}: the latest version {version} cannot be restored ({e}); the next checkpoint is a \
                 baseline (older versions stay restorable; `dckpt repair` removes what nothing needs)"
            ));
            false
        }
    }
}

/// The report of a written version; the write time runs from `t1` to now.
fn report_of(
    diff: &Diff,
    file_len: u64,
    logical: u64,
    t0: Instant,
    t1: Instant,
    gpu: Option<GpuTimings>,
) -> CheckpointReport {
    CheckpointReport {
        version: diff.version,
        baseline: diff.baseline,
        counts: diff.counts(),
        first_regions: diff.first.len(),
        shift_regions: crate::format::diff_file::stored_shift_entries(diff) as usize,
        logical_bytes: logical,
        file_bytes: file_len,
        metadata_bytes: file_len - diff.data_bytes(),
        record_entries: 0,
        dedup_seconds: (t1 - t0).as_secs_f64(),
        write_seconds: t1.elapsed().as_secs_f64(),
        gpu,
    }
}
