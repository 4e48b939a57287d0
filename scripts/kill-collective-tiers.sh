#!/usr/bin/env bash
# Kills one rank of a 2-rank `mpirun` at every step of a collective
# checkpoint through the tiers (local + shared), then checks that every
# version of every rank restores byte-exactly from every tier that lists it
# (or is absent), that a re-run proceeds, and that `verify` passes.
#   scripts/kill-collective-tiers.sh [DCKPT_BIN]    (default target/release/dckpt, built with
#   the crash points: cargo build --release --all-targets, or --features failpoints)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/dckpt}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
python3 - <<'PY'
import random
for v in range(1, 4):
    for r in range(2):
        shared = bytearray(random.Random(7).randbytes(1 << 20))
        rnd = random.Random(v)
        for _ in range(v * 5):
            at = rnd.randrange(0, (1 << 20) - 300)
            shared[at:at + 300] = rnd.randbytes(300)
        open(f"in-{v}-{r}", "wb").write(bytes(shared) + random.Random(100 + r).randbytes(1 << 20))
PY
# ckpt VERSION CRASH_RANK0 CRASH_RANK1 (an empty crash point: no crash)
ckpt() {
    local args=(checkpoint --collective --backend cpu --dir sh --local lo --version "$1" "in-$1-{rank}")
    timeout 120 mpirun --oversubscribe -np 1 env ${2:+DCKPT_CRASH_AT=$2} "$bin" "${args[@]}" : \
        -np 1 env ${3:+DCKPT_CRASH_AT=$3} "$bin" "${args[@]}" >/dev/null 2>&1
}
check() {
    for r in 0 1; do for v in 1 2 3; do for t in sh lo; do
        if "$bin" restore --dir $t --rank $r --version $v --output out.bin >/dev/null 2>&1; then
            cmp -s out.bin "in-$v-$r" || { echo "FAILED: $1: rank $r version $v on $t restores wrong bytes"; exit 1; }
        fi
    done; done; done
}
points="checkpoint.deduplicated checkpoint.cached collective.reduced store.temp_written store.renamed store.file_durable flush.durable:1 flush.durable:2"
for who in 0 1; do
    for p in $points; do
        rm -rf sh lo
        ckpt 1 "" "" || { echo "FAILED: version 1"; exit 1; }
        if [ "$who" = 0 ]; then ckpt 2 "$p" "" || true; else ckpt 2 "" "$p" || true; fi
        check "rank $who killed at $p"
        # The next version proceeds (version 2 again if it committed nowhere).
        ckpt 2 "" "" || ckpt 3 "" "" || { echo "FAILED: no checkpoint after rank $who was killed at $p"; exit 1; }
        check "after the re-run (rank $who killed at $p)"
        "$bin" verify --dir sh >/dev/null || { echo "FAILED: verify after rank $who was killed at $p"; exit 1; }
        echo "kill rank $who at $p: ok"
    done
done
