#!/usr/bin/env bash
# The README's install lines, run exactly as printed: the blocks after the
# markers `<!-- tested: install-pkg-config -->`, `install-cmake` (a
# CMakeLists.txt) and `install-cmake-build`, and the first screen's C
# program (`quick-c`, saved as quick.c) with its lines (`quick-c-run`: built,
# killed at step 135, run again: it must start at step 130) and the same in
# Fortran (`quick-fortran`, `quick-fortran-run`), in a scratch directory that
# holds the repository's `scripts` and `examples` (links) and whose HOME is
# its own (so `$HOME/.local` is scratch too). The heat examples built each
# way must run and print their plate's digest, the same for C and CMake.
#   scripts/install-test.sh      (after cargo build --release; CMake needed)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
command -v cmake >/dev/null || { echo "install-test: cmake not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d)
trap 'rm -rf "$work" /tmp/ckpt-c /tmp/ckpt-f /tmp/ckpt-cmake /tmp/quick-ckpt /tmp/quick-ckpt-f' EXIT
rm -rf /tmp/ckpt-c /tmp/ckpt-f /tmp/ckpt-cmake /tmp/quick-ckpt /tmp/quick-ckpt-f

# The fenced block after the marker `<!-- tested: NAME ...-->`.
block() { "$repo/scripts/readme-block.sh" "$1" "$repo/README.md"; }
for name in install-pkg-config install-cmake install-cmake-build quick-c quick-c-run quick-fortran quick-fortran-run; do
    block "$name" >/dev/null || exit 1
done

# cargo and rustup keep their homes when HOME changes.
export CARGO_HOME=${CARGO_HOME:-$HOME/.cargo} RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}
mkdir -p "$work/home" "$work/project"
ln -s "$repo/scripts" "$work/project/scripts"
ln -s "$repo/examples" "$work/project/examples"
cd "$work/project"
HOME="$work/home" bash -eo pipefail -c "$(block install-pkg-config)" >"$work/pkg.log" 2>&1 ||
    { echo "FAILED: the README's pkg-config lines"; cat "$work/pkg.log"; exit 1; }
c_digest=$(grep -o 'heat-c: .*digest [0-9a-f]*' "$work/pkg.log" | grep -o '[0-9a-f]*$') ||
    { echo "FAILED: heat-c built with pkg-config printed no digest"; cat "$work/pkg.log"; exit 1; }
grep -q 'heat-f: .*digest' "$work/pkg.log" || { echo "FAILED: heat-f built with pkg-config printed no digest"; exit 1; }
echo "install-test: scripts/install.sh, then pkg-config: heat-c and heat-f built and run (digest $c_digest)"
# The installed library is built without the feature `failpoints`: no crash point's name in it.
for f in "$work/home/.local/lib/libdckpt.so" "$work/home/.local/lib/libdckpt.a" "$work/home/.local/bin/dckpt"; do
    [ -f "$f" ] || { echo "FAILED: $f was not installed"; exit 1; }
    ! grep -aq 'store.temp_written' "$f" || { echo "FAILED: $f has the crash points (feature failpoints)"; exit 1; }
done
echo "install-test: the installed library and command have no crash points"

mkdir -p "$work/cmake"
cd "$work/cmake"
block install-cmake >CMakeLists.txt
cp "$repo/examples/c/heat.c" "$repo/examples/fortran/heat.f90" .
HOME="$work/home" bash -eo pipefail -c "$(block install-cmake-build)" >"$work/cmake.log" 2>&1 ||
    { echo "FAILED: the README's CMake lines"; cat "$work/cmake.log"; exit 1; }
got=$(grep -o 'heat-c: .*digest [0-9a-f]*' "$work/cmake.log" | grep -o '[0-9a-f]*$') ||
    { echo "FAILED: heat-c built with CMake printed no digest"; cat "$work/cmake.log"; exit 1; }
[ "$got" = "$c_digest" ] || { echo "FAILED: heat-c built with CMake: digest $got, with pkg-config $c_digest"; exit 1; }
[ -x build/heat-f ] || { echo "FAILED: CMake did not build heat-f (dckpt::fortran)"; exit 1; }
echo "install-test: find_package(dckpt): heat-c and heat-f built, heat-c run (the same digest)"

# The first screen: the C program, built, killed at step 135, run again.
mkdir -p "$work/quick"
cd "$work/quick"
ln -s "$repo/scripts" scripts
block quick-c >quick.c
HOME="$work/home" bash -eo pipefail -c "$(block quick-c-run)" >"$work/quick.log" 2>&1 ||
    { echo "FAILED: the README's first C program"; cat "$work/quick.log"; exit 1; }
"$repo/scripts/check-first-program.sh" "$work/quick.log" "first C program" "field[6] = 600.0"

# The same program in Fortran, with the module the first program's install put in place.
block quick-fortran >quick.f90
HOME="$work/home" bash -eo pipefail -c "$(block quick-fortran-run)" >"$work/quick-f.log" 2>&1 ||
    { echo "FAILED: the README's Fortran program"; cat "$work/quick-f.log"; exit 1; }
"$repo/scripts/check-first-program.sh" "$work/quick-f.log" "Fortran program" "field(7) = 600.0"
