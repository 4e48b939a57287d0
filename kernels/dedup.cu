// dckpt GPU de-duplication kernels (NVRTC; digests.cuh is prepended by the host).
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
// The output is byte-identical to the CPU engine's (src/format/diff_file.rs)
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
// fits a repeat entry's 24 bits (MAX_PERIOD in src/format/diff_file.rs).
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

// ------------------------------------------------------------------ runs ----

// Per root (in chunk order): kind, count, source; per-root flags for scans.
// counters[1] = number of roots. level_off: device array of level offsets.
extern "C" __global__ void root_info(u64* counters, const u64* roots, const u8* root_at, Levels lv,
                                     const u64* level_off, u64 n, u32 cs, u64 data_len, u8* kind, u64* count,
                                     u64* src_ver, u64* src_start, u64* first_flag, u64* bytes) {
    u64 m = counters[1];
    for (u64 r = blockIdx.x * (u64)blockDim.x + threadIdx.x; r < m; r += (u64)gridDim.x * blockDim.x) {
        u64 start = roots[r];
        u32 level = (u32)root_at[start] - 1;
        u64 node = level_off[level] + (start >> level);
        u64 end = start + (1ull << level);
        if (end > n) end = n;
        u8 k = lv.lab[node];
        kind[r] = k;
        count[r] = end - start;
        if (k == L_SHIFT) {
            // The owner (+1, 0 = this rank) rides in the high word, so runs
            // coalesce only within one rank's file.
            u64 snode = lv.snode[node];
            src_ver[r] = (u64)lv.sver[node] | ((u64)node_owner_plus1(snode) << 32);
            src_start[r] = node_first_chunk(snode);
            u32 src_level = (u32)(snode >> INDEX_BITS);
            if (end - start > (1ull << src_level)) {  // a repeat node (dedup/tree.rs: repeat_period)
                src_ver[r] |= SRC_REPEAT | ((u64)src_level << SRC_PERIOD_SHIFT);
                counters[C_REPEATS] = 1;
            }
        } else {
            src_ver[r] = 0;
            src_start[r] = 0;
        }
        u64 b0 = start * cs, b1 = end * cs;
        if (b1 > data_len) b1 = data_len;
        bytes[r] = k == L_FIRST ? b1 - b0 : 0;
        first_flag[r] = k == L_FIRST;
    }
}

// Marks run heads (a root that does not extend the previous root's run; a
// repeat node never does, nor is it extended: one entry of its own).
extern "C" __global__ void run_heads(const u64* counters, const u64* roots, const u8* kind, const u64* count,
                                     const u64* src_ver, const u64* src_start, int coalesce, u64* first_head,
                                     u64* shift_head) {
    u64 m = counters[1];
    for (u64 r = blockIdx.x * (u64)blockDim.x + threadIdx.x; r < m; r += (u64)gridDim.x * blockDim.x) {
        bool head = true;
        if (coalesce && r > 0 && roots[r - 1] + count[r - 1] == roots[r] && kind[r - 1] == kind[r]) {
            if (kind[r] == L_FIRST) head = false;
            else if (src_ver[r - 1] == src_ver[r] && !(src_ver[r] & SRC_REPEAT) &&
                     src_start[r - 1] + count[r - 1] == src_start[r])
                head = false;
        }
        first_head[r] = head && kind[r] == L_FIRST;
        shift_head[r] = head && kind[r] == L_SHIFT;
    }
}

__device__ __forceinline__ void put64(u8* out, u64 off, u64 v) { *(u64*)(out + off) = v; }
__device__ __forceinline__ void put32(u8* out, u64 off, u32 v) { *(u32*)(out + off) = v; }

// counters: [0] changed, [1] roots, [2] F (FIRST runs), [3] S (SHIFT runs), [4] D (data bytes).
// first_id/shift_id: exclusive scans of the head flags; run_end: scratch per run.
extern "C" __global__ void emit_runs(const u64* counters, const u64* roots, const u8* kind, const u64* count,
                                     const u64* src_ver, const u64* src_start, const u64* first_head,
                                     const u64* shift_head, const u64* first_id, const u64* shift_id, u64* run_end,
                                     u8* out, int write_first_table, u32 rank) {
    u64 m = counters[1];
    u64 F = write_first_table ? counters[2] : 0;
    u64 shift_base = 96 + 16 * F;
    for (u64 r = blockIdx.x * (u64)blockDim.x + threadIdx.x; r < m; r += (u64)gridDim.x * blockDim.x) {
        bool last = r + 1 == m || first_head[r + 1] || shift_head[r + 1];
        u64 end = roots[r] + count[r];
        if (kind[r] == L_FIRST) {
            u64 j = first_id[r] - (first_head[r] ? 0 : 1);
            if (first_head[r] && write_first_table) put64(out, 96 + 16 * j, roots[r]);
            if (last) run_end[j] = end;
        } else {
            u64 j = shift_id[r] - (shift_head[r] ? 0 : 1);
            if (shift_head[r]) {
                u64 o = shift_base + 40 * j;
                put64(out, o, roots[r]);
                put64(out, o + 16, src_start[r]);
                u64 sv = src_ver[r];
                u32 owner1 = (u32)((sv >> 32) & SRC_OWNER_MASK);
                put64(out, o + 24, sv & 0xffffffffull);
                put32(out, o + 32, owner1 ? owner1 - 1 : rank);
                // A repeat node: flag bit 1, the period in bits 8..31 (format v3).
                u32 period = 1u << ((sv >> SRC_PERIOD_SHIFT) & 31);
                put32(out, o + 36, (sv & SRC_REPEAT) ? (2u | (period << 8)) : 0u);
            }
            if (last) run_end[counters[2] + j] = end;  // SHIFT ends after the FIRST ends
        }
    }
}

// Writes the counts: FIRST count = run_end - start.
extern "C" __global__ void finish_runs(const u64* counters, const u64* run_end, u8* out, int write_first_table) {
    u64 F = counters[2], S = counters[3];
    u64 FT = write_first_table ? F : 0;
    for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < F + S; j += (u64)gridDim.x * blockDim.x) {
        if (j < F) {
            if (write_first_table) {
                u64 o = 96 + 16 * j;
                put64(out, o + 8, run_end[j] - *(u64*)(out + o));
            }
        } else {
            u64 o = 96 + 16 * FT + 40 * (j - F);
            put64(out, o + 8, run_end[j] - *(u64*)(out + o));
        }
    }
}

// Compacts FIRST roots: their start chunks and data offsets, for the gather.
extern "C" __global__ void first_roots(const u64* counters, const u64* roots, const u8* kind, const u64* bytes_off,
                                       const u64* first_rank, u64* fr_start, u64* fr_off) {
    u64 m = counters[1];
    for (u64 r = blockIdx.x * (u64)blockDim.x + threadIdx.x; r < m; r += (u64)gridDim.x * blockDim.x) {
        if (kind[r] == L_FIRST) {
            u64 j = first_rank[r];
            fr_start[j] = roots[r];
            fr_off[j] = bytes_off[r];
        }
    }
}

// Copies the FIRST bytes to out[data_base ..]: each thread one 16-byte unit of
// the output, finding its root by binary search (warps stay coalesced).
// counters[5] = number of FIRST roots; counters[4] = D.
extern "C" __global__ void gather(const u64* counters, const u64* fr_start, const u64* fr_off, const u8* data,
                                  u32 cs, u8* out, int write_first_table, u64 bitmap_len) {
    u64 nfr = counters[5], D = counters[4];
    u64 data_base = 96 + (write_first_table ? 16 * counters[2] : 0) + 40 * counters[3] + bitmap_len;
    u64 units = (D + 15) / 16;
    u8* dst = out + data_base;
    for (u64 u = blockIdx.x * (u64)blockDim.x + threadIdx.x; u < units; u += (u64)gridDim.x * blockDim.x) {
        u64 o = u * 16;
        u64 lo = 0, hi = nfr;  // last j with fr_off[j] <= o
        while (hi - lo > 1) {
            u64 mid = (lo + hi) / 2;
            if (fr_off[mid] <= o) lo = mid; else hi = mid;
        }
        u64 j = lo;
        u64 root_end = j + 1 < nfr ? fr_off[j + 1] : D;
        u64 src = fr_start[j] * cs + (o - fr_off[j]);
        u64 len = D - o < 16 ? D - o : 16;
        if (o + len <= root_end && ((src | (data_base + o)) & 7ull) == 0 && len == 16) {
            const u64* s = (const u64*)(data + src);
            u64* d = (u64*)(dst + o);
            d[0] = s[0];
            d[1] = s[1];
        } else {
            for (u64 b = 0; b < len; b++) {
                u64 ob = o + b;
                while (j + 1 < nfr && fr_off[j + 1] <= ob) j++;
                dst[ob] = data[fr_start[j] * cs + (ob - fr_off[j])];
            }
        }
    }
}

// The 96-byte header (src/format/diff_file.rs, DiffHeader::encode).
extern "C" __global__ void write_header(const u64* counters, u8* out, u32 method, u32 hash, u32 flags, u32 rank,
                                        u32 cs, u64 version, u64 data_len, u64 bitmap_len, int write_first_table) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const char magic[8] = {'D', 'C', 'K', 'P', 'T', 'D', 'I', 'F'};
    for (int i = 0; i < 8; i++) out[i] = (u8)magic[i];
    out[8] = counters[C_REPEATS] ? 3 : 2;  // format version (FORMAT_VERSION(_REPEATS) in diff_file.rs)
    out[9] = 0;
    out[10] = (u8)method;
    out[11] = (u8)hash;
    put32(out, 12, flags);
    put32(out, 16, rank);
    put32(out, 20, cs);
    put64(out, 24, version);
    put64(out, 32, data_len);
    put64(out, 40, write_first_table ? counters[2] : 0);
    put64(out, 48, counters[3]);
    put64(out, 56, bitmap_len);
    put64(out, 64, counters[4]);
    put32(out, 72, 65536u);
    for (int i = 76; i < 96; i++) out[i] = 0;
}

// Basic: the bitmap is the changed-leaf ballots, LSB first.
extern "C" __global__ void write_bitmap(const u32* ballots, u64 bitmap_len, u8* out) {
    for (u64 b = blockIdx.x * (u64)blockDim.x + threadIdx.x; b < bitmap_len; b += (u64)gridDim.x * blockDim.x) {
        out[96 + b] = (u8)(ballots[b >> 2] >> (8 * (b & 3)));
    }
}

// After a commit: the changed leaves' digests become the previous version's.
extern "C" __global__ void commit_leaves(const u64* counters, const u64* idx, const u64* dig, u64* prev) {
    u64 m = counters[0];
    for (u64 k = blockIdx.x * (u64)blockDim.x + threadIdx.x; k < m; k += (u64)gridDim.x * blockDim.x) {
        u64 i = idx[k];
        prev[2 * i] = dig[2 * i];
        prev[2 * i + 1] = dig[2 * i + 1];
    }
}

// The collective step's region digests, read off the tree this version just
// built: out[3i, 3i + 1] = dig[idx[i]] (a node's index over all levels) and
// out[3i + 2] = 1, or 0 for a node not labelled FIRST, which has no digest of
// this version's bytes (the host then hashes the region itself, or leaves it
// out of the offer).
extern "C" __global__ void gather_digests(const u64* dig, const u8* lab, const u64* idx, u64 count, u64* out) {
    for (u64 k = blockIdx.x * (u64)blockDim.x + threadIdx.x; k < count; k += (u64)gridDim.x * blockDim.x) {
        u64 i = idx[k];
        out[3 * k] = dig[2 * i];
        out[3 * k + 1] = dig[2 * i + 1];
        out[3 * k + 2] = lab[i] == L_FIRST ? 1ull : 0ull;
    }
}

// The collective step's region digests hashed from the regions' bytes, where
// no tree of this version holds them (a version stored whole, or a node the
// tree did not label FIRST): region r is len[r] bytes at device address
// addr[r], cut into chunks of cs bytes (the last may be short), and its
// digest is the Merkle root over them exactly as the host's subtree_digest
// builds it: level by level, pairs (2i, 2i + 1), an odd last node carried
// up unchanged. One warp per region: the lanes hash 32 consecutive chunks
// and fold them into one node (a group: aligned, so its pairs are the
// tree's); lane 0 merges groups like a binary counter (equal heights) and
// folds what is left right to left, which gives the carried tree.
// Lane 0's stack lives in shared memory (one per warp of the 256-thread
// blocks it is launched with), not in every lane's local memory.
#define RD_STACK 44
#define RD_WARPS 8
extern "C" __global__ void __launch_bounds__(256)
    region_digests(const u64* addr, const u64* len, u64 count, u32 cs, int algo, u64* out) {
    __shared__ dig128 stacks[RD_WARPS][RD_STACK];
    __shared__ u8 heights[RD_WARPS][RD_STACK];
    const u32 lane = threadIdx.x & 31u;
    dig128* stack = stacks[threadIdx.x >> 5];
    u8* height = heights[threadIdx.x >> 5];
    const u64 warps = (u64)gridDim.x * (blockDim.x >> 5);
    for (u64 r = (blockIdx.x * (u64)blockDim.x + threadIdx.x) >> 5; r < count; r += warps) {
        const u8* p = (const u8*)addr[r];
        const u64 bytes = len[r];
        const u64 m = bytes == 0 ? 1 : (bytes + cs - 1) / cs;
        int top = 0;
        for (u64 g = 0; g < m; g += 32) {
            const u64 in_group = m - g < 32 ? m - g : 32;
            dig128 d;
            d.lo = 0;
            d.hi = 0;
            if (lane < in_group) {
                const u64 off = (g + lane) * cs;
                const u64 rem = bytes - off;
                d = leaf_digest(algo, p + off, rem < cs ? (u32)rem : cs, false);
            }
            for (u32 s = 1; s < 32; s <<= 1) {
                dig128 q;
                q.lo = __shfl_down_sync(0xffffffffu, d.lo, s);
                q.hi = __shfl_down_sync(0xffffffffu, d.hi, s);
                if ((lane & (2 * s - 1)) == 0 && lane + s < in_group) d = node_digest(algo, d, q);
            }
            if (lane == 0 && top < RD_STACK) {
                u8 h = 5;
                while (top > 0 && height[top - 1] == h) {
                    d = node_digest(algo, stack[top - 1], d);
                    top--;
                    h++;
                }
                stack[top] = d;
                height[top] = h;
                top++;
            }
        }
        if (lane == 0) {
            dig128 d = stack[top - 1];
            for (int i = top - 2; i >= 0; i--) d = node_digest(algo, stack[i], d);
            out[2 * r] = d.lo;
            out[2 * r + 1] = d.hi;
        }
        __syncwarp();
    }
}

// ------------------------------------------------------- block digests ----
// The integrity digests of a diff file's data: BLAKE3-256 of each 64 KiB
// block (the last may be short), written as 32 bytes each. One warp per
// block: each lane compresses chunks lane and lane + 32 into their chaining
// values (shared memory), then lane 0 merges them as BLAKE3's tree does
// (left-balanced: the same stack merge as b3_hash). Identical to the host's
// `blake3::hash` of the block (format::finish_body); tests/gpu.rs checks the
// files byte for byte.
#define BD_WARPS 4
// Digests land right after the data, at any alignment: byte stores.
__device__ __forceinline__ void put32_bytes(u8* out, u32 v) {
    for (int i = 0; i < 4; i++) out[i] = (u8)(v >> (8 * i));
}

extern "C" __global__ void block_digests(const u8* data, u64 len, u8* out) {
    __shared__ u32 cvs[BD_WARPS][64][8];
    const u32 lane = threadIdx.x & 31u, w = threadIdx.x >> 5;
    const u64 nblocks = (len + 65535) / 65536;
    for (u64 b = blockIdx.x * (u64)BD_WARPS + w; b < nblocks; b += (u64)gridDim.x * BD_WARPS) {
        const u8* p = data + b * 65536;
        const u32 blen = (u32)(len - b * 65536 < 65536 ? len - b * 65536 : 65536);
        const u32 nch = blen == 0 ? 1 : (blen + 1023) / 1024;
        u32 cv[8], last[16], llen, lflags, o[16];
        if (nch == 1) {
            if (lane == 0) {
                b3_chunk(B3_IV, p, blen, 0, 0u, cv, last, llen, lflags);
                b3_compress(cv, last, 0, llen, lflags | B3_ROOT, o);
                for (int i = 0; i < 8; i++) put32_bytes(out + 32 * b + 4 * i, o[i]);
            }
            continue;
        }
        for (u32 c = lane; c < nch; c += 32) {
            const u32 clen = c + 1 < nch ? 1024u : blen - 1024u * c;
            b3_chunk(B3_IV, p + 1024u * c, clen, c, 0u, cv, last, llen, lflags);
            b3_compress(cv, last, c, llen, lflags, o);
            for (int i = 0; i < 8; i++) cvs[w][c][i] = o[i];
        }
        __syncwarp();
        if (lane == 0) {
            u32 stack[7][8], pb[16];
            int depth = 0;
            for (u32 c = 0; c + 1 < nch; c++) {
                u32 ccv[8];
                for (int i = 0; i < 8; i++) ccv[i] = cvs[w][c][i];
                for (u64 total = (u64)c + 1; (total & 1) == 0; total >>= 1) {
                    for (int i = 0; i < 8; i++) {
                        pb[i] = stack[depth - 1][i];
                        pb[i + 8] = ccv[i];
                    }
                    b3_compress(B3_IV, pb, 0, 64, B3_PARENT, o);
                    for (int i = 0; i < 8; i++) ccv[i] = o[i];
                    depth--;
                }
                for (int i = 0; i < 8; i++) stack[depth][i] = ccv[i];
                depth++;
            }
            u32 right[8];
            for (int i = 0; i < 8; i++) right[i] = cvs[w][nch - 1][i];
            while (depth > 0) {
                for (int i = 0; i < 8; i++) {
                    pb[i] = stack[depth - 1][i];
                    pb[i + 8] = right[i];
                }
                b3_compress(B3_IV, pb, 0, 64, B3_PARENT | (depth == 1 ? B3_ROOT : 0u), o);
                for (int i = 0; i < 8; i++) right[i] = o[i];
                depth--;
            }
            for (int i = 0; i < 8; i++) put32_bytes(out + 32 * b + 4 * i, right[i]);
        }
        __syncwarp();
    }
}

// ------------------------------------------------------------- rebuild ----
// Reopening a store (engine::rebuild): the latest version was checkpointed
// as a baseline, so every live entry of version `latest` names a node of it.
// Each is moved to where the node's bytes are stored — `runs` map this
// version's chunks [dst, dst + count) to chunks [src, ...) of (rank, ver),
// sorted by dst, RUN_WORDS words each: dst, count, src, owner_chunks,
// rank | ver << 32 — or dropped when they are not contiguous in one run at an
// aligned node of the same shape in the owner's tree (`owner_chunks` leaves),
// exactly as `locate` in src/engine/rebuild.rs.
extern "C" __global__ void table_locate(Table t, u32 latest, u32 me, u64 n, u64 nruns, const u64* runs) {
    for (u64 s = blockIdx.x * (u64)blockDim.x + threadIdx.x; s <= t.mask; s += (u64)gridDim.x * blockDim.x) {
        Slot* sl = &t.slots[s];
        if (sl->flags != SLOT_FULL || sl->ver != latest) continue;
        const u64 raw = sl->node;
        const u32 k = (u32)(raw >> INDEX_BITS);
        const u64 i = raw & ((1ull << INDEX_BITS) - 1);
        const u64 a = i << k;
        const u64 b = ((i + 1) << k) < n ? ((i + 1) << k) : n;
        u64 lo = 0, hi = nruns;  // first run with dst + count > a
        while (lo < hi) {
            u64 mid = (lo + hi) / 2;
            if (runs[RUN_WORDS * mid] + runs[RUN_WORDS * mid + 1] <= a) lo = mid + 1; else hi = mid;
        }
        const u64* r = &runs[RUN_WORDS * (lo < nruns ? lo : 0)];
        bool keep = lo < nruns && r[0] <= a && b <= r[0] + r[1];
        u64 first = 0, ni = 0;
        if (keep) {
            first = r[2] + (a - r[0]);
            keep = (first & ((1ull << k) - 1)) == 0;
        }
        if (keep) {
            const u64 no = r[3];
            const u32 levels = 64 - __clzll(no - 1) + 1;
            ni = first >> k;
            const u64 end = ((ni + 1) << k) < no ? ((ni + 1) << k) : no;
            keep = k < levels && ni < ((no + (1ull << k) - 1) >> k) && end - first == b - a && ni < (1ull << 40);
        }
        if (keep) {
            const u32 owner = (u32)r[4];
            sl->node = ((u64)k << INDEX_BITS) | ni | (owner != me ? ((u64)owner + 1) << 40 : 0ull);
            sl->ver = (u32)(r[4] >> 32);
        } else {
            sl->flags = SLOT_DEAD;
            atomicAdd(t.count, (u64)-1ll);
        }
    }
}
