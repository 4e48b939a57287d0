//! The kernels of `kernels/dedup.cu` and `kernels/files.cu`, one typed
//! function each: [`Kernels`] loads them and launches each with exactly its
//! parameter list, so that no call site orders `.arg()` calls by hand. The
//! table below states every parameter's Rust type and the C type it binds
//! to; a test (`the_launch_table_is_the_kernels_signatures`) holds it to
//! the kernel sources.
//!
//! What a launch needs to be sound, and where it comes from:
//! - **The parameter list** is the kernel's: fixed here, checked by the
//!   test against the `.cu` sources.
//! - **Buffers passed as cudarc slices or views** are live for the launch.
//!   cudarc records the launch on them, and it frees them in stream order
//!   after the work queued before.
//! - **Raw device addresses** ([`DevAddr`], and the ones inside
//!   [`TableArgs`] and [`LevelArgs`]) are made only from such slices
//!   ([`DevAddr::of`], [`TableArgs::new`], [`LevelArgs::new`]), or from a
//!   protected region whose span `check_region` found inside one
//!   allocation of the device ([`DevAddr::of_region`]). A `DevAddr` keeps
//!   its allocation's end: moving it ([`DevAddr::add`]) and giving it a
//!   span ([`DevAddr::spanning`], which every copy and the launches that
//!   read a span call) fail past that end.
//! - **The sizes a kernel indexes by** (chunk counts, counters, the plan's
//!   capacities) are the ones the pipeline sized every buffer with
//!   (`GpuDedup::with_budget`). They are the pipeline's invariant: these
//!   functions are crate-private for that reason.

#![allow(unsafe_code)]

use super::{check_region, cuda_err};
use crate::error::{Error, Result};
use crate::memory::DeviceRegion;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use std::sync::Arc;

/// A device address a kernel or a copy reads or writes, with the end of
/// the allocation it lies in: made only from memory known to be live (see
/// the module documentation), moved within it ([`DevAddr::add`]) and
/// checked to hold a span ([`DevAddr::spanning`]) before a kernel or a copy
/// is given it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DevAddr {
    ptr: u64,
    end: u64,
}

impl DevAddr {
    /// The address of `slice` (on `stream`, which orders the launch after
    /// the work that made it).
    pub(crate) fn of<T>(slice: &CudaSlice<T>, stream: &Arc<CudaStream>) -> Self {
        let ptr = slice.device_ptr(stream).0;
        DevAddr { ptr, end: ptr + (slice.len() * std::mem::size_of::<T>()) as u64 }
    }

    /// The address of a protected region, once `check_region` found its
    /// span inside one allocation of `gpu`'s device.
    pub(crate) fn of_region(gpu: &super::Gpu, region: &DeviceRegion<'_>) -> Result<Self> {
        check_region(gpu, region)?;
        Ok(DevAddr { ptr: region.ptr(), end: region.ptr() + region.len() as u64 })
    }

    /// [`DevAddr::of_region`] on the device of context `ctx`.
    pub(crate) fn of_region_in(ctx: &Arc<CudaContext>, region: &DeviceRegion<'_>) -> Result<Self> {
        super::check_region_in(ctx, region)?;
        Ok(DevAddr { ptr: region.ptr(), end: region.ptr() + region.len() as u64 })
    }

    /// No buffer: a kernel parameter documented as optional (`NULL`).
    pub(crate) const NULL: DevAddr = DevAddr { ptr: 0, end: 0 };

    /// `bytes` further on, within the allocation.
    pub(crate) fn add(self, bytes: u64) -> Result<Self> {
        match self.ptr.checked_add(bytes) {
            Some(ptr) if ptr <= self.end => Ok(DevAddr { ptr, end: self.end }),
            _ => Err(past_the_end(self, bytes)),
        }
    }

    /// The same address, once checked to hold `len` bytes before its
    /// allocation's end.
    pub(crate) fn spanning(self, len: u64) -> Result<Self> {
        self.add(len).map(|_| self)
    }

    /// The address as a number (what a kernel or a copy is given).
    pub(crate) fn get(self) -> u64 {
        self.ptr
    }
}

fn past_the_end(at: DevAddr, bytes: u64) -> Error {
    Error::Internal(format!("{bytes} bytes from device address {:#x} pass its allocation's end {:#x}", at.ptr, at.end))
}

/// The record table as the kernels see it (`struct Table` in dedup.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct TableArgs {
    slots: u64,
    mask: u64,
    count: u64,
    overflow: u64,
    limit: u64,
}

// SAFETY: plain-old-data of device pointers and integers, laid out as the
// kernel's `struct Table`.
unsafe impl DeviceRepr for TableArgs {}

impl TableArgs {
    /// The table over `slots` (a power of two of 32-byte slots: 4 words,
    /// `Slot` in dedup.cu) and its two statistics words (`stats`: the
    /// count, then the overflow flag), inserting at most `limit` entries.
    pub(crate) fn new(
        slots: &CudaSlice<u64>,
        stats: &CudaSlice<u64>,
        cap: usize,
        limit: u64,
        stream: &Arc<CudaStream>,
    ) -> Result<Self> {
        if !cap.is_power_of_two() || slots.len() < 4 * cap || stats.len() < 2 {
            return Err(Error::Internal(format!("a record table of {cap} slots in {} words", slots.len())));
        }
        let stats = stats.device_ptr(stream).0;
        Ok(TableArgs {
            slots: slots.device_ptr(stream).0,
            mask: cap as u64 - 1,
            count: stats,
            overflow: stats + 8,
            limit,
        })
    }
}

/// Per-level node arrays as the kernels see them (`struct Levels`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct LevelArgs {
    lab: u64,
    dig: u64,
    sver: u64,
    snode: u64,
}

// SAFETY: as for TableArgs.
unsafe impl DeviceRepr for LevelArgs {}

impl LevelArgs {
    /// The tree's node arrays: labels, digests (two words a node), source
    /// versions and source nodes, all of one node count.
    pub(crate) fn new(
        lab: &CudaSlice<u8>,
        dig: &CudaSlice<u64>,
        sver: &CudaSlice<u32>,
        snode: &CudaSlice<u64>,
        stream: &Arc<CudaStream>,
    ) -> Result<Self> {
        let nodes = lab.len();
        if dig.len() < 2 * nodes || sver.len() < nodes || snode.len() < nodes {
            return Err(Error::Internal(format!("tree arrays shorter than its {nodes} nodes")));
        }
        Ok(LevelArgs {
            lab: lab.device_ptr(stream).0,
            dig: dig.device_ptr(stream).0,
            sver: sver.device_ptr(stream).0,
            snode: snode.device_ptr(stream).0,
        })
    }
}

/// Declares the kernels: the struct that holds them, its loader, one
/// launch function per kernel, and the table the test reads. A parameter
/// is `ptr` (a slice or a view, given by reference), `val` (by value) or
/// `addr` (a [`DevAddr`], given as its address), with the C type it binds
/// to.
macro_rules! kernels {
    ($(
        $(#[$doc:meta])*
        $name:ident ( $( $kind:ident $arg:ident : $ty:ty = $c:literal ),* $(,)? );
    )*) => {
        /// The loaded kernels, one function each.
        pub(crate) struct Kernels {
            $( $name: CudaFunction, )*
        }

        impl Kernels {
            /// Loads every kernel from `module`.
            pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self> {
                let f = |name: &str| module.load_function(name).map_err(|e| Error::Gpu(format!("kernel {name}: {e}")));
                Ok(Kernels { $( $name: f(stringify!($name))?, )* })
            }

            $(
                $(#[$doc])*
                #[allow(clippy::too_many_arguments)]
                pub(crate) fn $name(&self, stream: &Arc<CudaStream>, cfg: LaunchConfig, $( $arg: $ty ),*) -> Result<()> {
                    let mut b = stream.launch_builder(&self.$name);
                    $( kernels!(@push b, $kind, $arg); )*
                    // SAFETY: the parameters are the kernel's, in its order
                    // and of its C types (the table, held to the sources by
                    // the test); every address among them is live and sized
                    // for the kernel (the module documentation).
                    unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda_err)
                }
            )*
        }

        /// Every kernel's C parameter types, as the launch table binds them.
        #[cfg(test)]
        pub(super) const SIGNATURES: &[(&str, &[&str])] = &[ $( (stringify!($name), &[ $( $c ),* ]) ),* ];

        /// Every kernel's Rust parameter types, as the launch table binds them.
        #[cfg(test)]
        pub(super) const RUST_TYPES: &[(&str, &[&str])] = &[ $( (stringify!($name), &[ $( stringify!($ty) ),* ]) ),* ];
    };
    (@push $b:ident, ptr, $arg:ident) => { $b.arg($arg) };
    (@push $b:ident, val, $arg:ident) => { $b.arg(&$arg) };
    (@push $b:ident, addr, $arg:ident) => { let $arg = $arg.get(); $b.arg(&$arg) };
}

kernels! {
    /// Pass 1 over the leaves, Murmur3 digests (`leaf_pass_impl<1>`).
    leaf_pass_murmur3(addr data: DevAddr = "const u8*", val data_len: u64 = "u64", val cs: u32 = "u32", val n: u64 = "u64",
        ptr prev: &CudaSlice<u64> = "const u64*", val has_prev: i32 = "int", ptr dig: &CudaSlice<u64> = "u64*",
        ptr ballots: &CudaSlice<u32> = "u32*", ptr block_counts: &CudaSlice<u64> = "u64*");
    /// The same with XXH3 digests.
    leaf_pass_xxh3(addr data: DevAddr = "const u8*", val data_len: u64 = "u64", val cs: u32 = "u32", val n: u64 = "u64",
        ptr prev: &CudaSlice<u64> = "const u64*", val has_prev: i32 = "int", ptr dig: &CudaSlice<u64> = "u64*",
        ptr ballots: &CudaSlice<u32> = "u32*", ptr block_counts: &CudaSlice<u64> = "u64*");
    /// The same with BLAKE3 digests.
    leaf_pass_blake3(addr data: DevAddr = "const u8*", val data_len: u64 = "u64", val cs: u32 = "u32", val n: u64 = "u64",
        ptr prev: &CudaSlice<u64> = "const u64*", val has_prev: i32 = "int", ptr dig: &CudaSlice<u64> = "u64*",
        ptr ballots: &CudaSlice<u32> = "u32*", ptr block_counts: &CudaSlice<u64> = "u64*");
    /// Ballots and per-block counts of a byte array's non-zero flags.
    flag_ballot(ptr flags: &CudaSlice<u8> = "const u8*", val n: u64 = "u64", ptr ballots: &CudaSlice<u32> = "u32*",
        ptr block_counts: &CudaSlice<u64> = "u64*");
    /// The indices of set flags, from the ballots and the scanned block counts.
    compact_flags(ptr ballots: &CudaSlice<u32> = "const u32*", ptr block_offsets: &CudaSlice<u64> = "const u64*",
        val n: u64 = "u64", ptr out: &CudaSlice<u64> = "u64*");
    /// Scan step 1: each tile's exclusive scan and its sum.
    scan_tiles(ptr input: &CudaSlice<u64> = "const u64*", ptr output: &CudaSlice<u64> = "u64*",
        ptr n_ptr: &CudaView<'_, u64> = "const u64*", ptr sums: &CudaSlice<u64> = "u64*");
    /// Scan step 2: the tiles' sums scanned, the total stored.
    scan_sums(ptr sums: &CudaSlice<u64> = "u64*", ptr n_ptr: &CudaView<'_, u64> = "const u64*",
        ptr total: &CudaView<'_, u64> = "u64*");
    /// Scan step 3: each tile's offset added.
    scan_add(ptr output: &CudaSlice<u64> = "u64*", ptr n_ptr: &CudaView<'_, u64> = "const u64*",
        ptr sums: &CudaSlice<u64> = "const u64*");
    /// The changed leaves' digests into the record (List and Tree).
    insert_leaves(ptr counters: &CudaSlice<u64> = "const u64*", ptr idx: &CudaSlice<u64> = "const u64*",
        ptr dig: &CudaSlice<u64> = "const u64*", val t: TableArgs = "Table", val version: u32 = "u32");
    /// Each changed leaf's label from the record.
    label_leaves(ptr counters: &CudaSlice<u64> = "const u64*", ptr idx: &CudaSlice<u64> = "const u64*",
        ptr dig: &CudaSlice<u64> = "const u64*", val t: TableArgs = "Table", val version: u32 = "u32",
        val use_table: i32 = "int", val lv: LevelArgs = "Levels", addr root_at: DevAddr = "u8*");
    /// Algorithm 1, stage 1, one level: FIRST parents.
    stage1(val lv: LevelArgs = "Levels", val off_k: u64 = "u64", val len_k: u64 = "u64", val off_k1: u64 = "u64",
        val len_k1: u64 = "u64", val level_k1: u32 = "u32", val t: TableArgs = "Table", val version: u32 = "u32",
        val algo: i32 = "int");
    /// Algorithm 1, stage 2, one level: SHIFT parents and repeat nodes.
    stage2(val lv: LevelArgs = "Levels", val off_k: u64 = "u64", val len_k: u64 = "u64", val off_k1: u64 = "u64",
        val len_k1: u64 = "u64", val level_k: u32 = "u32", val t: TableArgs = "Table", val algo: i32 = "int",
        ptr root_at: &CudaSlice<u8> = "u8*", val n: u64 = "u64");
    /// The root of the whole tree.
    top_root(val lv: LevelArgs = "Levels", val off_top: u64 = "u64", val top: u32 = "u32",
        ptr root_at: &CudaSlice<u8> = "u8*");
    /// Each root's kind, extent, source and bytes.
    root_info(ptr counters: &CudaSlice<u64> = "u64*", ptr roots: &CudaSlice<u64> = "const u64*",
        ptr root_at: &CudaSlice<u8> = "const u8*", val lv: LevelArgs = "Levels",
        ptr level_off: &CudaSlice<u64> = "const u64*", val n: u64 = "u64", val cs: u32 = "u32",
        val data_len: u64 = "u64", ptr kind: &CudaSlice<u8> = "u8*", ptr count: &CudaSlice<u64> = "u64*",
        ptr src_ver: &CudaSlice<u64> = "u64*", ptr src_start: &CudaSlice<u64> = "u64*",
        ptr first_flag: &CudaSlice<u64> = "u64*", ptr bytes: &CudaSlice<u64> = "u64*");
    /// Which roots start a run.
    run_heads(ptr counters: &CudaSlice<u64> = "const u64*", ptr roots: &CudaSlice<u64> = "const u64*",
        ptr kind: &CudaSlice<u8> = "const u8*", ptr count: &CudaSlice<u64> = "const u64*",
        ptr src_ver: &CudaSlice<u64> = "const u64*", ptr src_start: &CudaSlice<u64> = "const u64*",
        val coalesce: i32 = "int", ptr first_head: &CudaSlice<u64> = "u64*", ptr shift_head: &CudaSlice<u64> = "u64*");
    /// The runs' table entries into the file.
    emit_runs(ptr counters: &CudaSlice<u64> = "const u64*", ptr roots: &CudaSlice<u64> = "const u64*",
        ptr kind: &CudaSlice<u8> = "const u8*", ptr count: &CudaSlice<u64> = "const u64*",
        ptr src_ver: &CudaSlice<u64> = "const u64*", ptr src_start: &CudaSlice<u64> = "const u64*",
        ptr first_head: &CudaSlice<u64> = "const u64*", ptr shift_head: &CudaSlice<u64> = "const u64*",
        ptr first_id: &CudaSlice<u64> = "const u64*", ptr shift_id: &CudaSlice<u64> = "const u64*",
        ptr run_end: &CudaSlice<u64> = "u64*", ptr out: &CudaSlice<u8> = "u8*", val write_first_table: i32 = "int",
        val rank: u32 = "u32");
    /// Each run's length, from the run ends.
    finish_runs(ptr counters: &CudaSlice<u64> = "const u64*", ptr run_end: &CudaSlice<u64> = "const u64*",
        ptr out: &CudaSlice<u8> = "u8*", val write_first_table: i32 = "int");
    /// Where each FIRST root's bytes go in the file's data.
    first_roots(ptr counters: &CudaSlice<u64> = "const u64*", ptr roots: &CudaSlice<u64> = "const u64*",
        ptr kind: &CudaSlice<u8> = "const u8*", ptr bytes_off: &CudaSlice<u64> = "const u64*",
        ptr first_rank: &CudaSlice<u64> = "const u64*", ptr fr_start: &CudaSlice<u64> = "u64*",
        ptr fr_off: &CudaSlice<u64> = "u64*");
    /// The FIRST bytes gathered from the input into the file.
    gather(ptr counters: &CudaSlice<u64> = "const u64*", ptr fr_start: &CudaSlice<u64> = "const u64*",
        ptr fr_off: &CudaSlice<u64> = "const u64*", addr data: DevAddr = "const u8*", val cs: u32 = "u32",
        ptr out: &CudaSlice<u8> = "u8*", val write_first_table: i32 = "int", val bitmap_len: u64 = "u64");
    /// The file's header.
    write_header(ptr counters: &CudaSlice<u64> = "const u64*", ptr out: &CudaSlice<u8> = "u8*", val method: u32 = "u32",
        val hash: u32 = "u32", val flags: u32 = "u32", val rank: u32 = "u32", val cs: u32 = "u32",
        val version: u64 = "u64", val data_len: u64 = "u64", val bitmap_len: u64 = "u64",
        val write_first_table: i32 = "int");
    /// The changed-chunk bitmap (Basic).
    write_bitmap(ptr ballots: &CudaSlice<u32> = "const u32*", val bitmap_len: u64 = "u64", ptr out: &CudaSlice<u8> = "u8*");
    /// The committed version's leaf digests become the previous ones.
    commit_leaves(ptr counters: &CudaSlice<u64> = "const u64*", ptr idx: &CudaSlice<u64> = "const u64*",
        ptr dig: &CudaSlice<u64> = "const u64*", ptr prev: &CudaSlice<u64> = "u64*");
    /// A pending version's record entries removed.
    table_rollback(val t: TableArgs = "Table", val version: u32 = "u32");
    /// The 64 KiB blocks' BLAKE3-256 digests of `len` bytes at `data`.
    block_digests(addr data: DevAddr = "const u8*", val len: u64 = "u64", addr out: DevAddr = "u8*");
    /// Record entries moved to where their bytes are stored.
    table_locate(val t: TableArgs = "Table", val latest: u32 = "u32", val me: u32 = "u32", val n: u64 = "u64",
        val nruns: u64 = "u64", ptr runs: &CudaSlice<u64> = "const u64*");
    /// Digests of tree nodes gathered.
    gather_digests(ptr dig: &CudaSlice<u64> = "const u64*", ptr lab: &CudaSlice<u8> = "const u8*",
        ptr idx: &CudaSlice<u64> = "const u64*", val count: u64 = "u64", ptr out: &mut CudaSlice<u64> = "u64*");
    /// Merkle digests of byte spans (their addresses and lengths in device memory).
    region_digests(ptr addr: &CudaSlice<u64> = "const u64*", ptr len: &CudaSlice<u64> = "const u64*",
        val count: u64 = "u64", val cs: u32 = "u32", val algo: i32 = "int", ptr out: &mut CudaSlice<u64> = "u64*");
}

impl Kernels {
    /// [`Kernels::leaf_pass_murmur3`] and its siblings by digest (`algo`:
    /// 1 Murmur3, 2 XXH3, 3 BLAKE3).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn leaf_pass(
        &self,
        algo: i32,
        stream: &Arc<CudaStream>,
        cfg: LaunchConfig,
        data: DevAddr,
        data_len: u64,
        cs: u32,
        n: u64,
        prev: &CudaSlice<u64>,
        has_prev: i32,
        dig: &CudaSlice<u64>,
        ballots: &CudaSlice<u32>,
        block_counts: &CudaSlice<u64>,
    ) -> Result<()> {
        data.spanning(data_len)?;
        match algo {
            1 => self.leaf_pass_murmur3(stream, cfg, data, data_len, cs, n, prev, has_prev, dig, ballots, block_counts),
            2 => self.leaf_pass_xxh3(stream, cfg, data, data_len, cs, n, prev, has_prev, dig, ballots, block_counts),
            3 => self.leaf_pass_blake3(stream, cfg, data, data_len, cs, n, prev, has_prev, dig, ballots, block_counts),
            other => Err(Error::Internal(format!("no leaf pass for digest {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DevAddr, RUST_TYPES, SIGNATURES};

    #[test]
    fn a_device_address_moves_and_spans_only_within_its_allocation() {
        let at = DevAddr { ptr: 0x1000, end: 0x1100 };
        assert_eq!(at.add(0x100).map(DevAddr::get).ok(), Some(0x1100), "to the end, exactly");
        assert!(at.add(0x101).is_err(), "past the end");
        assert!(at.add(u64::MAX).is_err(), "an overflow");
        assert!(at.add(0x80).and_then(|a| a.spanning(0x80)).is_ok());
        assert!(at.add(0x80).and_then(|a| a.spanning(0x81)).is_err());
        assert!(DevAddr::NULL.spanning(1).is_err(), "NULL holds nothing");
    }

    /// The kernels' parameter types in `src`, in order (the `LEAF_PASS`
    /// macro's kernel is named `NAME`).
    fn kernel_signatures(src: &str) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        for (at, _) in src.match_indices("__global__ void") {
            let mut rest = src[at + "__global__ void".len()..].trim_start_matches([' ', '\\', '\n']);
            if let Some(bounded) = rest.strip_prefix("__launch_bounds__") {
                rest = bounded[bounded.find(')').map_or(0, |i| i + 1)..].trim_start_matches([' ', '\\', '\n']);
            }
            let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else { continue };
            let types = rest[open + 1..close]
                .replace('\\', " ")
                .split(',')
                .map(|p| {
                    let p = p.split_whitespace().collect::<Vec<_>>().join(" ");
                    // The parameter's name goes: its type remains.
                    p.rfind([' ', '*']).map_or(p.clone(), |i| p[..=i].trim().to_string())
                })
                .collect();
            out.push((rest[..open].trim().to_string(), types));
        }
        out
    }

    #[test]
    fn the_launch_table_is_the_kernels_signatures() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        let mut src = String::new();
        for f in ["dedup.cu", "files.cu"] {
            src += &std::fs::read_to_string(root.join(f)).unwrap_or_default();
        }
        let found = kernel_signatures(&src);
        let by_name = |name: &str| -> Option<Vec<String>> {
            let name = if name.starts_with("leaf_pass_") { "NAME" } else { name };
            found.iter().find(|(n, _)| n == name).map(|(_, p)| p.clone())
        };
        let mut problems = Vec::new();
        for (name, table) in SIGNATURES {
            match by_name(name) {
                Some(params) if params.iter().map(String::as_str).eq(table.iter().copied()) => {}
                Some(params) => problems.push(format!("{name}: the sources say {params:?}, the table {table:?}")),
                None => problems.push(format!("{name}: no such kernel in kernels/*.cu")),
            }
        }
        // Every kernel the sources define is in the table.
        assert!(found.len() > 20, "kernels/*.cu not read: {found:?}");
        for (name, _) in &found {
            let known = name == "NAME" || SIGNATURES.iter().any(|(n, _)| n == name);
            if !known {
                problems.push(format!("{name}: a kernel without a launch function"));
            }
        }
        // Each Rust type binds its C type: a pointer to a slice, view or
        // address, a scalar to one of its width.
        for ((name, c_types), (_, rust_types)) in SIGNATURES.iter().zip(RUST_TYPES) {
            for (c, r) in c_types.iter().zip(rust_types.iter()) {
                let r = r.replace(' ', "");
                let ok = if c.ends_with('*') {
                    let elem = c.trim_start_matches("const ").trim_end_matches('*').trim();
                    r == "DevAddr" || r.ends_with(&format!("<{elem}>")) || r.ends_with(&format!(",{elem}>"))
                } else {
                    matches!((*c, r.as_str()), ("u64", "u64") | ("u32", "u32") | ("int", "i32"))
                        || (*c == "Table" && r == "TableArgs")
                        || (*c == "Levels" && r == "LevelArgs")
                };
                if !ok {
                    problems.push(format!("{name}: C `{c}` bound to Rust `{r}`"));
                }
            }
        }
        assert!(problems.is_empty(), "the launch table and the kernels disagree:\n{}", problems.join("\n"));
    }
}
