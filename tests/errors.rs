//! Errors say what happened: a buffer of the wrong size, a restored
//! buffer that does not fit, a thread the system refuses are each their
//! own kind with a stable code, not `InvalidOption` or `Internal`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failure is the message

use dckpt::backend::Backend;
use dckpt::backend::cpu::CpuBackend;
use dckpt::dedup::DedupState;
use dckpt::layout::Layout;
use dckpt::memory::ProtectedMut;
use dckpt::{Engine, ErrorKind, HashAlgo, Method, StoreOptions};

#[test]
fn a_buffer_of_another_length_is_a_size_mismatch_naming_both_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions { chunk_size: 64, ..StoreOptions::default() };
    let mut engine = Engine::open_or_create(dir.path(), 0, 4096, &opts).unwrap();
    engine.checkpoint(1, &vec![1u8; 4096][..]).unwrap();
    let err = engine.checkpoint(2, &vec![1u8; 4000][..]).expect_err("a shorter buffer");
    assert_eq!(err.kind(), ErrorKind::SizeMismatch, "{err}");
    assert_eq!(err.code(), 18);
    let text = err.to_string();
    assert!(text.contains("4000") && text.contains("4096"), "{text}");
    // The store is unharmed: the next right-sized version goes in.
    engine.checkpoint(2, &vec![2u8; 4096][..]).unwrap();
    assert_eq!(dckpt::restore::restore_version(dir.path(), 0, 2).unwrap(), vec![2u8; 4096]);
}

#[test]
fn restored_bytes_that_do_not_fit_their_buffer_are_a_size_mismatch() {
    let layout = Layout::new(4096, 64).unwrap();
    let backend = CpuBackend::new(DedupState::new(layout, HashAlgo::Murmur3, 0), Method::Tree);
    let mut out = vec![0u8; 100];
    let err = backend.place(&[7u8; 64], ProtectedMut::Host(&mut out)).expect_err("64 bytes into 100");
    assert_eq!(err.kind(), ErrorKind::SizeMismatch, "{err}");
    assert!(out.iter().all(|&b| b == 0), "nothing was written");
}

#[test]
fn a_refused_thread_is_resources_exhausted_not_a_bug() {
    let err = dckpt::Error::no_thread("a flush thread", std::io::Error::from_raw_os_error(libc_eagain()));
    assert_eq!(err.kind(), ErrorKind::ResourcesExhausted);
    assert_eq!(err.code(), 20);
    assert!(err.to_string().starts_with("starting a flush thread: resources exhausted"), "{err}");
    assert_eq!(dckpt::Error::MissingRegion { rank: 3, what: "region 7 is not protected".into() }.code(), 19);
}

/// EAGAIN, what `pthread_create` answers when no thread can be made.
fn libc_eagain() -> i32 {
    11
}
