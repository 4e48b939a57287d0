//! [`Runtime`]: the handle (see the module documentation of `runtime`).

use crate::backend::cuda::DeviceStaging;
use crate::collective::mpi::{all_agree, all_agree_on_name};
use crate::collective::{CollectiveReport, TieredCollective};
use crate::config::{Config, Mode};
use crate::error::{Error, Result};
use crate::memory::Protected;
use crate::tiers::TieredReport;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use super::raw::{self, Region};

mod restart;
mod stopping;
use super::study::RunStats;
use super::table::{RegionTable, TableEntry};
pub use stopping::HaltReason;

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
    /// What [`Runtime::should_exit`] keeps between calls.
    halt: stopping::HaltState,
    /// The per-node agent that finishes a killed job's flushes.
    agent: super::agent_watch::AgentWatch,
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
        super::placement::size_the_pool(comm);
        let node = crate::collective::protect::node_map(comm, config.ranks_per_node).node(comm.rank().max(0) as u32);
        // What a killed job left is finished on every node before any rank
        // opens a store.
        let agent = super::agent_watch::AgentWatch::start(&config);
        comm.barrier();
        Runtime {
            comm: comm.duplicate(),
            config,
            regions: BTreeMap::new(),
            names: HashMap::new(),
            stats: RunStats::default(),
            node,
            halt: stopping::HaltState::default(),
            agent,
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
                .and_then(|()| check_table(&roots, &table))
                // A store another job size wrote is not this job's to add to.
                .and_then(|()| self.check_rank_count(name)),
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
            if self.rank() == 0 {
                let tiers: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
                tracing::info!(
                    "checkpoint '{name}': opened, {} region(s), {total} bytes a rank on rank 0, backend {}, tiers {}, {}",
                    shapes.len(),
                    ckpt.engine().backend(),
                    tiers.join(" and "),
                    if opts.local_only { "local-only" } else { "collective" }
                );
            }
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
        let _call = crate::profile::Span::new("runtime-call", version);
        let started = std::time::Instant::now();
        let report = self.checkpoint_untimed(name, version)?;
        let seconds = started.elapsed().as_secs_f64();
        let _stats = crate::profile::Span::new("runtime-stats", version);
        self.halt.called(name, version, started, seconds);
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
        {
            let _span = crate::profile::Span::new("runtime-agree-name", version);
            all_agree_on_name(&self.comm, "the checkpoint's number and name", version, name, numbered)?;
        }
        self.agent.check(!self.names.is_empty());
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

    /// The tier directory old ranks' tables and files are read from: the
    /// persistent one (every rank sees it), else the scratch one.
    fn read_root(&self, name: &str) -> Result<std::path::PathBuf> {
        check_name(name)?;
        let t = self.tiers(name);
        t.shared.or(t.local).ok_or_else(|| Error::InvalidOption("no directory configured".into()))
    }

    /// The regions every rank of the job that wrote `name` protected (any
    /// number of ranks; for a restart on another rank count; empty for a
    /// name never checkpointed). Collective: an error is every rank's
    /// ([`Error::OnRanks`]). With no shared tier, an old job of another
    /// rank count whose files some rank cannot reach (they lie on other
    /// nodes' node-local disks) is refused: the error says to restart on the
    /// old rank count, or to configure `persistent`. Where a node lost its
    /// directory, its ranks may see fewer tables than the others (a restart
    /// on the same rank count rebuilds them from the copies).
    pub fn old_regions(&self, name: &str) -> Result<Vec<RegionTable>> {
        let step = "reading the old job's region tables";
        let local = check_name(name).and_then(|()| super::table::all_tables_of_tiers(&self.tier_roots(name)));
        let tables = all_agree_on_name(&self.comm, step, 0, name, local)?;
        let mut old_ranks = 0u64;
        self.comm.all_reduce_into(&(tables.len() as u64), &mut old_ranks, ::mpi::collective::SystemOperation::max());
        let tiers = self.tiers(name);
        // Another rank count, read from node-local directories only: every
        // old rank's files must be in this rank's.
        let resized = old_ranks > 0 && old_ranks != u64::from(self.comm.size().unsigned_abs());
        let reached = match (resized, tiers.shared, tiers.local) {
            (true, None, Some(local)) if !(0..old_ranks).all(|r| crate::store::rank_dir(&local, r as u32).is_dir()) => {
                Err(Error::InvalidOption(format!(
                    "'{name}' was written by a job of {old_ranks} ranks on node-local directories only (no \
                     `persistent` tier), and not every old rank's files are on this node ({}): restart with \
                     {old_ranks} ranks, or set `persistent` (a directory every node sees) for the job that writes it",
                    local.display()
                )))
            }
            _ => Ok(()),
        };
        all_agree(&self.comm, step, 0, reached)?;
        Ok(tables)
    }

    /// The tier directories of `name` on this rank, fastest first.
    fn tier_roots(&self, name: &str) -> Vec<std::path::PathBuf> {
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
        super::table::tables_of_tiers(&self.tier_roots(name), Some(rank))?;
        super::table::read_region(&self.read_root(name)?, rank, id, version, range)
    }

    /// Blocks until `version` of `name` is durable on every tier of every
    /// rank. Collective.
    pub fn wait(&mut self, name: &str, version: u64) -> Result<()> {
        let waited = self.named(name)?.ckpt.wait(version);
        self.account_settled();
        if waited.is_ok() {
            self.halt.durable(name, version);
        }
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
