//! On-disk formats, written and read by hand in little-endian so that the
//! layout is documented (docs/FORMAT.md) and independent of any serializer.
//! Every length read from disk is checked against the bytes actually there
//! before it is used.

pub mod checked_json;
pub mod codec;
pub mod compress;
pub mod diff_file;
pub mod manifest;

pub use compress::{Compression, compress_file};
pub use diff_file::{
    DiffHeader, DiffReader, data_start_of, decode_body, decode_meta, decode_meta_folded, encode_body, encode_diff,
    encode_meta, finish_body, fold_repeats, seal, trailer_of,
};
pub use manifest::{Manifest, VersionEntry};
