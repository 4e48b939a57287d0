#!/usr/bin/env bash
# Installs the system packages dckpt's build and tests need, only those
# missing (idempotent: nothing runs when `dpkg -s` finds them all):
#   libopenmpi-dev openmpi-bin  MPI for the collective layer (rsmpi) and mpirun
#   libclang-dev                rsmpi's bindgen
#   pkg-config                  finding the MPI library
#   gfortran                    the Fortran example and module (mpifort)
#   cmake                       the install test (find_package(dckpt))
# Override the list with DCKPT_APT_PACKAGES (e.g. "libmpich-dev mpich ..." for MPICH).
set -euo pipefail
packages=${DCKPT_APT_PACKAGES:-"libopenmpi-dev openmpi-bin libclang-dev pkg-config gfortran cmake python3-venv"}
command -v dpkg >/dev/null 2>&1 || { echo "install-deps: not a Debian/Ubuntu system; install: $packages" >&2; exit 0; }
missing=()
for p in $packages; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
$sudo_cmd apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
