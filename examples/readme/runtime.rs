//! The README's runtime example: what a simulation holds.
#![allow(unsafe_code)] // protect: the runtime reads and restores the regions in place
use dckpt::config::Config;
use dckpt::runtime::{Region, Runtime};

fn main() -> dckpt::Result<()> {
    let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Multiple).expect("MPI_Init");
    let world = universe.world();
    let config = Config { persistent: Some("target/readme/runtime".into()), ..Config::default() }; // or Config::load(Some(path))
    let mut rt = Runtime::init(&world, config);
    let (mut temp, mut step) = (vec![0.0f32; 1 << 18], 0u64);
    // SAFETY: `temp` and `step` stay allocated, and untouched while rt's calls run.
    unsafe {
        rt.protect(0, Region::Host { ptr: temp.as_mut_ptr().cast(), len: temp.len() * 4 })?;
        rt.protect(1, Region::Host { ptr: (&raw mut step).cast(), len: 8 })?; // device memory: Region::Device { ptr, len }
    }
    // The newest version every rank restores (older ones where the newest is
    // damaged on every tier, with one warning); None: start from the beginning.
    if let Some(v) = rt.restart_latest("heat")? {
        println!("restarted from step {v}"); // every region back in place (the device's on the device)
    }
    while step < 100 {
        temp.iter_mut().for_each(|t| *t += 1.0); // compute
        step += 1;
        if step.is_multiple_of(10) {
            rt.checkpoint("heat", step)?; // collective
        }
    }
    rt.finalize()
}
