#!/usr/bin/env bash
# Installs dckpt for C, Fortran and the command line under a prefix:
#   bin/dckpt                          the command line
#   lib/libdckpt.so, lib/libdckpt.a    the C ABI (src/ffi)
#   lib/libdckpt_fortran.a             the Fortran module's procedures
#   include/dckpt.h, include/dckpt.mod the C header, the Fortran module (built with FC)
#   lib/pkgconfig/dckpt.pc, dckpt-fortran.pc
#   lib/cmake/dckpt/dckptConfig.cmake (+ Version): targets dckpt::dckpt, dckpt::fortran
#   share/dckpt/dckpt.f90              the module's source (for another Fortran compiler)
#
#   scripts/install.sh --prefix DIR [--no-build]
# Builds `cargo build --release` first (unless --no-build). FC (default: mpifort,
# else gfortran) compiles the Fortran module; without one, the Fortran parts are
# left out and it says so. Re-running replaces an earlier install.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
prefix="" build=1
while [ $# -gt 0 ]; do
    case $1 in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --no-build) build=0; shift ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$prefix" ] || { echo "install.sh: --prefix DIR is required" >&2; exit 2; }
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

if [ "$build" = 1 ]; then
    cargo build --release --quiet
fi
release=target/release
for f in "$release/dckpt" "$release/libdckpt.so" "$release/libdckpt.a"; do
    [ -f "$f" ] || { echo "install.sh: $f is missing (cargo build --release)" >&2; exit 1; }
    # A tests' build (--all-targets, --examples) has the crash points: never installed.
    ! grep -aq 'store.temp_written' "$f" ||
        { echo "install.sh: $f was built with the tests' crash points (feature failpoints): run without --no-build" >&2; exit 1; }
done

install -d "$prefix/bin" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/dckpt" "$prefix/include" "$prefix/share/dckpt"
install -m 755 "$release/dckpt" "$prefix/bin/dckpt"
install -m 755 "$release/libdckpt.so" "$prefix/lib/libdckpt.so"
install -m 644 "$release/libdckpt.a" "$prefix/lib/libdckpt.a"
install -m 644 src/ffi/dckpt.h "$prefix/include/dckpt.h"
install -m 644 src/ffi/dckpt.f90 "$prefix/share/dckpt/dckpt.f90"

# What a static link adds for Rust's standard library.
static_libs="-lgcc_s -lutil -lrt -lpthread -lm -ldl"
cat >"$prefix/lib/pkgconfig/dckpt.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: dckpt
Description: Collective, de-duplicated checkpoints of GPU and host memory for MPI simulations (C ABI)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -ldckpt
Libs.private: $static_libs
EOF

fortran=""
fc=${FC:-}
if [ -z "$fc" ]; then
    fc=$(command -v mpifort || command -v gfortran || true)
fi
if [ -n "$fc" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$fc" -O2 -c src/ffi/dckpt.f90 -J"$work" -o "$work/dckpt.o"
    ar rcs "$prefix/lib/libdckpt_fortran.a" "$work/dckpt.o"
    install -m 644 "$work/dckpt.mod" "$prefix/include/dckpt.mod"
    cat >"$prefix/lib/pkgconfig/dckpt-fortran.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: dckpt-fortran
Description: The dckpt Fortran module (use dckpt), built with $(basename "$fc")
Version: $version
Requires: dckpt = $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -ldckpt_fortran
EOF
    fortran="include/dckpt.mod and lib/libdckpt_fortran.a (built with $fc)"
fi

cat >"$prefix/lib/cmake/dckpt/dckptConfig.cmake" <<'EOF'
# dckpt's CMake package: find_package(dckpt) gives the imported targets
# dckpt::dckpt (the C ABI: dckpt.h, libdckpt.so) and, where the Fortran
# module was built, dckpt::fortran (use dckpt; links dckpt::dckpt).
get_filename_component(_dckpt_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET dckpt::dckpt)
  add_library(dckpt::dckpt SHARED IMPORTED)
  set_target_properties(dckpt::dckpt PROPERTIES
    IMPORTED_LOCATION "${_dckpt_prefix}/lib/libdckpt.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_dckpt_prefix}/include")
  if(EXISTS "${_dckpt_prefix}/lib/libdckpt_fortran.a")
    add_library(dckpt::fortran STATIC IMPORTED)
    set_target_properties(dckpt::fortran PROPERTIES
      IMPORTED_LOCATION "${_dckpt_prefix}/lib/libdckpt_fortran.a"
      INTERFACE_INCLUDE_DIRECTORIES "${_dckpt_prefix}/include"
      INTERFACE_LINK_LIBRARIES dckpt::dckpt)
  endif()
endif()
set(dckpt_INCLUDE_DIRS "${_dckpt_prefix}/include")
set(dckpt_LIBRARIES dckpt::dckpt)
unset(_dckpt_prefix)
EOF
cat >"$prefix/lib/cmake/dckpt/dckptConfigVersion.cmake" <<EOF
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  string(REGEX MATCH "^[0-9]+\\\\.[0-9]+" _have "\${PACKAGE_VERSION}")
  string(REGEX MATCH "^[0-9]+\\\\.[0-9]+" _want "\${PACKAGE_FIND_VERSION}")
  if(_have STREQUAL _want OR NOT PACKAGE_FIND_VERSION)
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
  else()
    set(PACKAGE_VERSION_COMPATIBLE FALSE)
  endif()
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
EOF

echo "installed dckpt $version under $prefix: bin/dckpt, lib/libdckpt.{so,a}, include/dckpt.h, pkg-config and CMake files"
if [ -n "$fortran" ]; then
    echo "  Fortran: $fortran"
else
    echo "  Fortran: left out (no mpifort or gfortran; set FC): the module's source is share/dckpt/dckpt.f90"
fi
echo "  use: export PKG_CONFIG_PATH=$prefix/lib/pkgconfig:\$PKG_CONFIG_PATH   (CMake: -DCMAKE_PREFIX_PATH=$prefix)"
