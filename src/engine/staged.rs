//! A checkpoint in steps: de-duplicate locally ([`Engine::deduplicate_local`];
//! the tiers' collective step then gives regions to other ranks,
//! [`LocalCheckpoint::give_away`]), write the files without listing them
//! ([`Engine::stage`]), and list them ([`Engine::publish`]) — or give up
//! ([`Engine::abandon`]). Both backends.

use super::{CheckpointReport, Engine, report_of};
use crate::backend::{Backend, Deduplicated};
use crate::diff::Diff;
use crate::error::Result;
use crate::format::manifest::VersionEntry;
use crate::layout::Layout;
use crate::memory::Protected;
use crate::regions::{Conversion, Region};
use std::marker::PhantomData;
use std::time::Instant;

/// One version de-duplicated on this rank and not yet written. It borrows
/// the protected memory for `'a`: on the CUDA backend its file may still
/// lie there (a version stored whole is copied from the input when it is
/// written or handed over), so the input must stay allocated and unchanged
/// until then.
#[derive(Debug)]
pub struct LocalCheckpoint<'a> {
    version: Deduplicated,
    started: Instant,
    _input: PhantomData<Protected<'a>>,
}

impl<'a> LocalCheckpoint<'a> {
    /// A version the backend just de-duplicated from `input` (started at `started`).
    pub(crate) fn new(version: Deduplicated, started: Instant, _input: Protected<'a>) -> Self {
        LocalCheckpoint { version, started, _input: PhantomData }
    }

    /// The diff as it stands.
    pub fn diff(&self) -> &Diff {
        &self.version.diff
    }

    /// Turns the converted regions into references to their owners
    /// (`layouts[r]` is rank r's layout); the record entries move to the
    /// owners' copies (on the GPU, in the device table), so later versions
    /// reference them. Both backends write the same files.
    pub fn give_away(&mut self, conv: &[Conversion], layouts: &[Layout]) -> Result<()> {
        self.version.give_away(conv, layouts)
    }
}

/// A version whose files are durable but not yet listed in the manifest
/// (invisible until [`Engine::publish`]).
#[derive(Debug)]
pub struct StagedCheckpoint {
    entry: VersionEntry,
    version: Deduplicated,
    report: CheckpointReport,
}

impl StagedCheckpoint {
    /// What the checkpoint will report once published.
    pub fn report(&self) -> &CheckpointReport {
        &self.report
    }

    /// The written file's entry (what a collective commit record lists for this rank).
    pub fn entry(&self) -> &VersionEntry {
        &self.entry
    }
}

impl Engine {
    /// Step 1: de-duplicates `input` against this rank's history without
    /// writing or remembering anything (the backend keeps its pending state
    /// until [`Engine::publish`] or [`Engine::abandon`]).
    pub fn deduplicate_local<'a>(&mut self, version: u64, input: Protected<'a>) -> Result<LocalCheckpoint<'a>> {
        self.deduplicate(version, input)
    }

    /// The regions `local`'s FIRST runs offer to a collective step (nodes of
    /// at most `2^max_level` chunks) with their digests (read off the GPU's
    /// tree where it has one). `data` is the protected buffer (CPU).
    pub fn regions(&mut self, local: &LocalCheckpoint<'_>, data: &[u8], max_level: u32) -> Result<Vec<Region>> {
        self.backend.regions(&local.version.diff, &local.version.pending, data, max_level)
    }

    /// Step 1 (the single-rank path and the collective step alike).
    pub(crate) fn deduplicate<'a>(&mut self, version: u64, input: Protected<'a>) -> Result<LocalCheckpoint<'a>> {
        self.check_version(version)?;
        let baseline = self.next_is_baseline();
        let started = Instant::now();
        let version = self.backend.deduplicate(version, input, baseline)?;
        Ok(LocalCheckpoint::new(version, started, input))
    }

    /// Step 2: serializes the (possibly rewritten) diff and durably writes
    /// its files, still invisible. `data` is the protected buffer (CPU; the
    /// GPU carries its own bytes and ignores it).
    pub fn stage(&mut self, local: LocalCheckpoint<'_>, data: &[u8]) -> Result<StagedCheckpoint> {
        let LocalCheckpoint { mut version, started, .. } = local;
        let (number, baseline) = (version.diff.version, version.diff.baseline);
        let file = self.backend.serialize(version.as_mut(), data)?;
        let t1 = Instant::now();
        let trailer = file.trailer();
        let entry =
            self.store.write_diff_with(number, baseline, file.len() as u64, trailer, &mut |f| file.write_to(f))?;
        let logical = version.diff.layout.data_len();
        let report = report_of(&version.diff, entry.file_len, logical, started, t1, version.gpu);
        Ok(StagedCheckpoint { entry, version, report })
    }

    /// Step 3 (single rank): lists a staged version in the manifest — the
    /// commit point — and remembers it. On error nothing is committed.
    pub fn publish(&mut self, staged: StagedCheckpoint) -> Result<CheckpointReport> {
        let t = Instant::now();
        if let Err(e) = self.store.publish(staged.entry.clone()) {
            self.abandon()?;
            return Err(e);
        }
        self.remember(staged, t)
    }

    fn remember(&mut self, staged: StagedCheckpoint, t: Instant) -> Result<CheckpointReport> {
        let StagedCheckpoint { version, report, .. } = staged;
        if report.baseline {
            self.force_baseline = false;
        }
        self.backend.commit(version)?;
        self.record_len = self.backend.record_entries();
        Ok(CheckpointReport {
            record_entries: self.record_len,
            write_seconds: report.write_seconds + t.elapsed().as_secs_f64(),
            ..report
        })
    }

    /// Gives up a local or staged checkpoint (another rank failed): the
    /// engine's state is as before it (the GPU's pending record is rolled
    /// back; written but unlisted files are overwritten by the next attempt).
    pub fn abandon(&mut self) -> Result<()> {
        self.backend.rollback()
    }
}
