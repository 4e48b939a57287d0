// dckpt GPU de-duplication kernels (NVRTC; the host compiles digests.cuh,
// this file and files.cu as one source, in that order).
//
// One checkpoint is a fixed sequence of launches on one stream, with no host
// round trip until the final size read:
//   leaf_pass -> scan -> compact_flags          changed leaves, in index order
//   insert_leaves -> label_leaves               FIRST / SHIFT (List, Tree)
//   stage1 (per level) -> stage2 (per level)    Algorithm 1 (Tree)
//   flag_ballot -> scan -> compact_flags        region roots, in chunk order
//   root_info -> scans -> emit_runs -> finish   FIRST / SHIFT tables
//   gather -> write_header                      one contiguous output buffer
//   block_digests                               BLAKE3-256 per 64 KiB data block
// This file holds the record table, the scans and the stages up to the
// region roots; files.cu turns the roots into the diff file.
// The output is byte-identical to the CPU engine's (src/format/diff_file/)
// up to, not including, the trailer, which the host adds (it hashes only the
// metadata and the block digests). table_locate rebuilds the record when a
// store is reopened (src/engine/rebuild.rs).

#define L_FIXED 0
#define L_FIRST 1
#define L_SHIFT 2
#define L_MIXED 3
#define L_OTHER 4

#define SLOT_EMPTY 0u
#define SLOT_BUSY 1u
#define SLOT_FULL 2u
#define SLOT_DEAD 3u

#define INDEX_BITS 58
#define RUN_WORDS 5
// A repeat node's source is at most on this level: its size, the period,
// fits a repeat entry's 24 bits (MAX_PERIOD in src/format/diff_file/header.rs).
#define MAX_REPEAT_LEVEL 23
// A root's src_ver word: the version (bits 0..31), the owner + 1 (bits
// 32..57), and for a repeat node the period's log2 (58..62) and a flag (63),
// so that a repeat node never coalesces with a neighbour.
#define SRC_OWNER_MASK 0x3ffffffull
#define SRC_REPEAT (1ull << 63)
#define SRC_PERIOD_SHIFT 58
// counters[7]: set when some root is a repeat node (the file is then v3).
#define C_REPEATS 7

// One record entry: 32 bytes, so a probe touches one 32-byte sector.
struct Slot {
    u64 klo;
    u64 khi;
    u64 node;
    u32 ver;
    u32 flags;
};

// The record as an open-addressing table (linear probing, power-of-two size).
struct Table {
    Slot* slots;
    u64 mask;
    u64* count;     // live entries
    u32* overflow;  // set when an insert found no room
    u64 limit;      // max live entries before overflow is declared
};

// Per-level node arrays, concatenated; level k starts at off[k].
struct Levels {
    u8* lab;
    u64* dig;       // 2 words per node
    u32* sver;      // SHIFT source version
    u64* snode;     // SHIFT source node (raw NodeId)
};

__device__ __forceinline__ dig128 leaf_digest(int algo, const u8* p, u32 len, bool aligned16) {
    if (algo == 1) return aligned16 ? murmur3_x64_128_aligned16(p, len, 0) : murmur3_x64_128(p, len, 0);
    if (algo == 2) return xxh3_128(p, len, 0ull);
    return blake3_128(p, len);
}

__device__ __forceinline__ dig128 node_digest(int algo, dig128 l, dig128 r) {
    if (algo == 1) return node_murmur3(l, r);
    if (algo == 2) return node_xxh3(l, r);
    return node_blake3(l, r);
}

__device__ __forceinline__ dig128 load_dig(const u64* d, u64 i) {
    dig128 x;
    x.lo = d[2 * i];
    x.hi = d[2 * i + 1];
    return x;
}

__device__ __forceinline__ void store_dig(u64* d, u64 i, dig128 x) {
    d[2 * i] = x.lo;
    d[2 * i + 1] = x.hi;
}

__device__ __forceinline__ u64 node_id(u32 level, u64 index) { return ((u64)level << INDEX_BITS) | index; }
// A record slot's node may name another rank (a collective checkpoint gave
// the region to it): bits [OWNER_SHIFT, INDEX_BITS) hold owner + 1 (0 = this
// rank), so indices are limited to OWNER_SHIFT bits.
#define OWNER_SHIFT 40
__device__ __forceinline__ u64 node_first_chunk(u64 raw) {
    return (raw & ((1ull << OWNER_SHIFT) - 1)) << (raw >> INDEX_BITS);
}
__device__ __forceinline__ u32 node_owner_plus1(u64 raw) {
    return (u32)((raw >> OWNER_SHIFT) & ((1ull << (INDEX_BITS - OWNER_SHIFT)) - 1));
}

// ---------------------------------------------------------------- table ----

// Finds `d`; returns the slot or -1.
__device__ long long table_find(const Table t, dig128 d) {
    u64 slot = d.lo & t.mask;
    for (u64 probe = 0; probe <= t.mask; probe++) {
        volatile Slot* sl = (volatile Slot*)&t.slots[slot];
        u32 f = sl->flags;
        while (f == SLOT_BUSY) f = sl->flags;
        if (f == SLOT_EMPTY) return -1;
        if (f == SLOT_FULL) {
            __threadfence();
            if (sl->klo == d.lo && sl->khi == d.hi) return (long long)slot;
        }
        slot = (slot + 1) & t.mask;
    }
    return -1;
}

// Inserts `d` -> (version, node) unless present. When present with the same
// version and `min_node`, keeps the smaller node (lowest index wins).
// Returns the slot, or -1 on overflow; `inserted` says whether it is new.
// The caller adds the new entries to *t.count (once per warp).
// A new entry takes the first tombstone (SLOT_DEAD, left by table_rollback
// and table_locate) of its probe sequence, else the empty slot that ends
// it, once the probe has shown `d` absent: the table has a fixed size, so
// tombstones must not use it up. Tombstones are only made by kernels that
// run alone, so every thread inserting `d` picks the same slot; a thread
// whose claim fails probes again (the winner may have inserted `d`).
__device__ long long table_insert(const Table t, dig128 d, u32 version, u64 node, bool min_node, bool& inserted) {
    inserted = false;
    for (;;) {
        u64 slot = d.lo & t.mask;
        long long dead = -1, target = -1;
        for (u64 probe = 0; probe <= t.mask; probe++) {
            volatile Slot* sl = (volatile Slot*)&t.slots[slot];
            u32 f = sl->flags;
            if (f == SLOT_EMPTY) {
                target = dead >= 0 ? dead : (long long)slot;
                break;
            }
            while (f == SLOT_BUSY) f = sl->flags;
            if (f == SLOT_FULL) {
                __threadfence();
                if (sl->klo == d.lo && sl->khi == d.hi) {
                    if (min_node && sl->ver == version) atomicMin(&t.slots[slot].node, node);
                    return (long long)slot;
                }
            } else if (f == SLOT_DEAD && dead < 0) {
                dead = (long long)slot;
            }
            slot = (slot + 1) & t.mask;
        }
        if (target < 0) target = dead;  // no empty slot: the first tombstone, if any
        if (target < 0 || *(volatile u64*)t.count >= t.limit) {
            atomicExch(t.overflow, 1u);
            return -1;
        }
        Slot* raw = &t.slots[target];
        const u32 expect = target == dead ? SLOT_DEAD : SLOT_EMPTY;
        if (atomicCAS(&raw->flags, expect, SLOT_BUSY) == expect) {
            volatile Slot* sl = (volatile Slot*)raw;
            sl->klo = d.lo;
            sl->khi = d.hi;
            sl->ver = version;
            sl->node = node;
            __threadfence();
            atomicExch(&raw->flags, SLOT_FULL);
            inserted = true;
            return target;
        }
    }
}

// Adds the warp's new entries to the table's count with one atomic.
__device__ __forceinline__ void count_inserts(const Table t, bool inserted) {
    u32 active = __activemask();
    u32 m = __ballot_sync(active, inserted);
    if ((threadIdx.x & 31) == (u32)(__ffs(active) - 1) && m) atomicAdd(t.count, (u64)__popc(m));
}

extern "C" __global__ void table_rollback(Table t, u32 version) {
    for (u64 s = blockIdx.x * (u64)blockDim.x + threadIdx.x; s <= t.mask; s += (u64)gridDim.x * blockDim.x) {
        if (t.slots[s].flags == SLOT_FULL && t.slots[s].ver == version) {
            t.slots[s].flags = SLOT_DEAD;
            atomicAdd(t.count, (u64)-1ll);
        }
    }
}

// ---------------------------------------------------------------- scans ----

// Exclusive prefix sum of `x` over the 1024 threads of the block; the block's
// total to `total`. Every thread of the block must call it (it synchronizes);
// `warp_tot` is 33 words of shared memory.
__device__ __forceinline__ u64 block_exclusive_scan(u64 x, u64* warp_tot, u64& total) {
    u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    u64 incl = x;
    for (int o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= (u32)o) incl += y;
    }
    if (lane == 31) warp_tot[w] = incl;
    __syncthreads();
    if (w == 0) {
        u64 t = warp_tot[lane];
        u64 ti = t;
        for (int o = 1; o < 32; o <<= 1) {
            u64 y = __shfl_up_sync(0xffffffffu, ti, o);
            if (lane >= (u32)o) ti += y;
        }
        warp_tot[lane] = ti - t;
        if (lane == 31) warp_tot[32] = ti;
    }
    __syncthreads();
    u64 excl = incl - x + warp_tot[w];
    total = warp_tot[32];
    __syncthreads();  // warp_tot may be reused
    return excl;
}

// Exclusive scan of `in` into `out` (may alias) by 1024-element tiles; the
// element count is read from the device (*n), so the grid is fixed and no host
// round trip is needed: blocks stride over the tiles. Tile totals to `sums`.
extern "C" __global__ void __launch_bounds__(1024) scan_tiles(const u64* in, u64* out, const u64* n_ptr, u64* sums) {
    __shared__ u64 warp_tot[33];
    u64 n = *n_ptr;
    u64 tiles = n == 0 ? 1 : (n + 1023) / 1024;
    for (u64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        u64 i = tile * 1024ull + threadIdx.x;
        u64 total;
        u64 e = block_exclusive_scan(i < n ? in[i] : 0, warp_tot, total);
        if (i < n) out[i] = e;
        if (threadIdx.x == 0) sums[tile] = total;
    }
}

// Exclusive scan of the tile totals in one block; the grand total to *total.
extern "C" __global__ void __launch_bounds__(1024) scan_sums(u64* sums, const u64* n_ptr, u64* total) {
    __shared__ u64 warp_tot[33];
    u64 tiles = (*n_ptr + 1023) / 1024;
    if (tiles == 0) tiles = 1;
    u64 carry = 0;  // the same in every thread
    for (u64 base = 0; base < tiles; base += 1024) {
        u64 i = base + threadIdx.x;
        u64 part;
        u64 e = block_exclusive_scan(i < tiles ? sums[i] : 0, warp_tot, part);
        if (i < tiles) sums[i] = carry + e;
        carry += part;
    }
    if (threadIdx.x == 0) *total = carry;
}

extern "C" __global__ void __launch_bounds__(1024) scan_add(u64* out, const u64* n_ptr, const u64* sums) {
    u64 n = *n_ptr;
    for (u64 i = blockIdx.x * 1024ull + threadIdx.x; i < n; i += (u64)gridDim.x * 1024ull) out[i] += sums[i / 1024];
}

// ------------------------------------------------------------- leaf pass ----

// Murmur3 of the block's 256 chunks, staged through shared memory in
// 128-byte segments so that every global load is a coalesced 16-byte access
// (a thread per chunk reading its own chunk strides the warp across 32 lines).
// Requires cs % 16 == 0 and a 16-byte-aligned buffer.
#define SEG 128
#define SEG_PITCH (SEG + 16)  // one 16-byte pad per chunk: conflict-free 16-byte reads
__device__ __forceinline__ dig128 murmur3_staged(const u8* data, u64 data_len, u32 cs, u64 n) {
    __shared__ u64x2 seg[256 * SEG_PITCH / 16];
    u64 first = blockIdx.x * 256ull;
    u64 i = first + threadIdx.x;
    u64 block_end = (first + 256) * cs < data_len ? (first + 256) * cs : data_len;  // bytes of this block
    u64 block_start = first * cs;
    u64 my_len = 0;
    if (i < n) {
        u64 rem = data_len - i * cs;
        my_len = rem < cs ? rem : cs;
    }
    u64 h1 = 0, h2 = 0;
    u32 full_blocks = (u32)(my_len / 16);
    for (u32 s0 = 0; s0 < cs; s0 += SEG) {
        // Cooperative load: segment [s0, s0+SEG) of each chunk, 16 bytes per thread per step.
        const u32 units = 256 * (SEG / 16);
        for (u32 u = threadIdx.x; u < units; u += 256) {
            u32 c = u / (SEG / 16), k = u % (SEG / 16);
            u64 src = block_start + (u64)c * cs + s0 + 16 * k;
            u64x2 v;
            v.x = 0;
            v.y = 0;
            if (s0 + 16 * k < cs && src + 16 <= block_end) v = *(const u64x2*)(data + src);
            seg[(c * SEG_PITCH) / 16 + k] = v;
        }
        __syncthreads();
        u32 b0 = s0 / 16, b1 = b0 + SEG / 16;
        if (b1 > full_blocks) b1 = full_blocks;
        for (u32 b = b0; b < b1; b++) {
            u64x2 v = seg[(threadIdx.x * SEG_PITCH) / 16 + (b - b0)];
            m3_block(h1, h2, v.x, v.y);
        }
        __syncthreads();
    }
    u32 rem = (u32)(my_len & 15);
    return m3_tail(h1, h2, data + i * cs + 16ull * full_blocks, rem, (u32)my_len);
}

// One thread per chunk: hash it, compare with the previous version's digest.
// Changed leaves get their digest stored and a bit in `ballots`; each block
// of 256 threads writes its changed count. One kernel per algorithm, so the
// Murmur3 path is not sized for BLAKE3's registers.
template <int ALGO>
__device__ __forceinline__ void leaf_pass_impl(const u8* data, u64 data_len, u32 cs, u64 n, const u64* prev,
                                               int has_prev, u64* dig, u32* ballots, u64* block_counts) {
    u64 i = blockIdx.x * 256ull + threadIdx.x;
    bool changed = false;
    dig128 d;
    d.lo = 0;
    d.hi = 0;
    if (ALGO == 1 && (cs & 15u) == 0 && (((u64)data) & 15ull) == 0) {
        d = murmur3_staged(data, data_len, cs, n);
    } else if (i < n) {
        u64 off = i * cs;
        u64 rem = data_len - off;
        u32 len = rem < cs ? (u32)rem : cs;
        d = leaf_digest(ALGO, data + off, len, false);
    }
    if (i < n) {
        changed = !has_prev || d.lo != prev[2 * i] || d.hi != prev[2 * i + 1];
        if (changed) store_dig(dig, i, d);
    }
    u32 b = __ballot_sync(0xffffffffu, changed);
    if ((threadIdx.x & 31) == 0 && i < n) ballots[i >> 5] = b;
    int cnt = __syncthreads_count(changed);
    if (threadIdx.x == 0) block_counts[blockIdx.x] = (u64)cnt;
}

#define LEAF_PASS(NAME, ALGO)                                                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                                          \
        NAME(const u8* data, u64 data_len, u32 cs, u64 n, const u64* prev, int has_prev, u64* dig, u32* ballots, \
             u64* block_counts) {                                                                              \
        leaf_pass_impl<ALGO>(data, data_len, cs, n, prev, has_prev, dig, ballots, block_counts);              \
    }
LEAF_PASS(leaf_pass_murmur3, 1)
LEAF_PASS(leaf_pass_xxh3, 2)
LEAF_PASS(leaf_pass_blake3, 3)

// Flags from a byte array (non-zero = set), in the leaf_pass layout.
extern "C" __global__ void __launch_bounds__(256) flag_ballot(const u8* flags, u64 n, u32* ballots, u64* block_counts) {
    u64 i = blockIdx.x * 256ull + threadIdx.x;
    bool set = i < n && flags[i] != 0;
    u32 b = __ballot_sync(0xffffffffu, set);
    if ((threadIdx.x & 31) == 0 && i < n) ballots[i >> 5] = b;
    int cnt = __syncthreads_count(set);
    if (threadIdx.x == 0) block_counts[blockIdx.x] = (u64)cnt;
}

// Writes the indices of set flags in order, using the scanned block counts.
extern "C" __global__ void __launch_bounds__(256) compact_flags(const u32* ballots, const u64* block_offsets, u64 n,
                                                                 u64* out) {
    __shared__ u32 warp_off[8];
    u64 i = blockIdx.x * 256ull + threadIdx.x;
    u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    u32 b = i < n ? ballots[i >> 5] : 0u;
    if (lane == 0) warp_off[w] = __popc(b);
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 acc = 0;
        for (int k = 0; k < 8; k++) {
            u32 c = warp_off[k];
            warp_off[k] = acc;
            acc += c;
        }
    }
    __syncthreads();
    if (i < n && ((b >> lane) & 1u)) {
        out[block_offsets[blockIdx.x] + warp_off[w] + __popc(b & ((1u << lane) - 1u))] = i;
    }
}

// ------------------------------------------------------ leaf labelling ----

// counters[0] = number of changed leaves.
extern "C" __global__ void insert_leaves(const u64* counters, const u64* idx, const u64* dig, Table t, u32 version) {
    u64 m = counters[0];
    for (u64 k = blockIdx.x * (u64)blockDim.x + threadIdx.x; k < m; k += (u64)gridDim.x * blockDim.x) {
        u64 i = idx[k];
        bool ins;
        table_insert(t, load_dig(dig, i), version, i, true, ins);
        count_inserts(t, ins);
    }
}

// FIRST when the record's entry is this very leaf, SHIFT otherwise.
// `use_table` = 0 (Basic): every changed leaf is FIRST.
extern "C" __global__ void label_leaves(const u64* counters, const u64* idx, const u64* dig, Table t, u32 version,
                                        int use_table, Levels lv, u8* root_at) {
    u64 m = counters[0];
    for (u64 k = blockIdx.x * (u64)blockDim.x + threadIdx.x; k < m; k += (u64)gridDim.x * blockDim.x) {
        u64 i = idx[k];
        u8 label = L_FIRST;
        if (use_table) {
            long long s = table_find(t, load_dig(dig, i));
            if (s < 0) {
                atomicExch(t.overflow, 2u);
            } else if (!(t.slots[s].ver == version && t.slots[s].node == i)) {
                label = L_SHIFT;
                lv.sver[i] = t.slots[s].ver;
                lv.snode[i] = t.slots[s].node;
            }
        }
        lv.lab[i] = label;
        if (root_at) root_at[i] = 1;  // List and Basic: every changed leaf is a root
    }
}

// ------------------------------------------------------------ Algorithm 1 ----

// Stage 1, level k -> k+1 (dense over level k+1): FIRST subtrees.
extern "C" __global__ void stage1(Levels lv, u64 off_k, u64 len_k, u64 off_k1, u64 len_k1, u32 level_k1, Table t,
                                  u32 version, int algo) {
    u64 p = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (p >= len_k1) return;
    u64 c0 = off_k + 2 * p, c1 = c0 + 1;
    u64 me = off_k1 + p;
    u8 a = lv.lab[c0];
    if (2 * p + 1 >= len_k) {  // carried
        u8 l = a == L_FIRST ? L_FIRST : (a == L_FIXED ? L_FIXED : L_OTHER);
        lv.lab[me] = l;
        if (l == L_FIRST) store_dig(lv.dig, me, load_dig(lv.dig, c0));
        return;
    }
    u8 b = lv.lab[c1];
    bool ins = false;
    if (a == L_FIRST && b == L_FIRST) {
        dig128 d = node_digest(algo, load_dig(lv.dig, c0), load_dig(lv.dig, c1));
        store_dig(lv.dig, me, d);
        lv.lab[me] = L_FIRST;
        table_insert(t, d, version, node_id(level_k1, p), false, ins);
    } else if (a == L_FIXED && b == L_FIXED) {
        lv.lab[me] = L_FIXED;
    } else {
        lv.lab[me] = L_OTHER;
    }
    count_inserts(t, ins);
}

// Stage 2, level k -> k+1: SHIFT subtrees; marks region roots among level k.
// root_at[first chunk of a root] = its level + 1. Two whole, identical SHIFT
// children whose parent is not in the record make a repeat node: the parent
// keeps their source, a smaller node (src/dedup/tree.rs, the same rule).
extern "C" __global__ void stage2(Levels lv, u64 off_k, u64 len_k, u64 off_k1, u64 len_k1, u32 level_k, Table t,
                                  int algo, u8* root_at, u64 n) {
    u64 p = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (p >= len_k1) return;
    u64 me = off_k1 + p;
    if (lv.lab[me] != L_OTHER) return;  // FIRST or FIXED: children merged, no roots
    u64 c0 = off_k + 2 * p, c1 = c0 + 1;
    u8 a = lv.lab[c0];
    if (2 * p + 1 >= len_k) {  // carried: same label and source as its child
        lv.lab[me] = a;
        if (a == L_SHIFT) {
            store_dig(lv.dig, me, load_dig(lv.dig, c0));
            lv.sver[me] = lv.sver[c0];
            lv.snode[me] = lv.snode[c0];
        }
        return;
    }
    u8 b = lv.lab[c1];
    if (a == L_SHIFT && b == L_SHIFT) {
        dig128 d = node_digest(algo, load_dig(lv.dig, c0), load_dig(lv.dig, c1));
        long long s = table_find(t, d);
        if (s >= 0) {
            lv.lab[me] = L_SHIFT;
            store_dig(lv.dig, me, d);
            lv.sver[me] = t.slots[s].ver;
            lv.snode[me] = t.slots[s].node;
            return;
        }
        dig128 dl = load_dig(lv.dig, c0), dr = load_dig(lv.dig, c1);
        if (dl.lo == dr.lo && dl.hi == dr.hi && lv.sver[c0] == lv.sver[c1] && lv.snode[c0] == lv.snode[c1] &&
            ((2 * p + 2) << level_k) <= n && (lv.snode[c0] >> INDEX_BITS) <= MAX_REPEAT_LEVEL) {
            lv.lab[me] = L_SHIFT;
            store_dig(lv.dig, me, d);
            lv.sver[me] = lv.sver[c0];
            lv.snode[me] = lv.snode[c0];
            return;
        }
    }
    lv.lab[me] = L_MIXED;
    if (a == L_FIRST || a == L_SHIFT) root_at[(2 * p) << level_k] = (u8)(level_k + 1);
    if (b == L_FIRST || b == L_SHIFT) root_at[(2 * p + 1) << level_k] = (u8)(level_k + 1);
}

extern "C" __global__ void top_root(Levels lv, u64 off_top, u32 top, u8* root_at) {
    u8 l = lv.lab[off_top];
    if (l == L_FIRST || l == L_SHIFT) root_at[0] = (u8)(top + 1);
}
