//! Sizes as users write them (`4096`, `64K`, `1.5G`, `4GiB`: binary units),
//! and the device-memory amounts of the CUDA backend's options
//! ([`GpuMemory`], [`GpuCache`]): values of the store's options and of the
//! configuration file, parsed here, below every layer that takes them
//! (`backend::budget` turns them into a plan).

use crate::error::{Error, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Parses a size: a number of bytes, possibly fractional, with an optional
/// unit in binary multiples (`K`, `KB` and `KiB` all mean 1024): `4096`,
/// `64K`, `1.5G`, `4GiB`, `2 TB`.
pub fn parse_size(s: &str) -> Result<u64> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| Error::InvalidOption(format!("bad size '{s}': {e} (examples: 4096, 64K, 1.5G, 4GiB)")))
}

/// A size or a budget as a configuration file may write it: an integer, or
/// text for the caller to parse (`"64K"`, `"1.5x"`).
#[derive(serde::Deserialize)]
#[serde(untagged)]
pub(crate) enum IntOrText {
    /// An integer.
    Int(u64),
    /// Text, parsed by the caller.
    Text(String),
}

/// A setting written as an integer (bytes: `bytes(n)`) or as text (parsed
/// by `T`'s `FromStr`): the deserializer of [`GpuMemory`] and [`GpuCache`].
fn bytes_or_text<'de, D: Deserializer<'de>, T: FromStr<Err = Error>>(
    d: D,
    bytes: fn(u64) -> T,
) -> std::result::Result<T, D::Error> {
    match IntOrText::deserialize(d)? {
        IntOrText::Int(n) => Ok(bytes(n)),
        IntOrText::Text(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

/// The smallest budget a multiple of the buffer gives (small buffers).
pub const MIN_BUDGET: u64 = 64 << 20;

/// How much device memory the CUDA backend may hold for one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuMemory {
    /// A multiple of the protected buffer, in thousandths (`1500` = 1.5×),
    /// at least [`MIN_BUDGET`].
    Times(u32),
    /// A number of bytes.
    Bytes(u64),
}

impl Default for GpuMemory {
    fn default() -> Self {
        GpuMemory::Times(1500)
    }
}

impl GpuMemory {
    /// The budget in bytes for a protected buffer of `data_len` bytes.
    pub fn bytes_for(self, data_len: u64) -> u64 {
        match self {
            GpuMemory::Times(t) => {
                let b = u128::from(data_len) * u128::from(t) / 1000;
                u64::try_from(b).unwrap_or(u64::MAX).max(MIN_BUDGET)
            }
            GpuMemory::Bytes(b) => b,
        }
    }
}

impl fmt::Display for GpuMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            GpuMemory::Times(t) if t % 1000 == 0 => write!(f, "{}x", t / 1000),
            GpuMemory::Times(t) => {
                let s = format!("{}.{:03}", t / 1000, t % 1000);
                write!(f, "{}x", s.trim_end_matches('0'))
            }
            GpuMemory::Bytes(b) => write!(f, "{b}"),
        }
    }
}

impl FromStr for GpuMemory {
    type Err = Error;
    /// `"1.5x"` (a multiple of the buffer) or a size (`"6G"`, `"4096"`).
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        let bad = || Error::InvalidOption(format!("bad GPU memory budget '{s}' (examples: 1.5x, 2x, 6G)"));
        if let Some(num) = t.strip_suffix(['x', 'X']) {
            let v: f64 = num.trim().parse().map_err(|_| bad())?;
            if !(v.is_finite() && v > 0.0 && v <= 1000.0) {
                return Err(bad());
            }
            return Ok(GpuMemory::Times((v * 1000.0).round() as u32));
        }
        parse_size(t).map(GpuMemory::Bytes).map_err(|_| bad())
    }
}

impl Serialize for GpuMemory {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GpuMemory {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        bytes_or_text(d, GpuMemory::Bytes)
    }
}

/// How much of the budget the GPU cache tier's arena gets (the asynchronous
/// tiers' `gpu_cache_size`): diff files wait there between the pipeline's
/// output buffer and the host cache (the CUDA backend's `DeviceCache`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GpuCache {
    /// What the budget leaves spare once every other part has what it can
    /// use (none below [`MIN_GPU_CACHE`]).
    #[default]
    Auto,
    /// This many bytes, taken before the other parts share the rest
    /// (0: no GPU cache).
    Bytes(u64),
}

/// The smallest GPU cache arena worth allocating.
pub const MIN_GPU_CACHE: u64 = 16 << 20;

impl GpuCache {
    /// No GPU cache (the synchronous path).
    pub const NONE: GpuCache = GpuCache::Bytes(0);
}

impl fmt::Display for GpuCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuCache::Auto => f.write_str("auto"),
            GpuCache::Bytes(b) => write!(f, "{b}"),
        }
    }
}

impl FromStr for GpuCache {
    type Err = Error;
    /// `"auto"` or a size (`"512M"`, `"0"`).
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "auto" => Ok(GpuCache::Auto),
            t => parse_size(t).map(GpuCache::Bytes).map_err(|_| {
                Error::InvalidOption(format!("bad GPU cache size '{s}' (auto, 0, or a size such as 512M)"))
            }),
        }
    }
}

impl Serialize for GpuCache {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GpuCache {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        bytes_or_text(d, GpuCache::Bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_units_fractions_and_both_spellings() {
        for (text, bytes) in [
            ("4096", 4096u64),
            ("64K", 64 << 10),
            ("64KB", 64 << 10),
            ("64KiB", 64 << 10),
            ("1M", 1 << 20),
            ("1.5G", 3 << 29),
            ("4GiB", 4 << 30),
            (" 2 TB ", 2 << 40),
            ("8B", 8),
        ] {
            assert_eq!(parse_size(text).unwrap(), bytes, "{text}");
        }
        for bad in ["", "x", "4Q", "-1", "1.5.2G"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains("bad size"), "{bad}: {e}");
        }
    }

    #[test]
    fn budgets_parse_as_multiples_or_sizes() {
        assert_eq!("1.5x".parse::<GpuMemory>().unwrap(), GpuMemory::Times(1500));
        assert_eq!("6GiB".parse::<GpuMemory>().unwrap(), GpuMemory::Bytes(6 << 30));
        assert_eq!("auto".parse::<GpuCache>().unwrap(), GpuCache::Auto);
        assert_eq!("512M".parse::<GpuCache>().unwrap(), GpuCache::Bytes(512 << 20));
        assert_eq!(GpuMemory::Times(1500).to_string(), "1.5x");
        assert!("0x".parse::<GpuMemory>().is_err() && "lots".parse::<GpuCache>().is_err());
    }
}
