//! Where de-duplication runs: the CPU engine (`crate::dedup`, rayon) or the
//! CUDA backend ([`cuda`]), which computes the same diff on the GPU.
//!
//! Both take the same inputs and record state and write byte-identical
//! files; the GPU test program (`tests/gpu.rs`) checks it.

pub mod cuda;

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Which backend to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// CUDA when a device is found, otherwise the CPU.
    #[default]
    Auto,
    /// The CPU engine.
    Cpu,
    /// The CUDA backend (an error when no device is usable).
    Cuda,
}

impl BackendKind {
    /// Resolves `Auto` by probing for a usable CUDA device.
    pub fn resolve(self) -> BackendKind {
        match self {
            BackendKind::Auto if cuda::available() => BackendKind::Cuda,
            BackendKind::Auto => BackendKind::Cpu,
            other => other,
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Auto => "auto",
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        })
    }
}

impl FromStr for BackendKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(BackendKind::Auto),
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" => Ok(BackendKind::Cuda),
            _ => Err(Error::InvalidOption(format!("unknown backend '{s}' (expected auto, cpu or cuda)"))),
        }
    }
}
