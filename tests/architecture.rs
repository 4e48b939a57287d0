//! The module table of docs/architecture.md (ARCHITECTURE.md, the one-page
//! overview, points there) against the code: every module of
//! the library is in it once, each row says exactly which modules its
//! files use (`crate::` paths outside comments), and the rows run from the
//! core up, so that no module uses one listed after it (no import runs back
//! up). The benchmarks live in the binary, over the public API: no library
//! module is one. Two sibling files never use each other.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failure is the message

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Names the crate root re-exports, and the module that defines each.
const ROOT_NAMES: [(&str, &str); 8] = [
    ("Error", "error"),
    ("ErrorKind", "error"),
    ("Result", "error"),
    ("Digest", "hash"),
    ("HashAlgo", "hash"),
    ("Method", "method"),
    ("StoreOptions", "store"),
    ("Engine", "engine"),
];

/// One row: its modules and what it says they use.
struct Row {
    modules: Vec<String>,
    uses: BTreeSet<String>,
}

fn rows() -> Vec<Row> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs").join("architecture.md")).unwrap();
    let mut lines = text.lines().skip_while(|l| !l.starts_with("| module | job | depends on |")).skip(2);
    let mut rows = Vec::new();
    for line in lines.by_ref().take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        assert!(cells.len() >= 3, "a row of the module table without three cells: {line}");
        let names = |cell: &str| -> Vec<String> {
            cell.split(',')
                .map(|s| s.trim().trim_matches('`').to_string())
                .filter(|s| !s.is_empty() && s != "—")
                .collect()
        };
        rows.push(Row { modules: names(cells[0]), uses: names(cells[cells.len() - 1]).into_iter().collect() });
    }
    assert!(rows.len() > 10, "the module table of docs/architecture.md was not found");
    rows
}

/// Every `.rs` file under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without its comments (line comments and doc comments).
fn code(path: &Path) -> String {
    code_of(&std::fs::read_to_string(path).unwrap())
}

/// The identifiers that follow each `prefix` in `code` (`crate::x` gives `x`).
fn after<'c>(code: &'c str, prefix: &str) -> Vec<&'c str> {
    code.match_indices(prefix)
        .filter(|(at, _)| !code[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':'))
        .map(|(at, _)| {
            let rest = &code[at + prefix.len()..];
            &rest[..rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len())]
        })
        .collect()
}

/// The library's files (not the binary's, not the crate root) with their
/// top module.
fn library(src: &Path) -> Vec<(PathBuf, String)> {
    let mut all = Vec::new();
    files(src, &mut all);
    all.sort();
    all.into_iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(src).unwrap().to_path_buf();
            let first = rel.components().next()?.as_os_str().to_str()?.trim_end_matches(".rs").to_string();
            if first == "bin" || first == "lib" {
                return None;
            }
            Some((p, first))
        })
        .collect()
}

#[test]
fn the_module_table_is_the_code_and_runs_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rows = rows();
    let row_of: BTreeMap<String, usize> =
        rows.iter().enumerate().flat_map(|(i, r)| r.modules.iter().map(move |m| (m.clone(), i))).collect();
    let roots: BTreeMap<&str, &str> = ROOT_NAMES.into_iter().collect();
    // What each row's files use.
    let mut used: Vec<BTreeMap<String, BTreeSet<String>>> = vec![BTreeMap::new(); rows.len()];
    let mut problems = Vec::new();
    for (path, module) in library(&src) {
        let Some(&row) = row_of.get(&module) else {
            problems.push(format!("{}: module `{module}` has no row in the table", path.display()));
            continue;
        };
        let code = code(&path);
        let top_level = path.parent() == Some(src.as_path());
        let mut names: Vec<&str> = after(&code, "crate::");
        if top_level {
            names.extend(after(&code, "super::"));
        }
        for name in names {
            let target = roots.get(name).map_or(name, |m| *m).to_string();
            if target != module && row_of.contains_key(&target) {
                used[row].entry(target).or_default().insert(path.strip_prefix(&src).unwrap().display().to_string());
            }
        }
    }
    for (i, row) in rows.iter().enumerate() {
        let actual: BTreeSet<String> = used[i].keys().filter(|m| !row.modules.contains(m)).cloned().collect();
        let declared: BTreeSet<String> = row.uses.iter().filter(|m| !row.modules.contains(m)).cloned().collect();
        for m in actual.difference(&declared) {
            problems.push(format!("`{}` uses `{m}` ({:?}), which its row does not list", row.modules[0], used[i][m]));
        }
        for m in declared.difference(&actual) {
            problems.push(format!("`{}`'s row lists `{m}`, which it does not use", row.modules[0]));
        }
        for m in &declared {
            match row_of.get(m) {
                Some(&j) if j < i => {}
                Some(_) => {
                    problems.push(format!("`{}` uses `{m}`, listed after it: an import runs back up", row.modules[0]))
                }
                None => problems.push(format!("`{}`'s row lists `{m}`, which is no module", row.modules[0])),
            }
        }
    }
    assert!(problems.is_empty(), "docs/architecture.md's module table and the code disagree:\n{}", problems.join("\n"));
}

#[test]
fn the_benchmarks_and_workload_generators_live_in_the_binary() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let in_library: Vec<String> = library(&src)
        .into_iter()
        .filter(|(p, _)| {
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            stem.starts_with("bench") || stem == "generate" || stem == "simulate"
        })
        .map(|(p, _)| p.display().to_string())
        .collect();
    assert!(in_library.is_empty(), "benchmark code in the library's public API: {in_library:?}");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let lib = code_of(&lib);
    let exported: Vec<&str> = after(&lib, "pub mod ").into_iter().filter(|m| m.starts_with("bench")).collect();
    assert!(exported.is_empty(), "the library exports benchmark modules: {exported:?}");
}

/// `code` for text already read.
fn code_of(text: &str) -> String {
    text.lines().map(|l| if l.trim_start().starts_with("//") { "" } else { l }).collect::<Vec<_>>().join("\n")
}

#[test]
fn no_two_sibling_files_use_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    // Module path of a file: src/a/b.rs and src/a/b/mod.rs are `a::b`.
    let path_of = |p: &Path| -> String {
        let rel = p.strip_prefix(&src).unwrap().with_extension("");
        let parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        let parts: Vec<String> = parts.into_iter().filter(|s| s != "mod").collect();
        parts.join("::")
    };
    let mut uses: BTreeSet<(String, String)> = BTreeSet::new();
    let modules: BTreeSet<String> = all.iter().map(|p| path_of(p)).collect();
    for p in &all {
        if p.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs") {
            continue; // a folder's face: it declares and re-exports its files
        }
        let me = path_of(p);
        let parent = me.rsplit_once("::").map_or(String::new(), |(a, _)| a.to_string());
        let code = code(p);
        let mut targets = Vec::new();
        for name in after(&code, "super::") {
            targets.push(if parent.is_empty() { name.to_string() } else { format!("{parent}::{name}") });
        }
        if !parent.is_empty() {
            for name in after(&code, &format!("crate::{parent}::")) {
                targets.push(format!("{parent}::{name}"));
            }
        }
        for t in targets {
            if t != me
                && modules.contains(&t)
                && t.rsplit_once("::").map_or(String::new(), |(a, _)| a.to_string()) == parent
            {
                uses.insert((me.clone(), t));
            }
        }
    }
    let circles: Vec<String> = uses
        .iter()
        .filter(|(a, b)| a < b && uses.contains(&(b.clone(), a.clone())))
        .map(|(a, b)| format!("{a} <-> {b}"))
        .collect();
    assert!(circles.is_empty(), "sibling files that use each other: {circles:?}");
}

/// Where `unsafe` code is allowed, and why: every other module is under the
/// crate's `unsafe_code = "deny"`. Whole modules: the CUDA wall (`driver`:
/// raw driver calls; `launch`: one typed function per kernel; `bounce`: the
/// pipelined upload), the C boundary (`ffi`) and the one place that turns
/// application addresses into slices (`runtime/raw.rs`), the one place that
/// maps memory (`shm.rs`: the agent's shared-memory segments). Single items: the
/// functions that queue device copies outliving a call, the application's
/// `unsafe` constructors and `protect`, and `ThreadComm`'s `Send`.
const UNSAFE_ALLOWED: [(&str, usize); 13] = [
    ("shm.rs", 1),
    ("backend/cuda/driver.rs", 1),
    ("backend/cuda/launch.rs", 1),
    ("backend/cuda/bounce.rs", 1),
    ("backend/cuda/mod.rs", 2),
    ("backend/cuda/device_cache.rs", 3),
    ("backend/cuda/staging.rs", 2),
    ("backend/cuda/pipeline/exits.rs", 1),
    ("ffi/mod.rs", 1),
    ("runtime/raw.rs", 1),
    ("runtime/handle.rs", 1),
    ("collective/reduce.rs", 1),
    ("bin/dckpt/bench/runtime.rs", 1),
];

/// The CUDA wall's modules, and the most lines they may hold together.
const CUDA_WALL: [&str; 3] = ["backend/cuda/driver.rs", "backend/cuda/launch.rs", "backend/cuda/bounce.rs"];
const CUDA_WALL_LINES: usize = 900;

#[test]
fn unsafe_code_is_allowed_only_where_the_list_says() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut found: BTreeMap<String, usize> = BTreeMap::new();
    for p in &all {
        let n = code(p).matches("allow(unsafe_code)").count();
        if n > 0 {
            found.insert(p.strip_prefix(&src).unwrap().display().to_string(), n);
        }
    }
    let listed: BTreeMap<String, usize> = UNSAFE_ALLOWED.iter().map(|(f, n)| (f.to_string(), *n)).collect();
    assert_eq!(found, listed, "`allow(unsafe_code)` where the list does not say (or gone from where it does)");
    for f in CUDA_WALL {
        let text = std::fs::read_to_string(src.join(f)).unwrap();
        assert!(text.contains("#![allow(unsafe_code)]"), "{f} is a module of the wall");
    }
    let lines: usize = CUDA_WALL.iter().map(|f| std::fs::read_to_string(src.join(f)).unwrap().lines().count()).sum();
    assert!(lines < CUDA_WALL_LINES, "the CUDA wall holds {lines} lines (at most {CUDA_WALL_LINES})");
}
