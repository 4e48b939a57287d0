//! The README's library example: one rank's store, a checkpoint, a restore.
use dckpt::{Engine, HashAlgo, Method, StoreOptions};

fn main() -> dckpt::Result<()> {
    let (dir, rank, version) = (std::path::Path::new("target/readme/library"), 0, 1);
    let _ = std::fs::remove_dir_all(dir); // a fresh store for this example
    let buffer: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let opts = StoreOptions { chunk_size: 128, method: Method::Tree, hash: HashAlgo::Murmur3, ..Default::default() };
    let mut engine = Engine::open_or_create(dir, rank, buffer.len() as u64, &opts)?;
    engine.checkpoint(version, &buffer)?; // durable when it returns
    // A restart: the same call continues the history; the de-duplication state is
    // rebuilt from a restore of the latest version (engine.open_report() says what it cost).
    let bytes = dckpt::restore::restore_version(dir, rank, version)?;
    assert!(bytes == buffer, "the restore differs");
    Ok(())
}
