//! The diff file (format v1; docs/FORMAT.md has the byte map).
//!
//! ```text
//! header (96 B) | FIRST table | SHIFT table | bitmap | FIRST data | block digests | trailer (32 B)
//! ```
//!
//! The data is cut into 64 KiB blocks, each with its BLAKE3-256 digest; the
//! trailer is BLAKE3-256 over the header, the tables, the bitmap and the
//! block digests. So one hash pass covers every byte, `verify` checks the
//! whole file, and `restore` checks exactly the blocks it reads.

pub(crate) mod header;
mod reader;
mod tables;
#[cfg(test)]
mod tests;

pub use header::*;
pub use reader::*;
pub use tables::*;
