//! The CPU backend: the methods of [`crate::dedup`] over a [`DedupState`],
//! the FIRST bytes read from the protected host buffer.

use super::{Backend, BackendKind, Deduplicated, DiffBytes, GivenAway, Handed, PendingVersion, StepDiff, VersionMut};
use crate::dedup::{DedupInput, DedupState, HeldInserts, Pending};
use crate::diff::Diff;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::memory::{Protected, ProtectedMut};
use crate::method::Method;
use crate::record::Record;
use crate::regions::Rewrite;
use crate::regions::{self, Conversion, FirstBytes};

/// De-duplication on the CPU (rayon).
#[derive(Debug)]
pub struct CpuBackend {
    state: DedupState,
    method: Method,
    /// The pending version restarted the record: dropping it forgets the
    /// record, as on the GPU (whose table is cleared at once, `dedup::limits`).
    restart_pending: bool,
    /// A state being rebuilt on a thread of its own (after a restart's
    /// restore): installed by the next call that needs the state.
    rebuilding: Option<std::thread::JoinHandle<DedupState>>,
    /// The record entries of the version committed before its collective
    /// step ran ([`Backend::commit_before_step`]), until
    /// [`Backend::settle_step`] moves them.
    held: Option<(u64, HeldInserts)>,
    /// The record, away on a thread of its own taking in a settled
    /// version's entries (moved where the step gave their bytes away):
    /// installed by the next call that needs it, the entries it will hold.
    absorbing: Option<Box<(std::thread::JoinHandle<Record>, u64)>>,
}

/// Held entries below this many are moved and absorbed in the call (a
/// thread costs more than they do).
const ABSORB_INLINE: usize = 1 << 14;

impl CpuBackend {
    /// Forgets the record if the version left pending restarted it.
    fn forget_restarted(&mut self) {
        if std::mem::take(&mut self.restart_pending) {
            self.state.record.clear();
        }
    }

    /// A backend continuing from `state` with `method`.
    pub fn new(state: DedupState, method: Method) -> Self {
        CpuBackend { state, method, restart_pending: false, rebuilding: None, held: None, absorbing: None }
    }

    /// Drops record entries still held for a collective step that never
    /// settled (fewer entries store more bytes, never wrong ones: the
    /// step may have given their bytes away).
    fn drop_unsettled(&mut self) {
        if let Some((version, held)) = self.held.take() {
            tracing::debug!("version {version}: {} record entries dropped, its step never settled", held.len());
        }
    }

    /// Installs the record back from its absorbing thread, if away, waiting
    /// for it (one that panicked leaves an empty record: the next version
    /// stores more, never wrong bytes). Called with `settle_rebuild`, first
    /// thing wherever the state is read or changed.
    fn settle_absorb(&mut self) {
        if let Some((thread, _)) = self.absorbing.take().map(|a| *a) {
            let _span = crate::profile::Span::new("absorb-wait", 0);
            self.state.record = thread.join().unwrap_or_else(|_| {
                tracing::warn!("taking a version's record entries in failed; the next version stores more");
                Record::new()
            });
        }
    }

    /// Installs the state rebuilt in the background, waiting for it if
    /// needed (a rebuild that panicked leaves an empty record: the next
    /// version stores more, never wrong bytes).
    fn settle_rebuild(&mut self) {
        if let Some(thread) = self.rebuilding.take() {
            let _span = crate::profile::Span::new("rebuild-wait", 0);
            let limits = self.state.limits;
            match thread.join() {
                Ok(state) => self.state = state,
                Err(_) => {
                    tracing::warn!("rebuilding the de-duplication state failed; the next version stores more");
                    self.state = DedupState::new(self.state.layout, self.state.hash, self.state.rank);
                }
            }
            self.state.limits = limits;
        }
    }
}

/// A CPU version's pending record and leaf changes; once regions were
/// given away, the diff as de-duplicated (its file is then made from it and
/// rewritten: at once by `serialize`, in the flush worker by the tiers);
/// and where the FIRST data of the file handed over begin.
#[derive(Debug)]
pub struct CpuPending(Pending, Option<Diff>, usize);

impl PendingVersion for CpuPending {
    fn first_bytes<'a>(&'a self, diff: &'a Diff, data: &'a [u8]) -> Result<FirstBytes<'a>> {
        Ok(FirstBytes::whole(diff.layout, data))
    }

    fn give_away(&mut self, diff: &mut Diff, conv: &[Conversion], layouts: &[Layout]) -> Result<()> {
        let (me, layout) = (diff.rank, diff.layout);
        if let Some(before) = regions::apply(diff, conv) {
            // The first give-away's diff is the file as written (a later one
            // rewrites the same file).
            self.1.get_or_insert(before);
        }
        self.0.remap_entries(|e| regions::relocate(e, me, &layout, conv, layouts));
        Ok(())
    }
}

impl Backend for CpuBackend {
    type Pending = CpuPending;

    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn record_entries(&self) -> u64 {
        self.absorbing.as_ref().map_or(self.state.record.len() as u64, |a| a.1)
    }

    fn bounds_hit(&self) -> crate::dedup::BoundsHit {
        self.state.bounds_hit
    }

    fn deduplicate(&mut self, version: u64, input: Protected<'_>, baseline: bool) -> Result<Deduplicated<CpuPending>> {
        self.settle_rebuild();
        self.settle_absorb();
        self.drop_unsettled();
        let Protected::Host(data) = input else {
            return Err(Error::InvalidOption("device memory needs the CUDA backend".into()));
        };
        self.forget_restarted();
        let outcome = self.method.deduplicator().deduplicate(&self.state, &DedupInput { data, version, baseline })?;
        self.restart_pending = outcome.pending.bounds().record_restarts > 0;
        let mut diff = outcome.diff;
        // Repeats kept as the file stores them: what follows costs entries.
        crate::format::fold_repeats(&mut diff);
        Ok(Deduplicated { diff, pending: CpuPending(outcome.pending, None, 0), gpu: None })
    }

    /// The rewritten diff encoded from the buffer at once (the same bytes
    /// as applying the deferred rewrite, with less copying); before any
    /// give-away, the file as made, its data's place kept for a give-away
    /// decided later (the collective step's thread).
    fn serialize<'a>(&'a mut self, version: VersionMut<'_, CpuPending>, data: &[u8]) -> Result<DiffBytes<'a>> {
        if version.pending.1.take().is_none() {
            return self.serialize_deferred(version, data).map(|(file, _)| file);
        }
        Ok(DiffBytes::Owned(crate::format::encode_diff(version.diff, data)))
    }

    /// The diff encoded from the buffer; after a give-away, the body as
    /// de-duplicated and its rewrite.
    fn serialize_deferred<'a>(
        &'a mut self,
        version: VersionMut<'_, CpuPending>,
        data: &[u8],
    ) -> Result<(DiffBytes<'a>, Option<Rewrite>)> {
        let p = version.pending;
        if let Some(before) = p.1.take() {
            // Only the bytes leave the buffer now (tables and FIRST data, no
            // block digests): the rewrite hashes what it keeps.
            let body = crate::format::encode_body(&before, data);
            let data_start = body.len() - before.data_bytes() as usize;
            return Ok((DiffBytes::Owned(body), Some(Rewrite::new(before, version.diff.clone(), data_start))));
        }
        let body = crate::format::encode_body(version.diff, data);
        p.2 = body.len() - version.diff.data_bytes() as usize;
        Ok((DiffBytes::Owned(crate::format::finish_body(body, p.2)), None))
    }

    fn commit_before_step(&mut self, handed: Handed<CpuPending>) -> Result<StepDiff> {
        let d = handed.pending.ok_or_else(|| Error::Internal("a handed-over CPU version without its state".into()))?;
        self.settle_rebuild();
        self.settle_absorb();
        self.drop_unsettled();
        let Deduplicated { diff, pending, .. } = d;
        let held = self.state.commit_holding_inserts(pending.0);
        self.held = Some((diff.version, held));
        self.restart_pending = false;
        Ok(StepDiff::Known(diff))
    }

    fn settle_step(&mut self, version: u64, given: GivenAway<'_>) -> Result<()> {
        let GivenAway { conv, layouts, .. } = given;
        let Some((held_version, mut held)) = self.held.take() else { return Ok(()) };
        if held_version != version {
            tracing::debug!("version {held_version}: its record entries dropped, version {version} settles");
            return Ok(());
        }
        self.settle_absorb();
        let (me, layout) = (self.state.rank, self.state.layout);
        if held.len() < ABSORB_INLINE {
            if !conv.is_empty() {
                held.remap(|e| regions::relocate(e, me, &layout, conv, layouts));
            }
            self.state.absorb(held);
            return Ok(());
        }
        // Off the call: the next call that reads the record waits for it
        // (span `absorb-wait`); an upper bound of its size meanwhile.
        let mut record = std::mem::take(&mut self.state.record);
        let entries = (record.len() + held.len()) as u64;
        let (conv, layouts) = (conv.to_vec(), layouts.to_vec());
        let thread = std::thread::Builder::new()
            .name("dckpt-absorb".into())
            .spawn(move || {
                if !conv.is_empty() {
                    held.remap(|e| regions::relocate(e, me, &layout, &conv, &layouts));
                }
                held.absorb_into(&mut record);
                record
            })
            .map_err(|e| Error::no_thread("the record's absorbing thread", e))?;
        self.absorbing = Some(Box::new((thread, entries)));
        Ok(())
    }

    fn commit(&mut self, version: Deduplicated<CpuPending>) -> Result<()> {
        self.settle_rebuild();
        self.settle_absorb();
        self.drop_unsettled();
        let Deduplicated { diff, pending, .. } = version;
        // The diff's lists are freed off the call.
        crate::memory::drop_later(diff);
        self.state.commit(pending.0);
        self.restart_pending = false;
        Ok(())
    }

    fn rollback(&mut self) -> Result<()> {
        self.settle_rebuild();
        self.settle_absorb();
        self.drop_unsettled();
        // Nothing changed before commit, but a dropped record restart.
        self.forget_restarted();
        Ok(())
    }

    /// On a thread of its own, from a copy of `data` (the application may
    /// change its memory as soon as the restart returns): the next call
    /// that needs the state waits for it (span `rebuild-wait`).
    fn rebuild_from(&mut self, version: u64, data: Protected<'_>, map: crate::restore::PendingMap) -> Result<()> {
        let Protected::Host(bytes) = data else {
            return Err(Error::InvalidOption("the CPU backend rebuilds from host memory".into()));
        };
        self.settle_rebuild();
        self.settle_absorb();
        self.drop_unsettled();
        self.forget_restarted();
        let (layout, hash, rank) = (self.state.layout, self.state.hash, self.state.rank);
        let method = self.method;
        let copy = {
            let _span = crate::profile::Span::new("rebuild-copy", 0);
            let mut copy = vec![0u8; bytes.len()];
            crate::memory::parallel_copy(&mut copy, bytes);
            copy
        };
        let thread = std::thread::Builder::new()
            .name("dckpt-rebuild".into())
            .spawn(move || {
                let map = {
                    let _span = crate::profile::Span::new("restore-map", version);
                    map.make()
                };
                super::rebuild::rebuilt_from(&copy, &map, layout, method, hash).into_state(layout, hash, rank)
            })
            .map_err(|e| Error::no_thread("the rebuild thread", e))?;
        self.rebuilding = Some(thread);
        Ok(())
    }

    fn place(&self, bytes: &[u8], dst: ProtectedMut<'_>) -> Result<()> {
        match dst {
            ProtectedMut::Host(out) if out.len() == bytes.len() => {
                out.copy_from_slice(bytes);
                Ok(())
            }
            ProtectedMut::Host(out) => {
                Err(Error::size_mismatch("restored bytes for their buffer", out.len() as u64, bytes.len() as u64))
            }
            ProtectedMut::Device(_) => Err(Error::InvalidOption("device memory needs the CUDA backend".into())),
        }
    }
}
