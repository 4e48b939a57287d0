//! The README's tiers example: a checkpoint that returns once the diff is in
//! the host cache, flushed to a node-local and a shared directory behind it.
use dckpt::backend::BackendKind;
use dckpt::format::Compression;
use dckpt::tiers::{TierOptions, TieredEngine};

fn main() -> dckpt::Result<()> {
    let _ = std::fs::remove_dir_all("target/readme/tiers"); // fresh directories for this example
    let tiers = TierOptions {
        local: Some("target/readme/tiers/scratch".into()), // node-local, e.g. /scratch/ckpt
        shared: Some("target/readme/tiers/shared".into()), // shared, e.g. /gpfs/run42/ckpt
        host_cache_bytes: 64 << 20,
        compression: Some(Compression::Zstd { level: 1 }), // optional, on the flush path
        keep_local: Some(2),                               // optional retention per tier
        ..TierOptions::default()
    };
    let mut data = vec![0u8; 8 << 20];
    let mut e = TieredEngine::open(0, data.len() as u64, &Default::default(), &tiers, BackendKind::Auto)?;
    for v in 1..=3 {
        data[v as usize * 4096] = v as u8; // the simulation
        e.checkpoint(v, &data)?; // returns after de-duplication + copy to the cache
    } // (device memory: e.checkpoint(v, DeviceRegion::of(&slice)?))
    e.wait(3)?; // durable on local and shared
    e.finalize()?; // every queued version flushed
    Ok(())
}
