//! A runtime's restarts: which version every rank can restart from
//! (`latest`, `versions`), the restore of one (`restart`) or of the newest
//! that restores everywhere (`restart_latest`, falling back and setting
//! aside what it skipped), each step agreed over the ranks so that every
//! rank ends alike: restarted, starting from the beginning, or one error.

use super::{Named, Runtime, Staging, check_name, check_table, table_of};
use crate::collective::TieredCollective;
use crate::collective::mpi::{all_agree, all_agree_on_name};
use crate::error::{Error, Result};
use crate::memory::ProtectedMut;
use ::mpi::traits::*;
use std::collections::BTreeMap;

use super::raw::{self, Region};

impl Runtime {
    /// The newest version of `name` that every rank can restart from (its
    /// regions protected first, as for a checkpoint); `None` if there is
    /// none. Before the name is used in this process, read from the tiers'
    /// manifests and commit records alone (nothing is opened or restored);
    /// afterwards, the newest version taken. A checkpoint written by a job
    /// of another size is [`Error::RankCount`] on every rank. Collective.
    pub fn latest(&mut self, name: &str) -> Result<Option<u64>> {
        let _span = crate::profile::Span::new("runtime-latest", 0);
        all_agree_on_name(&self.comm, "finding the latest version", 0, name, check_name(name))?;
        if !self.names.contains_key(name) {
            // A lost node's files rebuilt first, from the other nodes' copies.
            check_name(name)?;
            // (Ranks that disagree on redundancy would meet in different collectives.)
            crate::runtime::agreement::agree_on_config(&self.comm, &self.config)?;
            let opts = self.config.collective_options();
            TieredCollective::prepare(&self.comm, &self.tiers(name), &opts)?;
        }
        let mine = match self.names.get_mut(name) {
            Some(named) => {
                named.ckpt.settle();
                Ok(named.ckpt.engine().latest().unwrap_or(0))
            }
            None => self.listed_newest(name),
        };
        let mine = all_agree(&self.comm, "finding the latest version", 0, mine)?;
        let mut newest = 0u64;
        self.comm.all_reduce_into(&mine, &mut newest, ::mpi::collective::SystemOperation::min());
        let mut highest = 0u64;
        self.comm.all_reduce_into(&mine, &mut highest, ::mpi::collective::SystemOperation::max());
        if highest > newest && !self.names.contains_key(name) {
            // Versions some rank lists and another cannot (a lost node's
            // versions its copies could not rebuild, a rank that lists
            // none): no restart reaches them, and the job will take their
            // numbers again. Set aside on every tier of every rank, as a
            // fallback does; with no version common to every rank, all of
            // them: the job starts from the beginning, on purpose.
            self.set_aside_on_every_tier(name, newest, "setting aside the versions not every rank has")?;
            let rank = self.rank();
            if rank == 0 && newest > 0 {
                tracing::warn!(
                    "checkpoint '{name}': versions {}..={highest} are not on every rank; set aside (*.damaged), \
                     the job restarts from version {newest}",
                    newest + 1
                );
            } else if rank == 0 {
                tracing::warn!(
                    "checkpoint '{name}': no version is on every rank (some list up to {highest}); all set aside \
                     (*.damaged), the job starts from the beginning"
                );
            }
        }
        Ok((newest > 0).then_some(newest))
    }

    /// Refuses, on every rank alike, version `version` of `name` whose
    /// ranks' files are not the ones the commit records name: a directory
    /// of another run put in place of one rank's (a node restored from the
    /// wrong backup) would otherwise restart that rank from another run's
    /// state; a damaged trailer fails here too, before anything is read. Each rank's file trailer is gathered and compared with the
    /// commit record of `version` each rank reads on its tiers (none
    /// found: nothing to compare). Collective.
    fn check_one_run(&self, name: &str, version: u64) -> Result<()> {
        const HEX: usize = 64;
        let roots = self.tier_roots(name);
        let rank = self.rank();
        // The file's own trailer (its last 32 bytes), not its manifest's
        // entry: opening a store rolls the entries forward from the records.
        let trailer_of = |root: &std::path::Path| -> Option<String> {
            use std::io::{Read, Seek, SeekFrom};
            let path = root.join(crate::store::rank_rel(rank)).join(crate::store::diff_file_name(version));
            let mut file = crate::storage::fsio::open_regular(&path).ok()?;
            file.seek(SeekFrom::End(-32)).ok()?;
            let mut trailer = [0u8; 32];
            file.read_exact(&mut trailer).ok()?;
            Some(hex::encode(trailer))
        };
        let mine = roots.iter().find_map(|r| trailer_of(r)).unwrap_or_default();
        let mut sent = [0u8; HEX];
        let n = mine.len().min(HEX);
        sent[..n].copy_from_slice(&mine.as_bytes()[..n]);
        let mut all = vec![0u8; HEX * self.comm.size() as usize];
        self.comm.all_gather_into(&sent[..], &mut all[..]);
        let compared = (|| -> Result<()> {
            for root in &roots {
                let log = crate::store::commits::CommitLog::load(root)?;
                let Some(record) = log.records().find(|r| r.version == version) else { continue };
                let odd: Vec<u32> = record
                    .entries
                    .iter()
                    .filter(|e| {
                        let got = all.get(e.rank as usize * HEX..(e.rank as usize + 1) * HEX).unwrap_or_default();
                        let got = std::str::from_utf8(got).unwrap_or_default().trim_end_matches('\0');
                        !got.is_empty() && got != e.trailer
                    })
                    .map(|e| e.rank)
                    .collect();
                if !odd.is_empty() {
                    return Err(Error::corrupt(
                        root,
                        format!(
                            "version {version}: rank(s) {odd:?} hold files other than the ones the commit records \
                             name (a directory of another run in place of theirs?): move it away; the job then \
                             rebuilds those ranks from their copies, or starts from the beginning"
                        ),
                    ));
                }
                return Ok(());
            }
            Ok(())
        })();
        all_agree(&self.comm, "checking that every rank's files are of one run", version, compared)
    }

    /// This rank's newest version of `name` listed on any tier (0 if none),
    /// from the manifests alone, once the protected regions and the job's
    /// size are checked against what the name holds.
    fn listed_newest(&self, name: &str) -> Result<u64> {
        check_name(name)?;
        let shapes = self.shapes();
        if shapes.is_empty() {
            return Err(Error::InvalidOption(format!("checkpoint '{name}': no region is protected")));
        }
        let table = table_of(self.rank(), &shapes);
        let t = self.tiers(name);
        let roots: Vec<std::path::PathBuf> = [t.local, t.shared].into_iter().flatten().collect();
        // A damaged manifest of this rank is rebuilt from its verified
        // files first (what `dckpt repair` would do for it).
        for root in &roots {
            if let Some(report) = crate::repair::mend_manifest(root, self.rank())? {
                for a in &report.actions {
                    tracing::warn!("rank {}: {}: {}", self.rank(), a.path.display(), a.what);
                }
            }
        }
        self.check_rank_count(name)?;
        check_table(&roots, &table)?;
        Ok(self.listed_versions(name)?.last().copied().unwrap_or(0))
    }

    /// Refuses a name written by a job of another size
    /// ([`Error::RankCount`]): the most ranks its commit records or region
    /// tables name, on any tier (a table lost on every tier does not make
    /// the job look smaller).
    pub(super) fn check_rank_count(&self, name: &str) -> Result<()> {
        let written = crate::runtime::table::written_rank_count(&self.tier_roots(name))?;
        let now = self.comm.size().max(1) as u32;
        if written == 0 || written == now {
            return Ok(());
        }
        Err(Error::RankCount { name: name.to_string(), written, now })
    }

    /// Restores version `version` of `name` into every protected region
    /// (device regions on the device), reading it once: the next checkpoint
    /// continues from those same bytes. Collective: it succeeds on every
    /// rank or fails on every rank (naming the ranks that could not
    /// restore), so no rank goes on alone. On an error the regions' content
    /// is unspecified. [`Runtime::restart_latest`] falls back to older
    /// versions instead.
    pub fn restart(&mut self, name: &str, version: u64) -> Result<()> {
        all_agree_on_name(&self.comm, "the restart", version, name, check_name(name))?;
        let restored = self.restart_here(name, version);
        all_agree(&self.comm, "the restart", version, restored)?;
        self.place_restored(name, version)
    }

    /// Restarts from the newest version of `name` that restores on every
    /// rank: the newest listed first; where it does not restore on some
    /// rank (damage on every tier), the ranks agree on the next older one,
    /// and so on. Returns the version restored (`None` if there is none:
    /// start from the beginning), with one warning naming what was skipped.
    /// Collective.
    pub fn restart_latest(&mut self, name: &str) -> Result<Option<u64>> {
        let Some(mut version) = self.latest(name)? else {
            if self.rank() == 0 {
                tracing::info!("checkpoint '{name}': no version every rank holds; the job starts from the beginning");
            }
            return Ok(None);
        };
        if self.rank() == 0 {
            tracing::info!("checkpoint '{name}': restarting from version {version}, the newest every rank holds");
        }
        let mut skipped = Vec::new();
        // Whether every version skipped on this rank was damaged (not a
        // condition of this machine, such as an I/O error).
        let mut only_damage = true;
        loop {
            // A store another process still writes (the job before, still
            // ending) says nothing about any version: every rank stops with
            // that error, nothing set aside, and the next run proceeds once
            // that process is gone.
            let (restored, busy) = match self.restart_here(name, version) {
                Err(e) if crate::repair::is_in_use(&e) => (None, Err(e)),
                restored => (Some(restored), Ok(())),
            };
            all_agree(&self.comm, "the restart", version, busy)?;
            let restored = restored.ok_or_else(|| Error::Internal("a store in use agreed as free".into()))?;
            only_damage &= restored.as_ref().err().is_none_or(crate::repair::is_damage);
            let ok = u64::from(restored.is_ok());
            let mut everywhere = 0u64;
            self.comm.all_reduce_into(&ok, &mut everywhere, ::mpi::collective::SystemOperation::min());
            if everywhere == 1 {
                self.place_restored(name, version)?;
                tracing::debug!("checkpoint '{name}': version {version} restored and placed");
                if !skipped.is_empty() {
                    self.set_aside_newer(name, version)?;
                    if self.rank() == 0 {
                        tracing::warn!(
                            "checkpoint '{name}': restarted from version {version}; skipped (set aside as *.damaged) {}",
                            skipped.join("; ")
                        );
                    }
                }
                return Ok(Some(version));
            }
            let why = restored.err().map_or_else(|| "it did not restore on another rank".into(), |e| e.to_string());
            skipped.push(format!("version {version} (rank {}: {why})", self.rank()));
            // The next older version every rank lists.
            let older = self.listed_below(name, version).unwrap_or(0);
            let mut next = 0u64;
            self.comm.all_reduce_into(&older, &mut next, ::mpi::collective::SystemOperation::min());
            if next == 0 {
                // Damaged on every rank's tiers: the job starts from the
                // beginning on purpose, every version set aside (kept as
                // `*.damaged`), rather than fail the same way on every run.
                let damage = u64::from(only_damage);
                let mut everywhere = 0u64;
                self.comm.all_reduce_into(&damage, &mut everywhere, ::mpi::collective::SystemOperation::min());
                let tried = skipped.join("; ");
                if everywhere == 1 {
                    self.set_aside_newer(name, 0)?;
                    if self.rank() == 0 {
                        tracing::warn!(
                            "checkpoint '{name}': no version restores on every rank (damaged: {tried}); all set \
                             aside (*.damaged), the job starts from the beginning"
                        );
                    }
                    return Ok(None);
                }
                return Err(Error::Collective(format!(
                    "checkpoint '{name}': no version restores on every rank; tried {tried}"
                )));
            }
            version = next;
        }
    }

    /// The versions of `name` every rank lists on some tier, oldest first:
    /// what [`Runtime::restart`] may be asked for (each is restored and
    /// verified only when asked; [`Runtime::restart_latest`] falls back
    /// through them). Read from the manifests, nothing opened. Collective.
    pub fn versions(&mut self, name: &str) -> Result<Vec<u64>> {
        all_agree_on_name(&self.comm, "listing the versions", 0, name, check_name(name))?;
        let mine = self.listed_versions(name);
        let mine = all_agree(&self.comm, "listing the versions", 0, mine)?;
        // Rank 0's list, then each rank's membership of it, reduced.
        let mut count = mine.len() as u64;
        let root = self.comm.process_at_rank(0);
        root.broadcast_into(&mut count);
        let mut candidates = if self.rank() == 0 { mine.clone() } else { vec![0u64; count as usize] };
        if count > 0 {
            root.broadcast_into(&mut candidates[..]);
        }
        let member: Vec<u64> = candidates.iter().map(|v| u64::from(mine.binary_search(v).is_ok())).collect();
        let mut everywhere = vec![0u64; member.len()];
        if !member.is_empty() {
            self.comm.all_reduce_into(&member[..], &mut everywhere[..], ::mpi::collective::SystemOperation::min());
        }
        Ok(candidates.into_iter().zip(everywhere).filter(|&(_, e)| e == 1).map(|(v, _)| v).collect())
    }

    /// The versions of `name` this rank lists on any tier, sorted.
    fn listed_versions(&self, name: &str) -> Result<Vec<u64>> {
        self.check_rank_count(name)?;
        let t = self.tiers(name);
        let mut all = std::collections::BTreeSet::new();
        for root in [t.local, t.shared].into_iter().flatten() {
            match crate::store::Store::open(&root, self.rank()) {
                Ok(store) => all.extend(store.manifest().versions.iter().map(|v| v.version)),
                Err(Error::NoStore { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(all.into_iter().collect())
    }

    /// After a fallback to `keep`: the versions newer than it leave the
    /// history on every tier of every rank (set aside, not deleted), so the
    /// application's next checkpoints, numbered from `keep` on, proceed.
    /// The name is closed and opened again (from the manifests; the first
    /// checkpoint rebuilds the state from `keep`). Collective.
    fn set_aside_newer(&mut self, name: &str, keep: u64) -> Result<()> {
        let closed = match self.names.remove(name) {
            Some(named) => named.ckpt.finalize(),
            None => Ok(()),
        };
        all_agree(&self.comm, "closing the name", keep, closed)?;
        self.set_aside_on_every_tier(name, keep, "setting aside the skipped versions")?;
        self.named(name).map(drop)
    }

    /// This rank's versions of `name` newer than `keep` set aside on every
    /// tier (`repair::set_aside_newer`), agreed as `step`. Collective.
    fn set_aside_on_every_tier(&self, name: &str, keep: u64, step: &str) -> Result<()> {
        let rank = self.rank();
        let done = self
            .tier_roots(name)
            .iter()
            .try_for_each(|root| crate::repair::set_aside_newer(root, rank, keep).map(drop));
        all_agree(&self.comm, step, keep, done)
    }

    /// The newest version older than `version` this rank lists on any tier.
    fn listed_below(&self, name: &str, version: u64) -> Result<u64> {
        Ok(self.listed_versions(name)?.into_iter().filter(|&v| v < version).max().unwrap_or(0))
    }

    /// This rank's part of a restart (the name opened if needed; its
    /// flushes of `version` settled on every rank first).
    fn restart_here(&mut self, name: &str, version: u64) -> Result<()> {
        let _span = crate::profile::Span::new("runtime-restart", version);
        let regions = self.regions.clone();
        if !self.names.contains_key(name) {
            // Agreed, as every step before the name's collectives.
            let counted = self.check_rank_count(name);
            all_agree(&self.comm, "checking the job's size", version, counted)?;
            // Damage of a file's trailer, or another run's directory: this
            // version fails on every rank (`restart_latest` falls back).
            self.check_one_run(name, version)?;
        }
        let named = {
            let _span = crate::profile::Span::new("restart-open", version);
            self.named(name)?
        };
        {
            let _span = crate::profile::Span::new("restart-settle", version);
            named.ckpt.settle_for_restore(version);
        }
        let _span = crate::profile::Span::new("restart-restore", version);
        Self::restart_named(named, &regions, version)
    }

    /// The restore of a restart into `named`'s staging (a direct name's
    /// one region is restored in place).
    fn restart_named(named: &mut Named, regions: &BTreeMap<u32, Region>, version: u64) -> Result<()> {
        match &mut named.staging {
            Staging::Host(buf) => named.ckpt.restart_into(version, ProtectedMut::Host(buf)),
            Staging::Device(staging) => {
                staging.region().and_then(|region| named.ckpt.restart_into(version, ProtectedMut::Device(region)))
            }
            Staging::Direct => match raw::pieces_mut(regions).pop() {
                Some((_, region)) => named.ckpt.restart_into(version, region),
                None => Err(Error::Internal("a direct name has one region".into())),
            },
        }
    }

    /// Once every rank restored `version` of `name` into its staging: the
    /// bytes copied into the protected regions (so that a restart failing on
    /// any rank changes no region of a staged name, on any rank), then the
    /// host cache let be made. Collective.
    fn place_restored(&mut self, name: &str, version: u64) -> Result<()> {
        let _span = crate::profile::Span::new("restart-scatter", version);
        let regions = self.regions.clone();
        let named = self.names.get_mut(name).ok_or_else(|| Error::Internal("named checkpoint".into()));
        let placed = named.and_then(|named| {
            let placed = match &mut named.staging {
                Staging::Host(buf) => {
                    raw::scatter_host(&regions, buf);
                    Ok(())
                }
                Staging::Device(staging) => staging.scatter(&mut raw::pieces_mut(&regions)),
                Staging::Direct => Ok(()),
            };
            // The host cache is made from now on: nothing was allocated
            // beside the restore and the copy into the application's memory.
            named.ckpt.engine().make_cache();
            placed
        });
        all_agree(&self.comm, "placing the restored bytes", version, placed)
    }
}
