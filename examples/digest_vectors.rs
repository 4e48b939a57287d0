//! Prints digests of fixed inputs, for checking the GPU digests
//! (`kernels/digests.cuh`) against the Rust ones without a GPU:
//! `kernels/tests/check_digests.sh` compiles the header as host C++ and
//! compares its output with this program's.

use dckpt::HashAlgo;

fn print(name: &str, len: usize, d: dckpt::Digest) {
    println!("{name} {len} {d}");
}

fn main() {
    let lens = [
        0usize, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 97, 100, 127, 128, 129, 200, 239, 240,
        241, 255, 256, 257, 500, 1000, 1023, 1024, 1025, 2047, 2048, 2049, 3072, 4096, 5000, 65536,
    ];
    let buf: Vec<u8> = (0..65536u32 + 16).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    for len in lens {
        print("murmur3", len, HashAlgo::Murmur3.leaf(&buf[..len]));
        print("murmur3-a16", len, HashAlgo::Murmur3.leaf(&buf[..len]));
        print("murmur3-u", len, HashAlgo::Murmur3.leaf(&buf[3..3 + len]));
        print("xxh3", len, HashAlgo::Xxh3.leaf(&buf[..len]));
        print("xxh3-u", len, HashAlgo::Xxh3.leaf(&buf[5..5 + len]));
        print("blake3", len, HashAlgo::Blake3.leaf(&buf[..len]));
        print("blake3-u", len, HashAlgo::Blake3.leaf(&buf[1..1 + len]));
    }
    let l = HashAlgo::Murmur3.leaf(&buf[..100]);
    let r = HashAlgo::Murmur3.leaf(&buf[..200]);
    print("node-murmur3", 32, HashAlgo::Murmur3.node(l, r));
    print("node-xxh3", 32, HashAlgo::Xxh3.node(l, r));
    print("node-blake3", 32, HashAlgo::Blake3.node(l, r));
}
