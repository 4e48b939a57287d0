// dckpt GPU kernels, second part (after digests.cuh and dedup.cu, whose
// definitions it uses): the region roots become the diff file's tables and
// data, the block digests seal it, and table_locate rebuilds the record.

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

// The 96-byte header (src/format/diff_file/header.rs, DiffHeader::encode).
extern "C" __global__ void write_header(const u64* counters, u8* out, u32 method, u32 hash, u32 flags, u32 rank,
                                        u32 cs, u64 version, u64 data_len, u64 bitmap_len, int write_first_table) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const char magic[8] = {'D', 'C', 'K', 'P', 'T', 'D', 'I', 'F'};
    for (int i = 0; i < 8; i++) out[i] = (u8)magic[i];
    out[8] = counters[C_REPEATS] ? 3 : 2;  // format version (FORMAT_VERSION(_REPEATS) in diff_file/header.rs)
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
