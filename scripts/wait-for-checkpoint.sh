#!/usr/bin/env bash
# Waits until a checkpoint's commit part exists under DIR (a job's first
# checkpoint is stored, so its ranks have asked should_exit and watch the
# signals), at most SECONDS (default 30); exits 1 if none came.
#   scripts/wait-for-checkpoint.sh DIR [SECONDS]
set -euo pipefail
dir=${1:?a directory}
for _ in $(seq $(( ${2:-30} * 10 ))); do
    [ -n "$(find "$dir" -name 'v*.part' -print -quit 2>/dev/null)" ] && exit 0
    sleep 0.1
done
echo "wait-for-checkpoint: no checkpoint under $dir after ${2:-30} s" >&2
exit 1
