//! Where `mpirun` placed the ranks: the CPUs each may run on. dckpt's own
//! threads (the collective step's, the flush workers, the de-duplication
//! pool, the CUDA driver's) run beside the application's. A rank bound to
//! one CPU while the node has CPUs to spare (OpenMPI binds each rank to a
//! core when it starts two or fewer) makes them time-slice against the
//! application and against MPI's busy waits: on an H100 with 2 ranks the
//! heat example's checkpoint call took 18.6 ms bound to a core and 5.9 ms
//! with 8 cores a rank (BENCHMARKS.md, "Placement"). [`Runtime::init`]
//! warns once per job.
//!
//! [`Runtime::init`]: super::Runtime::init

/// CPUs this process may run on (its affinity mask and CPU quota); 1 when
/// unknown.
pub fn cpus_allowed() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// CPUs online on this node (Linux's `/sys/devices/system/cpu/online`), if
/// known.
pub fn cpus_online() -> Option<usize> {
    std::fs::read_to_string("/sys/devices/system/cpu/online").ok().and_then(|s| cpu_list_len(&s))
}

/// The number of CPUs in a Linux CPU list such as `0-3,8,10-11`; `None`
/// when it does not parse.
pub fn cpu_list_len(list: &str) -> Option<usize> {
    let list = list.trim();
    if list.is_empty() {
        return None;
    }
    list.split(',').try_fold(0usize, |n, part| {
        let count = match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.trim().parse::<usize>().ok()?, b.trim().parse::<usize>().ok()?);
                b.checked_sub(a)? + 1
            }
            None => part.trim().parse::<usize>().map(|_| 1).ok()?,
        };
        n.checked_add(count)
    })
}

/// The warning for a node with `online` CPUs where `ranks_here` ranks run
/// and the most confined one may use `fewest_allowed`: `Some` when a rank is
/// bound to a single CPU although every rank could have two or more.
pub fn crowding_warning(fewest_allowed: usize, online: usize, ranks_here: usize) -> Option<String> {
    (fewest_allowed <= 1 && online >= 2 * ranks_here.max(1)).then(|| {
        format!(
            "dckpt: warning: a rank is bound to one CPU while its node has {online} for {ranks_here} rank(s); \
             dckpt's background threads share that CPU with the application and checkpoints take longer \
             (OpenMPI binds each rank to a core when it starts two or fewer): launch with \
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
    let node = comm.split_shared(0);
    let mine = cpus_allowed() as u64;
    let mut fewest = 0u64;
    node.all_reduce_into(&mine, &mut fewest, SystemOperation::min());
    let online = cpus_online().unwrap_or(0);
    let warning = crowding_warning(fewest as usize, online, node.size().max(1) as usize);
    let mut any = 0u64;
    comm.all_reduce_into(&u64::from(warning.is_some()), &mut any, SystemOperation::max());
    // Every `init` checks (it is collective on whatever communicator it is
    // given); the process prints once.
    static PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if any > 0 && comm.rank() == 0 && !PRINTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        let text = warning.unwrap_or_else(|| {
            "dckpt: warning: on some node a rank is bound to one CPU while the node has CPUs to spare; \
             launch with `mpirun --bind-to none` or `--map-by slot:PE=<cores per rank>`"
                .to_string()
        });
        eprintln!("{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_ranges_and_singles() {
        assert_eq!(cpu_list_len("0-15\n"), Some(16));
        assert_eq!(cpu_list_len("0"), Some(1));
        assert_eq!(cpu_list_len("0-3,8,10-11"), Some(7));
        assert_eq!(cpu_list_len(""), None);
        assert_eq!(cpu_list_len("3-1"), None);
        assert_eq!(cpu_list_len("a-b"), None);
    }

    #[test]
    fn one_cpu_a_rank_is_crowded_only_with_cpus_to_spare() {
        // 2 ranks on a 16-CPU node, each bound to a core: warned.
        assert!(crowding_warning(1, 16, 2).is_some_and(|w| w.contains("--bind-to none")));
        // 2 ranks on 2 CPUs: one each is all there is.
        assert!(crowding_warning(1, 2, 2).is_none());
        assert!(crowding_warning(1, 3, 2).is_none());
        // 8 cores a rank: fine.
        assert!(crowding_warning(8, 16, 2).is_none());
        // One rank on one CPU of a 1-CPU machine.
        assert!(crowding_warning(1, 1, 1).is_none());
    }

    #[test]
    fn this_process_has_a_cpu() {
        assert!(cpus_allowed() >= 1);
        if let Some(n) = cpus_online() {
            assert!(n >= 1);
        }
    }
}
