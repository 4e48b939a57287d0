//! The C ABI's tests that need no MPI: NULL handles, `dckpt_config`.
use super::*;
use crate::error::ErrorKind;

/// The message of the calling thread's last error.
fn last() -> String {
    // SAFETY: dckpt_last_error returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(dckpt_last_error()) }.to_string_lossy().into_owned()
}

#[test]
fn dckpt_config_sets_a_key_for_the_next_init_and_refuses_a_bad_one_at_once() {
    // SAFETY: NUL-terminated literals.
    unsafe {
        assert_eq!(dckpt_config(c"persistent = \"/tmp/dckpt-config-test\"".as_ptr()), DCKPT_OK, "{}", last());
        assert_eq!(dckpt_config(c"mode=sync".as_ptr()), DCKPT_OK, "{}", last());
        assert_eq!(dckpt_config(c"mode = sink".as_ptr()), DCKPT_ERR_INVALID_OPTION);
        assert!(last().contains("mode"), "{}", last());
        assert_eq!(dckpt_config(c"chunk_sise = 64".as_ptr()), DCKPT_ERR_INVALID_OPTION);
        assert!(last().contains("did you mean `chunk_size`?"), "{}", last());
        assert_eq!(dckpt_config(c"no equals sign".as_ptr()), DCKPT_ERR_INVALID_OPTION);
    }
    let c = load_config(None).expect("the settings make a configuration");
    assert_eq!(c.persistent.as_deref(), Some(Path::new("/tmp/dckpt-config-test")));
    assert_eq!(c.mode, crate::config::Mode::Sync);
}

#[test]
fn a_failed_latest_or_restart_leaves_version_zero() {
    let mut v = 42u64;
    // SAFETY: a NULL handle is refused before anything is read; `v` is writable.
    let code = unsafe { dckpt_restart_latest(std::ptr::null_mut(), c"heat".as_ptr(), &mut v) };
    assert!(code != DCKPT_OK && v == 0, "code {code}, version {v}");
    v = 42;
    // SAFETY: as above.
    let code = unsafe { dckpt_latest(std::ptr::null_mut(), c"heat".as_ptr(), &mut v) };
    assert!(code != DCKPT_OK && v == 0, "code {code}, version {v}");
}

#[test]
fn the_c_codes_are_the_error_kinds_codes() {
    let pairs = [
        (DCKPT_ERR_IO, ErrorKind::Io),
        (DCKPT_ERR_CORRUPT, ErrorKind::Corrupt),
        (DCKPT_ERR_MISSING_VERSION, ErrorKind::MissingVersion),
        (DCKPT_ERR_NO_STORE, ErrorKind::NoStore),
        (DCKPT_ERR_MISMATCH, ErrorKind::Mismatch),
        (DCKPT_ERR_VERSION_NOT_NEWER, ErrorKind::VersionNotNewer),
        (DCKPT_ERR_INVALID_OPTION, ErrorKind::InvalidOption),
        (DCKPT_ERR_GPU, ErrorKind::Gpu),
        (DCKPT_ERR_COLLECTIVE, ErrorKind::Collective),
        (DCKPT_ERR_OWNER_UNAVAILABLE, ErrorKind::OwnerUnavailable),
        (DCKPT_ERR_BROKEN_REFERENCE, ErrorKind::BrokenReference),
        (DCKPT_ERR_LOCKED, ErrorKind::Locked),
        (DCKPT_ERR_UNSAFE_PATH, ErrorKind::UnsafePath),
        (DCKPT_ERR_NEEDS_REPAIR, ErrorKind::NeedsRepair),
        (DCKPT_ERR_NO_SPACE, ErrorKind::NoSpace),
        (DCKPT_ERR_NOT_DURABLE, ErrorKind::NotDurable),
        (DCKPT_ERR_RANK_COUNT, ErrorKind::RankCount),
        (DCKPT_ERR_SIZE_MISMATCH, ErrorKind::SizeMismatch),
        (DCKPT_ERR_MISSING_REGION, ErrorKind::MissingRegion),
        (DCKPT_ERR_RESOURCES_EXHAUSTED, ErrorKind::ResourcesExhausted),
        (DCKPT_ERR_INTERNAL, ErrorKind::Internal),
    ];
    for (code, kind) in pairs {
        assert_eq!(code, kind as c_int, "{kind:?}");
    }
}

#[test]
fn errors_and_panics_become_codes_and_messages() {
    let last = || unsafe { CStr::from_ptr(dckpt_last_error()) }.to_string_lossy().into_owned();
    assert_eq!(status(|| Ok(())), DCKPT_OK);
    assert_eq!(status(|| Err(Error::InvalidOption("bad chunk size".into()))), DCKPT_ERR_INVALID_OPTION);
    assert!(last().contains("bad chunk size"), "{}", last());
    assert_eq!(status(|| panic!("boom")), DCKPT_ERR_INTERNAL);
    assert!(last().contains("panic") && last().contains("boom"), "{}", last());
    // A NULL handle or name is refused, not dereferenced.
    let name = c"heat";
    assert_eq!(unsafe { dckpt_checkpoint(std::ptr::null_mut(), name.as_ptr(), 1) }, DCKPT_ERR_INVALID_OPTION);
    assert!(last().contains("NULL"), "{}", last());
    assert_eq!(unsafe { dckpt_unprotect(std::ptr::null_mut(), 0) }, DCKPT_ERR_INVALID_OPTION);
    assert_eq!(unsafe { dckpt_finalize(std::ptr::null_mut()) }, DCKPT_OK);
}
