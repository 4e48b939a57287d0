#!/usr/bin/env bash
# Measures the collective step under mpirun and writes CSV + a PNG plot:
#  - the reduction alone (the top-K merger up a binomial tree + MPI_Bcast) vs K
#    and ranks, worst case (all digests unique) and best case (all shared),
#    as in Figures 2 and 3 of Nicolae (IPDPS'13);
#  - a mixed workload (half of each rank's buffer replicated): collective vs
#    local-only vs Full, total and per-rank stored bytes and time.
#
#   scripts/bench-collective.sh [OUT_DIR]           (default docs/bench/collective)
#   scripts/bench-collective.sh --plot OUT_DIR      only redraw the plot from OUT_DIR/reduce.csv
# Environment (empty = skip that part): RANKS ("1 2 4 8 16 32 64"), KS (2^14..2^18), CASES ("unique shared"),
# REPEAT (3), MIXED_RANKS ("1 2 4"), MIXED_SIZE (32M), MIXED_BACKEND (cpu; auto|cuda), MIXED_TIERED (a host cache
# size per rank, e.g. 2G: the mixed workload also through the asynchronous tiers), DCKPT_BIN (target/release/dckpt;
# set it on a machine without cargo), NO_PLOT=1 to skip the plot; the plot's title: MACHINE (default this host,
# its cores and GPUs), DATE (of the run, default today; set both with --plot for another machine's CSV) or
# HOST_LABEL (both in one), REDUCTION (what was measured; default the binomial tree).
set -euo pipefail
cd "$(dirname "$0")/.."
plot_only=0
if [ "${1:-}" = "--plot" ]; then plot_only=1; shift; fi
out=${1:-docs/bench/collective}
ranks=${RANKS-"1 2 4 8 16 32 64"}
ks=${KS:-"16384 32768 65536 131072 262144"}
cases=${CASES:-"unique shared"}
repeat=${REPEAT:-3}
mixed_ranks=${MIXED_RANKS-"1 2 4"}
mixed_size=${MIXED_SIZE:-32M}
bin=${DCKPT_BIN:-}
if [ "$plot_only" = 1 ]; then
    :
elif [ -z "$bin" ]; then
    cargo build --release --quiet --bin dckpt
    bin=target/release/dckpt
fi
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
# shellcheck source=scripts/placement.sh
. scripts/placement.sh
# What the plot's title names (MACHINE, DATE or HOST_LABEL, REDUCTION: see the header).
if [ -z "${MACHINE:-}" ]; then
    gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c |
        awk '{n = $1; $1 = ""; printf "%s%s ×%s", sep, n, $0; sep = ", "}' || true)
    MACHINE="$(hostname) ($cores cores${gpus:+, $gpus})"
fi
host=${HOST_LABEL:-"$MACHINE, ${DATE:-$(date -u +%Y-%m-%d)}"}
reduction=${REDUCTION:-"binomial-tree reduction (point-to-point merges) + MPI_Bcast"}
reduce_csv="$out/reduce.csv"
mixed_csv="$out/mixed.csv"
if [ "$plot_only" = 0 ]; then

echo "ranks,threshold,case,min_seconds,median_seconds,merged_entries,wire_bytes,oversubscribed" >"$reduce_csv"
for np in $ranks; do
    for k in $ks; do
        for c in $cases; do
            line=$($(mpirun_for "$np") "$bin" bench-collective --workload reduce --threshold "$k" --case "$c" --repeat "$repeat")
            python3 - "$line" "$np" "$cores" >>"$reduce_csv" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
over = int(sys.argv[2]) > int(sys.argv[3])
print(f"{r['ranks']},{r['threshold']},{r['case']},{r['min_seconds']:.6f},{r['median_seconds']:.6f},{r['merged_entries']},{r['wire_bytes']},{int(over)}")
PY
            tail -n 1 "$reduce_csv"
        done
    done
done

echo "ranks,mode,backend,tiered_cache,total_stored_bytes,max_rank_bytes,min_rank_bytes,seconds,local_seconds,offer_seconds,reduce_seconds,drain_seconds,version_seconds,size_per_rank,shared_fraction,change,versions" >"$mixed_csv"
for np in $mixed_ranks; do
    for tiered in "" ${MIXED_TIERED:-}; do
        line=$($(mpirun_for "$np") "$bin" bench-collective --workload mixed --size "$mixed_size" --backend "${MIXED_BACKEND:-cpu}" \
            --shared-fraction 0.5 --change 0.01 --versions 5 --dir "${TMPDIR:-/tmp}/dckpt-bench-collective" \
            ${tiered:+--tiered "$tiered"})
        python3 - "$line" >>"$mixed_csv" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); p = r["params"]
cache = p.get("tiered_cache_bytes") or 0
for m in r["modes"]:
    print(f"{r['ranks']},{m['mode']},{m['backend']},{cache},{m['total_stored_bytes']},{m['max_rank_bytes']},{m['min_rank_bytes']},{m['seconds']:.4f},{m['local_seconds']:.4f},{m['offer_seconds']:.4f},{m['reduce_seconds']:.4f},{m['drain_seconds']:.4f},{' '.join(f'{x:.4f}' for x in m['version_seconds'])},{p['size']},{p['shared_fraction']},{p['change']},{p['versions']}")
PY
    done
done
rm -rf "${TMPDIR:-/tmp}/dckpt-bench-collective"
cat "$mixed_csv"
fi

[ "${NO_PLOT:-0}" = 1 ] && exit 0
if [ ! -f "$reduce_csv" ] || [ "$(wc -l <"$reduce_csv")" -le 1 ]; then
    echo "no reduction measured in $reduce_csv: no plot" >&2
    exit 0
fi
command -v gnuplot >/dev/null 2>&1 || DCKPT_APT_PACKAGES="gnuplot-nox" scripts/install-deps.sh
# The data files for gnuplot beside the CSV, and the gnuplot program: one panel a case (columns) and x axis
# (rows: vs K, vs ranks) that the CSV has more than one value of.
python3 - "$reduce_csv" "$out" "$reduction" "$host" <<'PY' | gnuplot
import csv, sys, collections, textwrap
path, out, reduction, host = sys.argv[1:5]
rows = list(csv.DictReader(open(path)))
by_k = collections.defaultdict(dict)   # case -> {(ranks, k): t}
for r in rows:
    by_k[r["case"]][(int(r["ranks"]), int(r["threshold"]))] = float(r["median_seconds"])
ranks = sorted({int(r["ranks"]) for r in rows}); ks = sorted({int(r["threshold"]) for r in rows})
for case, d in by_k.items():
    with open(f"{out}/reduce-{case}-vs-k.dat", "w") as f:
        f.write("K " + " ".join(f"P{p}" for p in ranks) + "\n")
        for k in ks:
            f.write(f"{k} " + " ".join(f"{d.get((p, k), float('nan')):.6f}" for p in ranks) + "\n")
    with open(f"{out}/reduce-{case}-vs-p.dat", "w") as f:
        f.write("P " + " ".join(f"K{k}" for k in ks) + "\n")
        for p in ranks:
            f.write(f"{p} " + " ".join(f"{d.get((p, k), float('nan')):.6f}" for k in ks) + "\n")

def q(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

over = sorted(int(r["ranks"]) for r in rows if r.get("oversubscribed") == "1")
sizes = (f"K = {', '.join(map(str, ks))} entries a rank; P = {', '.join(map(str, ranks))} ranks"
         + (f" (more ranks than cores from P = {over[0]})" if over else "")
         + "; median of the repetitions, the slowest rank's time")
cases = sorted(by_k, key=lambda c: (c != "unique", c != "shared", c))
label = {"unique": "worst case: all digests unique", "shared": "best case: all digests shared"}
axes = [a for a, n in (("k", len(ks)), ("p", len(ranks))) if n > 1] or ["k"]
width = max(700 * len(cases), 1000)
print(f"set terminal pngcairo size {width},{500 * len(axes) + 100} font \",11\" noenhanced")
print(f"set output {q(out + '/reduce.png')}")
lines = [f"dckpt collective reduction: {reduction}, median seconds", host, sizes]
title = "\n".join(w for line in lines for w in textwrap.wrap(line, width // 8))  # about 8 pixels a character
print(f"set multiplot layout {len(axes)},{len(cases)} rowsfirst title {q(title)}")
print("set key left top; set grid; set logscale x 2")
for a in axes:
    if a == "k":
        print('set xlabel "K (entries per rank)"; set ylabel "seconds"; set logscale y; set yrange [*:*]')
    else:
        print('set xlabel "ranks"; set ylabel "seconds"; unset logscale y; set yrange [0:*]')
    for c in cases:
        what = label.get(c, f"case {c}")
        if a == "p":
            what = what.split(":")[0] + " vs ranks" + (" (log2 x, linear y: a straight line is logarithmic growth)"
                                                        if c == cases[0] else "")
        n = len(ranks) if a == "k" else len(ks)
        print(f"set title {q(what)}")
        print(f"plot for [i=2:{n + 1}] {q(f'{out}/reduce-{c}-vs-{a}.dat')} using 1:i with linespoints title columnhead(i)")
print("unset multiplot")
PY
echo "wrote $reduce_csv, $mixed_csv and $out/reduce.png"
