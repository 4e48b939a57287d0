//! A version's one road through the tiers, on one rank or in a collective
//! checkpoint: de-duplicated and handed to the host cache
//! ([`TieredEngine::hand_over`]), then committed and queued
//! ([`TieredEngine::submit_before_step`]; its flush waits at a
//! [`LateRewrite`] where a collective step still decides how the file is
//! rewritten, which reads it as a [`StepFile`]), then settled
//! ([`TieredEngine::settle_step`]: the record entries follow the step's
//! give-away); or abandoned before the commit. [`TieredEngine::submit_handed`]
//! is the road with no step.

use super::*;
use crate::backend::{Described, GivenAway, StepDiff};
use std::borrow::Cow;

/// A version handed to the host cache with no regions to offer
/// ([`TieredEngine::hand_over`]), not yet committed nor queued.
pub(crate) struct HandedVersion {
    handed: crate::backend::Handed,
    cached: Cached,
    sealed: bool,
    report: TieredReport,
    t0: Instant,
}

/// A version committed before its collective step ran, as the step reads
/// it: its diff (or how to decode it) and its cached file.
pub(crate) struct StepFile {
    version: u64,
    diff: StepDiff,
    cached: Arc<Cached>,
}

impl StepFile {
    /// The version's number.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// The step's side of the version (any thread; the application is not
    /// waiting): the diff decoded from the cached file's metadata where the
    /// device made it (folded, as the file stores it), and its FIRST
    /// regions (nodes of at most `2^max_level` chunks) hashed from the
    /// cached FIRST bytes, by the digest rule every backend shares.
    pub(crate) fn describe(self, max_level: u32) -> Result<(Described, Vec<Region>)> {
        let cached = &self.cached;
        cached.ready()?;
        let short = || Error::Internal("a cached diff file shorter than its tables".into());
        let mut read = |at: u64, buf: &mut [u8]| cached.read_at(at as usize, buf).ok_or_else(short);
        let version = self.version;
        let decode = crate::profile::Span::new("step-describe-decode", version);
        let described = match self.diff {
            StepDiff::Later(describe) => describe(&mut read)?,
            // Described already (the CPU, folded as its encoder folds): the
            // data's place from the header.
            StepDiff::Known(diff) => {
                let mut header = [0u8; crate::format::diff_file::HEADER_LEN as usize];
                read(0, &mut header)?;
                let at = crate::format::data_start_of(&header, cached.len() as u64)
                    .map_err(|e| Error::Internal(format!("a cached diff file: {e}")))?;
                Described { diff, data_start: at as usize, unfolded: false, pack_moves: None }
            }
        };
        drop(decode);
        let (diff, data_start) = (&described.diff, described.data_start);
        // Each region hashed where its bytes lie in the cache (a segment,
        // or a spilled file's one piece); only a region across two segments
        // is copied.
        let _span = crate::profile::Span::new("step-describe-hash", version);
        let index = crate::regions::FirstIndex::gathered(diff);
        let data_bytes = diff.data_bytes();
        let in_file = |at: std::ops::Range<u64>| {
            if at.end > data_bytes {
                return None;
            }
            let at = data_start + at.start as usize..data_start + at.end as usize;
            match cached.contiguous(at.clone()) {
                Some(bytes) => Some(Cow::Borrowed(bytes)),
                None => {
                    let mut bytes = vec![0u8; at.len()];
                    cached.read_at(at.start, &mut bytes).map(|()| Cow::Owned(bytes))
                }
            }
        };
        let regions = crate::regions::first_regions_read(diff, &index, max_level, &in_file).ok_or_else(short)?;
        Ok((described, regions))
    }
}

impl TieredEngine {
    /// The call's part of a checkpoint with no regions to offer (one
    /// rank, or local-only): de-duplicates `input` and hands its file to
    /// the host cache, nothing more on the host (a device-made diff's
    /// tables are not decoded); the version stays pending until
    /// [`TieredEngine::submit_handed`] or [`TieredEngine::abandon`].
    pub(crate) fn hand_over(&mut self, version: u64, input: Protected<'_>) -> Result<HandedVersion> {
        let t0 = Instant::now();
        let _quiet = self.quiet(version);
        self.rebuild_if_pending();
        crate::error::check_version_number(version)?;
        if let Some(latest) = self.latest.filter(|&l| l >= version) {
            return Err(Error::VersionNotNewer { latest, requested: version });
        }
        let baseline = self.next_is_baseline();
        let mut sink = CacheSink { cache: &self.shared.cache, handed: None };
        let handed = self.backend.hand_over_new(version, input, baseline, &mut sink)?;
        let Some((cached, waited, t1, copied, sealed)) = sink.handed else {
            self.backend.rollback()?;
            return Err(Error::Internal("the backend handed no file over".into()));
        };
        let file_bytes = cached.len() as u64;
        let baseline = handed.baseline;
        let mut report = report_of(version, baseline, file_bytes, t0, t1, copied, waited, handed.gpu);
        report.held_on_gpu = cached.deferred();
        report.spilled = cached.spilled();
        Ok(HandedVersion { handed, cached, sealed, report, t0 })
    }

    /// Commits a version [`TieredEngine::hand_over`] cached and queues it on
    /// every tier, with no collective step: [`TieredEngine::submit_before_step`]
    /// with nothing to wait for, settled at once. On error the next
    /// checkpoint is a baseline.
    pub(crate) fn submit_handed(&mut self, h: HandedVersion) -> Result<TieredReport> {
        let (report, _) = self.submit_before_step(h, None)?;
        self.settle_step(report.version, GivenAway::default())?;
        Ok(report)
    }

    /// Commits a version [`TieredEngine::hand_over`] cached before its
    /// collective step ran, and queues it on every tier: each tier's flush
    /// waits for `late` to say how the step rewrote the file (it gave
    /// regions away or kept them), and the record entries the version
    /// adds wait for [`TieredEngine::settle_step`]. Returns what the step
    /// reads. On error the next checkpoint is a baseline.
    pub(crate) fn submit_before_step(
        &mut self,
        h: HandedVersion,
        late: Option<Arc<dyn LateRewrite>>,
    ) -> Result<(TieredReport, StepFile)> {
        let HandedVersion { handed, cached, sealed, mut report, t0 } = h;
        let diff = {
            let _span = crate::profile::Span::new("submit-commit", report.version);
            self.backend.commit_before_step(handed)?
        };
        let cached = Arc::new(cached);
        {
            let _span = crate::profile::Span::new("submit-enqueue", report.version);
            self.enqueue(report.version, report.baseline, Arc::clone(&cached), sealed, None, late)?;
        }
        report.total_seconds = t0.elapsed().as_secs_f64();
        let version = report.version;
        Ok((report, StepFile { version, diff, cached }))
    }

    /// The collective step of `version` ([`TieredEngine::submit_before_step`])
    /// is over: the record entries of the regions its file gave away
    /// (none when it kept them) move to their owners' copies, and the
    /// version's entries join the record. Before the next checkpoint. No
    /// device work here (the CUDA backend moves its entries when it
    /// prepares the next version, inside that call's quiet).
    pub(crate) fn settle_step(&mut self, version: u64, given: GivenAway<'_>) -> Result<()> {
        self.backend.settle_step(version, given)
    }

    /// Gives up a version between steps 1 and 3 (another rank failed): the
    /// backend's state is as before it; cached bytes go back when dropped.
    pub(crate) fn abandon(&mut self) -> Result<()> {
        self.backend.rollback()
    }

    /// Makes the next version a baseline (the collective step asks for it
    /// when any rank needs one).
    pub(crate) fn force_baseline(&mut self) {
        self.force_baseline = true;
    }

    /// Whether the next version will be a baseline.
    /// (A state still to be rebuilt is rebuilt first: a rebuild that fails
    /// makes it one.)
    pub(crate) fn next_baseline(&mut self) -> bool {
        self.rebuild_if_pending();
        self.next_is_baseline()
    }
}
