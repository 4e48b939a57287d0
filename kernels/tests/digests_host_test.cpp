// Host build of kernels/digests.cuh: prints the digests of fixed inputs in
// the format of `cargo run --example digest_vectors`. Run check_digests.sh.
#define DCKPT_HOST_TEST
#include "../digests.cuh"
#include <cstdio>
#include <vector>

static void print(const char* name, unsigned len, dig128 d) {
    printf("%s %u ", name, len);
    for (int i = 0; i < 8; i++) printf("%02x", (unsigned)((d.lo >> (8 * i)) & 0xff));
    for (int i = 0; i < 8; i++) printf("%02x", (unsigned)((d.hi >> (8 * i)) & 0xff));
    printf("\n");
}

int main() {
    const unsigned lens[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 97, 100, 127, 128,
                             129, 200, 239, 240, 241, 255, 256, 257, 500, 1000, 1023, 1024, 1025, 2047, 2048, 2049,
                             3072, 4096, 5000, 65536};
    std::vector<u8> buf(65536 + 16);
    for (unsigned i = 0; i < buf.size(); i++) buf[i] = (u8)((i * 2654435761u) >> 13);
    for (unsigned len : lens) {
        print("murmur3", len, murmur3_x64_128(buf.data(), len, 0));
        print("murmur3-a16", len, murmur3_x64_128_aligned16(buf.data(), len, 0));
        print("murmur3-u", len, murmur3_x64_128(buf.data() + 3, len, 0));
        print("xxh3", len, xxh3_128(buf.data(), len, 0));
        print("xxh3-u", len, xxh3_128(buf.data() + 5, len, 0));
        print("blake3", len, blake3_128(buf.data(), len));
        print("blake3-u", len, blake3_128(buf.data() + 1, len));
    }
    dig128 l = murmur3_x64_128(buf.data(), 100, 0), r = murmur3_x64_128(buf.data(), 200, 0);
    print("node-murmur3", 32, node_murmur3(l, r));
    print("node-xxh3", 32, node_xxh3(l, r));
    print("node-blake3", 32, node_blake3(l, r));
    return 0;
}
