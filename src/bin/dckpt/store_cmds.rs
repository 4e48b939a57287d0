//! checkpoint, restore, verify, inspect.

use crate::progress::{bytes, rate};
use clap::Args;
use dckpt::config::Config;
use dckpt::{Engine, Error, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `dckpt checkpoint`. The options are the configuration's
/// keys: the defaults, then `--config`'s file, then `DCKPT_<KEY>`, then the
/// flags given here, each over the one before ([`Config::builder`]).
#[derive(Args)]
pub struct CheckpointArgs {
    /// Store directory (the configuration's `persistent`; with a local tier,
    /// the shared one).
    #[arg(long)]
    pub dir: PathBuf,
    /// Print the report as JSON (with a schema version).
    #[arg(long)]
    pub json: bool,
    /// Version number (larger than every committed one).
    #[arg(long)]
    pub version: u64,
    /// Rank (with --collective, the MPI rank is used instead).
    #[arg(long, default_value_t = 0, conflicts_with = "collective")]
    rank: u32,
    /// tree, list, basic or full [default: tree].
    #[arg(long)]
    method: Option<String>,
    /// Chunk size in bytes, 32..=65536 [default: 128].
    #[arg(long)]
    chunk_size: Option<String>,
    /// murmur3, xxh3, blake3 or sha1 [default: murmur3].
    #[arg(long)]
    hash: Option<String>,
    /// Re-baseline once a chain holds this many versions.
    #[arg(long)]
    max_chain: Option<String>,
    /// auto, cpu or cuda (auto = CUDA when a device is found) [default: auto].
    #[arg(long)]
    backend: Option<String>,
    /// CUDA backend: device memory it may hold, as a multiple of the buffer
    /// (1.5x) or a size (6G); a version over a bound of it restarts the
    /// record or is stored whole [default: 1.5x].
    #[arg(long)]
    gpu_memory: Option<String>,
    /// Collective checkpoint of every rank of an `mpirun` job (CPU backend;
    /// the rank is the MPI rank, `{rank}` in FILE is replaced by it).
    #[arg(long)]
    pub collective: bool,
    /// Collective: K, the most entries a partial result of the reduction keeps [default: 131072].
    #[arg(long, requires = "collective")]
    threshold: Option<String>,
    /// Collective: largest region offered to the reduction, in bytes (0 = automatic) [default: 0].
    #[arg(long, requires = "collective")]
    region_bytes: Option<String>,
    /// Collective: smallest region offered, in bytes (0 = every region;
    /// smaller ones stay this rank's: a shorter reduction, more bytes) [default: 0].
    #[arg(long, requires = "collective")]
    min_region_bytes: Option<String>,
    /// Through the asynchronous tiers: the version goes to a host cache,
    /// then this node-local directory (the configuration's `scratch`, so
    /// `DCKPT_SCRATCH` or a file's `scratch` does the same), then --dir (the
    /// shared tier); the command returns once it is durable on both
    /// (checkpoint, then wait).
    #[arg(long)]
    local: Option<PathBuf>,
    /// Through the tiers: compress each file's data on its way to them
    /// (lz4, zstd or zstd:LEVEL); restores decompress.
    #[arg(long)]
    compress: Option<String>,
    /// Through the tiers: keep the newest N versions on the local tier (and
    /// what their chains need) [default: the configuration's max_versions].
    #[arg(long)]
    keep_local: Option<u64>,
    /// Through the tiers: the same retention on the shared tier (--dir).
    #[arg(long)]
    keep_shared: Option<u64>,
    /// A configuration file (TOML with the runtime's keys; `dckpt config
    /// --check FILE` prints what it sets) under the environment's
    /// `DCKPT_<KEY>` and the flags: method, chunk_size, hash, max_chain,
    /// backend, gpu_memory; collective, threshold, region_bytes; `scratch`
    /// as the local tier (then --dir is the shared one: --dir stands for the
    /// file's `persistent`) with host_cache_size, gpu_cache_size,
    /// compression and max_versions, which apply only through the tiers.
    /// `collective = false` makes a --collective run local-only (and allows
    /// method "full"); it does not imply --collective. `mode` is ignored:
    /// the command always waits.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The buffer to checkpoint.
    pub file: PathBuf,
}

/// A path as a TOML string, so that a name like 2024-06-01 stays a name.
fn toml_text(path: &Path) -> String {
    toml::Value::String(path.to_string_lossy().into_owned()).to_string()
}

impl CheckpointArgs {
    /// The one configuration this command runs with: the defaults,
    /// `--config`'s file, `DCKPT_<KEY>`, then the flags.
    pub fn config(&self) -> Result<Config> {
        let mut b = Config::builder().file(self.config.as_deref()).environment().set(
            "persistent",
            toml_text(&self.dir),
            "--dir",
        );
        if let Some(local) = &self.local {
            b = b.set("scratch", toml_text(local), "--local");
        }
        if !self.collective {
            // One rank's store: no collective step, so any method goes.
            b = b.set("collective", "false", "dckpt checkpoint without --collective");
        }
        let flags = [
            ("method", "--method", &self.method),
            ("chunk_size", "--chunk-size", &self.chunk_size),
            ("hash", "--hash", &self.hash),
            ("max_chain", "--max-chain", &self.max_chain),
            ("backend", "--backend", &self.backend),
            ("gpu_memory", "--gpu-memory", &self.gpu_memory),
            ("threshold", "--threshold", &self.threshold),
            ("region_bytes", "--region-bytes", &self.region_bytes),
            ("min_region_bytes", "--min-region-bytes", &self.min_region_bytes),
            ("compression", "--compress", &self.compress),
        ];
        for (key, flag, value) in flags {
            if let Some(v) = value {
                b = b.set(key, v, flag);
            }
        }
        let config = b.build()?;
        let tier_flags = [
            (self.compress.is_some(), "--compress"),
            (self.keep_local.is_some(), "--keep-local"),
            (self.keep_shared.is_some(), "--keep-shared"),
        ];
        if config.scratch.is_none()
            && let Some((_, flag)) = tier_flags.iter().find(|(given, _)| *given)
        {
            return Err(Error::InvalidOption(format!("{flag} applies through the tiers: give --local (or scratch)")));
        }
        Ok(config)
    }

    /// The tiers `config` asks for (a local tier: --local or `scratch`;
    /// `None` without one), with a host cache that holds one diff of a
    /// `len`-byte buffer at least.
    pub fn tier_options(&self, config: &Config, len: u64) -> Option<dckpt::tiers::TierOptions> {
        // --local as given (a path that is not UTF-8 too), else the configuration's.
        let local = self.local.as_ref().or(config.scratch.as_ref())?;
        // The configuration's host cache where it sets one; else what one diff needs.
        let asked = match config.host_cache_size == Config::default().host_cache_size {
            true => 0,
            false => config.host_cache_size.0,
        };
        Some(dckpt::tiers::TierOptions {
            local: Some(local.clone()),
            shared: Some(self.dir.clone()),
            host_cache_bytes: asked.max(len + len / 4 + (8 << 20)),
            compression: config.compression,
            keep_local: self.keep_local.or(config.max_versions),
            keep_shared: self.keep_shared.or(config.max_versions),
            gpu_cache: config.gpu_cache_size,
            ..Default::default()
        })
    }
}

/// Arguments of `dckpt restore`.
#[derive(Args)]
pub struct RestoreArgs {
    /// Store directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// Version to restore.
    #[arg(long)]
    version: u64,
    /// Rank.
    #[arg(long, default_value_t = 0)]
    rank: u32,
    /// Where to write the restored bytes.
    #[arg(long)]
    output: PathBuf,
    /// Only bytes START..END of the version (e.g. 4096..8192): reads just
    /// the chunks holding them.
    #[arg(long, value_parser = parse_range)]
    range: Option<std::ops::Range<u64>>,
    /// Print the report as JSON (with a schema version).
    #[arg(long)]
    json: bool,
}

/// `START..END` (bytes, END exclusive).
fn parse_range(s: &str) -> std::result::Result<std::ops::Range<u64>, String> {
    let (a, b) = s.split_once("..").ok_or_else(|| format!("{s:?} is not START..END"))?;
    let num = |x: &str| x.trim().parse::<u64>().map_err(|e| format!("{x:?} in {s:?}: {e}"));
    let (a, b) = (num(a)?, num(b)?);
    if a > b {
        return Err(format!("{s:?} ends before it starts"));
    }
    Ok(a..b)
}

/// `dckpt checkpoint` of one rank's store (`a` with its configuration
/// applied; `--collective` is `collective_cmd::checkpoint`).
pub fn checkpoint(a: CheckpointArgs, config: &Config) -> Result<ExitCode> {
    let size = std::fs::metadata(&a.file).map(|m| m.len()).unwrap_or(0);
    let busy = crate::progress::spinner(&format!("checkpointing {}, {}", a.file.display(), bytes(size)));
    let data = std::fs::read(&a.file).map_err(|e| Error::io(&a.file, e))?;
    let opts = config.store_options();
    if let Some(tiers) = a.tier_options(config, data.len() as u64) {
        let mut engine = dckpt::tiers::TieredEngine::open(a.rank, data.len() as u64, &opts, &tiers, config.backend)?;
        for w in &engine.open_report().warnings {
            busy.suspend(|| eprintln!("dckpt: warning: {w}"));
        }
        let r = engine.checkpoint(a.version, &data)?;
        engine.wait(a.version)?;
        engine.finalize()?;
        busy.finish_and_clear();
        if a.json {
            crate::report::print_json("checkpoint", &r)?;
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "rank {} version {}: {}, returned after {:.3} s ({}), durable on {} after the wait{}",
            a.rank,
            r.version,
            bytes(r.file_bytes),
            r.total_seconds,
            rate(data.len() as u64, r.total_seconds),
            tiers.disks_named().join(" and "),
            if r.baseline { ", baseline" } else { "" }
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut engine = Engine::open_with_backend(&a.dir, a.rank, data.len() as u64, &opts, config.backend)?;
    for w in &engine.open_report().warnings {
        busy.suspend(|| eprintln!("dckpt: warning: {w}"));
    }
    let r = engine.checkpoint(a.version, &data)?;
    busy.finish_and_clear();
    if a.json {
        crate::report::print_json("checkpoint", &r)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "rank {} version {}: {} -> {} ({:.1}x), {} FIRST / {} SHIFT / {} FIXED chunks in {} + {} regions{}",
        a.rank,
        r.version,
        bytes(r.logical_bytes),
        bytes(r.file_bytes),
        r.logical_bytes as f64 / r.file_bytes as f64,
        r.counts.first,
        r.counts.shift,
        r.counts.fixed,
        r.first_regions,
        r.shift_regions,
        if r.baseline { ", baseline" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}

pub fn restore(a: RestoreArgs) -> Result<ExitCode> {
    if let Some(range) = a.range {
        let bytes = dckpt::restore::restore_range(&a.dir, a.rank, a.version, range.clone())?;
        dckpt::store::write_output(&a.output, &bytes, &a.dir)?;
        if a.json {
            let r = serde_json::json!({"rank": a.rank, "version": a.version, "start": range.start, "end": range.end});
            crate::report::print_json("restore", &r)?;
            return Ok(ExitCode::SUCCESS);
        }
        println!("restored bytes {range:?} of rank {} version {}", a.rank, a.version);
        return Ok(ExitCode::SUCCESS);
    }
    let busy = crate::progress::spinner(&format!("restoring rank {} version {}", a.rank, a.version));
    let started = std::time::Instant::now();
    let stats = dckpt::restore::restore_to_file(&a.dir, a.rank, a.version, &a.output)?;
    let seconds = started.elapsed().as_secs_f64();
    busy.finish_and_clear();
    if a.json {
        let r = serde_json::json!({"rank": a.rank, "version": a.version, "stats": stats});
        crate::report::print_json("restore", &r)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "restored rank {} version {}: {} from {} files ({} read) in {seconds:.3} s ({})",
        a.rank,
        a.version,
        bytes(stats.data_len),
        stats.files_opened,
        bytes(stats.bytes_read),
        rate(stats.data_len, seconds)
    );
    Ok(ExitCode::SUCCESS)
}

pub fn verify(dir: &Path, json: bool) -> Result<ExitCode> {
    // Made once the total is known (a bar drawn before would read 0 B/0 B).
    let mut bar: Option<indicatif::ProgressBar> = None;
    let mut report = dckpt::verify::verify_store_with(dir, &mut |at| {
        bar.get_or_insert_with(|| crate::progress::bytes_bar(at.total_bytes, "verifying")).set_position(at.done_bytes);
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // A runtime checkpoint's region tables (`regions/`), where there are any.
    #[cfg(feature = "mpi")]
    for (path, message) in dckpt::runtime::table::check_tables(dir) {
        report.problems.push(dckpt::verify::Problem::corrupt(path, format!("region table: {message}")));
    }
    if json {
        crate::report::print_json("verify", &report)?;
        return Ok(if report.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }
    for p in &report.problems {
        eprintln!("dckpt: {}: {} [E{:03}]", p.path.display(), p.message, p.code);
    }
    if report.problems.is_empty() {
        println!(
            "ok: {} ranks, {} versions verified{}",
            report.ranks,
            report.versions,
            if report.versions == 0 { " (no rank holds a checkpoint yet)" } else { "" }
        );
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("dckpt: verify failed: {} problem(s) in {} versions", report.problems.len(), report.versions);
        Ok(ExitCode::FAILURE)
    }
}

pub fn repair(dir: &Path, opts: &dckpt::repair::RepairOptions, json: bool) -> Result<ExitCode> {
    let dry_run = opts.dry_run;
    let report = dckpt::repair::repair_store_with(dir, opts)?;
    if json {
        crate::report::print_json("repair", &report)?;
        return Ok(ExitCode::SUCCESS);
    }
    for a in &report.actions {
        println!("{}: {}", a.path.display(), a.what);
    }
    println!(
        "{}{} rank(s), {} action(s), {} {}",
        if dry_run { "dry run: " } else { "" },
        report.ranks,
        report.actions.len(),
        bytes(report.bytes_removed),
        if dry_run { "would be removed" } else { "removed" }
    );
    Ok(ExitCode::SUCCESS)
}

pub fn prune(dir: &Path, keep: u64, dry_run: bool, json: bool) -> Result<ExitCode> {
    let report = dckpt::prune::prune_store(dir, keep, dry_run)?;
    if json {
        crate::report::print_json("prune", &report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if dry_run { "would delete" } else { "deleted" };
    for (rank, version) in &report.deleted {
        println!("rank {rank}: {verb} version {version}");
    }
    println!(
        "{}{} rank(s): kept {} version(s), {verb} {} ({}), {} commit record(s)",
        if dry_run { "dry run: " } else { "" },
        report.ranks,
        report.kept.len(),
        report.deleted.len(),
        bytes(report.bytes_removed),
        report.records_removed.len()
    );
    let asked = report.ranks as u64 * keep;
    if report.kept.len() as u64 > asked {
        println!(
            "why {} more than the last {keep} of each rank are kept: a version restores from its chain's baseline \
             on (a baseline every max_chain versions), and from the owners' files its cross-rank references \
             name; a version goes only when no kept version needs it",
            report.kept.len() as u64 - asked
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn inspect(dir: &Path, json: bool) -> Result<ExitCode> {
    let all = match dckpt::inspect::store_stats(dir) {
        Ok(all) => all,
        // A runtime's tier directory: one store per checkpoint name below it.
        Err(e @ Error::NoStore { .. }) => {
            let names = checkpoint_names(dir);
            if names.is_empty() {
                return Err(e);
            }
            if json {
                #[derive(serde::Serialize)]
                struct Name {
                    name: String,
                    ranks: usize,
                    dir: std::path::PathBuf,
                }
                #[derive(serde::Serialize)]
                struct RuntimeDir {
                    runtime_directory: std::path::PathBuf,
                    names: Vec<Name>,
                }
                let names = names.into_iter().map(|(name, ranks)| Name { dir: dir.join(&name), name, ranks }).collect();
                crate::report::print_json("inspect", &RuntimeDir { runtime_directory: dir.to_path_buf(), names })?;
                return Ok(ExitCode::SUCCESS);
            }
            println!("{} is a runtime directory holding {} checkpoint name(s):", dir.display(), names.len());
            for (name, ranks) in &names {
                println!("  {name:24} {ranks} rank(s)   (dckpt inspect --dir {})", dir.join(name).display());
            }
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    if json {
        crate::report::print_json("inspect", &all)?;
        return Ok(ExitCode::SUCCESS);
    }
    let stats = &all.versions;
    println!(
        "{:>5} {:>8} {:>6} {:>13} {:>12} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "rank", "version", "method", "logical", "stored", "metadata", "FIRST", "SHIFT", "FIXED", "ratio"
    );
    for s in stats {
        println!(
            "{:>5} {:>8} {:>6} {:>13} {:>12} {:>10} {:>10} {:>10} {:>10} {:>8.1}{}",
            s.rank,
            s.version,
            s.method,
            s.logical_bytes,
            s.stored_bytes,
            s.metadata_bytes,
            s.first_chunks,
            s.shift_chunks,
            s.fixed_chunks,
            s.ratio,
            if s.dense {
                " baseline (dense)"
            } else if s.baseline {
                " baseline"
            } else {
                ""
            }
        );
    }
    for r in &all.ranks {
        println!(
            "rank {}: {} versions, {} stored, {} cross-rank references ({} chunks)",
            r.rank,
            r.versions,
            bytes(r.stored_bytes),
            r.cross_rank_references,
            r.cross_rank_chunks
        );
    }
    for (r, v) in &all.copies.partner {
        println!("partner copies of rank {r}: versions {v:?}");
    }
    for (r, v) in &all.copies.parity {
        println!("parity segments held by rank {r}: versions {v:?}");
    }
    println!(
        "total: {} stored in diff files, {} on disk ({} in other files, of which {} copies for other nodes), \
         max/mean over ranks {:.3}",
        bytes(all.total_stored_bytes),
        bytes(all.bytes_on_disk),
        bytes(all.overhead_bytes),
        bytes(all.copies.bytes),
        all.max_over_mean
    );
    Ok(ExitCode::SUCCESS)
}

/// `result` of a command run on `dir`, with a hint on standard error when
/// it found no store because `dir` is the wrong level: one rank's directory
/// inside a store (the store is above), or a directory with stores below it
/// (a runtime's tier directory: one store per checkpoint name; or the
/// directory a job was given, holding its tiers).
pub fn hinted(dir: &Path, result: Result<ExitCode>) -> Result<ExitCode> {
    if !matches!(result, Err(Error::NoStore { .. })) {
        return result;
    }
    if let Some((store, rank)) = rank_dir_of_store(dir) {
        eprintln!(
            "dckpt: hint: {} is rank {rank}'s directory inside the store {}: give the store, \
             e.g. --dir {} (and --rank {rank} where the command takes one)",
            dir.display(),
            store.display(),
            store.display()
        );
    } else {
        let below = stores_below(dir, 3);
        if let Some(first) = below.first() {
            let shown: Vec<String> = below.iter().take(6).map(|p| p.display().to_string()).collect();
            eprintln!(
                "dckpt: hint: {} holds no store itself; below it: {}{}: give one, e.g. --dir {}",
                dir.display(),
                shown.join(", "),
                if below.len() > shown.len() { ", …" } else { "" },
                first.display()
            );
        }
    }
    result
}

/// The store and rank `dir` is the directory of, if it is one rank's
/// directory (`rank-NNNNN`, `.` included) inside a store.
fn rank_dir_of_store(dir: &Path) -> Option<(PathBuf, u32)> {
    let real = std::fs::canonicalize(dir).ok()?;
    let rank: u32 = real.file_name()?.to_str()?.strip_prefix("rank-")?.parse().ok()?;
    let store = real.parent()?;
    dckpt::store::list_ranks(store).ok()?.contains(&rank).then(|| (store.to_path_buf(), rank))
}

/// The stores (directories holding `rank-NNNNN` directories) up to `depth`
/// levels below `dir`, in name order, not looking inside a store.
fn stores_below(dir: &Path, depth: usize) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    let mut subdirs: Vec<PathBuf> =
        entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect();
    subdirs.sort();
    for sub in subdirs {
        if dckpt::store::list_ranks(&sub).is_ok_and(|r| !r.is_empty()) {
            found.push(sub);
        } else if depth > 1 {
            found.extend(stores_below(&sub, depth - 1));
        }
    }
    found
}

fn checkpoint_names(dir: &Path) -> Vec<(String, usize)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut names: Vec<(String, usize)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let ranks = dckpt::store::list_ranks(&e.path()).ok()?.len();
            (ranks > 0).then(|| (e.file_name().to_string_lossy().into_owned(), ranks))
        })
        .collect();
    names.sort();
    names
}
