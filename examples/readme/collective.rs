//! The README's collective example: every rank checkpoints its buffer; what
//! several ranks hold is stored once, on one owner.
use dckpt::StoreOptions;
use dckpt::collective::{Collective, CollectiveOptions};
use mpi::traits::*;

fn main() -> dckpt::Result<()> {
    let universe = mpi::initialize().expect("MPI_Init");
    let world = universe.world();
    let dir = std::path::Path::new("target/readme/collective"); // a directory every rank sees
    if world.rank() == 0 {
        let _ = std::fs::remove_dir_all(dir); // a fresh store for this example
    }
    world.barrier();
    // The same 1 MiB on every rank but its first 4 KiB.
    let mut buffer: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    buffer[..4096].fill(world.rank() as u8);
    let mut ckpt =
        Collective::open(&world, dir, buffer.len() as u64, &StoreOptions::default(), &CollectiveOptions::default())?;
    let report = ckpt.checkpoint(1, &buffer)?; // collective: every rank calls it
    println!("rank {}: {} bytes referenced on other ranks", world.rank(), report.bytes_referenced);
    Ok(())
}
