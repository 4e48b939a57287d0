#!/usr/bin/env bash
# Checks the log of one of the README's first programs run by its lines
# (install-test.sh: C and Fortran; readme-test.sh: Rust; python-test.sh:
# Python): killed at step 135 as asked, went on from step 130, the right field.
#   scripts/check-first-program.sh LOG WHAT FIELD    e.g. quick.log "C program" "field[6] = 600.0"
set -euo pipefail
log=$1 what=$2 field=$3
for want in "killed at step 135, as asked" "starting at step 130" "done: $field"; do
    grep -qF "$want" "$log" || { echo "FAILED: the README's $what: no '$want' in its output"; cat "$log"; exit 1; }
done
echo "the README's $what: killed at step 135, went on from step 130, $field"
