//! The application runtime: one handle per process for an `mpirun`-launched
//! simulation. It owns a duplicate of the communicator, keeps the regions
//! the application protects (host or device memory it owns, by address and
//! length, any number), and takes each named checkpoint of all of them as
//! one collective checkpoint through the asynchronous tiers
//! ([`crate::collective::TieredCollective`]), configured by a
//! [`Config`].
//!
//! ```text
//! protect(id, region)…   checkpoint(name, v): gather the regions (ids in order) into one
//!                        buffer (device regions device-to-device) → collective checkpoint
//!                        → return (mode "sync": after `wait`)
//! restart(name, v):      restore this rank's buffer → scatter it back into the regions
//! ```
//!
//! **Rules for regions.** A name's first checkpoint fixes its regions: their
//! ids, lengths and kinds (host or device). Later checkpoints and restarts of
//! that name need the same set protected (a region may move: re-protect the
//! id at its new address); a different set is an error, not a silent
//! re-layout (use a new name). Every rank calls `checkpoint`, `latest`,
//! `restart` and `finalize` of the same names in the same order (they are
//! collective); each rank protects its own regions, of any sizes.

mod raw;

use crate::backend::cuda::DeviceStaging;
use crate::collective::{CollectiveReport, TieredCollective};
use crate::config::{Config, Mode};
use crate::memory::{Protected, ProtectedMut};
use crate::tiers::TieredReport;
use crate::{Error, Result};
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;
use std::collections::{BTreeMap, HashMap};

pub use raw::Region;

/// A process's checkpointing runtime (see the module documentation).
pub struct Runtime {
    comm: SimpleCommunicator,
    config: Config,
    regions: BTreeMap<u32, Region>,
    names: HashMap<String, Named>,
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
}

/// Where the regions are gathered.
enum Staging {
    /// Host regions only.
    Host(Vec<u8>),
    /// Some device region: one device buffer.
    Device(DeviceStaging),
}

impl Runtime {
    /// A runtime over a duplicate of `comm` with `config` (checked already:
    /// [`Config::load`]). Nothing is opened until a checkpoint or restart.
    pub fn init<C: Communicator>(comm: &C, config: Config) -> Runtime {
        Runtime { comm: comm.duplicate(), config, regions: BTreeMap::new(), names: HashMap::new() }
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
            .ok_or_else(|| Error::InvalidOption(format!("region {id} is not protected")))
    }

    /// The regions protected now, in id order, as a layout.
    fn shapes(&self) -> Vec<Shape> {
        self.regions.iter().map(|(&id, r)| Shape { id, len: r.len(), device: r.is_device() }).collect()
    }

    /// The open handle of `name` (opened on first use, collectively), its
    /// layout checked against the regions protected now.
    fn named(&mut self, name: &str) -> Result<&mut Named> {
        let shapes = self.shapes();
        if !self.names.contains_key(name) {
            check_name(name)?;
            if shapes.is_empty() {
                return Err(Error::InvalidOption(format!("checkpoint '{name}': no region is protected")));
            }
            let total: usize = shapes.iter().map(|s| s.len).sum();
            let store = self.config.store_options();
            let opts = self.config.collective_options();
            let ckpt =
                TieredCollective::open(&self.comm, &self.config.tier_options(name), total as u64, &store, &opts)?;
            let staging = if shapes.iter().any(|s| s.device) {
                Staging::Device(DeviceStaging::new(ckpt.engine().device(), total)?)
            } else {
                Staging::Host(vec![0u8; total])
            };
            self.names.insert(name.to_string(), Named { ckpt, shapes: shapes.clone(), staging });
        }
        let named = self.names.get_mut(name).ok_or_else(|| Error::Internal("named checkpoint".into()))?;
        if named.shapes != shapes {
            return Err(Error::InvalidOption(format!(
                "checkpoint '{name}' holds regions {:?}, but {:?} are protected now (protect the same ids with the \
                 same lengths, or use a new name)",
                describe(&named.shapes),
                describe(&shapes)
            )));
        }
        Ok(named)
    }

    /// Takes version `version` of checkpoint `name`: every protected region
    /// of every rank, as one collective checkpoint. Returns once the
    /// regions may change again (mode `async`) or once the version is
    /// durable on every tier of every rank (mode `sync`). Collective.
    pub fn checkpoint(&mut self, name: &str, version: u64) -> Result<CollectiveReport<TieredReport>> {
        let regions = self.regions.clone();
        let sync = self.config.mode == Mode::Sync;
        let named = self.named(name)?;
        let report = match &mut named.staging {
            Staging::Host(buf) => {
                gather_host(&regions, buf);
                named.ckpt.checkpoint(version, Protected::Host(buf))?
            }
            Staging::Device(staging) => {
                let pieces = raw::pieces(&regions);
                staging.gather(&pieces)?;
                named.ckpt.checkpoint(version, staging.region()?)?
            }
        };
        if sync {
            named.ckpt.wait(version)?;
        }
        Ok(report)
    }

    /// The newest version of `name` that every rank can restart from (its
    /// regions protected first, as for a checkpoint); `None` if there is
    /// none. Collective.
    pub fn latest(&mut self, name: &str) -> Result<Option<u64>> {
        let named = self.named(name)?;
        let mine = named.ckpt.engine().latest().unwrap_or(0);
        let mut newest = 0u64;
        self.comm.all_reduce_into(&mine, &mut newest, ::mpi::collective::SystemOperation::min());
        Ok((newest > 0).then_some(newest))
    }

    /// Restores version `version` of `name` into every protected region
    /// (device regions on the device). Collective in opening `name`; the
    /// restore itself is this rank's own. On an error the regions' content
    /// is unspecified.
    pub fn restart(&mut self, name: &str, version: u64) -> Result<()> {
        let regions = self.regions.clone();
        let named = self.named(name)?;
        match &mut named.staging {
            Staging::Host(buf) => {
                named.ckpt.restore_into(version, ProtectedMut::Host(buf))?;
                scatter_host(&regions, buf);
                Ok(())
            }
            Staging::Device(staging) => {
                named.ckpt.restore_into(version, ProtectedMut::Device(staging.region()?))?;
                staging.scatter(&mut raw::pieces_mut(&regions))
            }
        }
    }

    /// Blocks until `version` of `name` is durable on every tier of every
    /// rank. Collective.
    pub fn wait(&mut self, name: &str, version: u64) -> Result<()> {
        self.named(name)?.ckpt.wait(version)
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

fn describe(shapes: &[Shape]) -> Vec<String> {
    shapes.iter().map(|s| format!("{}:{}{}", s.id, s.len, if s.device { " (device)" } else { "" })).collect()
}

/// Copies the host regions into `buf`, in id order.
fn gather_host(regions: &BTreeMap<u32, Region>, buf: &mut [u8]) {
    let mut at = 0;
    for r in regions.values() {
        let bytes = raw::host(r);
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    }
}

/// Copies `buf` back into the host regions, in id order.
fn scatter_host(regions: &BTreeMap<u32, Region>, buf: &[u8]) {
    let mut at = 0;
    for r in regions.values() {
        let len = r.len();
        raw::host_mut(r).copy_from_slice(&buf[at..at + len]);
        at += len;
    }
}
