//! Where `mpirun` placed the ranks: the cores each may run on. dckpt's own
//! threads (the collective step's, the flush workers, the de-duplication
//! pool, the CUDA driver's) run beside the application's. A rank bound to
//! one core while the job has cores to spare (OpenMPI binds each rank to a
//! core when it starts two or fewer) makes them time-slice against the
//! application and against MPI's busy waits: on an H100 with 2 ranks the
//! heat example's checkpoint call took 18.6 ms bound to a core and 5.9 ms
//! with 8 cores a rank (BENCHMARKS.md, "Placement"). The runtime's `init`
//! warns (rank 0 of its communicator, once per process).
//!
//! Cores, not logical CPUs: a core's hardware threads count once (a rank
//! bound to a core of a 2-way SMT machine may use 2 CPUs, and is still
//! crowded). What the job may use is its cgroup's CPU set (a batch
//! scheduler's or a container's), not every CPU the node has online; a CPU
//! quota is not a binding and does not count.

use crate::cpus::{cores_of, cpus_allowed, cpus_available};
use std::path::Path;

/// The warning for a node with `available` cores where `ranks_here` ranks
/// run and the most confined one may use `fewest_allowed`: `Some` when a
/// rank is bound to a single core although every rank could have two or
/// more.
pub fn crowding_warning(fewest_allowed: usize, available: usize, ranks_here: usize) -> Option<String> {
    (fewest_allowed <= 1 && available >= 2 * ranks_here.max(1)).then(|| {
        format!(
            "a rank is bound to one core while {available} cores are there for {ranks_here} rank(s) \
             of its node; dckpt's background threads share that core with the application and checkpoints take \
             longer (OpenMPI binds each rank to a core when it starts two or fewer): launch with \
             `mpirun --bind-to none` or `--map-by slot:PE=<cores per rank>`"
        )
    })
}

/// Checks every node's placement and has rank 0 of `comm` print the
/// warning (once per process; see the module documentation). Collective.
#[cfg(feature = "mpi")]
pub fn warn_if_crowded<C: ::mpi::traits::Communicator>(comm: &C) {
    use ::mpi::collective::SystemOperation;
    use ::mpi::traits::*;
    let sys = Path::new("/sys/devices/system/cpu");
    // Unknown counts are taken as roomy: no warning on a guess.
    let mine = cpus_allowed().map_or(u64::MAX, |cpus| cores_of(&cpus, sys) as u64);
    let available = cpus_available().map_or(0, |cpus| cores_of(&cpus, sys));
    let node = comm.split_shared(0);
    let mut fewest = 0u64;
    node.all_reduce_into(&mine, &mut fewest, SystemOperation::min());
    let warning =
        crowding_warning(usize::try_from(fewest).unwrap_or(usize::MAX), available, node.size().max(1) as usize);
    let mut any = 0u64;
    comm.all_reduce_into(&u64::from(warning.is_some()), &mut any, SystemOperation::max());
    // Every `init` checks (it is collective on whatever communicator it is
    // given); the process prints once.
    static PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if any > 0 && comm.rank() == 0 && !PRINTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        let text = warning.unwrap_or_else(|| {
            "on some node a rank is bound to one core while the node has cores to spare; \
             launch with `mpirun --bind-to none` or `--map-by slot:PE=<cores per rank>`"
                .to_string()
        });
        tracing::warn!("{text}");
    }
}

/// The threads of the process's data-parallel pool (rayon's global pool,
/// which de-duplication, hashing, restores and rewrites share) for a rank
/// that can count on `share` CPUs ([`crate::cpus::share`]) of the
/// `online` this process sees: its share, two at least (a pool of one would
/// run a task that waits for another pool task's result alone). `None`
/// where rayon's default (one thread a CPU online) is no larger, or where
/// the user chose (`RAYON_NUM_THREADS` set): 4 ranks of a 64-CPU node get
/// 16 threads each instead of 64 (4 × 64 threads on 64 CPUs slowed the
/// collective step's hashing and a restart's checks: BENCHMARKS.md, "The
/// pool at the rank's share").
pub fn pool_threads(share: Option<usize>, online: usize, user_chose: bool) -> Option<usize> {
    let threads = share?.max(2);
    (!user_chose && threads < online).then_some(threads)
}

/// Sizes the process's data-parallel pool to this rank's share of its
/// node's CPUs ([`pool_threads`]), if the pool is not running yet (the
/// application or an earlier `init` may have started it: then it stays as
/// it is). Collective.
#[cfg(feature = "mpi")]
pub fn size_the_pool<C: ::mpi::traits::Communicator>(comm: &C) {
    let share = crate::collective::mpi::cpu_share(comm);
    let online = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let Some(threads) = pool_threads(share, online, std::env::var_os("RAYON_NUM_THREADS").is_some()) else {
        return;
    };
    let built =
        rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("dckpt-pool-{i}")).build_global();
    match built {
        Ok(()) => tracing::debug!("the data-parallel pool runs {threads} threads (this rank's share of its node)"),
        Err(e) => tracing::debug!("the data-parallel pool stays as it is: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_takes_the_rank_s_share_unless_the_user_chose() {
        // 4 ranks of a 64-CPU node: 16 threads each.
        assert_eq!(pool_threads(Some(16), 64, false), Some(16));
        // Two at least: 2 ranks on a 2-CPU node keep rayon's default.
        assert_eq!(pool_threads(Some(1), 2, false), None);
        assert_eq!(pool_threads(Some(1), 8, false), Some(2));
        // One rank with every CPU: the default.
        assert_eq!(pool_threads(Some(64), 64, false), None);
        // RAYON_NUM_THREADS set, or the share unknown: as it is.
        assert_eq!(pool_threads(Some(16), 64, true), None);
        assert_eq!(pool_threads(None, 64, false), None);
    }

    #[test]
    fn one_core_a_rank_is_crowded_only_with_cores_to_spare() {
        // 2 ranks on a 16-core node, each bound to a core: warned.
        assert!(crowding_warning(1, 16, 2).is_some_and(|w| w.contains("--bind-to none")));
        // 2 ranks on 2 cores: one each is all there is.
        assert!(crowding_warning(1, 2, 2).is_none());
        assert!(crowding_warning(1, 3, 2).is_none());
        // 8 cores a rank: fine.
        assert!(crowding_warning(8, 16, 2).is_none());
        // One rank on one core of a 1-core machine.
        assert!(crowding_warning(1, 1, 1).is_none());
    }
}
