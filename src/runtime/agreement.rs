//! The settings every rank of a job must share, compared across ranks at a
//! checkpoint name's first use: a rank that differs would otherwise wait
//! in a collective call the others never make, or write files they cannot
//! use.

use crate::config::Config;
use crate::error::{Error, Result};
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;

/// The settings every rank must share: a rank that differs would wait in
/// a collective call the others never make, or write files they cannot
/// use. Where the scratch and persistent directories are may differ; whether
/// there is one may not.
const AGREED: [&str; 14] = [
    "mode",
    "chunk_size",
    "hash",
    "method",
    "max_chain",
    "collective",
    "threshold",
    "region_bytes",
    "min_region_bytes",
    "overlap",
    "max_versions",
    "tiers",
    "redundancy",
    "ranks_per_node",
];

/// Each of [`AGREED`]'s values in `config`, as text.
fn agreed_values(config: &Config) -> Result<Vec<String>> {
    let table: toml::Table =
        config.to_toml()?.parse().map_err(|e| Error::Internal(format!("reading the configuration back: {e}")))?;
    Ok(AGREED
        .iter()
        .map(|&key| match key {
            "tiers" => format!(
                "scratch {}, persistent {}",
                if config.scratch.is_some() { "set" } else { "unset" },
                if config.persistent.is_some() { "set" } else { "unset" }
            ),
            _ => table.get(key).map_or_else(|| "unset".to_string(), ToString::to_string),
        })
        .collect())
}

/// Refuses, on every rank alike, a configuration whose [`AGREED`]
/// settings differ between ranks, naming them. Collective.
pub(super) fn agree_on_config(comm: &SimpleCommunicator, config: &Config) -> Result<()> {
    let values = agreed_values(config)?;
    let mine: Vec<u64> = values.iter().map(|v| xxhash_rust::xxh3::xxh3_64(v.as_bytes())).collect();
    let mut all = vec![0u64; mine.len() * comm.size() as usize];
    comm.all_gather_into(&mine[..], &mut all[..]);
    let ranks: Vec<&[u64]> = all.chunks(mine.len()).collect();
    let differing: Vec<String> = (0..AGREED.len())
        .filter(|&i| ranks.iter().any(|r| r[i] != ranks[0][i]))
        .map(|i| {
            let odd: Vec<usize> = (0..ranks.len()).filter(|&r| ranks[r][i] != ranks[0][i]).collect();
            format!("{} (this rank: {}; ranks {odd:?} differ from rank 0)", AGREED[i], values[i])
        })
        .collect();
    if differing.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidOption(format!(
        "the ranks' configurations disagree on {}: give every rank the same configuration file and DCKPT_* variables",
        differing.join(", ")
    )))
}
