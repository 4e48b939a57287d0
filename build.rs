//! Embeds the kernels built ahead of time (`kernels/prebuilt/*.cubin`, made
//! by `dckpt kernels --emit kernels/prebuilt` on a GPU machine) into the
//! library; none is fine (the kernels are then compiled at first use).

use std::io::Write;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR")).join("kernels/prebuilt");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".cubin"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("prebuilt_kernels.rs");
    let mut f = std::fs::File::create(&out).expect("prebuilt_kernels.rs");
    writeln!(f, "/// The kernels built ahead of time: (file name, machine code).").expect("write");
    writeln!(f, "static PREBUILT: &[(&str, &[u8])] = &[").expect("write");
    for n in &names {
        println!("cargo:rerun-if-changed={}", dir.join(n).display());
        writeln!(f, "    ({n:?}, include_bytes!({:?})),", dir.join(n).display().to_string()).expect("write");
    }
    writeln!(f, "];").expect("write");
}
