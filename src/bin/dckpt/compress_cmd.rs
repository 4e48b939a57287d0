//! `dckpt bench-compression`: de-duplication vs compression vs both, on the
//! same versions.

use crate::bench::compression::{self as bench_compress, Evolving};
use crate::bench::generate::Workload;
use crate::bench::simulate::{SimWorkload, Simulation};
use clap::Args;
use dckpt::sizes::parse_size;
use dckpt::{Error, Method, Result, StoreOptions};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `dckpt bench-compression`.
#[derive(Args)]
pub struct CompressionArgs {
    /// heat, labels (simulations) or SHAPE:CHANGE (synthetic edits, e.g.
    /// scattered:0.01).
    #[arg(long, default_value = "heat")]
    workload: String,
    /// Bytes of the buffer (the simulations use the largest state that fits).
    #[arg(long, default_value = "64M")]
    size: String,
    /// Versions.
    #[arg(long, default_value_t = 10)]
    versions: u32,
    /// Chunk size of the de-duplication (Tree).
    #[arg(long, default_value_t = 128)]
    chunk_size: u32,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Scratch directory for the store (emptied first, removed after).
    #[arg(long, default_value = "bench-data/compression")]
    dir: PathBuf,
    /// Print one CSV line (with a header line first when this is "header").
    #[arg(long)]
    csv: Option<String>,
    /// Print the study as JSON (with a schema version) instead of a table.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
}

/// The CSV columns, in order.
const HEADER: &str = "workload,size,versions,chunk_size,full_bytes,zstd_bytes,lz4_bytes,dedup_bytes,dedup_zstd_bytes,\
dedup_lz4_bytes,ratio_zstd,ratio_dedup,ratio_dedup_zstd,dedup_over_zstd,dedup_zstd_gbps";

/// Runs the study and prints a table (or a CSV line).
pub fn run(a: CompressionArgs) -> Result<ExitCode> {
    let size = usize::try_from(parse_size(&a.size)?).map_err(|_| Error::InvalidOption("size too large".into()))?;
    let source = match a.workload.split_once(':') {
        Some((shape, change)) => {
            let change: f64 = change.parse().map_err(|_| Error::InvalidOption(format!("bad change '{change}'")))?;
            Evolving::Synthetic(Workload::new(size, change, shape.parse()?, a.seed)?)
        }
        None => Evolving::Simulation(SimWorkload::new(a.workload.parse::<Simulation>()?, size, a.seed)?),
    };
    let store = StoreOptions { chunk_size: a.chunk_size, method: Method::Tree, ..StoreOptions::default() };
    let pb = crate::progress::bytes_bar(u64::from(a.versions) * size as u64, "versions");
    let s = bench_compress::run(&a.workload, source, a.versions, &store, &a.dir, |_| pb.inc(size as u64))?;
    pb.finish_and_clear();
    let row = [s.zstd_bytes, s.dedup_bytes, s.dedup_zstd_bytes].map(|b| s.ratio(b));
    let gbps = s.dedup_bytes as f64 / 1e9 / s.dedup_zstd_seconds.max(1e-9);
    if a.json {
        crate::report::print_json("bench-compression", &s)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(mode) = &a.csv {
        if mode == "header" {
            println!("{HEADER}");
        }
        println!(
            "{},{},{},{},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3}",
            s.workload,
            s.size,
            s.versions,
            s.chunk_size,
            s.full_bytes,
            s.zstd_bytes,
            s.lz4_bytes,
            s.dedup_bytes,
            s.dedup_zstd_bytes,
            s.dedup_lz4_bytes,
            row[0],
            row[1],
            row[2],
            s.dedup_bytes as f64 / s.zstd_bytes.max(1) as f64,
            gbps
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} ({} bytes, {} versions, Tree {} B): bytes stored over all versions",
        s.workload, s.size, s.versions, s.chunk_size
    );
    let line = |name: &str, b: u64| println!("  {name:<14} {b:>14} bytes  {:>8.2}x smaller than full", s.ratio(b));
    line("full", s.full_bytes);
    line("zstd alone", s.zstd_bytes);
    line("lz4 alone", s.lz4_bytes);
    line("de-dup", s.dedup_bytes);
    println!("  {:<14} {:>14} bytes  (tables, digests, headers)", "  of which meta", s.dedup_meta_bytes);
    line("de-dup + zstd", s.dedup_zstd_bytes);
    line("de-dup + lz4", s.dedup_lz4_bytes);
    println!(
        "  de-dup stores {:.2}x what zstd alone stores; compressing the diff files: zstd {:.2} GB/s, lz4 {:.2} GB/s",
        s.dedup_bytes as f64 / s.zstd_bytes.max(1) as f64,
        gbps,
        s.dedup_bytes as f64 / 1e9 / s.dedup_lz4_seconds.max(1e-9)
    );
    Ok(ExitCode::SUCCESS)
}
