//! A checkpoint in steps, for the collective layer: de-duplicate locally
//! ([`Engine::deduplicate_local`]), give regions to other ranks
//! ([`LocalCheckpoint::give_away`]), write the files without listing them
//! ([`Engine::stage`]), and list them once every rank has written
//! ([`Engine::publish`]) — or give up ([`Engine::abandon`]). Both backends.

use super::{CheckpointReport, Engine, Worker, report_of};
use crate::backend::cuda::{GpuInput, GpuTimings};
use crate::dedup::{DedupInput, Pending, record_entries};
use crate::diff::Diff;
use crate::format::manifest::VersionEntry;
use crate::format::{encode_meta, finish_body};
use crate::hash::Digest;
use crate::layout::Layout;
use crate::record::RecordEntry;
use crate::regions::{self, Conversion, FirstBytes};
use crate::{Error, Result};
use std::io::Write;
use std::time::Instant;

/// One version de-duplicated on this rank and not yet written.
#[derive(Debug)]
pub struct LocalCheckpoint {
    diff: Diff,
    state: LocalState,
    started: Instant,
}

#[derive(Debug)]
enum LocalState {
    /// CPU: the record and leaf changes to apply once published.
    Cpu(Pending),
    /// GPU: the file the device produced (rewritten on the host when
    /// regions are given away), its FIRST data at `data_start`; the device
    /// holds the pending record. `moved` are entries to point at other
    /// ranks' copies, `forget` digests to drop from it.
    Gpu {
        file: GpuFile,
        data_start: usize,
        dense: bool,
        moved: Vec<(Digest, RecordEntry)>,
        forget: Vec<Digest>,
        timings: GpuTimings,
    },
}

/// Where a GPU diff file's bytes are.
#[derive(Debug)]
enum GpuFile {
    /// Still in the device's pinned output buffer (the single-rank path
    /// writes it from there): the whole file's length and its trailer.
    Pinned { file_len: usize, trailer: [u8; 32] },
    /// Copied to host memory (the collective path reads and may rewrite it).
    Host(Vec<u8>),
}

fn pinned_here() -> Error {
    Error::Internal("a GPU diff still in pinned memory cannot take part in a collective step".into())
}

impl LocalCheckpoint {
    /// The diff as it stands.
    pub fn diff(&self) -> &Diff {
        &self.diff
    }

    /// Where this diff's FIRST bytes are: `data` (the protected buffer, CPU)
    /// or the device's output (GPU; `data` is not used).
    pub fn first_bytes<'a>(&'a self, data: &'a [u8]) -> Result<FirstBytes<'a>> {
        match &self.state {
            LocalState::Cpu(_) => Ok(FirstBytes::whole(self.diff.layout, data)),
            LocalState::Gpu { file: GpuFile::Host(file), data_start, .. } => {
                Ok(FirstBytes::gathered(&self.diff, &file[*data_start..*data_start + self.diff.data_bytes() as usize]))
            }
            LocalState::Gpu { file: GpuFile::Pinned { .. }, .. } => Err(pinned_here()),
        }
    }

    /// Turns the converted regions into references to their owners
    /// (`layouts[r]` is rank r's layout); the record entries move to the
    /// owners' copies (on the GPU, in the device table), so later versions
    /// reference them. Both backends write the same files.
    pub fn give_away(&mut self, conv: &[Conversion], layouts: &[Layout]) -> Result<()> {
        if conv.is_empty() {
            return Ok(());
        }
        let me = self.diff.rank;
        let layout = self.diff.layout;
        match &mut self.state {
            LocalState::Cpu(pending) => {
                regions::apply(&mut self.diff, conv);
                pending.remap_entries(|e| regions::relocate(e, me, &layout, conv, layouts));
            }
            LocalState::Gpu { file: GpuFile::Pinned { .. }, .. } => return Err(pinned_here()),
            LocalState::Gpu { file: GpuFile::Host(file), data_start, dense, moved, forget, .. } => {
                let before = self.diff.clone();
                regions::apply(&mut self.diff, conv);
                let first_data = &file[*data_start..*data_start + before.data_bytes() as usize];
                let kept = FirstBytes::gathered(&before, first_data).gather(&self.diff.first);
                if !*dense {
                    // What the device inserted for this version (the same
                    // entries the CPU's pending record holds), moved like the
                    // CPU moves them.
                    for (d, e) in record_entries(&before, first_data) {
                        match regions::relocate(&e, me, &layout, conv, layouts) {
                            Some(m) if m == e => {}
                            Some(m) => moved.push((d, m)),
                            None => forget.push(d),
                        }
                    }
                }
                let mut body = encode_meta(&self.diff);
                *data_start = body.len();
                body.extend_from_slice(&kept);
                *file = finish_body(body, *data_start);
            }
        }
        Ok(())
    }
}

/// A version whose files are durable but not yet listed in the manifest
/// (invisible until [`Engine::publish`]).
#[derive(Debug)]
pub struct StagedCheckpoint {
    entry: VersionEntry,
    pending: Option<Pending>,
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
    /// writing or remembering anything (the GPU keeps its pending state until
    /// [`Engine::publish`] or [`Engine::abandon`]).
    pub fn deduplicate_local(&mut self, version: u64, input: GpuInput<'_>) -> Result<LocalCheckpoint> {
        self.deduplicate(version, input, true)
    }

    /// Step 1; `to_host` copies a GPU diff into host memory (the collective
    /// step reads it), otherwise it stays in pinned memory until written.
    pub(super) fn deduplicate(&mut self, version: u64, input: GpuInput<'_>, to_host: bool) -> Result<LocalCheckpoint> {
        self.check_version(version)?;
        let baseline = self.next_is_baseline();
        let started = Instant::now();
        match &mut self.worker {
            Worker::Cpu(state) => {
                let GpuInput::Host(data) = input else {
                    return Err(Error::InvalidOption("device buffers need the CUDA backend".into()));
                };
                let outcome =
                    self.opts.method.deduplicator().deduplicate(state, &DedupInput { data, version, baseline })?;
                Ok(LocalCheckpoint { diff: outcome.diff, state: LocalState::Cpu(outcome.pending), started })
            }
            Worker::Cuda(dev) => {
                let cp = dev.checkpoint(version, input, baseline)?;
                let file = if to_host {
                    GpuFile::Host(dev.file_vec(&cp)?)
                } else {
                    GpuFile::Pinned { file_len: cp.file_len, trailer: cp.trailer }
                };
                let state = LocalState::Gpu {
                    file,
                    data_start: cp.data_start,
                    dense: cp.diff.dense,
                    moved: Vec::new(),
                    forget: Vec::new(),
                    timings: cp.timings,
                };
                Ok(LocalCheckpoint { diff: cp.diff, state, started })
            }
        }
    }

    /// Step 2: serializes the (possibly rewritten) diff and durably writes
    /// its files, still invisible. `data` is the protected buffer (CPU; the
    /// GPU carries its own bytes and ignores it).
    pub fn stage(&mut self, local: LocalCheckpoint, data: &[u8]) -> Result<StagedCheckpoint> {
        let LocalCheckpoint { diff, state, started } = local;
        let logical = diff.layout.data_len();
        let (version, baseline) = (diff.version, diff.baseline);
        let (entry, pending, gpu, t1) = match (state, &mut self.worker) {
            (LocalState::Cpu(pending), _) => {
                let file = crate::format::encode_diff(&diff, data);
                let t1 = Instant::now();
                (self.store.write_files(version, baseline, &file)?, Some(pending), None, t1)
            }
            (LocalState::Gpu { file, moved, forget, timings, .. }, Worker::Cuda(dev)) => {
                dev.forget(&forget)?;
                dev.relocate(&moved)?;
                let t1 = Instant::now();
                let entry = match file {
                    GpuFile::Host(bytes) => self.store.write_files(version, baseline, &bytes)?,
                    GpuFile::Pinned { file_len, trailer } => {
                        let prefix = dev.pinned_prefix(file_len)?;
                        self.store.write_diff_with(version, baseline, file_len as u64, Some(&trailer), |f| {
                            f.write_all(prefix)?;
                            f.write_all(&trailer)
                        })?
                    }
                };
                (entry, None, Some(timings), t1)
            }
            (LocalState::Gpu { .. }, Worker::Cpu(_)) => {
                return Err(Error::Internal("a GPU checkpoint went to the CPU backend".into()));
            }
        };
        let report = report_of(&diff, entry.file_len, logical, started, t1, gpu);
        Ok(StagedCheckpoint { entry, pending, report })
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

    /// Step 3 (collective): the version's commit record is durable, so the
    /// version is committed; lists it in this rank's manifest (a cache of
    /// the record) and remembers it. A failed manifest write is returned
    /// beside the report: the version stays committed, and the next writer
    /// to open the store lists it.
    pub fn adopt(&mut self, staged: StagedCheckpoint) -> Result<(CheckpointReport, Option<Error>)> {
        let t = Instant::now();
        let listed = self.store.adopt(staged.entry.clone()).err();
        Ok((self.remember(staged, t)?, listed))
    }

    fn remember(&mut self, staged: StagedCheckpoint, t: Instant) -> Result<CheckpointReport> {
        let StagedCheckpoint { pending, report, .. } = staged;
        if report.baseline {
            self.force_baseline = false;
        }
        match (&mut self.worker, pending) {
            (Worker::Cpu(state), Some(p)) => {
                state.commit(p);
                self.record_len = state.record.len() as u64;
            }
            (Worker::Cuda(dev), _) => {
                dev.commit()?;
                self.record_len = dev.record_entries();
            }
            _ => return Err(Error::Internal("a staged checkpoint went to another backend".into())),
        }
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
        match &mut self.worker {
            Worker::Cpu(_) => Ok(()),
            Worker::Cuda(dev) => dev.rollback(),
        }
    }
}
