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

use std::collections::HashSet;
use std::path::Path;

/// The CPUs this process's affinity mask allows (Linux's
/// `Cpus_allowed_list` in `/proc/self/status`), if known.
pub fn cpus_allowed() -> Option<Vec<usize>> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    cpu_list(list)
}

/// The CPUs the job may use: its cgroup's effective CPU set (cgroup v2,
/// then v1), else the CPUs online; `None` when none of them reads.
pub fn cpus_available() -> Option<Vec<usize>> {
    [
        "/sys/fs/cgroup/cpuset.cpus.effective",
        "/sys/fs/cgroup/cpuset/cpuset.effective_cpus",
        "/sys/devices/system/cpu/online",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok().and_then(|s| cpu_list(&s)))
}

/// The CPUs of a Linux CPU list such as `0-3,8,10-11`; `None` when it does
/// not parse or is empty.
pub fn cpu_list(list: &str) -> Option<Vec<usize>> {
    let list = list.trim();
    if list.is_empty() {
        return None;
    }
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.trim().parse::<usize>().ok()?, b.trim().parse::<usize>().ok()?);
                if b < a {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse::<usize>().ok()?),
        }
    }
    Some(cpus)
}

/// The cores among `cpus`: distinct (package, core) pairs from the CPUs'
/// topology under `sys` (`/sys/devices/system/cpu`); a CPU whose topology
/// does not read counts as a core of its own.
pub fn cores_of(cpus: &[usize], sys: &Path) -> usize {
    let read = |cpu: usize, what: &str| {
        std::fs::read_to_string(sys.join(format!("cpu{cpu}/topology/{what}"))).ok().map(|s| s.trim().to_string())
    };
    let cores: HashSet<(String, String)> = cpus
        .iter()
        .map(|&cpu| match (read(cpu, "physical_package_id"), read(cpu, "core_id")) {
            (Some(package), Some(core)) => (package, core),
            _ => ("cpu".to_string(), cpu.to_string()),
        })
        .collect();
    cores.len()
}

/// The warning for a node with `available` cores where `ranks_here` ranks
/// run and the most confined one may use `fewest_allowed`: `Some` when a
/// rank is bound to a single core although every rank could have two or
/// more.
pub fn crowding_warning(fewest_allowed: usize, available: usize, ranks_here: usize) -> Option<String> {
    (fewest_allowed <= 1 && available >= 2 * ranks_here.max(1)).then(|| {
        format!(
            "dckpt: warning: a rank is bound to one core while {available} cores are there for {ranks_here} rank(s) \
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
            "dckpt: warning: on some node a rank is bound to one core while the node has cores to spare; \
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
    fn cpu_lists_list_ranges_and_singles() {
        assert_eq!(cpu_list("0-3\n").map(|c| c.len()), Some(4));
        assert_eq!(cpu_list("0"), Some(vec![0]));
        assert_eq!(cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(cpu_list(""), None);
        assert_eq!(cpu_list("3-1"), None);
        assert_eq!(cpu_list("a-b"), None);
    }

    #[test]
    fn hardware_threads_of_a_core_count_once() {
        // A fake topology: CPUs 0 and 1 are one core's two threads, 2 another core.
        let dir = std::env::temp_dir().join(format!("dckpt-placement-{}", std::process::id()));
        for (cpu, core) in [(0, 0), (1, 0), (2, 1)] {
            let t = dir.join(format!("cpu{cpu}/topology"));
            std::fs::create_dir_all(&t).unwrap();
            std::fs::write(t.join("physical_package_id"), "0\n").unwrap();
            std::fs::write(t.join("core_id"), format!("{core}\n")).unwrap();
        }
        assert_eq!(cores_of(&[0, 1], &dir), 1);
        assert_eq!(cores_of(&[0, 1, 2], &dir), 2);
        // CPU 7 has no topology: a core of its own.
        assert_eq!(cores_of(&[0, 7], &dir), 2);
        std::fs::remove_dir_all(&dir).unwrap();
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

    #[test]
    fn this_process_has_a_cpu() {
        assert!(cpus_allowed().is_none_or(|c| !c.is_empty()));
        assert!(cpus_available().is_none_or(|c| !c.is_empty()));
    }
}
