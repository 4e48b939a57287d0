//! The README's collective checkpoint through the tiers: the reduction runs
//! behind the call, on a thread of its own.
use dckpt::collective::{CollectiveOptions, TieredCollective};
use dckpt::tiers::TierOptions;
use mpi::traits::*;

fn main() -> dckpt::Result<()> {
    let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Multiple).expect("MPI_Init");
    let world = universe.world();
    let tiers = TierOptions { shared: Some("target/readme/tiered-collective".into()), ..TierOptions::default() };
    if world.rank() == 0 {
        let _ = std::fs::remove_dir_all("target/readme/tiered-collective"); // fresh for this example
    }
    world.barrier();
    let (v, data) = (1, vec![world.rank() as u8; 1 << 20]);
    let mut c =
        TieredCollective::open(&world, &tiers, data.len() as u64, &Default::default(), &CollectiveOptions::default())?;
    c.checkpoint(v, &data)?; // de-duplication, the copy into the cache (the reduction runs behind)
    c.wait(v)?; // every rank's files durable on every tier
    c.finalize()
}
