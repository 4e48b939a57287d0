#!/usr/bin/env bash
# Every snippet of the README compiled and run as printed (issue #45):
#  - each fenced block follows a marker: `<!-- tested: NAME (who runs it) -->`
#    or `<!-- not run by the tests: why -->`; each NAME is run by a script;
#  - the Rust programs are the files they say (examples/quick.rs,
#    examples/readme/*.rs), built with the examples and run (1 or 2 ranks);
#  - the quick start (heat killed at 130, restarted from 120) and the Rust
#    quick program (killed at 135, restarted from 130) as printed;
#  - the command synopsis: every command and flag in that command's --help;
#  - the configuration file: `dckpt config --check` accepts it;
#  - scripts/demo.sh (the main job) as the first block prints it;
#  - last, the C and Fortran build-tree lines on the README's quick.c and
#    quick.f90 (their `cargo build --release` leaves the crash points out of
#    target/release, so scripts/test.sh runs this just before install-test.sh).
# install-test.sh runs the install, CMake, C and Fortran blocks, python-test.sh
# the Python ones.
#   scripts/readme-test.sh      (after cargo build --release --all-targets)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
block() { scripts/readme-block.sh "$1"; }
work=$(mktemp -d)
# The build-tree lines work in the repository's root, where a reader of the
# README keeps quick.c and the like: theirs are set aside and put back.
mine=(quick.c quick.f90 quick quick-f dckpt.mod)
mkdir -p "$work/saved"
for f in "${mine[@]}"; do [ -e "$f" ] && mv "$f" "$work/saved/"; done
restore_mine() {
    for f in "${mine[@]}"; do rm -f "$repo/$f"; done
    for f in "$work"/saved/*; do [ -e "$f" ] && mv "$f" "$repo/"; done
    rm -rf "$work" /tmp/quick-ckpt-rs /tmp/quick-ckpt-tree target/readme
}
trap restore_mine EXIT
fail() { echo "FAILED: $1"; [ -f "${2:-}" ] && cat "$2"; exit 1; }

# Every block marked; every name run by some script.
python3 - <<'PY'
import re, subprocess, sys
lines = open("README.md").read().split("\n")
inside, bad, names = False, [], []
for i, line in enumerate(lines):
    if re.match(r"\s+(```|~~~)|~~~", line):
        bad.append(f"README.md:{i + 1}: an indented or ~~~ fence: start blocks with ``` at the margin, marked")
    if line.startswith("```"):
        if not inside:
            prev = lines[i - 1] if i else ""
            m = re.match(r"<!-- tested: ([\w-]+)[ >]", prev)
            if m:
                names.append(m.group(1))
            elif not re.match(r"<!-- not run by the tests: \S.*-->", prev):
                bad.append(f"README.md:{i + 1}: a {line[3:] or 'plain'} block with no marker before it")
        inside = not inside
for n in sorted(set(n for n in names if names.count(n) > 1)):
    bad.append(f"README.md: two blocks marked {n}")
scripts = subprocess.run("cat scripts/*.sh", shell=True, capture_output=True, text=True).stdout
# The names the scripts take blocks by: `block NAME`, `readme-block.sh NAME`,
# and the lists `for name in …` / `for pair in NAME:path …`.
taken = set(re.findall(r"(?:\bblock|readme-block\.sh)\s+\"?([\w-]+)", scripts))
for group in re.findall(r"for (?:name|pair) in ((?:[^;\n\\]|\\\n)*)", scripts):
    taken.update(w.split(":")[0] for w in group.replace("\\\n", " ").split())
for n in names:
    if n not in taken:
        bad.append(f"README.md: the block {n} is marked tested, but no script takes it")
if bad:
    print("\n".join(bad))
    sys.exit(1)
print(f"readme-test: {len(names)} blocks marked tested, every other block says why not")
PY

# The Rust programs are the files they say.
for pair in quick-rust:examples/quick.rs rust-library:examples/readme/library.rs rust-tiers:examples/readme/tiers.rs \
    rust-collective:examples/readme/collective.rs rust-tiered-collective:examples/readme/tiered_collective.rs \
    rust-runtime:examples/readme/runtime.rs; do
    diff <(block "${pair%%:*}") "${pair#*:}" >"$work/diff" || fail "the README's block ${pair%%:*} is not ${pair#*:}" "$work/diff"
done
echo "readme-test: the README's six Rust programs are the example files"

# The quick start and the Rust quick program, as printed.
rm -rf target/heat /tmp/quick-ckpt-rs
bash -eo pipefail -c "$(block quick-start)" >"$work/start.log" 2>&1 || fail "the README's quick start" "$work/start.log"
grep -q "a rank died at step 130, as asked" "$work/start.log" && grep -q "restarted from the checkpoint of step 120" "$work/start.log" ||
    fail "the quick start did not die at 130 and go on from 120" "$work/start.log"
echo "readme-test: the quick start: heat died at step 130, went on from 120"
bash -eo pipefail -c "$(block quick-rust-run)" >"$work/quick.log" 2>&1 || fail "the README's Rust program" "$work/quick.log"
scripts/check-first-program.sh "$work/quick.log" "Rust program" "field[6] = 600.0"

# The API programs: built with the examples, run.
rm -rf target/readme
for e in library tiers; do
    timeout 120 "target/release/examples/readme-$e" >"$work/$e.log" 2>&1 || fail "examples/readme/$e" "$work/$e.log"
done
for e in collective tiered-collective runtime runtime; do
    timeout 120 mpirun -np 2 "target/release/examples/readme-$e" >"$work/$e.log" 2>&1 || fail "examples/readme/$e on 2 ranks" "$work/$e.log"
done
grep -q "restarted from step 100" "$work/runtime.log" || fail "the README's runtime program did not restart" "$work/runtime.log"
echo "readme-test: the README's API programs ran (the runtime's second job restarted from step 100)"

# The command synopsis against each command's --help.
block cli >"$work/cli.txt"
python3 - "$work/cli.txt" target/release/dckpt <<'PY'
import re, subprocess, sys
text, dckpt = open(sys.argv[1]).read(), sys.argv[2]
commands, bad = [], []
for line in text.split("\n"):
    code = line.split("#")[0]
    m = re.match(r"\s*(?:mpirun -np P )?dckpt (\S+)", code)
    if m:
        commands.append([m.group(1), code])
    elif code.strip() and commands:
        commands[-1][1] += code  # a continuation line
for cmd, code in commands:
    help = subprocess.run([dckpt, cmd, "--help"], capture_output=True, text=True)
    if help.returncode != 0:
        bad.append(f"dckpt {cmd}: no such command")
        continue
    for flag in sorted(set(re.findall(r"--[a-z][a-z0-9-]*", code))):
        if not re.search(rf"{flag}\b", help.stdout):
            bad.append(f"dckpt {cmd}: the README names {flag}, its --help does not")
if bad:
    print("\n".join(bad))
    sys.exit(1)
print(f"readme-test: the command synopsis: {len(commands)} lines, every command and flag in its --help")
PY

# The configuration file.
block config-file >"$work/dckpt.toml"
target/release/dckpt config --check "$work/dckpt.toml" >"$work/config.log" 2>&1 || fail "dckpt config --check on the README's file" "$work/config.log"
echo "readme-test: the README's configuration file passes dckpt config --check"

# The main job, as the first block prints it.
line=$(block two-commands | grep '^scripts/demo.sh')
DCKPT_DEMO_DIR="$work/demo" bash -eo pipefail -c "$line" >"$work/demo.log" 2>&1 || fail "scripts/demo.sh" "$work/demo.log"
echo "readme-test: the main job, scripts/demo.sh, ran"

# Last: the build-tree lines, on the README's quick.c and quick.f90, in the repository.
block quick-c >quick.c
block quick-fortran >quick.f90
bash -eo pipefail -c "$(block build-tree)" >"$work/tree.log" 2>&1 || fail "the README's build-tree lines" "$work/tree.log"
for p in quick quick-f; do
    rm -rf /tmp/quick-ckpt-tree
    DCKPT_PERSISTENT=/tmp/quick-ckpt-tree timeout 120 mpirun -np 2 "./$p" >"$work/$p.log" 2>&1 || fail "$p built from the tree" "$work/$p.log"
    grep -q "done: field" "$work/$p.log" || fail "$p built from the tree did not finish" "$work/$p.log"
done
echo "readme-test: quick.c and quick.f90 built from the tree as printed, and run"
