//! `Runtime::should_exit` under mpirun: false on every rank while nothing
//! asks the job to stop; true on every rank once the scheduler (a stand-in
//! `squeue` on rank 0's `PATH`) says less walltime is left than
//! `halt_seconds` plus the last checkpoint's cost, and false again with a
//! margin that fits; true on every rank, naming the signal, once SIGUSR1
//! reached one rank only (the signal test comes last: the watched signal's
//! flag stays set for the process).
#![allow(unsafe_code)] // protecting memory by address; the environment set for a stand-in scheduler

use super::World;
use dckpt::config::{Bytes, Config};
use dckpt::runtime::{HaltReason, Region, Runtime};
use mpi::collective::SystemOperation;
use mpi::traits::*;
use std::path::Path;

fn config(root: &Path, halt_seconds: u64) -> Config {
    Config {
        scratch: Some(root.join("scratch")),
        persistent: Some(root.join("persistent")),
        host_cache_size: Bytes(16 << 20),
        backend: super::test_backend(),
        halt_seconds,
        ..Config::default()
    }
}

/// Every rank's answer: all the same, and this rank's.
fn agreed(w: &World, rt: &mut Runtime, what: &str) -> bool {
    let mine = rt.should_exit().unwrap_or_else(|e| panic!("rank {}: should_exit ({what}): {e}", w.rank));
    let (mut any, mut all) = (0u8, 0u8);
    w.comm.all_reduce_into(&u8::from(mine), &mut any, SystemOperation::max());
    w.comm.all_reduce_into(&u8::from(mine), &mut all, SystemOperation::min());
    assert_eq!(any, all, "rank {}: the ranks disagree ({what})", w.rank);
    mine
}

pub fn stopping(w: &World, root: &Path) {
    // No scheduler in this process's environment (CI is not a batch job;
    // inside one, SLURM_JOB_ID would make rank 0 ask the real one).
    let scheduled = ["SLURM_JOB_ID", "PBS_JOBID"].iter().any(|k| std::env::var_os(k).is_some());
    let mut data = vec![7u8; 200_000 + 1000 * w.rank as usize];
    {
        let mut rt = Runtime::init(w.comm, config(&root.join("quiet"), 0));
        // SAFETY: `data` outlives the runtime and is not touched during its calls.
        unsafe { rt.protect(0, Region::host(&mut data)) }.expect("protect");
        rt.checkpoint("s", 1).expect("checkpoint");
        if !scheduled {
            assert!(!agreed(w, &mut rt, "nothing asked"), "rank {}: should_exit with nothing asking", w.rank);
            assert_eq!(rt.halt_reason(), None);
        }
        rt.finalize().expect("finalize");
    }
    if !scheduled {
        walltime(w, root, &mut data);
    }
    // SIGUSR1 on the last rank only: every rank says stop, naming it.
    let mut rt = Runtime::init(w.comm, config(&root.join("signal"), 0));
    // SAFETY: as above.
    unsafe { rt.protect(0, Region::host(&mut data)) }.expect("protect");
    rt.checkpoint("s", 1).expect("checkpoint");
    let before = agreed(w, &mut rt, "before the signal"); // starts the watch
    assert!(scheduled || !before, "rank {}: should_exit before the signal", w.rank);
    w.comm.barrier();
    if w.rank == w.size - 1 {
        // SAFETY: raising a signal this process watches (its handler only sets a flag).
        assert_eq!(unsafe { libc::raise(libc::SIGUSR1) }, 0);
    }
    assert!(agreed(w, &mut rt, "after SIGUSR1 on one rank"), "rank {}: no stop after SIGUSR1", w.rank);
    assert_eq!(rt.halt_reason(), Some(&HaltReason::Signal(libc::SIGUSR1)), "rank {}", w.rank);
    // The last checkpoint, made durable, as an application ends.
    rt.checkpoint("s", 2).expect("the last checkpoint");
    rt.wait("s", 2).expect("durable");
    rt.finalize().expect("finalize");
}

/// A stand-in `squeue` says 30 s are left: stop with `halt_seconds` 60, go
/// on with 0 (the last checkpoint took far less than 30 s).
fn walltime(w: &World, root: &Path, data: &mut [u8]) {
    let bin = root.join("bin");
    let path = std::env::var("PATH").unwrap_or_default();
    if w.rank == 0 {
        std::fs::create_dir_all(&bin).expect("bin");
        let squeue = bin.join("squeue");
        std::fs::write(&squeue, "#!/bin/sh\n[ \"$3\" = 4242 ] && [ \"$5\" = %L ] && echo 00:00:30\n").expect("squeue");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&squeue, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        // SAFETY: no other thread of this process reads the environment now
        // (no runtime is open).
        unsafe {
            std::env::set_var("SLURM_JOB_ID", "4242");
            std::env::set_var("PATH", format!("{}:{path}", bin.display()));
        }
    }
    for (halt_seconds, stop) in [(60, true), (0, false)] {
        let mut rt = Runtime::init(w.comm, config(&root.join(format!("walltime-{halt_seconds}")), halt_seconds));
        // SAFETY: as above.
        unsafe { rt.protect(0, Region::host(data)) }.expect("protect");
        rt.checkpoint("s", 1).expect("checkpoint");
        rt.wait("s", 1).expect("durable");
        let said = agreed(w, &mut rt, &format!("30 s left, halt_seconds {halt_seconds}"));
        assert_eq!(said, stop, "rank {}: halt_seconds {halt_seconds}: {:?}", w.rank, rt.halt_reason());
        if stop {
            match rt.halt_reason() {
                Some(HaltReason::Walltime { left, needed }) => {
                    assert!(*left <= 30.0 && *left > 20.0 && *needed >= 60.0, "rank {}: {left} {needed}", w.rank)
                }
                other => panic!("rank {}: {other:?}", w.rank),
            }
        }
        rt.finalize().expect("finalize");
    }
    if w.rank == 0 {
        // SAFETY: as above.
        unsafe {
            std::env::remove_var("SLURM_JOB_ID");
            std::env::set_var("PATH", path);
        }
    }
}
