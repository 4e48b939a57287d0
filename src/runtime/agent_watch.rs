//! The runtime's side of the per-node agent (`crate::agent`, `agent =
//! "auto"`): at `Runtime::init`, the journals a killed job left on this node
//! are finished before anything opens a store (here, or by the agent
//! already at it), an agent is started where none runs, and every rank
//! meets; at each checkpoint (once a second at most) the agent's lock is
//! probed, and a gone agent started again.

use crate::config::Config;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long `init` waits for another process finishing a dead job's journals.
const FINISH_TIMEOUT: Duration = Duration::from_secs(300);

/// The agent as one rank sees it.
#[derive(Debug)]
pub(super) struct AgentWatch {
    /// The agents' directory (`None`: `agent = "off"`).
    root: Option<PathBuf>,
    /// When the agent was last looked for.
    checked: Instant,
    /// Whether a missing agent was reported already.
    warned: bool,
    /// The agent last found, and whether this rank's journals were open
    /// then (an agent never leaves while a journal is open: its loss since
    /// is a death, not an idle exit).
    seen: Option<(u32, bool)>,
}

impl AgentWatch {
    /// Finishes what dead processes left on this node and starts an agent
    /// (before the caller's barrier).
    pub(super) fn start(config: &Config) -> AgentWatch {
        let root = config.agent_root();
        let mut watch = AgentWatch { root, checked: Instant::now(), warned: false, seen: None };
        let Some(root) = watch.root.clone() else { return watch };
        if let Err(e) = crate::tiers::journal::prepare_root(&root) {
            tracing::warn!("the dckpt agent: {e}; returned checkpoints are not kept from a crash (agent = \"off\")");
            watch.root = None;
            return watch;
        }
        match crate::agent::finish_dead(&root, FINISH_TIMEOUT) {
            Ok(done) => {
                for (dir, outcome) in done {
                    match outcome {
                        Ok(f) => {
                            for (v, tier) in &f.written {
                                tracing::info!(
                                    "finished the flush of version {v} of rank {} on the {tier} tier (left by a killed job)",
                                    f.rank
                                );
                            }
                            for (v, tier, why) in &f.failed {
                                tracing::warn!(
                                    "the flush of version {v} of rank {} left by a killed job failed on the {tier} tier: {why}",
                                    f.rank
                                );
                            }
                        }
                        Err(e) => tracing::warn!("the journal {} a killed job left: {e}", dir.display()),
                    }
                }
            }
            Err(e) => tracing::error!("{e}"),
        }
        watch.ensure(false);
        watch
    }

    /// Starts an agent where none runs; warns once where none can start,
    /// and where the one found before died while this rank's journals
    /// (`journaled`) kept it busy.
    fn ensure(&mut self, journaled: bool) {
        let Some(root) = &self.root else { return };
        self.checked = Instant::now();
        let before = self.seen;
        match crate::agent::ensure_running(root) {
            Ok(Some(pid)) => {
                self.seen = Some((pid, journaled));
                if let Some((old, true)) = before.filter(|&(old, _)| old != pid && journaled) {
                    tracing::warn!("the per-node agent (pid {old}) is gone; started another (pid {pid})");
                }
            }
            Ok(None) if !self.warned => {
                self.warned = true;
                tracing::info!(
                    "no `dckpt` program beside this one or on PATH to run the per-node agent: a killed job's \
                     returned checkpoints are finished by the next job on this node"
                );
            }
            Ok(None) => {}
            Err(e) if !self.warned => {
                self.warned = true;
                tracing::warn!(
                    "the per-node agent: {e}; a killed job's returned checkpoints wait for the next job on this node"
                );
            }
            Err(_) => {}
        }
    }

    /// Probes the agent (once a second at most) and starts another if it
    /// is gone; `journaled`: this rank has journals open (the agent had no
    /// reason to leave).
    pub(super) fn check(&mut self, journaled: bool) {
        if self.root.is_some() && self.checked.elapsed() >= Duration::from_secs(1) {
            self.ensure(journaled);
        }
    }
}
