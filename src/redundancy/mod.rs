//! Copies of the node-local tier on other nodes, so that a job that loses
//! one node's local checkpoints restarts from the survivors (FTI's level 2
//! and SCR's PARTNER and XOR schemes).
//!
//! - [`Redundancy`]: the scheme (`none`, `partner`, `xor:N`), the value of
//!   the configuration key `redundancy`.
//! - [`nodes`]: which node each rank runs on and, from that, who holds
//!   whose copy ([`Plan`]): pure, tested without MPI.
//! - [`bundle`]: one rank's files of one version as one checked byte
//!   string, what a partner stores and what parity is computed over.
//! - [`parity`]: the XOR segments of a group (encode and rebuild), pure.
//!
//! The collective layer moves the bytes over MPI: `collective::protect`
//! makes the copies after each version is durable on the node-local tier
//! (in the background), and `collective::recover` rebuilds a lost node's
//! files at a restart, gives every node every rank's commit parts, and
//! fetches the owners' files a restore reads from other nodes.
//!
//! ```text
//! <scratch>/<name>/redundancy/partner/rank-00003/v000000000007.bundle   rank 3's files of version 7, held by its partner
//! <scratch>/<name>/redundancy/xor/rank-00005/v000000000007.parity       rank 5's parity segment of its group's version 7
//! ```

pub mod bundle;
mod envelope;
pub mod nodes;
pub mod parity;

pub use nodes::{Nodes, Plan};

use crate::error::{Error, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The directory of the copies, relative to a tier root.
pub const REDUNDANCY_DIR: &str = "redundancy";

/// The largest XOR group (`xor:N`).
pub const MAX_XOR_GROUP: u32 = 64;

/// How the node-local tier is protected against the loss of a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Redundancy {
    /// No copies: a lost node's local checkpoints are lost (the shared
    /// tier, if any, still has them).
    #[default]
    None,
    /// Each rank's files are copied to a rank on the next node: survives
    /// the loss of any one node (of two adjacent ones, not), at the cost
    /// of one more copy on the node-local tier.
    Partner,
    /// Groups of N ranks on N distinct nodes each store a parity segment of
    /// their files: survives the loss of one node per group, at the cost of
    /// 1/(N−1) of the files.
    Xor(u32),
}

impl Redundancy {
    /// Whether any copies are made.
    pub fn is_some(self) -> bool {
        self != Redundancy::None
    }

    /// A number for the scheme, the same on every rank (what agreements compare).
    pub fn code(self) -> u64 {
        match self {
            Redundancy::None => 0,
            Redundancy::Partner => 1,
            Redundancy::Xor(n) => 100 + u64::from(n),
        }
    }
}

impl fmt::Display for Redundancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Redundancy::None => f.write_str("none"),
            Redundancy::Partner => f.write_str("partner"),
            Redundancy::Xor(n) => write!(f, "xor:{n}"),
        }
    }
}

impl FromStr for Redundancy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::InvalidOption(format!(
                "unknown redundancy '{s}' (expected none, partner or xor:N with N from 2 to {MAX_XOR_GROUP})"
            ))
        };
        match s {
            "none" => Ok(Redundancy::None),
            "partner" => Ok(Redundancy::Partner),
            _ => {
                // Digits only, no sign or leading zero: what `Display` writes.
                let n: u32 = s
                    .strip_prefix("xor:")
                    .filter(|n| n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0'))
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(bad)?;
                if (2..=MAX_XOR_GROUP).contains(&n) { Ok(Redundancy::Xor(n)) } else { Err(bad()) }
            }
        }
    }
}

impl Serialize for Redundancy {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Redundancy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Where rank `rank`'s partner copy of `version` lies, relative to the
/// holder's tier root.
pub fn partner_rel(rank: u32, version: u64) -> PathBuf {
    Path::new(REDUNDANCY_DIR).join("partner").join(format!("rank-{rank:05}")).join(format!("v{version:012}.bundle"))
}

/// Where holder `rank`'s parity segment of `version` lies, relative to its
/// tier root.
pub fn parity_rel(rank: u32, version: u64) -> PathBuf {
    Path::new(REDUNDANCY_DIR).join("xor").join(format!("rank-{rank:05}")).join(format!("v{version:012}.parity"))
}

/// The placeholder of the node's index in `scratch` (`/tmp/ckpt/node-{node}`).
pub const NODE_PLACEHOLDER: &str = "{node}";

/// `dir` with every `{node}` replaced by `node`.
pub fn on_node(dir: &Path, node: u32) -> PathBuf {
    match dir.to_str() {
        Some(s) if s.contains(NODE_PLACEHOLDER) => PathBuf::from(s.replace(NODE_PLACEHOLDER, &node.to_string())),
        _ => dir.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_reads_back_as_written_and_refuses_other_words() {
        for r in [Redundancy::None, Redundancy::Partner, Redundancy::Xor(2), Redundancy::Xor(MAX_XOR_GROUP)] {
            assert_eq!(r.to_string().parse::<Redundancy>().ok(), Some(r));
        }
        for bad in
            ["", "xor", "xor:1", "xor:0", "xor:65", "xor:-2", "Partner", "rs:4", "xor:4 ", "xor:+3", "xor:03", "xor:"]
        {
            let e = bad.parse::<Redundancy>().expect_err(bad).to_string();
            assert!(e.contains("none, partner or xor:N"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_node_placeholder_is_replaced_everywhere_and_only_there() {
        assert_eq!(on_node(Path::new("/tmp/ckpt/node-{node}/x{node}"), 3), Path::new("/tmp/ckpt/node-3/x3"));
        assert_eq!(on_node(Path::new("/tmp/ckpt"), 3), Path::new("/tmp/ckpt"));
    }
}
