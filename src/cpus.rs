//! The CPUs this process may run on, and the cores among them: read from
//! Linux's `/proc` and `/sys` (nothing known elsewhere), and a rank's share
//! of its node's. The runtime warns when a rank is crowded onto one core
//! ([`crate::runtime::placement`]); the collective step keeps its reduction
//! in the call where a rank has fewer than two CPUs
//! ([`crate::collective::Overlap`]).

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

/// Words of a CPU mask as the ranks of a node exchange it
/// ([`mask`]): CPUs 0 to 4095.
pub const MASK_WORDS: usize = 64;

/// `cpus` as a bit mask (CPU c is bit c % 64 of word c / 64); CPUs past
/// the mask's 4096 are left out.
pub fn mask(cpus: &[usize]) -> [u64; MASK_WORDS] {
    let mut words = [0u64; MASK_WORDS];
    for &c in cpus.iter().filter(|&&c| c < 64 * MASK_WORDS) {
        words[c / 64] |= 1 << (c % 64);
    }
    words
}

/// The CPUs set in a [`mask`].
pub fn count(mask: &[u64]) -> usize {
    mask.iter().map(|w| w.count_ones() as usize).sum()
}

/// The CPUs one of `ranks_here` ranks of a node can count on: the
/// `allowed` CPUs of its affinity mask, but no more than its whole share
/// of the `node_cpus` its node's ranks may use together, and one at least
/// (oversubscribed ranks share one each). 16 ranks on 16 CPUs have 1 each,
/// 9 unbound ranks on 16 CPUs 1 each too (1.8, rounded down), 8 have 2.
pub fn share(allowed: usize, node_cpus: usize, ranks_here: usize) -> usize {
    allowed.min((node_cpus / ranks_here.max(1)).max(1))
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
        let dir = std::env::temp_dir().join(format!("dckpt-cpus-{}", std::process::id()));
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
    fn this_process_has_a_cpu() {
        assert!(cpus_allowed().is_none_or(|c| !c.is_empty()));
        assert!(cpus_available().is_none_or(|c| !c.is_empty()));
    }

    #[test]
    fn a_rank_counts_on_its_mask_and_its_share_of_the_node() {
        // Bound to one CPU of a roomy node: one.
        assert_eq!(share(1, 16, 2), 1);
        // Placed, 8 CPUs each: 8; unbound, 16 ranks on 16 CPUs: 1 each.
        assert_eq!(share(8, 16, 2), 8);
        assert_eq!(share(16, 16, 16), 1);
        // 9 unbound ranks on 16 CPUs: 1 each (rounded down); 8: 2 each.
        assert_eq!((share(16, 16, 9), share(16, 16, 8)), (1, 2));
        // Oversubscribed: one shared CPU each; no ranks counted: the node.
        assert_eq!(share(2, 2, 64), 1);
        assert_eq!(share(4, 4, 0), 4);
    }

    #[test]
    fn masks_count_each_cpu_once_and_unite_by_or() {
        let (a, b) = (mask(&[0, 1, 63, 64, 4095]), mask(&[1, 2, 4096, 9999]));
        assert_eq!((count(&a), count(&b)), (5, 2), "CPUs past 4095 are left out");
        let union: Vec<u64> = a.iter().zip(&b).map(|(x, y)| x | y).collect();
        assert_eq!(count(&union), 6);
        assert_eq!(count(&mask(&[])), 0);
    }
}
