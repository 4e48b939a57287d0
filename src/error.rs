//! Typed errors of the library. Every failure a user can cause (bad files,
//! wrong parameters, missing versions, I/O) is one of these; none panics.

use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in dckpt.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O error, with the path it concerned.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file exists but its bytes are not a valid dckpt file.
    #[error("{path}: corrupt: {reason}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What check failed.
        reason: String,
    },
    /// The requested version is not a complete version of this store.
    #[error("rank {rank}: version {version} is not a complete checkpoint in {dir}")]
    MissingVersion {
        /// Store directory.
        dir: PathBuf,
        /// Rank asked for.
        rank: u32,
        /// Version asked for.
        version: u64,
    },
    /// The store has no checkpoint for this rank at all.
    #[error("no checkpoint store for rank {rank} in {dir}")]
    NoStore {
        /// Directory searched.
        dir: PathBuf,
        /// Rank asked for.
        rank: u32,
    },
    /// A parameter contradicts the existing store (chunk size, hash, method, data length).
    #[error("{what}: the store in {dir} has {existing}, but {requested} was requested")]
    Mismatch {
        /// Which parameter.
        what: &'static str,
        /// Store directory.
        dir: PathBuf,
        /// Value recorded in the store.
        existing: String,
        /// Value the caller asked for.
        requested: String,
    },
    /// A new version number must be larger than every committed one.
    #[error("version {requested} is not newer than the latest committed version {latest}")]
    VersionNotNewer {
        /// The latest committed version.
        latest: u64,
        /// The version asked for.
        requested: u64,
    },
    /// An invalid option value (chunk size out of range, unknown name, ...).
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The GPU backend cannot be used or failed (no driver, no device, a CUDA error).
    #[error("GPU: {0}")]
    Gpu(String),
    /// A collective step failed on another rank (every rank reports it).
    #[error("collective checkpoint: {0}")]
    Collective(String),
    /// A cross-rank reference cannot be followed: the owner's file is missing or damaged.
    #[error("rank {rank} references rank {owner} version {version}, which cannot be read ({path}): {reason}")]
    OwnerUnavailable {
        /// The rank being restored or verified.
        rank: u32,
        /// The owner's version holding the bytes.
        version: u64,
        /// The rank that stores the bytes.
        owner: u32,
        /// The owner's diff file.
        path: PathBuf,
        /// What went wrong there.
        reason: String,
    },
    /// A reference in a diff file points at data that is not there.
    #[error("{path}: broken reference: {reason}")]
    BrokenReference {
        /// The file holding the reference.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// Another process holds the store's writer lock.
    #[error("{dir} is in use by another writer{holder}; one writer per rank store at a time")]
    Locked {
        /// The rank directory whose lock is held.
        dir: PathBuf,
        /// `" (pid N)"` when the holder wrote its pid, else empty.
        holder: String,
    },
    /// A path dckpt refuses to read or write through (a symbolic link inside
    /// a store, a FIFO or device in a file's place, a store's own file as an
    /// output).
    #[error("{path}: refused: {reason}")]
    UnsafePath {
        /// The path asked for.
        path: PathBuf,
        /// Why it is refused.
        reason: String,
    },
    /// A store directory is in a state that needs `dckpt repair` (or a person) first.
    #[error("{dir}: {reason}")]
    NeedsRepair {
        /// The rank directory.
        dir: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
    /// The store has no room left (ENOSPC or a quota).
    #[error("{path}: no space left on the device")]
    NoSpace {
        /// The file being written.
        path: PathBuf,
    },
    /// A checkpoint version could not be made durable on a tier (the
    /// asynchronous flush failed; older versions there are intact).
    #[error("version {version} is not durable on the {tier} tier: {reason}")]
    NotDurable {
        /// The version.
        version: u64,
        /// The tier (`local`, `shared`).
        tier: String,
        /// Why.
        reason: String,
    },
    /// A checkpoint written by a job of another size: its ranks' regions
    /// are read with `old_regions` / `read_region`, not restarted rank by rank.
    #[error(
        "checkpoint '{name}' was written by {written} rank(s); this job has {now} (read the old ranks' regions with \
         old_regions / read_region, or restart with {written} ranks)"
    )]
    RankCount {
        /// The checkpoint name.
        name: String,
        /// Ranks of the job that wrote it.
        written: u32,
        /// Ranks of this job.
        now: u32,
    },
    /// Bytes of one size given where another is needed: a buffer that is
    /// not the store's data length, restored bytes that do not fit the
    /// destination, a host buffer for a device buffer of another length.
    #[error("{what}: {actual} bytes where {expected} are needed")]
    SizeMismatch {
        /// What was measured.
        what: String,
        /// The size needed.
        expected: u64,
        /// The size given.
        actual: u64,
    },
    /// A region asked for is not there: never protected on this rank, or
    /// absent from the region table a checkpoint recorded.
    #[error("rank {rank}: {what}")]
    MissingRegion {
        /// The rank whose region was asked for.
        rank: u32,
        /// Which region, and where it was looked for.
        what: String,
    },
    /// The machine refused a resource dckpt needs: a thread, memory, an
    /// address range larger than this process can hold.
    #[error("{what}: resources exhausted: {reason}")]
    ResourcesExhausted {
        /// What was being made.
        what: String,
        /// What the system said.
        reason: String,
    },
    /// A collective call that failed on some rank(s): every rank of the
    /// call returns this same error (the same kind, hence the same C code,
    /// and the same text), that of the lowest failing rank, so that no rank
    /// goes on alone and every rank reports alike.
    #[error("{step} failed on rank(s) {ranks:?}: {reason}")]
    OnRanks {
        /// What the ranks were doing.
        step: String,
        /// The ranks where it failed.
        ranks: Vec<u32>,
        /// The kind of the lowest failing rank's error.
        kind: ErrorKind,
        /// That error, as its rank wrote it.
        reason: String,
    },
    /// An internal invariant failed (a bug: please report it).
    #[error("internal error: {0}")]
    Internal(String),
}

/// Stable numeric codes of the error kinds (the C ABI returns them; never
/// renumbered, new kinds get new numbers). 0 means success.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ErrorKind {
    /// [`Error::Io`].
    Io = 1,
    /// [`Error::Corrupt`].
    Corrupt = 2,
    /// [`Error::MissingVersion`].
    MissingVersion = 3,
    /// [`Error::NoStore`].
    NoStore = 4,
    /// [`Error::Mismatch`].
    Mismatch = 5,
    /// [`Error::VersionNotNewer`].
    VersionNotNewer = 6,
    /// [`Error::InvalidOption`].
    InvalidOption = 7,
    /// [`Error::Gpu`].
    Gpu = 8,
    /// [`Error::Collective`].
    Collective = 9,
    /// [`Error::OwnerUnavailable`].
    OwnerUnavailable = 10,
    /// [`Error::BrokenReference`].
    BrokenReference = 11,
    /// [`Error::Locked`].
    Locked = 12,
    /// [`Error::UnsafePath`].
    UnsafePath = 13,
    /// [`Error::NeedsRepair`].
    NeedsRepair = 14,
    /// [`Error::NoSpace`].
    NoSpace = 15,
    /// [`Error::NotDurable`].
    NotDurable = 16,
    /// [`Error::RankCount`].
    RankCount = 17,
    /// [`Error::SizeMismatch`].
    SizeMismatch = 18,
    /// [`Error::MissingRegion`].
    MissingRegion = 19,
    /// [`Error::ResourcesExhausted`].
    ResourcesExhausted = 20,
    /// [`Error::Internal`].
    Internal = 99,
}

impl ErrorKind {
    /// Every kind, for [`ErrorKind::from_code`].
    const ALL: [ErrorKind; 21] = [
        ErrorKind::Io,
        ErrorKind::Corrupt,
        ErrorKind::MissingVersion,
        ErrorKind::NoStore,
        ErrorKind::Mismatch,
        ErrorKind::VersionNotNewer,
        ErrorKind::InvalidOption,
        ErrorKind::Gpu,
        ErrorKind::Collective,
        ErrorKind::OwnerUnavailable,
        ErrorKind::BrokenReference,
        ErrorKind::Locked,
        ErrorKind::UnsafePath,
        ErrorKind::NeedsRepair,
        ErrorKind::NoSpace,
        ErrorKind::NotDurable,
        ErrorKind::RankCount,
        ErrorKind::SizeMismatch,
        ErrorKind::MissingRegion,
        ErrorKind::ResourcesExhausted,
        ErrorKind::Internal,
    ];

    /// The kind of stable code `code` (`kind as i32`), if there is one.
    pub fn from_code(code: i32) -> Option<ErrorKind> {
        Self::ALL.into_iter().find(|&k| k as i32 == code)
    }
}

/// Refuses version 0 (what `latest` answers for "none" in C and Fortran,
/// and what no store can list): every way of taking a checkpoint (the
/// runtime, the C ABI, the CLI, the collective and local engines) refuses it
/// with this one error before anything is written.
pub fn check_version_number(version: u64) -> Result<()> {
    match version {
        0 => Err(Error::InvalidOption("version 0: versions start at 1 (0 means none)".into())),
        _ => Ok(()),
    }
}

impl Error {
    /// Wraps an `std::io::Error` with the path it concerned (a full disk
    /// becomes [`Error::NoSpace`]).
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::StorageFull || source.raw_os_error() == Some(28) {
            return Error::NoSpace { path: path.into() };
        }
        Error::Io { path: path.into(), source }
    }

    /// The error's kind, with its stable numeric code (`kind() as i32`).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Io { .. } => ErrorKind::Io,
            Error::Corrupt { .. } => ErrorKind::Corrupt,
            Error::MissingVersion { .. } => ErrorKind::MissingVersion,
            Error::NoStore { .. } => ErrorKind::NoStore,
            Error::Mismatch { .. } => ErrorKind::Mismatch,
            Error::VersionNotNewer { .. } => ErrorKind::VersionNotNewer,
            Error::InvalidOption(_) => ErrorKind::InvalidOption,
            Error::Gpu(_) => ErrorKind::Gpu,
            Error::Collective(_) => ErrorKind::Collective,
            Error::OwnerUnavailable { .. } => ErrorKind::OwnerUnavailable,
            Error::BrokenReference { .. } => ErrorKind::BrokenReference,
            Error::Locked { .. } => ErrorKind::Locked,
            Error::UnsafePath { .. } => ErrorKind::UnsafePath,
            Error::NeedsRepair { .. } => ErrorKind::NeedsRepair,
            Error::NoSpace { .. } => ErrorKind::NoSpace,
            Error::NotDurable { .. } => ErrorKind::NotDurable,
            Error::RankCount { .. } => ErrorKind::RankCount,
            Error::SizeMismatch { .. } => ErrorKind::SizeMismatch,
            Error::MissingRegion { .. } => ErrorKind::MissingRegion,
            Error::ResourcesExhausted { .. } => ErrorKind::ResourcesExhausted,
            Error::OnRanks { kind, .. } => *kind,
            Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// The stable numeric code of [`Error::kind`].
    pub fn code(&self) -> i32 {
        self.kind() as i32
    }

    /// A [`Error::SizeMismatch`].
    pub fn size_mismatch(what: impl Into<String>, expected: u64, actual: u64) -> Self {
        Error::SizeMismatch { what: what.into(), expected, actual }
    }

    /// A thread the system would not start ([`Error::ResourcesExhausted`]).
    pub fn no_thread(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::ResourcesExhausted { what: format!("starting {}", what.into()), reason: source.to_string() }
    }

    /// A size this process cannot address ([`Error::ResourcesExhausted`]).
    pub fn too_large(what: impl Into<String>, bytes: u64) -> Self {
        Error::ResourcesExhausted {
            what: what.into(),
            reason: format!("{bytes} bytes exceed this process's address space"),
        }
    }

    /// A corrupt-file error.
    pub fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Corrupt { path: path.into(), reason: reason.into() }
    }
}
