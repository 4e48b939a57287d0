//! The configuration's keys, layers and errors.

use super::*;

fn load(text: &str, env: &[(&str, &str)]) -> Result<Config> {
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    let f = dir.path().join("dckpt.toml");
    std::fs::write(&f, text).map_err(|e| Error::io(&f, e))?;
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Config::load_with(Some(&f), |name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
}

#[test]
fn every_key_parses_and_maps_to_the_options() {
    let c = load(
        r#"
        scratch = "/local/ckpt"
        persistent = "/gpfs/ckpt"
        mode = "sync"
        chunk_size = 256
        hash = "xxh3"
        method = "list"
        max_chain = 8
        collective = false
        threshold = 1024
        region_bytes = "64K"
        min_region_bytes = "4K"
        overlap = false
        host_cache_size = "2G"
        prefetch_cache_size = 1048576
        eviction = "lru"
        max_versions = 3
        compression = "zstd:3"
        backend = "cpu"
        gpu_memory = "2.25x"
        gpu_cache_size = "512M"
        "#,
        &[],
    )
    .expect("config");
    assert_eq!(c.mode, Mode::Sync);
    let s = c.store_options();
    assert_eq!((s.chunk_size, s.hash, s.method, s.max_chain), (256, HashAlgo::Xxh3, Method::List, Some(8)));
    assert_eq!(s.gpu_memory, GpuMemory::Times(2250));
    let t = c.tier_options("heat");
    assert_eq!(t.local, Some(PathBuf::from("/local/ckpt/heat")));
    assert_eq!(t.shared, Some(PathBuf::from("/gpfs/ckpt/heat")));
    assert_eq!((t.host_cache_bytes, t.prefetch_cache_bytes), (2 << 30, 1 << 20));
    assert_eq!((t.keep_local, t.keep_shared, t.eviction), (Some(3), Some(3), Policy::Lru));
    assert_eq!(t.compression, Some(Compression::Zstd { level: 3 }));
    assert_eq!(t.gpu_cache, GpuCache::Bytes(512 << 20));
    let k = c.collective_options();
    assert_eq!((k.threshold, k.region_bytes, k.backend, k.local_only), (1024, 64 << 10, BackendKind::Cpu, true));
    assert_eq!((k.min_region_bytes, k.overlap), (4 << 10, Overlap::Off));
    // What --check prints reads back to the same configuration.
    let again = load(&c.to_toml().expect("toml"), &[]).expect("reparse");
    assert_eq!(again, c);
}

#[test]
fn the_environment_overrides_the_file() {
    let c = load(
        "persistent = \"/a\"\nchunk_size = 128\n",
        &[("DCKPT_CHUNK_SIZE", "512"), ("DCKPT_PERSISTENT", "/b/c"), ("DCKPT_COMPRESSION", "lz4")],
    )
    .expect("config");
    assert_eq!((c.chunk_size, c.persistent.as_deref()), (512, Some(Path::new("/b/c"))));
    assert_eq!(c.compression, Some(Compression::Lz4));
    // Local-only allows a method without a record.
    let full = load("persistent = \"/a\"\nmethod = \"full\"\n", &[("DCKPT_COLLECTIVE", "false")]).expect("full");
    assert!(full.collective_options().local_only && full.method == Method::Full);
    // overlap: auto by default, booleans as before, and words.
    for (value, want) in [("auto", Overlap::Auto), ("false", Overlap::Off), ("true", Overlap::On), ("on", Overlap::On)]
    {
        let c = load("persistent = \"/a\"\n", &[("DCKPT_OVERLAP", value)]).expect(value);
        assert_eq!(c.collective_options().overlap, want, "DCKPT_OVERLAP={value}");
        assert_eq!(load(&c.to_toml().expect("toml"), &[]).expect("reparse").overlap, want);
    }
    assert_eq!(load("persistent = \"/a\"\n", &[]).expect("default").overlap, Overlap::Auto);
    // late_step: baseline by default, then each word, through a reprint.
    for (value, want) in [("baseline", LateStep::Baseline), ("keep", LateStep::Keep), ("wait", LateStep::Wait)] {
        let c = load("persistent = \"/a\"\n", &[("DCKPT_LATE_STEP", value)]).expect(value);
        assert_eq!(c.collective_options().late_step, want, "DCKPT_LATE_STEP={value}");
        assert_eq!(load(&c.to_toml().expect("toml"), &[]).expect("reparse").late_step, want);
    }
    assert_eq!(load("persistent = \"/a\"\n", &[]).expect("default").late_step, LateStep::Baseline);
}

#[test]
fn bad_keys_and_values_are_refused_with_the_key_and_the_origin() {
    /// A file, its environment, and what the error must name.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case<'_>] = &[
        ("persistent = \"/a\"\nchunk_sise = 128\n", &[], "chunk_sise"),
        ("persistent = \"/a\"\nchunk_size = 16\n", &[], "chunk_size"),
        ("persistent = \"/a\"\nmethod = \"zip\"\n", &[], "zip"),
        ("persistent = \"/a\"\nhost_cache_size = \"lots\"\n", &[], "host_cache_size"),
        ("persistent = \"/a\"\ncompression = \"gzip\"\n", &[], "compression"),
        ("persistent = \"/a\"\nthreshold = 0\n", &[], "threshold"),
        ("persistent = \"/a\"\nmethod = \"full\"\n", &[], "method"),
        ("chunk_size = 128\n", &[], "persistent"),
        ("persistent = \"/a\"\nmax_versions = 0\n", &[], "max_versions"),
        ("persistent = \"/a\"\n", &[("DCKPT_EVICTION", "random")], "DCKPT_EVICTION"),
        ("persistent = \"/a\"\noverlap = \"sometimes\"\n", &[], "overlap"),
        ("persistent = \"/a\"\n", &[("DCKPT_LATE_STEP", "never")], "DCKPT_LATE_STEP"),
        ("persistent = \"/a\"\ngpu_memory = \"lots\"\n", &[], "gpu_memory"),
        ("persistent = \"/a\"\ngpu_cache_size = \"lots\"\n", &[], "gpu_cache_size"),
        ("persistent = \"/a\"\n", &[("DCKPT_GPU_MEMORY", "-2x")], "DCKPT_GPU_MEMORY"),
        ("persistent = [\n", &[], "dckpt.toml"),
        // A range error set by a variable names the variable, not the file.
        ("persistent = \"/a\"\n", &[("DCKPT_CHUNK_SIZE", "16")], "DCKPT_CHUNK_SIZE"),
        ("persistent = \"/a\"\n", &[("DCKPT_THRESHOLD", "0")], "DCKPT_THRESHOLD"),
        // An empty directory, and one directory for two tiers.
        ("scratch = \"/s\"\n", &[("DCKPT_PERSISTENT", "")], "DCKPT_PERSISTENT"),
        ("persistent = \"/a\"\nscratch = \"/a/\"\n", &[], "two directories"),
    ];
    for (text, env, named) in cases {
        let e = load(text, env).expect_err(text);
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidOption, "{text}: {e}");
        assert!(e.to_string().contains(named), "{text}: the error names {named}: {e}");
        assert!(!e.to_string().contains('\n'), "one line: {e}");
    }
    // A syntax error says where, on one line.
    let e = load("persistent = \"/a\"\nmode = = 3\n", &[]).expect_err("syntax");
    assert!(e.to_string().contains("line 2"), "{e}");
}

#[test]
fn misspelled_and_lower_case_variables_are_refused_by_name() {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    check_variable_names(names(&["DCKPT_CHUNK_SIZE", "DCKPT_PROFILE", "DCKPT_LOG", "PATH", "HOME"])).expect("known");
    let e = check_variable_names(names(&["DCKPT_CHUNKSIZE"])).expect_err("misspelled");
    assert!(e.to_string().contains("DCKPT_CHUNK_SIZE"), "the closest key: {e}");
    let e = check_variable_names(names(&["dckpt_host_cache_size"])).expect_err("lower case");
    assert!(e.to_string().contains("DCKPT_HOST_CACHE_SIZE"), "{e}");
    let e = check_variable_names(names(&["DCKPT_PERSISTANT"])).expect_err("misspelled");
    assert!(e.to_string().contains("DCKPT_PERSISTENT"), "{e}");
}

#[test]
fn caches_beyond_the_machine_s_memory_are_refused() {
    let c = load("persistent = \"/a\"\nhost_cache_size = \"1T\"\nprefetch_cache_size = \"1T\"\n", &[])
        .expect("a valid file");
    if machine_memory().is_some_and(|m| m < 2 << 40) {
        let e = c.check_machine().expect_err("2 TiB of caches");
        assert!(e.to_string().contains("host_cache_size"), "{e}");
    }
    load("persistent = \"/a\"\n", &[]).expect("defaults").check_machine().expect("the defaults fit");
}

#[test]
fn the_sources_name_the_variable_the_file_or_the_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("c.toml");
    std::fs::write(&f, "persistent = \"/a\"\nmethod = \"list\"\n").expect("write");
    let env = |v: &str| (v == "DCKPT_METHOD").then(|| "tree".to_string());
    let sources = Config::sources(Some(&f), env).expect("sources");
    let of = |k: &str| sources.iter().find(|(key, _)| *key == k).map(|(_, s)| s.clone()).unwrap_or_default();
    assert_eq!(of("method"), "environment variable DCKPT_METHOD");
    assert!(of("persistent").ends_with("c.toml"));
    assert_eq!(of("chunk_size"), "default");
}

#[test]
fn the_builder_layers_file_environment_and_set_values_in_that_order() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("dckpt.toml");
    std::fs::write(&f, "persistent = \"/gpfs/ckpt\"\nchunk_size = 64\nthreshold = 1000\n").unwrap();
    let env = |name: &str| (name == "DCKPT_CHUNK_SIZE").then(|| "256".to_string());
    let c = Config::builder().file(Some(&f)).environment_from(env).build().unwrap();
    assert_eq!((c.chunk_size, c.threshold), (256, 1000), "the environment over the file");
    let c =
        Config::builder().file(Some(&f)).environment_from(env).set("chunk_size", 512, "--chunk-size").build().unwrap();
    assert_eq!(c.chunk_size, 512, "a set value over the environment");
    // Errors name the layer that set the value at fault.
    let e = Config::builder().file(Some(&f)).set("chunk_size", 7, "--chunk-size").build().unwrap_err().to_string();
    assert!(e.contains("(--chunk-size)") && e.contains("chunk_size"), "{e}");
    let e = Config::builder().file(Some(&f)).set("chunk-size", 7, "--x").build().unwrap_err().to_string();
    assert!(e.contains("chunk-size is not a configuration key"), "{e}");
    // A program's own settings as the base, the defaults filling the rest.
    let base = Config { persistent: Some("/p".into()), max_versions: Some(3), ..Config::default() };
    let c = Config::builder().base(&base).set("max_versions", 5, "the program").build().unwrap();
    assert_eq!((c.max_versions, c.chunk_size), (Some(5), Config::default().chunk_size));
}

#[test]
fn a_misspelled_key_in_the_file_names_its_line_and_the_closest_key() {
    let e = load("persistent = \"/gpfs/ckpt\"\n  chunk_sise = 64\n", &[]).unwrap_err().to_string();
    assert!(e.contains("unknown key `chunk_sise` at line 2"), "{e}");
    assert!(e.contains("did you mean `chunk_size`?"), "{e}");
    assert!(e.matches("invalid option").count() == 1, "said once: {e}");
}

#[test]
fn the_agent_keys_map_to_the_tiers_journal() {
    let c = load("persistent = \"/gpfs/ckpt\"\nagent_dir = \"/dev/shm/mine\"\n", &[]).unwrap();
    assert_eq!(c.tier_options("x").journal, Some(PathBuf::from("/dev/shm/mine")));
    let off = load("persistent = \"/gpfs/ckpt\"\nagent = \"off\"\n", &[]).unwrap();
    assert_eq!(off.tier_options("x").journal, None);
    let default = load("persistent = \"/gpfs/ckpt\"\n", &[]).unwrap();
    assert_eq!(default.tier_options("x").journal, Some(crate::tiers::journal::default_root()));
}
