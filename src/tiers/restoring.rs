//! Restores and restarts through the tiers: from the nearest tier that
//! holds a version whole, with the record rebuilt after a restart, and
//! prefetching.

use super::*;

impl TieredEngine {
    /// Restores `version` into `dst`, every byte verified. A version still
    /// in the host cache is restored from there at once; otherwise as soon
    /// as some tier has it durable (waiting tier by tier, fastest first):
    /// its metadata from the fastest tier listing it, each file of its chain
    /// from the restore cache or the fastest tier holding it. If that fails
    /// (a damaged copy), from each tier listing it alone. The error, if
    /// every way fails, is the first one's; host memory is restored in
    /// place, so after an error its content is unspecified.
    pub fn restore_into(&self, version: u64, mut dst: ProtectedMut<'_>) -> Result<()> {
        let _quiet = self.quiet(version);
        self.restore_mapped(version, &mut dst).map(PendingMap::discard)
    }

    /// A restart's restore: `version` restored into `dst` as
    /// [`TieredEngine::restore_into`] does, and the de-duplication state
    /// rebuilt from those same bytes (on the device for device memory), so
    /// that the next checkpoint continues from it; nothing is read twice.
    /// A version older than the newest taken makes the next checkpoint a
    /// baseline (the record points into its chain, which retention may
    /// drop once newer chains exist).
    ///
    /// A host cache not made yet stays so (nothing allocated beside the
    /// restore): the next checkpoint, or [`TieredEngine::make_cache`] once
    /// the caller has placed the bytes, lets it be made.
    pub fn restart_into(&mut self, version: u64, mut dst: ProtectedMut<'_>) -> Result<()> {
        let _quiet = self.quiet_held(version);
        let map = self.restore_mapped(version, &mut dst)?;
        let _span = crate::profile::Span::new("restart-rebuild", version);
        let data = match &dst {
            ProtectedMut::Host(bytes) => Protected::Host(bytes),
            ProtectedMut::Device(region) => Protected::Device(*region),
        };
        match self.backend.rebuild_from(version, data, map) {
            Ok(()) => self.rebuild_pending = None,
            Err(e) => {
                tracing::warn!(
                    "rank {}: rebuilding from version {version}: {e}; the next checkpoint is a baseline",
                    self.rank
                );
                self.force_baseline = true;
                self.rebuild_pending = None;
            }
        }
        if self.latest != Some(version) {
            self.force_baseline = true;
        }
        Ok(())
    }

    /// Lets the host cache be made from now on, if it waits (a restart
    /// holds it until the application's memory is restored).
    pub fn make_cache(&self) {
        self.shared.cache.release();
    }

    /// Rebuilds the backend's state from the newest committed version if
    /// no restart did (the first checkpoint after opening a store).
    pub(super) fn rebuild_if_pending(&mut self) {
        if let Some((version, tier)) = self.rebuild_pending.take()
            && !crate::engine::rebuild_from_disk(
                &mut self.backend,
                &self.roots[tier],
                self.rank,
                version,
                &mut self.opened,
            )
        {
            self.force_baseline = true;
        }
    }

    /// [`TieredEngine::restore_into`], returning where the version's chunks
    /// are stored (the map still to be made).
    pub(super) fn restore_mapped(&self, version: u64, dst: &mut ProtectedMut<'_>) -> Result<PendingMap> {
        let _span = crate::profile::Span::new("restore", version);
        // Still in the host cache: from there, without waiting for its flush.
        let (overlay, mut first_error) =
            match writeback::Overlay::of(&self.shared.inflight, &self.roots[0], self.rank, version) {
                Ok(overlay) => (overlay, None),
                Err(e) => (None, Some(e)),
            };
        let mut map = None;
        let mut attempt = |home: usize, reach: Reach, overlay: Option<writeback::Overlay>| match self.restore_from(
            version,
            home,
            reach,
            overlay.map(Arc::new),
            dst,
        ) {
            Ok(m) => {
                map = Some(m);
                true
            }
            Err(e) => {
                first_error.get_or_insert(e);
                false
            }
        };
        let mut restored = false;
        if let Some(overlay) = overlay {
            self.gpu_cache_reads.fetch_add(overlay.peeked() as u64, std::sync::atomic::Ordering::Relaxed);
            restored = attempt(0, Reach::Fastest, Some(overlay));
        }
        let home = if restored { None } else { self.first_durable(version) };
        if let Some(home) = home {
            restored = attempt(home, Reach::Fastest, None) || attempt(home, Reach::HomeOnly, None);
        }
        if !restored {
            // The slower tiers, once they have settled it.
            let _ = self.shared.progress.wait(version);
            for (i, tier) in self.tiers().iter().enumerate() {
                if Some(i) != home && self.is_durable(version, tier) && attempt(i, Reach::HomeOnly, None) {
                    break;
                }
            }
        }
        if let Some(map) = map {
            return Ok(map);
        }
        Err(first_error.unwrap_or_else(|| Error::MissingVersion {
            dir: self.roots[0].clone(),
            rank: self.rank,
            version,
        }))
    }

    /// One way of restoring `version` (listed on tier `home`, or in flight
    /// through `overlay`) into `dst`: host memory in place, device memory
    /// through a host buffer.
    pub(super) fn restore_from(
        &self,
        version: u64,
        home: usize,
        reach: Reach,
        overlay: Option<Arc<writeback::Overlay>>,
        dst: &mut ProtectedMut<'_>,
    ) -> Result<PendingMap> {
        let cache = self.prefetch.as_ref().map(prefetch::Prefetcher::cache);
        let remote = crate::sync::lock(&self.remote).clone();
        let at = reader::At { roots: &self.roots, home, overlay, remote };
        match dst {
            ProtectedMut::Host(buf) => reader::restore(at, self.rank, version, reach, cache, buf),
            ProtectedMut::Device(region) => {
                // Through a reused host buffer: heap memory with every page
                // touched before the restore writes it; the upload goes
                // through the bounce buffers at the page-locked rate.
                let mut staging = crate::sync::lock(&self.restore_staging);
                // A new buffer is made (every page touched) on a thread of
                // its own while the restore resolves the version.
                let len = region.len();
                let making = match staging.as_ref().is_none_or(|s| s.bytes().len() != len) {
                    true => {
                        *staging = None; // freed before the new one is allocated
                        let made = std::thread::Builder::new()
                            .name("dckpt-restore-buffer".into())
                            .spawn(move || crate::memory::HeapSegment::prefaulted(len))
                            .map_err(|e| Error::no_thread("the restore buffer's thread", e))?;
                        Some(made)
                    }
                    false => None,
                };
                let slot = &mut *staging;
                // The upload runs while the references are checked.
                let upload = |buf: &[u8]| {
                    let _span = crate::profile::Span::new("restore-upload", version);
                    self.backend.place(buf, ProtectedMut::Device(*region))
                };
                let output = |want| {
                    if let Some(making) = making {
                        let _span = crate::profile::Span::new("restore-staging", version);
                        let made = making.join().map_err(|_| Error::Internal("making the restore buffer".into()))?;
                        *slot = Some(Box::new(made));
                    }
                    let buf = slot.as_mut().ok_or_else(|| Error::Internal("restore staging".into()))?.bytes_mut();
                    match buf.len() == want {
                        true => Ok(buf),
                        false => Err(Error::size_mismatch("restored bytes for their region", len as u64, want as u64)),
                    }
                };
                reader::restore_with(at, self.rank, version, reach, cache, output, upload)
            }
        }
    }

    /// A restart's restore: the newest version listed on any tier that
    /// restores intact (every byte verified), from the fastest tier holding
    /// it intact, into `dst`. Newer versions that are damaged on every tier
    /// are skipped, each with the reason, in [`Restored::skipped`].
    pub fn restore_latest(&self, dst: ProtectedMut<'_>) -> Result<Restored> {
        let _ = self.shared.progress.wait_all();
        let listed: Vec<Vec<u64>> = self
            .roots
            .iter()
            .map(|root| {
                Store::open(root, self.rank)
                    .map(|s| s.manifest().versions.iter().map(|v| v.version).collect())
                    .unwrap_or_default()
            })
            .collect();
        let mut candidates: Vec<u64> = listed.iter().flatten().copied().collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        candidates.dedup();
        let (mut skipped, mut first_error) = (Vec::new(), None);
        for version in candidates {
            for (i, tier) in self.tiers().iter().enumerate() {
                if !listed[i].contains(&version) {
                    continue;
                }
                match crate::restore::restore_version(&self.roots[i], self.rank, version) {
                    Ok(bytes) => {
                        self.backend.place(&bytes, dst)?;
                        return Ok(Restored { version, tier: tier.clone(), skipped });
                    }
                    Err(e) => {
                        skipped.push(format!("version {version} on the {tier} tier: {e}"));
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        // Nothing restores: the newest version's error, or no version at all.
        Err(first_error.unwrap_or_else(|| Error::NoStore { dir: self.roots[0].clone(), rank: self.rank }))
    }

    /// Hints that `version` will be restored after the versions hinted
    /// before it (a no-op without a prefetch cache). Once started, a
    /// background thread loads the hinted versions' files from the fastest
    /// tier holding them into the prefetch cache, in hint order.
    pub fn prefetch_enqueue(&self, version: u64) {
        if let Some(p) = &self.prefetch {
            p.enqueue(version);
        }
    }

    /// Starts prefetching the hinted versions (a no-op without a cache).
    pub fn prefetch_start(&self) {
        if let Some(p) = &self.prefetch {
            p.start();
        }
    }

    /// What the prefetch cache did so far (`None` without one).
    pub fn prefetch_stats(&self) -> Option<prefetch::PrefetchStats> {
        self.prefetch.as_ref().map(prefetch::Prefetcher::stats)
    }
}
