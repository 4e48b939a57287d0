//! The checkpointing method a store uses: a name, a one-byte code in the
//! file format, and what it needs (the previous version's leaves, a
//! record). Its implementation is `dedup`'s ([`Method::deduplicator`]).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The checkpointing method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Store every byte (no hashing).
    Full,
    /// Bitmap of chunks changed since the previous version, plus their bytes.
    Basic,
    /// One metadata entry per non-FIXED chunk (no compaction).
    List,
    /// Merkle-tree compaction (Algorithm 1 of Tan et al.).
    #[default]
    Tree,
}

impl Method {
    /// Every method.
    pub const ALL: [Method; 4] = [Method::Full, Method::Basic, Method::List, Method::Tree];

    /// Stable one-byte code for the file format.
    pub fn code(self) -> u8 {
        match self {
            Method::Full => 1,
            Method::Basic => 2,
            Method::List => 3,
            Method::Tree => 4,
        }
    }

    /// Inverse of [`Method::code`].
    pub fn from_code(code: u8) -> Option<Self> {
        Method::ALL.into_iter().find(|m| m.code() == code)
    }

    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Method::Full => "full",
            Method::Basic => "basic",
            Method::List => "list",
            Method::Tree => "tree",
        }
    }

    /// Whether the method compares against the previous version's leaves.
    pub fn uses_previous(self) -> bool {
        self != Method::Full
    }

    /// Whether the method keeps a record of digests.
    pub fn uses_record(self) -> bool {
        matches!(self, Method::List | Method::Tree)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Method {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Method::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| Error::InvalidOption(format!("unknown method '{s}' (expected tree, list, basic or full)")))
    }
}
