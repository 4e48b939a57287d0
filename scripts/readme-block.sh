#!/usr/bin/env bash
# Prints the README's fenced block that follows the marker
# `<!-- tested: NAME ...-->`, exactly as printed; fails when there is none.
# The scripts that run the README's snippets (install-test.sh,
# python-test.sh, readme-test.sh) take their text from here.
#   scripts/readme-block.sh NAME [README]
set -euo pipefail
name=${1:?usage: readme-block.sh NAME [README]}
readme=${2:-$(dirname "$0")/../README.md}
text=$(awk -v name="$name" '
    $0 ~ "<!-- tested: " name "[ >]" { armed = 1; next }
    armed && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' "$readme")
[ -n "$text" ] || { echo "readme-block.sh: README has no block marked $name" >&2; exit 1; }
printf '%s\n' "$text"
