//! [`Runtime`]: the handle (see the module documentation of `runtime`).

use crate::backend::cuda::DeviceStaging;
use crate::collective::mpi::{all_agree, all_agree_on_name};
use crate::collective::{CollectiveReport, TieredCollective};
use crate::config::{Config, Mode};
use crate::error::{Error, Result};
use crate::memory::{Protected, ProtectedMut};
use crate::tiers::TieredReport;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use super::raw::{self, Region};
use super::study::RunStats;
use super::table::{RegionTable, TableEntry};

/// A process's checkpointing runtime (see the module documentation).
pub struct Runtime {
    comm: SimpleCommunicator,
    config: Config,
    /// The regions protected now (`raw` adds them).
    pub(super) regions: BTreeMap<u32, Region>,
    names: HashMap<String, Named>,
    stats: RunStats,
    /// This rank's node (`{node}` in `scratch`).
    node: u32,
}

/// What a region looks like to a name's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    id: u32,
    len: usize,
    device: bool,
}

/// One checkpoint name's collective handle, its regions' layout and the
/// buffer they are gathered into.
struct Named {
    ckpt: TieredCollective,
    shapes: Vec<Shape>,
    staging: Staging,
    /// Checkpoint calls of this name in this process.
    calls: u64,
}

/// Where the regions are gathered.
enum Staging {
    /// Host regions only.
    Host(Vec<u8>),
    /// Some device region among others: one device buffer.
    Device(DeviceStaging),
    /// One region and nothing else (host or device): checkpointed and
    /// restored in place, with no staging copy (none in the call's time, and
    /// none against the host's or the device's memory).
    Direct,
}

impl Runtime {
    /// A runtime over a duplicate of `comm` with `config` (checked already:
    /// [`Config::load`]). Nothing is opened until a checkpoint or restart.
    /// Collective; rank 0 warns on standard error when a rank is bound to
    /// one CPU of a node with CPUs to spare ([`super::placement`]). Logs go
    /// to standard error at the level `DCKPT_LOG` sets ([`crate::log`]).
    pub fn init<C: Communicator>(comm: &C, config: Config) -> Runtime {
        crate::log::init(Some(comm.rank().max(0) as u32));
        super::placement::warn_if_crowded(comm);
        let node = crate::collective::protect::node_map(comm, config.ranks_per_node).node(comm.rank().max(0) as u32);
        Runtime {
            comm: comm.duplicate(),
            config,
            regions: BTreeMap::new(),
            names: HashMap::new(),
            stats: RunStats::default(),
            node,
        }
    }

    /// The tiers of checkpoint `name` on this rank's node (`{node}` in
    /// `scratch` replaced by its index).
    fn tiers(&self, name: &str) -> crate::tiers::TierOptions {
        let t = self.config.tier_options(name);
        crate::tiers::TierOptions { local: t.local.as_deref().map(|d| crate::redundancy::on_node(d, self.node)), ..t }
    }

    /// Whether checkpoint `name` is open in this process (a checkpoint or a
    /// restart opened it; `latest` alone does not).
    pub fn is_open(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// The configuration the runtime runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What this rank's checkpoint calls cost so far (every name). A
    /// version whose collective step still runs in the background counts
    /// its stored bytes and reduction once settled ([`Runtime::settle`]).
    pub fn stats(&self) -> RunStats {
        self.stats
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.comm.rank().max(0) as u32
    }

    /// Stops protecting region `id`.
    pub fn unprotect(&mut self, id: u32) -> Result<()> {
        self.regions
            .remove(&id)
            .map(|_| ())
            .ok_or_else(|| Error::MissingRegion { rank: self.rank(), what: format!("region {id} is not protected") })
    }

    /// The regions protected now, in id order, as a layout.
    fn shapes(&self) -> Vec<Shape> {
        self.regions.iter().map(|(&id, r)| Shape { id, len: r.len(), device: r.is_device() }).collect()
    }

    /// The open handle of `name` (opened on first use), its layout checked
    /// against the regions protected now. Collective: every rank's checks
    /// are agreed first, so a refusal on one rank is an error on all (none
    /// is left waiting in a collective call).
    fn named(&mut self, name: &str) -> Result<&mut Named> {
        let shapes = self.shapes();
        let table = table_of(self.rank(), &shapes);
        let t = self.tiers(name);
        let roots: Vec<std::path::PathBuf> = [t.local, t.shared].into_iter().flatten().collect();
        let verdict = match self.names.get(name) {
            Some(named) => same_shapes(name, &named.shapes, &shapes),
            None => check_name(name)
                .and_then(|()| match shapes.is_empty() {
                    true => Err(Error::InvalidOption(format!("checkpoint '{name}': no region is protected"))),
                    false => Ok(()),
                })
                .and_then(|()| check_table(&roots, &table)),
        };
        all_agree(&self.comm, "the protected regions", 0, verdict)?;
        if !self.names.contains_key(name) {
            super::agreement::agree_on_config(&self.comm, &self.config)?;
            let total: usize = shapes.iter().map(|s| s.len).sum();
            let store = self.config.store_options();
            let opts = self.config.collective_options();
            let ckpt = {
                let _span = crate::profile::Span::new("runtime-open", 0);
                TieredCollective::open(&self.comm, &self.tiers(name), total as u64, &store, &opts)?
            };
            let _span = crate::profile::Span::new("runtime-tables", 0);
            let written = roots.iter().try_for_each(|root| table.write(root));
            all_agree(&self.comm, "writing the region tables", 0, written)?;
            // Every node's directory holds every rank's table (a restart on
            // another node count, or after a node loss, reads them there).
            TieredCollective::share_across_nodes(&self.comm, &self.tiers(name), &opts)?;
            let staging = if let [_] = shapes[..] {
                Staging::Direct
            } else if shapes.iter().any(|s| s.device) {
                Staging::Device(DeviceStaging::new(ckpt.engine().device(), total)?)
            } else {
                Staging::Host(vec![0u8; total])
            };
            self.names.insert(name.to_string(), Named { ckpt, shapes, staging, calls: 0 });
        }
        self.names.get_mut(name).ok_or_else(|| Error::Internal("named checkpoint".into()))
    }

    /// Takes version `version` of checkpoint `name`: every protected region
    /// of every rank, as one collective checkpoint. Returns once the
    /// regions may change again (mode `async`) or once the version is
    /// durable on every tier of every rank (mode `sync`). Collective.
    pub fn checkpoint(&mut self, name: &str, version: u64) -> Result<CollectiveReport<TieredReport>> {
        let opening = self.names.get(name).is_none_or(|n| n.calls == 0);
        let started = std::time::Instant::now();
        let report = self.checkpoint_untimed(name, version)?;
        let seconds = started.elapsed().as_secs_f64();
        if let Some(named) = self.names.get_mut(name) {
            named.calls += 1;
        }
        let s = &mut self.stats;
        s.checkpoints += 1;
        s.checkpoint_seconds += seconds;
        if opening {
            s.opening_calls += 1;
            s.opening_seconds += seconds;
        }
        s.dedup_seconds += report.local_seconds;
        s.held_on_gpu += u64::from(report.checkpoint.held_on_gpu);
        s.overlapped_calls += u64::from(!report.settled);
        s.protected_bytes += self.regions.values().map(|r| r.len() as u64).sum::<u64>();
        let (mut waits, mut wait_seconds) = (0, 0.0);
        for named in self.names.values() {
            let (w, secs, lag) = named.ckpt.copy_lag();
            waits += w;
            wait_seconds += secs;
            s.max_copy_lag_seen = s.max_copy_lag_seen.max(lag as u64);
        }
        (s.copy_waits, s.copy_wait_seconds) = (waits, wait_seconds);
        self.account_settled();
        Ok(report)
    }

    /// Adds the versions settled since the last call to the statistics:
    /// their stored and referenced bytes and reductions (a version whose
    /// collective step runs in the background settles at the next
    /// collective call).
    fn account_settled(&mut self) {
        for named in self.names.values_mut() {
            for r in named.ckpt.take_settled() {
                self.stats.reduce_seconds += r.reduce_seconds;
                self.stats.stored_bytes += r.checkpoint.file_bytes;
                self.stats.referenced_bytes += r.bytes_referenced;
            }
        }
    }

    /// Settles every name's version whose collective step still runs in the
    /// background (see [`crate::collective::TieredCollective::settle`]), so
    /// that [`Runtime::stats`] counts every version taken. Collective.
    pub fn settle(&mut self) {
        let mut names: Vec<&String> = self.names.keys().collect();
        names.sort(); // the same order on every rank
        let names: Vec<String> = names.into_iter().cloned().collect();
        for name in names {
            if let Some(named) = self.names.get_mut(&name) {
                named.ckpt.settle();
            }
        }
        self.account_settled();
    }

    fn checkpoint_untimed(&mut self, name: &str, version: u64) -> Result<CollectiveReport<TieredReport>> {
        // 0 is `latest`'s "none" in C and Fortran: never a version.
        let numbered = crate::error::check_version_number(version);
        all_agree_on_name(&self.comm, "the checkpoint's number and name", version, name, numbered)?;
        let regions = self.regions.clone();
        let sync = self.config.mode == Mode::Sync;
        {
            let _span = crate::profile::Span::new("runtime-regions", version);
            self.named(name)?;
        }
        // A device gather can fail on one rank: every rank agrees first, so
        // none enters the checkpoint's collectives alone.
        let _span = crate::profile::Span::new("runtime-gather", version);
        let gathered = self.gather(name, &regions);
        all_agree(&self.comm, "gathering the regions", version, gathered)?;
        drop(_span);
        let named = self.names.get_mut(name).ok_or_else(|| Error::Internal("named checkpoint".into()))?;
        let taken = match &mut named.staging {
            Staging::Host(buf) => named.ckpt.checkpoint(version, Protected::Host(buf)),
            Staging::Device(staging) => staging.region().and_then(|region| named.ckpt.checkpoint(version, region)),
            Staging::Direct => match raw::pieces(&regions)[..] {
                [(_, region)] => named.ckpt.checkpoint(version, region),
                _ => Err(Error::Internal("a direct name has one region".into())),
            },
        };
        // Every rank leaves with the same outcome: a rank whose hand-over to
        // its flush workers failed after the last agreement must not leave
        // the others waiting in `wait`.
        let report = {
            let _span = crate::profile::Span::new("runtime-agree", version);
            all_agree(&self.comm, "the checkpoint", version, taken)?
        };
        if sync {
            let named = self.names.get_mut(name).ok_or_else(|| Error::Internal("named checkpoint".into()))?;
            named.ckpt.wait(version)?;
        }
        Ok(report)
    }

    /// Copies the protected regions into `name`'s buffer (host regions by a
    /// copy, device regions device to device; a direct name needs none).
    fn gather(&mut self, name: &str, regions: &BTreeMap<u32, Region>) -> Result<()> {
        let named = self.names.get_mut(name).ok_or_else(|| Error::Internal("named checkpoint".into()))?;
        match &mut named.staging {
            Staging::Host(buf) => {
                raw::gather_host(regions, buf);
                Ok(())
            }
            Staging::Device(staging) => {
                staging.gather(&raw::pieces(regions)).and_then(|()| staging.region().map(|_| ()))
            }
            Staging::Direct => Ok(()),
        }
    }

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
            super::agreement::agree_on_config(&self.comm, &self.config)?;
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
            let t = self.tiers(name);
            let rank = self.rank();
            let done = [t.local, t.shared]
                .into_iter()
                .flatten()
                .try_for_each(|root| crate::repair::set_aside_newer(&root, rank, newest).map(drop));
            all_agree(&self.comm, "setting aside the versions not every rank has", newest, done)?;
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
        let roots = self.table_roots(name);
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
            Some(crate::store::hex(&trailer))
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
    fn check_rank_count(&self, name: &str) -> Result<()> {
        let written = super::table::written_rank_count(&self.table_roots(name))?;
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
        let Some(mut version) = self.latest(name)? else { return Ok(None) };
        let mut skipped = Vec::new();
        // Whether every version skipped on this rank was damaged (not a
        // condition of this machine, such as an I/O error).
        let mut only_damage = true;
        loop {
            let restored = self.restart_here(name, version);
            only_damage &= restored.as_ref().err().is_none_or(crate::repair::is_damage);
            let ok = u64::from(restored.is_ok());
            let mut everywhere = 0u64;
            self.comm.all_reduce_into(&ok, &mut everywhere, ::mpi::collective::SystemOperation::min());
            if everywhere == 1 {
                self.place_restored(name, version)?;
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
        let t = self.tiers(name);
        let rank = self.rank();
        let done = [t.local, t.shared]
            .into_iter()
            .flatten()
            .try_for_each(|root| crate::repair::set_aside_newer(&root, rank, keep).map(drop));
        all_agree(&self.comm, "setting aside the skipped versions", keep, done)?;
        self.named(name).map(drop)
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

    /// The tier directory old ranks' tables and files are read from: the
    /// persistent one (every rank sees it), else the scratch one.
    fn read_root(&self, name: &str) -> Result<std::path::PathBuf> {
        check_name(name)?;
        let t = self.tiers(name);
        t.shared.or(t.local).ok_or_else(|| Error::InvalidOption("no directory configured".into()))
    }

    /// The regions every rank of the job that wrote `name` protected (any
    /// number of ranks; for a restart on another rank count). Not collective.
    pub fn old_regions(&self, name: &str) -> Result<Vec<RegionTable>> {
        check_name(name)?;
        super::table::all_tables_of_tiers(&self.table_roots(name))
    }

    /// The tier directories of `name` that hold region tables, fastest first.
    fn table_roots(&self, name: &str) -> Vec<std::path::PathBuf> {
        let t = self.tiers(name);
        [t.local, t.shared].into_iter().flatten().collect()
    }

    /// The versions of `name` committed (restorable on every old rank).
    pub fn committed_versions(&self, name: &str) -> Result<Vec<u64>> {
        super::table::committed_versions(&self.read_root(name)?)
    }

    /// Bytes `range` of region `id` of old rank `rank` at `version` of
    /// `name`, verified (for a restart on another rank count). Not
    /// collective.
    pub fn read_region(&self, name: &str, rank: u32, id: u32, version: u64, range: Range<u64>) -> Result<Vec<u8>> {
        // A table damaged on the tier read is written again from another's.
        super::table::tables_of_tiers(&self.table_roots(name), Some(rank))?;
        super::table::read_region(&self.read_root(name)?, rank, id, version, range)
    }

    /// Blocks until `version` of `name` is durable on every tier of every
    /// rank. Collective.
    pub fn wait(&mut self, name: &str, version: u64) -> Result<()> {
        let waited = self.named(name)?.ckpt.wait(version);
        self.account_settled();
        waited
    }

    /// Hints that `version` of `name` will be restored after the versions
    /// hinted before it (with a prefetch cache configured).
    pub fn prefetch_enqueue(&mut self, name: &str, version: u64) -> Result<()> {
        self.named(name)?.ckpt.engine().prefetch_enqueue(version);
        Ok(())
    }

    /// Starts prefetching the hinted versions of `name`.
    pub fn prefetch_start(&mut self, name: &str) -> Result<()> {
        self.named(name)?.ckpt.engine().prefetch_start();
        Ok(())
    }

    /// What the prefetching restores of `name` did so far (`None` without a
    /// prefetch cache, or before `name` was used).
    pub fn prefetch_stats(&self, name: &str) -> Option<crate::tiers::prefetch::PrefetchStats> {
        self.names.get(name).and_then(|n| n.ckpt.engine().prefetch_stats())
    }

    /// Waits until every checkpoint taken is durable everywhere and stops
    /// the background threads; the first failure, if any. Collective.
    pub fn finalize(self) -> Result<()> {
        let mut names: Vec<(String, Named)> = self.names.into_iter().collect();
        names.sort_by(|a, b| a.0.cmp(&b.0)); // the same order on every rank
        let mut first = Ok(());
        for (_, named) in names {
            let done = named.ckpt.finalize();
            if first.is_ok() {
                first = done;
            }
        }
        first
    }
}

/// Names become directory names: letters, digits, `.`, `_`, `-`.
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidOption(format!(
            "checkpoint name '{name}': use letters, digits, '.', '_' and '-' (not first '.')"
        )))
    }
}

/// Refuses a set of regions other than the one `name` was opened with.
fn same_shapes(name: &str, opened: &[Shape], now: &[Shape]) -> Result<()> {
    if opened == now {
        return Ok(());
    }
    Err(Error::Mismatch {
        what: "protected regions (protect the same ids with the same lengths, or use a new name)",
        dir: std::path::PathBuf::from(name),
        existing: format!("{:?}", describe(opened)),
        requested: format!("{:?}", describe(now)),
    })
}

/// This rank's table of `shapes` (offsets in the gathered buffer).
fn table_of(rank: u32, shapes: &[Shape]) -> RegionTable {
    let mut offset = 0;
    let regions = shapes
        .iter()
        .map(|s| {
            let e = TableEntry { id: s.id, len: s.len as u64, offset, device: s.device };
            offset += s.len as u64;
            e
        })
        .collect();
    RegionTable { rank, regions }
}

/// Refuses `table` where the tiers `roots` hold this rank's table of other
/// regions (other ids or lengths; where each lives may change between
/// runs: a checkpoint of device memory restarts into host memory and back).
/// A copy damaged on one tier is written again from another's; damaged on
/// every tier, it is an error, not "none".
fn check_table(roots: &[std::path::PathBuf], table: &RegionTable) -> Result<()> {
    let old = match super::table::tables_of_tiers(roots, Some(table.rank)) {
        // This rank's table damaged on every tier: written again from the
        // regions protected now (the checkpoints' length still checks them
        // when the name opens), the damaged copies set aside.
        Err(e @ Error::Corrupt { .. }) => {
            super::table::set_aside_table(roots, table.rank, &e);
            return Ok(());
        }
        other => other?,
    };
    let root = roots.first().cloned().unwrap_or_default();
    let layout = |t: &RegionTable| t.regions.iter().map(|e| (e.id, e.len, e.offset)).collect::<Vec<_>>();
    match old.iter().find(|t| t.rank == table.rank) {
        Some(t) if layout(t) != layout(table) => Err(Error::Mismatch {
            what: "protected regions (protect the same ids with the same lengths, or use a new name)",
            dir: root,
            existing: format!("{:?} on rank {}", t.regions.iter().map(|e| (e.id, e.len)).collect::<Vec<_>>(), t.rank),
            requested: format!("{:?}", table.regions.iter().map(|e| (e.id, e.len)).collect::<Vec<_>>()),
        }),
        _ => Ok(()),
    }
}

fn describe(shapes: &[Shape]) -> Vec<String> {
    shapes.iter().map(|s| format!("{}:{}{}", s.id, s.len, if s.device { " (device)" } else { "" })).collect()
}

impl Runtime {
    /// Protects `region` as region `id` (replacing what `id` protected: a
    /// region may move between checkpoints; its length and kind may not,
    /// for a name already checkpointed).
    ///
    /// # Safety
    /// Until `id` is unprotected or re-protected, or the runtime is dropped:
    /// the region stays allocated (host memory readable and writable; device
    /// memory on the runtime's GPU, allocated in its primary context), and
    /// while a call of this runtime runs, nothing else reads or writes it
    /// (the application's device work on it is complete: its streams are
    /// synchronized).
    #[allow(unsafe_code)] // a contract on the caller; the memory is touched in `raw` only
    pub unsafe fn protect(&mut self, id: u32, region: Region) -> Result<()> {
        raw::check(id, &region)?;
        self.regions.insert(id, region);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_of_device_memory_restarts_into_host_memory_but_not_into_other_regions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shapes =
            |device: bool, len: usize| vec![Shape { id: 0, len, device }, Shape { id: 1, len: 8, device: false }];
        table_of(2, &shapes(true, 4096)).write(dir.path()).expect("write");
        // The same ids and lengths, now in host memory: accepted.
        check_table(&[dir.path().to_path_buf()], &table_of(2, &shapes(false, 4096))).expect("host after device");
        // Another length: refused, naming the checkpoint.
        let refused =
            check_table(&[dir.path().to_path_buf()], &table_of(2, &shapes(false, 2048))).expect_err("other length");
        assert_eq!(refused.kind(), crate::error::ErrorKind::Mismatch, "{refused}");
        // Another rank's table is not this rank's business.
        check_table(&[dir.path().to_path_buf()], &table_of(3, &shapes(false, 2048))).expect("other rank");
    }
}
