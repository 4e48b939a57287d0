// dckpt chunk and node digests on the GPU, bit-identical to src/hash/.
//
// Plain C++17 for NVRTC (no headers). Defining DCKPT_HOST_TEST compiles the
// same code as host C++ so kernels/tests/check_digests.sh can compare it
// with the Rust implementation on this machine, without a GPU.
//
// A digest is {lo, hi}: the Rust u128 value is lo | hi << 64, its canonical
// bytes are lo then hi, little-endian.

#ifdef DCKPT_HOST_TEST
#define __device__
#define __forceinline__ inline
#define DCKPT_CONST static const
#else
#define DCKPT_CONST __device__ __constant__
#endif

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

struct dig128 {
    u64 lo;
    u64 hi;
};

// ------------------------------------------------------------ helpers ----

__device__ __forceinline__ u64 rotl64(u64 x, int r) { return (x << r) | (x >> (64 - r)); }
__device__ __forceinline__ u32 rotr32(u32 x, int r) { return (x >> r) | (x << (32 - r)); }

__device__ __forceinline__ u64 mulhi64(u64 a, u64 b) {
#ifdef DCKPT_HOST_TEST
    return (u64)(((unsigned __int128)a * b) >> 64);
#else
    return __umul64hi(a, b);
#endif
}

__device__ __forceinline__ u64 bswap64(u64 x) {
    x = ((x & 0x00ff00ff00ff00ffull) << 8) | ((x >> 8) & 0x00ff00ff00ff00ffull);
    x = ((x & 0x0000ffff0000ffffull) << 16) | ((x >> 16) & 0x0000ffff0000ffffull);
    return (x << 32) | (x >> 32);
}

__device__ __forceinline__ u32 bswap32(u32 x) {
    return (x >> 24) | ((x >> 8) & 0xff00u) | ((x << 8) & 0xff0000u) | (x << 24);
}

// Little-endian loads from any address (aligned addresses take one load).
__device__ __forceinline__ u64 ld64(const u8* p) {
    if ((((unsigned long long)p) & 7ull) == 0) return *(const u64*)p;
    u64 v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

__device__ __forceinline__ u32 ld32(const u8* p) {
    if ((((unsigned long long)p) & 3ull) == 0) return *(const u32*)p;
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// ------------------------------------------------------------ Murmur3 ----
// MurmurHash3_x64_128 (Austin Appleby, public domain), as src/hash/murmur3.rs.

#define M3_C1 0x87c37b91114253d5ull
#define M3_C2 0x4cf5ad432745937full

__device__ __forceinline__ u64 m3_fmix(u64 k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    return k ^ (k >> 33);
}

__device__ __forceinline__ void m3_block(u64& h1, u64& h2, u64 k1, u64 k2) {
    k1 *= M3_C1;
    k1 = rotl64(k1, 31);
    k1 *= M3_C2;
    h1 ^= k1;
    h1 = rotl64(h1, 27);
    h1 += h2;
    h1 = h1 * 5 + 0x52dce729;
    k2 *= M3_C2;
    k2 = rotl64(k2, 33);
    k2 *= M3_C1;
    h2 ^= k2;
    h2 = rotl64(h2, 31);
    h2 += h1;
    h2 = h2 * 5 + 0x38495ab5;
}

__device__ __forceinline__ dig128 m3_tail(u64 h1, u64 h2, const u8* tail, u32 rem, u32 len) {
    u64 k1 = 0, k2 = 0;
    for (int i = (int)rem - 1; i >= 8; i--) k2 = (k2 << 8) | tail[i];
    for (int i = (rem < 8 ? (int)rem : 8) - 1; i >= 0; i--) k1 = (k1 << 8) | tail[i];
    if (rem > 8) {
        k2 *= M3_C2;
        k2 = rotl64(k2, 33);
        k2 *= M3_C1;
        h2 ^= k2;
    }
    if (rem > 0) {
        k1 *= M3_C1;
        k1 = rotl64(k1, 31);
        k1 *= M3_C2;
        h1 ^= k1;
    }
    h1 ^= len;
    h2 ^= len;
    h1 += h2;
    h2 += h1;
    h1 = m3_fmix(h1);
    h2 = m3_fmix(h2);
    h1 += h2;
    h2 += h1;
    dig128 d;
    d.lo = h1;
    d.hi = h2;
    return d;
}

__device__ dig128 murmur3_x64_128(const u8* data, u32 len, u32 seed) {
    u64 h1 = seed, h2 = seed;
    u32 nblocks = len / 16;
    for (u32 b = 0; b < nblocks; b++) m3_block(h1, h2, ld64(data + 16 * b), ld64(data + 16 * b + 8));
    return m3_tail(h1, h2, data + 16 * nblocks, len & 15u, len);
}

// `data` must be 16-byte aligned: whole blocks load as one 16-byte access.
struct alignas(16) u64x2 {
    u64 x, y;
};

__device__ dig128 murmur3_x64_128_aligned16(const u8* data, u32 len, u32 seed) {
    u64 h1 = seed, h2 = seed;
    u32 nblocks = len / 16;
    const u64x2* blocks = (const u64x2*)data;
#ifndef DCKPT_HOST_TEST
#pragma unroll 4
#endif
    for (u32 b = 0; b < nblocks; b++) {
        u64x2 v = blocks[b];
        m3_block(h1, h2, v.x, v.y);
    }
    return m3_tail(h1, h2, data + 16 * nblocks, len & 15u, len);
}

// -------------------------------------------------------------- XXH3 ----
// XXH3-128 (Yann Collet, BSD-2), following the xxhash-rust crate's scalar
// code path. Inputs longer than 240 bytes use the default secret, so `seed`
// must be 0 for them (dckpt hashes leaves with seed 0 and 32-byte inner nodes
// with seed 1).

#define XP32_1 0x9E3779B1ull
#define XP32_2 0x85EBCA77ull
#define XP32_3 0xC2B2AE3Dull
#define XP64_1 0x9E3779B185EBCA87ull
#define XP64_2 0xC2B2AE3D27D4EB4Full
#define XP64_3 0x165667B19E3779F9ull
#define XP64_4 0x85EBCA77C2B2AE63ull
#define XP64_5 0x27D4EB2F165667C5ull

DCKPT_CONST u8 XXH3_SECRET[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

__device__ __forceinline__ u64 xs_secret64(int off) {
    u64 v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | XXH3_SECRET[off + i];
    return v;
}

__device__ __forceinline__ u32 xs_secret32(int off) {
    return (u32)XXH3_SECRET[off] | ((u32)XXH3_SECRET[off + 1] << 8) | ((u32)XXH3_SECRET[off + 2] << 16) |
           ((u32)XXH3_SECRET[off + 3] << 24);
}

__device__ __forceinline__ u64 xx_fold(u64 a, u64 b) { return (a * b) ^ mulhi64(a, b); }

__device__ __forceinline__ u64 xx3_avalanche(u64 h) {
    h ^= h >> 37;
    h *= 0x165667919E3779F9ull;
    return h ^ (h >> 32);
}

__device__ __forceinline__ u64 xx64_avalanche(u64 h) {
    h ^= h >> 33;
    h *= XP64_2;
    h ^= h >> 29;
    h *= XP64_3;
    return h ^ (h >> 32);
}

__device__ __forceinline__ u64 xx_mix16(const u8* in, int soff, u64 seed) {
    u64 lo = ld64(in) ^ (xs_secret64(soff) + seed);
    u64 hi = ld64(in + 8) ^ (xs_secret64(soff + 8) - seed);
    return xx_fold(lo, hi);
}

__device__ __forceinline__ void xx_mix32(u64& lo, u64& hi, const u8* in1, const u8* in2, int soff, u64 seed) {
    lo += xx_mix16(in1, soff, seed);
    lo ^= ld64(in2) + ld64(in2 + 8);
    hi += xx_mix16(in2, soff + 16, seed);
    hi ^= ld64(in1) + ld64(in1 + 8);
}

__device__ __forceinline__ dig128 xx_pair(u64 lo, u64 hi) {
    dig128 d;
    d.lo = lo;
    d.hi = hi;
    return d;
}

__device__ dig128 xxh3_128_short(const u8* in, u32 len, u64 seed) {
    if (len > 8) {
        u64 flip_lo = (xs_secret64(32) ^ xs_secret64(40)) - seed;
        u64 flip_hi = (xs_secret64(48) ^ xs_secret64(56)) + seed;
        u64 in_lo = ld64(in);
        u64 in_hi = ld64(in + len - 8);
        u64 a = in_lo ^ in_hi ^ flip_lo;
        u64 mul_low = a * XP64_1, mul_high = mulhi64(a, XP64_1);
        mul_low += ((u64)len - 1) << 54;
        in_hi ^= flip_hi;
        mul_high += in_hi + (u64)(u32)in_hi * (XP32_2 - 1);
        mul_low ^= bswap64(mul_high);
        u64 r_lo = mul_low * XP64_2;
        u64 r_hi = mulhi64(mul_low, XP64_2) + mul_high * XP64_2;
        return xx_pair(xx3_avalanche(r_lo), xx3_avalanche(r_hi));
    }
    if (len >= 4) {
        seed ^= (u64)bswap32((u32)seed) << 32;
        u64 in64 = (u64)ld32(in) + ((u64)ld32(in + len - 4) << 32);
        u64 flip = (xs_secret64(16) ^ xs_secret64(24)) + seed;
        u64 keyed = in64 ^ flip;
        u64 m = XP64_1 + ((u64)len << 2);
        u64 lo = keyed * m, hi = mulhi64(keyed, m);
        hi += lo << 1;
        lo ^= hi >> 3;
        lo ^= lo >> 35;
        lo *= 0x9FB21C651E98DF25ull;
        lo ^= lo >> 28;
        return xx_pair(lo, xx3_avalanche(hi));
    }
    if (len > 0) {
        u32 c1 = in[0], c2 = in[len >> 1], c3 = in[len - 1];
        u32 in_lo = (c1 << 16) | (c2 << 24) | c3 | (len << 8);
        u32 sw = bswap32(in_lo);
        u32 in_hi = (sw << 13) | (sw >> 19);
        u64 flip_lo = ((u64)xs_secret32(0) ^ (u64)xs_secret32(4)) + seed;
        u64 flip_hi = ((u64)xs_secret32(8) ^ (u64)xs_secret32(12)) - seed;
        return xx_pair(xx64_avalanche((u64)in_lo ^ flip_lo), xx64_avalanche((u64)in_hi ^ flip_hi));
    }
    u64 flip_lo = xs_secret64(64) ^ xs_secret64(72);
    u64 flip_hi = xs_secret64(80) ^ xs_secret64(88);
    return xx_pair(xx64_avalanche(seed ^ flip_lo), xx64_avalanche(seed ^ flip_hi));
}

__device__ __forceinline__ dig128 xx_finish_mid(u64 lo, u64 hi, u32 len, u64 seed) {
    u64 a = xx3_avalanche(lo + hi);
    u64 b = 0 - xx3_avalanche(lo * XP64_1 + hi * XP64_4 + ((u64)len - seed) * XP64_2);
    return xx_pair(a, b);
}

__device__ dig128 xxh3_128_mid(const u8* in, u32 len, u64 seed) {
    u64 lo = (u64)len * XP64_1, hi = 0;
    if (len <= 128) {
        if (len > 32) {
            if (len > 64) {
                if (len > 96) xx_mix32(lo, hi, in + 48, in + len - 64, 96, seed);
                xx_mix32(lo, hi, in + 32, in + len - 48, 64, seed);
            }
            xx_mix32(lo, hi, in + 16, in + len - 32, 32, seed);
        }
        xx_mix32(lo, hi, in, in + len - 16, 0, seed);
        return xx_finish_mid(lo, hi, len, seed);
    }
    u32 rounds = len / 32;
    for (u32 i = 0; i < 4; i++) xx_mix32(lo, hi, in + 32 * i, in + 32 * i + 16, 32 * i, seed);
    lo = xx3_avalanche(lo);
    hi = xx3_avalanche(hi);
    for (u32 i = 4; i < rounds; i++) xx_mix32(lo, hi, in + 32 * i, in + 32 * i + 16, 3 + 32 * (i - 4), seed);
    xx_mix32(lo, hi, in + len - 16, in + len - 32, 136 - 17 - 16, 0 - seed);
    return xx_finish_mid(lo, hi, len, seed);
}

__device__ __forceinline__ void xx_accumulate(u64* acc, const u8* in, int soff) {
    for (int i = 0; i < 8; i++) {
        u64 v = ld64(in + 8 * i);
        u64 k = v ^ xs_secret64(soff + 8 * i);
        acc[i ^ 1] += v;
        acc[i] += (k & 0xffffffffull) * (k >> 32);
    }
}

__device__ __forceinline__ void xx_scramble(u64* acc, int soff) {
    for (int i = 0; i < 8; i++) {
        u64 a = acc[i];
        a ^= a >> 47;
        a ^= xs_secret64(soff + 8 * i);
        acc[i] = a * XP32_1;
    }
}

__device__ __forceinline__ u64 xx_merge(const u64* acc, int soff, u64 start) {
    u64 r = start;
    for (int i = 0; i < 4; i++) r += xx_fold(acc[2 * i] ^ xs_secret64(soff + 16 * i), acc[2 * i + 1] ^ xs_secret64(soff + 16 * i + 8));
    return xx3_avalanche(r);
}

__device__ dig128 xxh3_128_long(const u8* in, u32 len) {
    u64 acc[8] = {XP32_3, XP64_1, XP64_2, XP64_3, XP64_4, XP32_2, XP64_5, XP32_1};
    const u32 stripes_per_block = (192 - 64) / 8;  // 16
    const u32 block_len = 64 * stripes_per_block;   // 1024
    u32 nb_blocks = (len - 1) / block_len;
    for (u32 b = 0; b < nb_blocks; b++) {
        for (u32 s = 0; s < stripes_per_block; s++) xx_accumulate(acc, in + b * block_len + 64 * s, 8 * s);
        xx_scramble(acc, 192 - 64);
    }
    u32 nb_stripes = ((len - 1) - block_len * nb_blocks) / 64;
    for (u32 s = 0; s < nb_stripes; s++) xx_accumulate(acc, in + nb_blocks * block_len + 64 * s, 8 * s);
    xx_accumulate(acc, in + len - 64, 192 - 64 - 7);
    u64 lo = xx_merge(acc, 11, (u64)len * XP64_1);
    u64 hi = xx_merge(acc, 192 - 64 - 11, ~((u64)len * XP64_2));
    return xx_pair(lo, hi);
}

__device__ dig128 xxh3_128(const u8* in, u32 len, u64 seed) {
    if (len <= 16) return xxh3_128_short(in, len, seed);
    if (len <= 240) return xxh3_128_mid(in, len, seed);
    return xxh3_128_long(in, len);
}

// ------------------------------------------------------------- BLAKE3 ----
// BLAKE3 (Aumasson, Neves, O'Connor, Wilcox-O'Hearn; CC0), the reference
// implementation's tree: 1 KiB chunks, parents merged from a CV stack.

#define B3_CHUNK_START 1u
#define B3_CHUNK_END 2u
#define B3_PARENT 4u
#define B3_ROOT 8u
#define B3_KEYED 16u

DCKPT_CONST u32 B3_IV[8] = {
    0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au, 0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};

// "dckpt merkle inner node key v1.." as little-endian words.
DCKPT_CONST u32 B3_NODE_KEY[8] = {
    0x706b6364u, 0x656d2074u, 0x656c6b72u, 0x6e6e6920u, 0x6e207265u, 0x2065646fu, 0x2079656bu, 0x2e2e3176u};

#define B3_G(a, b, c, d, x, y)   \
    a = a + b + x;               \
    d = rotr32(d ^ a, 16);       \
    c = c + d;                   \
    b = rotr32(b ^ c, 12);       \
    a = a + b + y;               \
    d = rotr32(d ^ a, 8);        \
    c = c + d;                   \
    b = rotr32(b ^ c, 7);

__device__ __forceinline__ void b3_compress(const u32 cv[8], const u32 block[16], u64 counter, u32 block_len, u32 flags,
                                            u32 out[16]) {
    u32 s[16] = {cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7],
                 B3_IV[0], B3_IV[1], B3_IV[2], B3_IV[3], (u32)counter, (u32)(counter >> 32), block_len, flags};
    u32 m[16];
    for (int i = 0; i < 16; i++) m[i] = block[i];
    const int perm[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};
    for (int r = 0; r < 7; r++) {
        B3_G(s[0], s[4], s[8], s[12], m[0], m[1]);
        B3_G(s[1], s[5], s[9], s[13], m[2], m[3]);
        B3_G(s[2], s[6], s[10], s[14], m[4], m[5]);
        B3_G(s[3], s[7], s[11], s[15], m[6], m[7]);
        B3_G(s[0], s[5], s[10], s[15], m[8], m[9]);
        B3_G(s[1], s[6], s[11], s[12], m[10], m[11]);
        B3_G(s[2], s[7], s[8], s[13], m[12], m[13]);
        B3_G(s[3], s[4], s[9], s[14], m[14], m[15]);
        if (r < 6) {
            u32 t[16];
            for (int i = 0; i < 16; i++) t[i] = m[perm[i]];
            for (int i = 0; i < 16; i++) m[i] = t[i];
        }
    }
    for (int i = 0; i < 8; i++) {
        out[i] = s[i] ^ s[i + 8];
        out[i + 8] = s[i + 8] ^ cv[i];
    }
}

// Loads a 64-byte block (zero-padded past `len`).
__device__ __forceinline__ void b3_load_block(const u8* p, u32 len, u32 block[16]) {
    if (len == 64) {
        for (int i = 0; i < 16; i++) block[i] = ld32(p + 4 * i);
        return;
    }
    for (int i = 0; i < 16; i++) block[i] = 0;
    for (u32 i = 0; i < len; i++) block[i / 4] |= (u32)p[i] << (8 * (i % 4));
}

// Processes one chunk (≤ 1 KiB) up to its last block; the last block's
// compression inputs are returned so the caller can finish it as root or not.
__device__ __forceinline__ void b3_chunk(const u32 key[8], const u8* p, u32 len, u64 counter, u32 base, u32 cv[8],
                                         u32 last_block[16], u32& last_len, u32& last_flags) {
    for (int i = 0; i < 8; i++) cv[i] = key[i];
    u32 nblocks = len == 0 ? 1 : (len + 63) / 64;
    for (u32 b = 0; b + 1 < nblocks; b++) {
        u32 block[16], out[16];
        b3_load_block(p + 64 * b, 64, block);
        b3_compress(cv, block, counter, 64, base | (b == 0 ? B3_CHUNK_START : 0u), out);
        for (int i = 0; i < 8; i++) cv[i] = out[i];
    }
    last_len = len - 64 * (nblocks - 1);
    b3_load_block(p + 64 * (nblocks - 1), last_len, last_block);
    last_flags = base | B3_CHUNK_END | (nblocks == 1 ? B3_CHUNK_START : 0u);
}

__device__ dig128 b3_hash(const u32 key[8], u32 base, const u8* data, u32 len) {
    u32 stack[8][8];
    int depth = 0;
    u32 nchunks = len == 0 ? 1 : (len + 1023) / 1024;
    u32 cv[8], block[16], out[16], blen, bflags;
    for (u32 c = 0; c + 1 < nchunks; c++) {
        b3_chunk(key, data + 1024 * c, 1024, c, base, cv, block, blen, bflags);
        b3_compress(cv, block, c, blen, bflags, out);
        u32 ccv[8];
        for (int i = 0; i < 8; i++) ccv[i] = out[i];
        u64 total = (u64)c + 1;
        while ((total & 1) == 0) {
            u32 pb[16];
            for (int i = 0; i < 8; i++) {
                pb[i] = stack[depth - 1][i];
                pb[i + 8] = ccv[i];
            }
            b3_compress(key, pb, 0, 64, base | B3_PARENT, out);
            for (int i = 0; i < 8; i++) ccv[i] = out[i];
            depth--;
            total >>= 1;
        }
        for (int i = 0; i < 8; i++) stack[depth][i] = ccv[i];
        depth++;
    }
    u32 last = nchunks - 1;
    b3_chunk(key, data + 1024 * last, len - 1024 * last, last, base, cv, block, blen, bflags);
    // The pending output: (cv, block, counter, len, flags); merge it up the stack.
    u64 counter = last;
    while (depth > 0) {
        b3_compress(cv, block, counter, blen, bflags, out);
        for (int i = 0; i < 8; i++) {
            block[i] = stack[depth - 1][i];
            block[i + 8] = out[i];
            cv[i] = key[i];
        }
        counter = 0;
        blen = 64;
        bflags = base | B3_PARENT;
        depth--;
    }
    b3_compress(cv, block, counter, blen, bflags | B3_ROOT, out);
    dig128 d;
    d.lo = (u64)out[0] | ((u64)out[1] << 32);
    d.hi = (u64)out[2] | ((u64)out[3] << 32);
    return d;
}

__device__ dig128 blake3_128(const u8* data, u32 len) { return b3_hash(B3_IV, 0u, data, len); }

__device__ dig128 blake3_128_keyed(const u32 key[8], const u8* data, u32 len) {
    return b3_hash(key, B3_KEYED, data, len);
}

// --------------------------------------------------------- inner nodes ----

__device__ __forceinline__ void node_bytes(dig128 l, dig128 r, u8 buf[32]) {
    u64 w[4] = {l.lo, l.hi, r.lo, r.hi};
    for (int i = 0; i < 32; i++) buf[i] = (u8)(w[i / 8] >> (8 * (i % 8)));
}

__device__ __forceinline__ dig128 node_murmur3(dig128 l, dig128 r) {
    u64 h1 = 1, h2 = 1;
    m3_block(h1, h2, l.lo, l.hi);
    m3_block(h1, h2, r.lo, r.hi);
    return m3_tail(h1, h2, (const u8*)0, 0, 32);
}

__device__ __forceinline__ dig128 node_xxh3(dig128 l, dig128 r) {
    u8 buf[32];
    node_bytes(l, r, buf);
    return xxh3_128_mid(buf, 32, 1ull);
}

__device__ __forceinline__ dig128 node_blake3(dig128 l, dig128 r) {
    u8 buf[32];
    node_bytes(l, r, buf);
    return blake3_128_keyed(B3_NODE_KEY, buf, 32);
}
