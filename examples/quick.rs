//! A field and its step counter protected, a restart at start, a checkpoint every 10 steps.
#![allow(unsafe_code)] // protect: the runtime reads and restores the regions in place
use dckpt::config::Config;
use dckpt::runtime::{Region, Runtime};
use mpi::traits::Communicator;

fn main() -> dckpt::Result<()> {
    let universe = mpi::initialize().expect("MPI_Init");
    let world = universe.world();
    let crash_at: Option<u64> = std::env::args().nth(1).and_then(|a| a.parse().ok()); // rank 0 dies there
    let mut field = vec![0.0f64; 1 << 16];
    let mut step = 0u64;
    let mut rt = Runtime::init(&world, Config::load(None)?); // None: defaults + DCKPT_<KEY>
    // SAFETY: `field` and `step` outlive `rt` and are not touched while its calls run.
    unsafe {
        rt.protect(0, Region::Host { ptr: field.as_mut_ptr().cast(), len: field.len() * 8 })?;
        rt.protect(1, Region::Host { ptr: (&raw mut step).cast(), len: 8 })?;
    }
    rt.restart_latest("quick")?; // None: a fresh start
    if world.rank() == 0 {
        println!("starting at step {step}");
    }
    while step < 200 {
        field.iter_mut().enumerate().for_each(|(i, x)| *x += 0.5 * (i % 7) as f64 + world.rank() as f64);
        step += 1;
        if Some(step) == crash_at && world.rank() == 0 {
            std::process::abort();
        }
        if step.is_multiple_of(10) {
            rt.checkpoint("quick", step)?;
        }
    }
    if world.rank() == 0 {
        println!("done: field[6] = {:.1}", field[6]);
    }
    rt.finalize()
}
