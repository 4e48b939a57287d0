#!/usr/bin/env bash
# Scaling studies of whole checkpointing runs of the examples (each rank
# checkpoints through the runtime every EVERY steps, the asynchronous tiers
# on local directories), each run in three modes: collective (the default),
# local-only (DCKPT_COLLECTIVE=false) and Full (local-only, DCKPT_METHOD=full).
#   strong: heat and labels with a fixed state of TOTAL_ROWS x COLS split over P ranks;
#   weak:   ROWS_PER_RANK x COLS per rank (replicated: TABLE + LOCAL per rank);
#   chunk:  chunk sizes CHUNKS at SWEEP_RANKS ranks (weak sizes);
#   every:  checkpoint intervals EVERYS at SWEEP_RANKS ranks (weak sizes).
# One CSV (OUT/NAME.csv: the study, then dckpt::runtime::study's columns)
# and one PNG per example (OUT/NAME-EXAMPLE.png: overhead per step, stored
# bytes, ratios vs Full and vs local-only, time split, the sweeps).
#   scripts/scaling-study.sh [OUT]      (default docs/bench/scaling)
# Environment: EXAMPLES ("heat labels replicated"), MODES ("collective local
# full"), STUDIES ("strong weak chunk every"), RANKS ("1 2 4 8 16 32 64"),
# STEPS (60), EVERY (10), TOTAL_ROWS (1024), ROWS_PER_RANK (128), COLS (1024),
# TABLE (2M), LOCAL (256K), SWEEP_RANKS (4), CHUNKS ("64 128 512 4096"),
# EVERYS ("1 5 10 30"), NAME (devbox-cpu), BIN_DIR (target/release/examples),
# DEVICE (heat: auto | cpu | gpu), MPIRUN_FLAGS (placement: scripts/placement.sh), APPEND=1 (add to the CSV: several
# invocations with other sizes or examples), PLOT_ONLY=1 (redraw from the CSV),
# NO_PLOT=1 (only the CSV: on a machine without matplotlib, draw elsewhere),
# MACHINE and DATE (what each figure's title names besides the sizes; default
# this host with its cores and GPUs, and today: set both when redrawing the CSV
# of another machine or day). A NAME without NAME.csv but with the first
# study's NAME-strong.csv / NAME-weak.csv redraws NAME.png from those.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/bench/scaling}
name=${NAME:-devbox-cpu}
csv="$out/$name.csv"
bins=${BIN_DIR:-}
if [ -z "$bins" ]; then
    [ -n "${PLOT_ONLY:-}" ] || cargo build --release --quiet --examples
    bins=target/release/examples
fi
bins=$(realpath "$bins")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=scripts/placement.sh
. scripts/placement.sh
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
examples=${EXAMPLES:-heat labels replicated}
modes=${MODES:-collective local full}
studies=${STUDIES:-strong weak chunk every}
ranks=${RANKS:-1 2 4 8 16 32 64}
sweep_p=${SWEEP_RANKS:-4}
chunks=${CHUNKS:-64 128 512 4096}
everys=${EVERYS:-1 5 10 30}

# The runs: "study example mode ranks chunk every", one per line.
plan() {
    for ex in $examples; do
        for study in $studies; do
            for mode in $modes; do
                case $study in
                strong) [ "$ex" = replicated ] || for p in $ranks; do echo "strong $ex $mode $p 128 ${EVERY:-10}"; done ;;
                weak) for p in $ranks; do echo "weak $ex $mode $p 128 ${EVERY:-10}"; done ;;
                chunk) [ "$mode" = full ] || for c in $chunks; do echo "chunk $ex $mode $sweep_p $c ${EVERY:-10}"; done ;;
                every) for e in $everys; do echo "every $ex $mode $sweep_p 128 $e"; done ;;
                esac
            done
        done
    done
}

# The example's size arguments for a study at P ranks.
sizes() {
    local study=$1 ex=$2 p=$3
    case $ex in
    replicated) echo "--table ${TABLE:-2M} --local ${LOCAL:-256K}" ;;
    *)
        local rows=${ROWS_PER_RANK:-128}
        [ "$study" = strong ] && rows=$(( ${TOTAL_ROWS:-1024} / p ))
        echo "--rows $rows --cols ${COLS:-1024}"
        ;;
    esac
}

if [ -z "${PLOT_ONLY:-}" ]; then
    [ -n "${APPEND:-}" ] || rm -f "$csv"
    total=$(plan | wc -l)
    k=0
    while read -r study ex mode p chunk every; do
        k=$((k + 1))
        printf '[%3d/%d] %-6s %-10s %-10s %2s ranks, chunk %4s, every %2s ... ' "$k" "$total" "$study" "$ex" "$mode" "$p" "$chunk" "$every" >&2
        rm -rf "$work/run" "$work/line.csv"
        env_mode=()
        case $mode in
        local) env_mode=(DCKPT_COLLECTIVE=false) ;;
        full) env_mode=(DCKPT_COLLECTIVE=false DCKPT_METHOD=full) ;;
        esac
        device=()
        [ "$ex" = heat ] && [ -n "${DEVICE:-}" ] && device=(--device "$DEVICE")
        # shellcheck disable=SC2046
        env "${env_mode[@]}" DCKPT_CHUNK_SIZE="$chunk" timeout 900 $(mpirun_for "$p") "$bins/$ex" \
            --steps "${STEPS:-60}" --every "$every" $(sizes "$study" "$ex" "$p") --dir "$work/run" \
            --report "$work/line.csv" "${device[@]}" </dev/null >/dev/null
        [ -f "$csv" ] || echo "study,$(head -1 "$work/line.csv")" >"$csv"
        echo "$study,$(tail -1 "$work/line.csv")" >>"$csv"
        tail -1 "$work/line.csv" | awk -F, '{printf "%.2f ms/step, %.1fx less than Full\n", $19, $20}' >&2
    done < <(plan)
fi
[ -z "${NO_PLOT:-}" ] || { echo "wrote $csv (no plots: NO_PLOT)" >&2; exit 0; }

python3 -c 'import matplotlib' 2>/dev/null || pip install --quiet matplotlib >&2
# What each figure's title names: the machine (MACHINE; default this host, its cores and GPUs), the date of the
# run (a `date` column of the CSV where it has one, else DATE, else today: set both when redrawing another
# machine's CSV) and the sizes (from the CSV).
if [ -z "${MACHINE:-}" ]; then
    gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c |
        awk '{n = $1; $1 = ""; printf "%s%s ×%s", sep, n, $0; sep = ", "}' || true)
    MACHINE="$(hostname), $(nproc) cores${gpus:+, $gpus}"
fi
python3 - "$csv" "$out" "$name" "$MACHINE" "${DATE:-$(date -u +%F)}" <<'PY'
import csv, math, os, sys, textwrap
from collections import defaultdict
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

path, out, name, machine, date = sys.argv[1:6]
MODES = {"collective": "o-", "local": "s--", "full": "^:"}


def mib(b):
    b = float(b) / 2**20
    return f"{b / 1024:.3g} GiB" if b >= 1024 else f"{b:.3g} MiB"


def span(vals, unit=""):
    v = sorted(set(vals))
    return f"{v[0]:g}{unit}" if len(v) == 1 else f"{v[0]:g}–{v[-1]:g}{unit}"


def run_date(rows):
    dates = sorted({r["date"] for r in rows if r.get("date")})
    return (dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}") if dates else date


def figure(panels, head, sizes):
    """One figure of the panels that have data (at most 3 a row): its title names machine, date and sizes."""
    n = len(panels)
    ncols = 2 if n == 4 else min(3, n)
    nrows = math.ceil(n / ncols)
    fig = plt.figure(figsize=(5.4 * ncols, 4.3 * nrows + 0.9), layout="constrained")
    axs = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for a, draw in zip(axs, panels):
        draw(a)
        a.set_xscale("log", base=2)
        a.grid(True, alpha=0.3)
    for a in axs[n:]:
        fig.delaxes(a)
    width = int(5.4 * ncols * 11)  # characters a line at this font size
    fig.suptitle("\n".join(textwrap.wrap(head, width) + textwrap.wrap(sizes, width)), fontsize=11)
    return fig


def legacy(out, name):
    """The first heat-only study (OUT/NAME-strong.csv and OUT/NAME-weak.csv, one mode, before NAME.csv)."""
    data = {k: list(csv.DictReader(open(p))) for k in ("strong", "weak") if os.path.exists(p := f"{out}/{name}-{k}.csv")}
    if not data:
        sys.exit(f"no {path}, nor {out}/{name}-strong.csv or -weak.csv")
    every = [r for rows in data.values() for r in rows]
    sizes = []
    for kind, rows in data.items():
        r0 = min(rows, key=lambda r: int(r["ranks"]))
        cells = int(r0["rows_per_rank"]) * int(r0["ranks"]) * int(r0["cols"])
        sizes.append(f"{kind}: {int(r0['rows_per_rank']) * int(r0['ranks'])} × {r0['cols']} cells "
                     f"({mib(8 * cells)}) over {span(int(r['ranks']) for r in rows)} ranks" if kind == "strong" else
                     f"{kind}: {r0['rows_per_rank']} × {r0['cols']} cells ({mib(8 * cells)}) a rank, "
                     f"{span(int(r['ranks']) for r in rows)} ranks")
    sizes = "; ".join(sizes) + (f"; {span(int(r['steps']) for r in every)} steps, a checkpoint every "
                                f"{span(int(r['every']) for r in every)}")

    def overhead(a):
        for kind, marker in (("strong", "o"), ("weak", "s")):
            if kind in data:
                a.plot([int(r["ranks"]) for r in data[kind]], [float(r["overhead_per_step_ms"]) for r in data[kind]],
                       marker=marker, label=kind)
        a.set(xlabel="ranks", ylabel="ms per step", title="application-visible checkpoint overhead")
        a.legend()

    def split(a):
        for kind, marker in (("strong", "o"), ("weak", "s")):
            if kind in data:
                p = [int(r["ranks"]) for r in data[kind]]
                a.plot(p, [float(r["compute_s"]) for r in data[kind]], marker=marker, label=f"{kind}: compute")
                a.plot(p, [float(r["checkpoint_s"]) for r in data[kind]], marker=marker, linestyle="--",
                       label=f"{kind}: checkpoint calls")
        a.set(xlabel="ranks", ylabel="seconds (slowest rank)", title="time split")
        a.legend()

    def ratio(a):
        for kind, marker in (("strong", "o"), ("weak", "s")):
            if kind in data:
                a.plot([int(r["ranks"]) for r in data[kind]], [float(r["ratio_to_full"]) for r in data[kind]],
                       marker=marker, label=kind)
        a.set(xlabel="ranks", ylabel="protected / stored bytes", title="checkpoint size vs Full")
        a.legend()

    fig = figure([overhead, split, ratio], f"{name}: heat, checkpoint overhead — {machine}, {run_date(every)}", sizes)
    fig.savefig(f"{out}/{name}.png", dpi=110)
    print(f"wrote {out}/{name}.png")


if not os.path.exists(path):
    legacy(out, name)
    sys.exit(0)
rows = list(csv.DictReader(open(path)))
for r in rows:
    r.pop(None, None)  # a row longer than its header (a newer column appended to an older CSV)
per_ckpt = lambda r: int(r["stored_bytes"]) / max(1, int(r["checkpoints"]) * int(r["ranks"]))
for ex in sorted({r["example"] for r in rows}):
    mine = [r for r in rows if r["example"] == ex]
    of = lambda study, mode=None: [r for r in mine if r["study"] == study and mode in (None, r["mode"])]

    def series(study, mode, key, x="ranks"):
        pts = sorted((int(r[x]), r) for r in of(study, mode))
        return [p for p, _ in pts], [key(r) for _, r in pts]

    # Stored bytes and the time split come from the weak study, or the strong one where there is no weak.
    base = "weak" if of("weak") else "strong"
    panels = []

    def overhead(study):
        def draw(a):
            for mode, style in MODES.items():
                x, y = series(study, mode, lambda r: float(r["overhead_per_step_ms"]))
                if x:
                    a.plot(x, y, style, label=mode)
            a.set(title=f"{ex}: {study} scaling", xlabel="ranks", ylabel="checkpoint ms per step (app waits)")
            a.legend(loc="upper left", fontsize=8)
        return draw

    def stored(a):
        for mode, style in MODES.items():
            x, y = series(base, mode, per_ckpt)
            if x:
                a.plot(x, [v / 2**20 for v in y], style, label=mode)
        a.set(title=f"{ex}: stored per checkpoint and rank ({base})", xlabel="ranks", ylabel="MiB")
        a.legend(loc="upper left", fontsize=8)

    def ratios_and_split(a):
        # Full's stored bytes and local-only's over collective's, and the time split of the collective runs.
        by = defaultdict(dict)
        for r in of(base):
            by[int(r["ranks"])][r["mode"]] = int(r["stored_bytes"])
        ps = sorted(p for p in by if "collective" in by[p])
        for other, style in (("full", "^-"), ("local", "s-")):
            pts = [(p, by[p][other] / by[p]["collective"]) for p in ps if other in by[p]]
            if pts:
                a.plot([p for p, _ in pts], [v for _, v in pts], style, label=f"{other} / collective")
        ratios = bool(a.get_lines())
        if ratios:
            a.set(title=f"{ex}: bytes stored vs collective; time split ({base})", xlabel="ranks",
                  ylabel="stored / collective's")
            a.legend(loc="upper left", fontsize=8)
        x, split = series(base, "collective", lambda r: r)
        t = a.twinx() if ratios else a
        dedup = [float(r["dedup_s"]) for r in split]
        reduce = [float(r["reduce_s"]) for r in split]
        first = [float(r["first_call_s"]) for r in split]
        rest = [max(0.0, float(r["checkpoint_s"]) - d - e - f) for r, d, e, f in zip(split, dedup, reduce, first)]
        drain = [float(r["drain_s"]) for r in split]
        t.stackplot(x, dedup, reduce, first, rest, drain, alpha=0.25,
                    labels=["de-dup", "reduction", "first call", "rest of calls", "drain at finalize"])
        t.set_ylabel("seconds (collective, slowest rank)")
        t.legend(loc="upper right", fontsize=7)
        if not ratios:
            a.set(title=f"{ex}: time split of the collective runs ({base})", xlabel="ranks")

    def sweep(study, key, xlabel):
        def draw(a):
            for mode, style in MODES.items():
                x, y = series(study, mode, lambda r: float(r["overhead_per_step_ms"]), key)
                if x:
                    a.plot(x, y, style, label=f"{mode}: ms/step")
            a.set(title=f"{ex}: {xlabel} ({span(int(r['ranks']) for r in of(study))} ranks)", xlabel=xlabel,
                  ylabel="ms per step")
            a.legend(loc="upper left", fontsize=8)
            if study == "chunk":  # the chunk sweep's stored bytes on a second axis
                t2 = a.twinx()
                for mode, style in MODES.items():
                    x, y = series(study, mode, per_ckpt, key)
                    if x:
                        t2.plot(x, [v / 2**20 for v in y], style, alpha=0.4, color="gray")
                t2.set_ylabel("MiB stored per checkpoint and rank (gray)")
        return draw

    for study in ("strong", "weak"):
        if of(study):
            panels.append(overhead(study))
    if of(base):
        panels.append(stored)
    if of(base, "collective"):
        panels.append(ratios_and_split)
    if of("chunk"):
        panels.append(sweep("chunk", "chunk_size", "chunk bytes"))
    if of("every"):
        panels.append(sweep("every", "every", "steps between checkpoints"))
    if not panels:
        continue

    # The sizes, from the CSV: state, ranks, sweeps, steps, interval and chunk of the strong and weak runs.
    sizes = []
    if of("strong"):
        r0 = min(of("strong"), key=lambda r: int(r["ranks"]))
        sizes.append(f"strong: {mib(int(r0['state_bytes_per_rank']) * int(r0['ranks']))} split over "
                     f"{span(int(r['ranks']) for r in of('strong'))} ranks")
    if of("weak"):
        state = sorted({int(r["state_bytes_per_rank"]) for r in of("weak")})
        sizes.append(f"weak: {'–'.join(mib(b) for b in sorted({state[0], state[-1]}))} a rank, "
                     f"{span(int(r['ranks']) for r in of('weak'))} ranks")
    if of("chunk"):
        sizes.append(f"chunk sweep {span((int(r['chunk_size']) for r in of('chunk')), ' B')} at "
                     f"{span(int(r['ranks']) for r in of('chunk'))} ranks")
    if of("every"):
        sizes.append(f"interval sweep {span(int(r['every']) for r in of('every'))} steps at "
                     f"{span(int(r['ranks']) for r in of('every'))} ranks")
    sw = of("strong") + of("weak")
    if sw:
        sizes.append(f"chunk {span((int(r['chunk_size']) for r in sw), ' B')}, a checkpoint every "
                     f"{span(int(r['every']) for r in sw)} steps")
    sizes.append(f"{span(int(r['steps']) for r in mine)} steps; modes "
                 + ", ".join(m for m in (*MODES, *sorted({r['mode'] for r in mine} - set(MODES)))
                             if m in {r['mode'] for r in mine}))
    head = f"{name}: {ex}, whole checkpointing runs — {machine}, {run_date(mine)}"
    fig = figure(panels, head, "; ".join(sizes))
    fig.savefig(f"{out}/{name}-{ex}.png", dpi=100)
    print(f"wrote {out}/{name}-{ex}.png")
print(f"wrote {path}")
PY
