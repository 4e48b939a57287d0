//! Where de-duplication runs: the CPU engine ([`cpu`], over `crate::dedup`
//! and rayon) or the CUDA backend ([`cuda`]), which computes the same diff on
//! the GPU.
//!
//! Both implement [`Backend`], the one contract the engine drives:
//! de-duplicate a version into a [`Deduplicated`] (the diff plus the
//! backend's pending state: its own type, [`Backend::Pending`]), let the collective layer
//! give regions away, serialize it, then [`Backend::commit`] it once its
//! files are durable or [`Backend::rollback`] it. Both take the same inputs
//! ([`Protected`]), keep the same record and write byte-identical files
//! under the same bounds ([`budget`]: the CUDA backend's device budget
//! bounds its state; the CPU engine is unbounded unless given the same
//! `crate::dedup::Limits`, and the two differ only where a bound binds);
//! the GPU test program (`tests/gpu.rs`) checks it.

mod any;
pub mod budget;
pub mod cpu;
pub mod cuda;
pub mod rebuild;
pub mod ring;

use crate::diff::Diff;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::memory::{Protected, ProtectedMut};
use crate::regions::{self, Conversion, FirstBytes, Region, Rewrite};
pub use any::{AnyBackend, AnyPending};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A de-duplicated version that is neither committed nor rolled back:
/// `P` is the pending state of the backend that made it
/// ([`Backend::Pending`]; for the engine's [`AnyBackend`], [`AnyPending`]).
#[derive(Debug)]
pub struct Deduplicated<P = AnyPending> {
    /// The diff as it stands (regions given away are references).
    pub diff: Diff,
    /// What the backend needs to serialize and commit it.
    pub pending: P,
    /// Device-side times (CUDA backend).
    pub gpu: Option<cuda::GpuTimings>,
}

impl<P> Deduplicated<P> {
    /// The same version with its pending state turned by `f` (into the
    /// engine's [`AnyPending`], say).
    pub fn map_pending<Q>(self, f: impl FnOnce(P) -> Q) -> Deduplicated<Q> {
        Deduplicated { diff: self.diff, pending: f(self.pending), gpu: self.gpu }
    }

    /// The version as a backend's method takes it: the diff and the
    /// pending state, borrowed apart.
    pub fn as_mut(&mut self) -> VersionMut<'_, P> {
        VersionMut { diff: &mut self.diff, pending: &mut self.pending, gpu: &mut self.gpu }
    }
}

/// A pending version as a backend's methods take it: its diff and the
/// backend's own pending state, borrowed apart (so that [`AnyBackend`] can
/// hand each backend its own type).
#[derive(Debug)]
pub struct VersionMut<'v, P> {
    /// The diff as it stands.
    pub diff: &'v mut Diff,
    /// The backend's pending state.
    pub pending: &'v mut P,
    /// Device-side times (CUDA backend).
    pub gpu: &'v mut Option<cuda::GpuTimings>,
}

impl<P: PendingVersion> Deduplicated<P> {
    /// Turns the converted regions into references to their owners
    /// (`layouts[r]` is rank r's layout); the pending record follows
    /// ([`PendingVersion::give_away`]).
    pub fn give_away(&mut self, conv: &[Conversion], layouts: &[Layout]) -> Result<()> {
        if conv.is_empty() {
            return Ok(());
        }
        self.pending.give_away(&mut self.diff, conv, layouts)
    }
}

/// The backend-specific part of a [`Deduplicated`] version.
pub trait PendingVersion: fmt::Debug + Send + 'static {
    /// Where the diff's FIRST bytes are: `data` (the protected host buffer,
    /// CPU) or the backend's own copy (GPU; `data` is not read).
    fn first_bytes<'a>(&'a self, diff: &'a Diff, data: &'a [u8]) -> Result<FirstBytes<'a>>;

    /// Turns the converted regions of `diff` into references to their
    /// owners (`layouts[r]` is rank r's layout); the record entries this
    /// version adds move to the owners' copies.
    fn give_away(&mut self, diff: &mut Diff, conv: &[Conversion], layouts: &[Layout]) -> Result<()>;
}

/// A serialized diff file, ready for the store.
#[derive(Debug)]
pub enum DiffBytes<'a> {
    /// The whole file in host memory.
    Owned(Vec<u8>),
    /// Everything up to the trailer in the backend's (pinned) memory, and the trailer.
    Borrowed {
        /// The file's bytes before the trailer.
        prefix: &'a [u8],
        /// The trailer (BLAKE3-256 of the metadata and block digests).
        trailer: [u8; 32],
    },
}

impl DiffBytes<'_> {
    /// The file's length.
    pub fn len(&self) -> usize {
        match self {
            DiffBytes::Owned(v) => v.len(),
            DiffBytes::Borrowed { prefix, .. } => prefix.len() + 32,
        }
    }

    /// Whether the file is empty (never, for a valid diff).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The trailer (the last 32 bytes).
    pub fn trailer(&self) -> Option<&[u8]> {
        match self {
            DiffBytes::Owned(v) => v.get(v.len().checked_sub(32)?..),
            DiffBytes::Borrowed { trailer, .. } => Some(trailer),
        }
    }

    /// The file as consecutive pieces.
    pub fn parts(&self) -> Vec<&[u8]> {
        match self {
            DiffBytes::Owned(v) => vec![v],
            DiffBytes::Borrowed { prefix, trailer } => vec![prefix, trailer],
        }
    }

    /// Writes the whole file to `out`.
    pub fn write_to(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        match self {
            DiffBytes::Owned(v) => out.write_all(v),
            DiffBytes::Borrowed { prefix, trailer } => {
                out.write_all(prefix)?;
                out.write_all(trailer)
            }
        }
    }
}

/// The contract the engine drives, once per version:
/// [`deduplicate`](Backend::deduplicate) → (collective: give regions away) →
/// [`serialize`](Backend::serialize) → the store makes the file durable →
/// [`commit`](Backend::commit), or [`rollback`](Backend::rollback) on any
/// failure. Until `commit` the backend's history is unchanged; a new
/// `deduplicate` rolls back a version left pending.
pub trait Backend: Send {
    /// The pending state of a version it de-duplicated, until commit or
    /// rollback: its own type, so that no method checks at run time which
    /// backend made a version.
    type Pending: PendingVersion;

    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Entries in the record (the digests it can de-duplicate against).
    fn record_entries(&self) -> u64;

    /// What bounds on the backend's state cost the committed versions
    /// (`crate::dedup::limits`): record restarts, versions stored whole.
    fn bounds_hit(&self) -> crate::dedup::BoundsHit;

    /// Where the device-memory budget went (CUDA backend).
    fn device_plan(&self) -> Option<budget::DevicePlan> {
        None
    }

    /// De-duplicates `input` as `version` (a `baseline` ignores history).
    /// The diff's bytes stay where [`Backend::regions`] and
    /// [`Backend::serialize`] read them.
    fn deduplicate(
        &mut self,
        version: u64,
        input: Protected<'_>,
        baseline: bool,
    ) -> Result<Deduplicated<Self::Pending>>;

    /// The regions of `version`'s FIRST runs a collective step offers
    /// (nodes of at most `2^max_level` chunks) with their digests. By
    /// default hashed on the host from [`PendingVersion::first_bytes`]; the
    /// CUDA backend reads them off the tree it just built, where it has one.
    fn regions(&mut self, diff: &Diff, pending: &Self::Pending, data: &[u8], max_level: u32) -> Result<Vec<Region>> {
        let bytes = pending.first_bytes(diff, data)?;
        Ok(regions::first_regions(diff, &bytes, max_level))
    }

    /// The diff file of `version` (after regions were given away); applies
    /// the record moves that giving away implies. `data` is the protected
    /// host buffer (CPU).
    fn serialize<'a>(&'a mut self, version: VersionMut<'_, Self::Pending>, data: &[u8]) -> Result<DiffBytes<'a>> {
        match self.serialize_deferred(version, data)? {
            (file, None) => Ok(file),
            (file, Some(rewrite)) => {
                let mut whole = Vec::with_capacity(file.len());
                file.write_to(&mut whole).map_err(|e| Error::Internal(format!("gathering a diff file: {e}")))?;
                Ok(DiffBytes::Owned(rewrite.apply(&whole)?))
            }
        }
    }

    /// As [`Backend::serialize`], but a rewrite for regions given away that
    /// the backend has not applied to the bytes yet may come back beside
    /// them (the file as made): the asynchronous tiers apply it in their
    /// flush worker, off the application's path. Applied, it gives the same
    /// bytes as `serialize`.
    fn serialize_deferred<'a>(
        &'a mut self,
        version: VersionMut<'_, Self::Pending>,
        data: &[u8],
    ) -> Result<(DiffBytes<'a>, Option<Rewrite>)>;

    /// Commits a version [`Backend::hand_over_new`] handed over whose
    /// collective step has not run yet: its state is permanent but for the
    /// record entries it adds, held (the CPU's) or left in the device's
    /// table until [`Backend::settle_step`] says where the step put their
    /// bytes. Returns what the step reads of it.
    fn commit_before_step(&mut self, handed: Handed<Self::Pending>) -> Result<StepDiff>;

    /// The collective step of `version`, committed by
    /// [`Backend::commit_before_step`], is over: the record entries of the
    /// regions its file gives away move to the owners' copies, and the held
    /// ones join the record. Called before the next de-duplication.
    fn settle_step(&mut self, version: u64, given: GivenAway<'_>) -> Result<()>;

    /// Makes a serialized version's state permanent (its files are durable).
    fn commit(&mut self, version: Deduplicated<Self::Pending>) -> Result<()>;

    /// Forgets the pending version, if any.
    fn rollback(&mut self) -> Result<()>;

    /// Copies restored bytes into the application's memory (host, or device
    /// memory on the CUDA backend).
    fn place(&self, bytes: &[u8], dst: ProtectedMut<'_>) -> Result<()>;

    /// Rebuilds the de-duplication state from `data`, the restored bytes of
    /// committed `version` (host memory, or device memory on the CUDA
    /// backend), whose chunks are stored where `map` says: the previous
    /// leaves and the record a baseline of it would leave, each entry moved
    /// to where its bytes are stored ([`crate::backend::rebuild`]'s rule).
    /// The map is made where the backend has time for it (beside the
    /// device's pass, or on the CPU rebuild's own thread). Any pending
    /// version is forgotten first.
    fn rebuild_from(&mut self, version: u64, data: Protected<'_>, map: crate::restore::PendingMap) -> Result<()>;

    /// The host memory its files should be cached in, made from `base`'s
    /// segments (the heap without it): `base` itself, or the CUDA backend's
    /// segments page-locked, which its device copies diffs into directly
    /// ([`FileSink::fill`]).
    fn host_segments(&self, base: Option<crate::memory::SegmentAlloc>) -> Option<crate::memory::SegmentAlloc> {
        base
    }

    /// The asynchronous tiers' path: de-duplicates
    /// `input` and hands its file to `sink`, the version left pending until
    /// [`Backend::commit_before_step`] (or [`Backend::rollback`], when another
    /// rank failed). Nothing but what the file needs happens on the host:
    /// no decoding of a device-made diff's tables (what a checkpoint with
    /// no regions to offer, local-only or on one rank, takes). On any error,
    /// the sink's included, the version is rolled back.
    fn hand_over_new(
        &mut self,
        version: u64,
        input: Protected<'_>,
        baseline: bool,
        sink: Sink<'_>,
    ) -> Result<Handed<Self::Pending>> {
        let mut d = {
            let _span = crate::profile::Span::new("dedup", version);
            self.deduplicate(version, input, baseline)?
        };
        let gpu = d.gpu;
        let handed = {
            let _span = crate::profile::Span::new("serialize-cache", version);
            self.serialize(d.as_mut(), input.host_bytes()).and_then(|file| sink.put(&file.parts(), true))
        };
        if let Err(e) = handed {
            self.rollback()?;
            return Err(e);
        }
        Ok(Handed { baseline: d.diff.baseline, pending: Some(d), describe: None, gpu })
    }
}

/// What a settled collective step gave away, as a backend's record needs it.
#[derive(Debug, Default)]
pub struct GivenAway<'a> {
    /// The regions given away (empty: the version kept them all).
    pub conv: &'a [Conversion],
    /// `layouts[r]` is rank r's layout.
    pub layouts: &'a [Layout],
    /// The version's diff was dense: it added no record entries.
    pub dense: bool,
    /// The moves in the device's form, packed on the step's thread
    /// ([`Described::pack_moves`]); packed by the backend when `None`.
    pub packed: Option<cuda::PackedRuns>,
}

/// Packs the record moves of regions given away in the device's form
/// (`version`, this rank, its layout, the conversions, every rank's layout).
pub type PackMoves = fn(u64, u32, &Layout, &[Conversion], &[Layout]) -> Result<cuda::PackedRuns>;

/// What the collective step reads of a version committed before it ran
/// ([`Backend::commit_before_step`]).
pub enum StepDiff {
    /// The diff, on the host already (the CPU).
    Known(Diff),
    /// How to decode it from the handed-over file (a device-made file).
    Later(DescribeDiff),
}

/// Decodes a handed-over file's diff (folded, as the file stores it) given
/// a reader of the file.
pub type DescribeDiff = Box<dyn FnOnce(&mut dyn FnMut(u64, &mut [u8]) -> Result<()>) -> Result<Described> + Send>;

/// A handed-over file's diff, decoded by a [`DescribeDiff`].
#[derive(Debug)]
pub struct Described {
    /// The diff, its repeats folded as the file stores them.
    pub diff: Diff,
    /// Where the file's FIRST data start.
    pub data_start: usize,
    /// Whether the file holds runs the encoder would fold (a device wrote
    /// them one by one): its bytes are brought to the encoder's form before
    /// they are stored, rewritten even where no region is given away.
    pub unfolded: bool,
    /// How the step packs the record moves of what it gives away, where
    /// the backend wants them packed (the device's table): off the call.
    pub pack_moves: Option<PackMoves>,
}

/// Describes a version handed over without its diff on the host
/// ([`Handed::describe`]): given a reader of the handed-over file
/// (`read(offset, buf)` fills `buf` from the file at `offset`), decodes its
/// metadata into the pending version the backend commits or gives regions
/// away from, and says where its FIRST data starts in the file.
pub type Describe<P = AnyPending> =
    Box<dyn FnOnce(&mut dyn FnMut(u64, &mut [u8]) -> Result<()>) -> Result<(Deduplicated<P>, usize)> + Send>;

/// A version [`Backend::hand_over_new`] gave to its sink, not committed yet.
pub struct Handed<P = AnyPending> {
    /// The backend's pending state, where it keeps one outside itself (the
    /// CPU's); `None` where the backend holds it (the device's record).
    pub pending: Option<Deduplicated<P>>,
    /// Whether the version is a baseline: asked for, or stored whole
    /// because nearly every chunk changed.
    pub baseline: bool,
    /// Where `pending` is `None`: how to describe the version later, from
    /// its handed-over file (the collective step's thread does, off the
    /// application's path).
    pub describe: Option<Describe<P>>,
    /// Device-side times (CUDA backend).
    pub gpu: Option<cuda::GpuTimings>,
}

impl<P: fmt::Debug> fmt::Debug for Handed<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handed")
            .field("pending", &self.pending)
            .field("baseline", &self.baseline)
            .field("describe", &self.describe.is_some())
            .finish()
    }
}

/// Receives a diff file ([`Backend::hand_over_new`]), and whether it is
/// sealed: as consecutive parts it copies, or written straight into its own
/// buffers (a device copies into a page-locked host cache directly).
pub trait FileSink {
    /// Takes a file given as consecutive `parts` (copied).
    fn put(&mut self, parts: &[&[u8]], sealed: bool) -> Result<()>;

    /// Takes a file of `len` bytes that `fill` writes into the sink's
    /// buffers (consecutive slices totalling `len` bytes). `fill` may
    /// return before the bytes are there (a device copy still running): it
    /// then returns the [`Ready`] wait, which the sink runs before anything
    /// reads or reuses the buffers.
    fn fill(&mut self, len: usize, sealed: bool, fill: &mut Fill<'_>) -> Result<()>;

    /// Whether a file of `len` bytes would be taken now, without waiting
    /// for room in the sink's buffers.
    fn has_room(&self, len: usize) -> bool {
        let _ = len;
        true
    }

    /// Takes a file of `len` bytes that the caller holds elsewhere for now
    /// (the GPU cache tier): `fill` writes it into the sink's buffers later,
    /// on whichever thread first needs its bytes, once the sink has room.
    /// By default the sink fills it now.
    fn defer(&mut self, len: usize, sealed: bool, file: Deferred) -> Result<()> {
        let mut once = Some(file.fill);
        self.fill(len, sealed, &mut |bufs| {
            once.take().ok_or_else(|| Error::Internal("a deferred file was filled twice".into()))?(bufs)
        })
    }
}

/// A [`FileSink::defer`]red file, held by the backend (the GPU cache tier)
/// until a reader needs its bytes in host memory.
pub struct Deferred {
    /// Writes (or starts writing) the file into the buffers it is given,
    /// later and possibly on another thread: the flusher's read, once.
    pub fill: DeferredFill,
    /// Copies the file into one host buffer of its length now and leaves it
    /// where it is (a restore's read, which must not wait for room in the
    /// sink); `Ok(false)`, copying nothing, once `fill` has taken the file.
    pub peek: DeferredPeek,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deferred")
    }
}

/// [`Deferred::fill`]: writes (or starts writing) a deferred file into the
/// buffers it is given.
pub type DeferredFill = Box<dyn FnOnce(&mut [&mut [u8]]) -> Result<Option<Ready>> + Send>;

/// [`Deferred::peek`]: copies a deferred file into one buffer, leaving it
/// where it is; `Ok(false)` once it was filled.
pub type DeferredPeek = Box<dyn Fn(&mut [u8]) -> Result<bool> + Send + Sync>;

/// Waits until the bytes a [`FileSink::fill`] started writing are there.
pub type Ready = Box<dyn FnOnce() -> Result<()> + Send>;

/// What [`FileSink::fill`] runs: writes (or starts writing) the file into
/// the buffers; `Some(ready)` while the writing goes on.
pub type Fill<'a> = dyn FnMut(&mut [&mut [u8]]) -> Result<Option<Ready>> + 'a;

/// The sink of [`Backend::hand_over_new`].
pub type Sink<'a> = &'a mut dyn FileSink;

/// A pending version made by another backend: [`AnyBackend`] given
/// another backend's [`AnyPending`] (an internal error).
pub(crate) fn foreign() -> Error {
    Error::Internal("a pending version went to another backend".into())
}

/// Which backend to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// CUDA when a device is found, otherwise the CPU.
    #[default]
    Auto,
    /// The CPU engine.
    Cpu,
    /// The CUDA backend (an error when no device is usable).
    Cuda,
}

impl BackendKind {
    /// Resolves `Auto` by probing for a usable CUDA device.
    pub fn resolve(self) -> BackendKind {
        match self {
            BackendKind::Auto if cuda::available() => BackendKind::Cuda,
            BackendKind::Auto => {
                tracing::debug!("backend auto: no usable CUDA device, the CPU backend");
                BackendKind::Cpu
            }
            other => other,
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Auto => "auto",
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        })
    }
}

impl FromStr for BackendKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(BackendKind::Auto),
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" => Ok(BackendKind::Cuda),
            _ => Err(Error::InvalidOption(format!("unknown backend '{s}' (expected auto, cpu or cuda)"))),
        }
    }
}
