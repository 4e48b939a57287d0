#!/usr/bin/env python3
"""The scaling study's plots (scripts/scaling-study.sh), and the rules every committed plot keeps (issue #45).

  scripts/plot-scaling.py CSV [--out DIR] [--name NAME] [--machine TEXT] [--date YYYY-MM-DD]
      One PNG per example of the study's CSV: OUT/NAME-EXAMPLE.png (OUT: the CSV's folder, NAME: its stem).
      Where CSV does not exist but OUT/NAME-strong.csv or OUT/NAME-weak.csv does (the first, heat-only
      study): OUT/NAME.png. The title names the machine (--machine), the date (the CSV's `date` column, else
      --date, else today) and the sizes (from the CSV).
  scripts/plot-scaling.py --committed
      Redraws every committed plot of docs/bench/scaling and docs/bench/gpu-cache from its committed CSV,
      with the machine and date of COMMITTED below (cost-model.png: scripts/cost-model.py).
  scripts/plot-scaling.py --check
      Draws the figures of every committed CSV and the cost model's in memory (nothing is written) and
      checks the rules below on the figure objects; first it checks that the checker fails a figure that
      breaks each rule, and that every committed PNG is in COMMITTED. Exit 1 on a broken rule.

The rules (check()): an axis whose lines span more than 10x is logarithmic; tick labels are plain numbers
(1, 2, 4, 8, 0.01; no 2^k, 10^k, offset or exponent), at least two on every axis with data; the figure's
title is at most two lines, fits the figure's width and names a date; every line is visible (not hidden,
inside the view, not covered by a line drawn over it through the same points).

Python dependencies: matplotlib and numpy, in a virtual environment of their own, target/plot-venv. Run
with any python3, this script re-executes itself there, creating it (`python3 -m venv`) and pip-installing
matplotlib and numpy into it when they are missing; nothing is installed into the system's python. Exit
77 (and why) when the environment cannot be made or matplotlib cannot be installed (no network).
"""
import argparse
import csv
import datetime
import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "target" / "plot-venv"
NEEDS = ("matplotlib", "numpy")
SKIP = 77  # matplotlib cannot be had here


def in_venv():
    try:
        return Path(sys.prefix).resolve() == VENV.resolve()
    except OSError:
        return False


def ensure_venv():
    """Re-executes the running script (sys.argv) under target/plot-venv, made and filled when needed."""
    if in_venv():
        return
    py = VENV / "bin" / "python"

    def works(*args):
        return py.exists() and subprocess.run([str(py), *args], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL).returncode == 0

    def give_up(why):
        print(f"plot-scaling: {why}; no plots (matplotlib cannot be had)", file=sys.stderr)
        sys.exit(SKIP)

    if not works("-c", "import " + ", ".join(NEEDS)):
        if not works("-m", "pip", "--version"):  # none yet, or one left without pip (no ensurepip)
            shutil.rmtree(VENV, ignore_errors=True)
            r = subprocess.run([sys.executable, "-m", "venv", str(VENV)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
            if r.returncode != 0 or not works("-m", "pip", "--version"):
                shutil.rmtree(VENV, ignore_errors=True)
                give_up(f"`{sys.executable} -m venv {VENV}` failed (Debian: apt-get install python3-venv): "
                        + " ".join(r.stderr.strip().splitlines()[-1:]))
        print(f"plot-scaling: installing {' '.join(NEEDS)} into {VENV}", file=sys.stderr)
        r = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--timeout", "10", "--retries", "1", *NEEDS], stdout=subprocess.DEVNULL)
        if r.returncode != 0:
            give_up(f"pip could not install {' '.join(NEEDS)} into {VENV} (no network?)")
    os.execv(str(py), [str(py), sys.argv[0], *sys.argv[1:]])


ensure_venv()
sys.modules.setdefault("plot_scaling", sys.modules[__name__])  # scripts/cost-model.py shares this module

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402

# What a committed plot's title names: (folder, NAME, machine, date). The machine says what BENCHMARKS.md's
# section of the run says; the CSVs measured before the `date` column have the date here.
COMMITTED = [
    ("docs/bench/scaling", "devbox-cpu", "2-core development VM, CPU backend, oversubscribed beyond 2 ranks",
     "2026-11-23"),
    ("docs/bench/scaling", "h100-gpu", "one H100 80GB (nvidia-h100-x1, 16 cores), the plate in GPU memory",
     "2026-11-23"),
    ("docs/bench/scaling", "h100", "one H100 80GB (nvidia-h100-x1, 16 cores), ranks placed", "2026-11-24"),
    ("docs/bench/scaling", "h100-cpu", "the H100's 16-core host, CPU backend, oversubscribed beyond 16 ranks",
     "2026-11-24"),
    ("docs/bench/scaling", "h200x2", "2 × H200 (nvidia-h200-x2, 32 cores), 1–2 ranks bound to one core",
     "2026-11-24"),
    ("docs/bench/scaling", "h200x2-placed", "2 × H200 (nvidia-h200-x2, 32 cores), ranks placed", "2026-11-24"),
    ("docs/bench/scaling", "h200x2-1128-cpu", "the 2 × H200 host's 32 cores, CPU backend", "2026-11-28"),
    ("docs/bench/scaling", "h200x2-1128-gpu", "2 × H200 (nvidia-h200-x2, 32 cores)", "2026-11-28"),
    ("docs/bench/scaling", "h200x4-gpu", "4 × H200 (nvidia-h200-x4, 64 cores)", "2026-11-28"),
    ("docs/bench/gpu-cache/h100-collective", "h100-gpucache",
     "one H100 80GB (nvidia-h100-x1, 16 cores), GPU cache tier on", "2026-11-23"),
    ("docs/bench/gpu-cache/h100-collective", "h100-nocache",
     "one H100 80GB (nvidia-h100-x1, 16 cores), no GPU cache tier", "2026-11-23"),
]
OTHER_PNGS = {"docs/bench/scaling/cost-model.png"}  # drawn by scripts/cost-model.py

# One look a mode everywhere: the collective line wide and filled under local-only's hollow squares and
# Full's hollow triangles, so that lines through the same points all show.
STYLE = {
    "collective": dict(color="C0", marker="o", ls="-", lw=2.4, ms=6, zorder=3),
    "local": dict(color="C1", marker="s", ls="--", lw=1.6, ms=10, mfc="none", mew=1.6, zorder=4),
    "full": dict(color="C2", marker="^", ls=":", lw=2.0, ms=10, mfc="none", mew=1.6, zorder=5),
}
LEGACY = {"strong": STYLE["collective"], "weak": STYLE["local"]}


# --- axes that people read ---------------------------------------------------------------------------

def plain(v, _pos=None):
    """A tick label as a plain number: 1, 2, 4, 4096, 0.25, 0.001."""
    if v == 0:
        return "0"
    return np.format_float_positional(v, precision=6, unique=True, trim="-").replace("-", "−")


def line_data(ax, which):
    """The finite x or y values of the axes' lines (not those with gid "guide": a reference, not data)."""
    vals = [np.asarray(ln.get_xdata() if which == "x" else ln.get_ydata(), float) for ln in ax.lines
            if ln.get_visible() and ln.get_gid() != "guide"]
    vals = np.concatenate(vals) if vals else np.array([])
    return vals[np.isfinite(vals)]


def wide(vals):
    """Values that want a logarithmic axis: all positive, the largest over 10 times the smallest."""
    return len(vals) > 0 and vals.min() > 0 and vals.max() / vals.min() > 10


def log_y(ax):
    """A logarithmic y axis from a labelled tick below the lowest point to one above the highest."""
    ys = line_data(ax, "y")
    pos = ys[ys > 0]
    subs = (1, 2, 5) if pos.max() / pos.min() < 300 else (1,)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=np.arange(2, 10)))
    ticks = [s * 10.0**e for e in range(math.floor(math.log10(pos.min())) - 1, math.ceil(math.log10(pos.max())) + 2)
             for s in subs]
    ax.set_ylim(max(t for t in ticks if t <= pos.min() / 1.1), min(t for t in ticks if t >= pos.max() * 1.1))


def finish(ax, xs=None, legend=True, **legend_kw):
    """Ticks at the measured x values `xs` (log base 2 where they span 4x or more), y logarithmic where the
    lines span more than 10x, every label plain; grid and legend."""
    if xs is not None and len(xs):
        xs = sorted(set(float(x) for x in xs))
        if xs[-1] / max(xs[0], 1e-300) >= 4:
            ax.set_xscale("log", base=2)
            ax.set_xlim(xs[0] / 1.3, xs[-1] * 1.3)
        ax.xaxis.set_major_locator(FixedLocator(xs))
        ax.xaxis.set_minor_locator(NullLocator())
    if ax.get_yscale() == "linear" and wide(line_data(ax, "y")):
        log_y(ax)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(plain))
        axis.set_minor_formatter(NullFormatter())
    ax.grid(True, alpha=0.3)
    unhide(ax)
    if legend:
        ax.legend(**{"fontsize": 8, "loc": "best", **legend_kw})


def unhide(ax, extra=2.5):
    """A line that one drawn over it covers (the same points, a line as wide) is made wider beneath it, so
    that both show: a thin line inside a wider one of another colour."""
    data = [ln for ln in ax.lines if ln.get_gid() != "guide"]
    order = sorted(range(len(data)), key=lambda k: (data[k].get_zorder(), k))
    pix = {k: pixels(ax, data[k]) for k in order}
    for a in reversed(range(len(order))):  # from the top down: three lines through the same points, three widths
        low = data[order[a]]
        for t in order[a + 1:]:
            if covers(data[t], low, pix[order[a]], pix[t], tol=2.5):
                low.set_linewidth(data[t].get_linewidth() + extra)
                break


def figure(panels, title):
    """One figure of the panels (functions drawing one axes each), 1 to 4 a row; `title`: two lines at most."""
    n = len(panels)
    ncols = {1: 1, 2: 2, 3: 3, 4: 2, 5: 3, 6: 3}.get(n, 4)
    nrows = math.ceil(n / ncols)
    fig = plt.figure(figsize=(5.0 * ncols, 4.0 * nrows + 0.7), layout="constrained")
    axs = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for a, draw in zip(axs, panels):
        draw(a)
    for a in axs[n:]:
        fig.delaxes(a)
    suptitle(fig, title)
    return fig


def suptitle(fig, lines, size=11):
    """The title, its font made smaller (down to 8 points) until each line fits the figure's width."""
    t = fig.suptitle("\n".join(lines), fontsize=size)
    r = fig.canvas.get_renderer()
    while size > 8 and t.get_window_extent(r).width > 0.98 * fig.bbox.width:
        size -= 0.5
        t.set_fontsize(size)
    return t


# --- the study's figures -----------------------------------------------------------------------------

def mib(b):
    b = float(b) / 2**20
    return f"{b / 1024:.3g} GiB" if b >= 1024 else f"{b:.3g} MiB"


def span(vals, unit=""):
    v = sorted(set(vals))
    return f"{v[0]:g}{unit}" if len(v) == 1 else f"{v[0]:g}–{v[-1]:g}{unit}"


def run_date(rows, date):
    dates = sorted({r["date"] for r in rows if r.get("date")})
    return (dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}") if dates else date


def legacy(out, name, machine, date):
    """The first heat-only study (OUT/NAME-strong.csv and OUT/NAME-weak.csv, one mode, before NAME.csv)."""
    data = {k: list(csv.DictReader(open(p))) for k in ("strong", "weak")
            if (p := Path(out) / f"{name}-{k}.csv").exists()}
    if not data:
        sys.exit(f"plot-scaling: no {out}/{name}.csv, nor {out}/{name}-strong.csv or -weak.csv")
    every = [r for rows in data.values() for r in rows]
    sizes = []
    for kind, rows in data.items():
        r0 = min(rows, key=lambda r: int(r["ranks"]))
        cells = int(r0["rows_per_rank"]) * int(r0["ranks"]) * int(r0["cols"])
        ranks = span(int(r["ranks"]) for r in rows)
        sizes.append(f"strong: {int(r0['rows_per_rank']) * int(r0['ranks'])} × {r0['cols']} cells ({mib(8 * cells)}) "
                     f"over {ranks} ranks" if kind == "strong" else
                     f"{kind}: {r0['rows_per_rank']} × {r0['cols']} cells ({mib(8 * cells)}) a rank, {ranks} ranks")
    sizes.append(f"{span(int(r['steps']) for r in every)} steps, a checkpoint every "
                 f"{span(int(r['every']) for r in every)}")

    def xs(rows):
        return [int(r["ranks"]) for r in rows]

    def overhead(a):
        for kind, rows in data.items():
            a.plot(xs(rows), [float(r["overhead_per_step_ms"]) for r in rows], **LEGACY[kind], label=kind)
        a.set(xlabel="ranks", ylabel="ms per step", title="application-visible checkpoint overhead")
        finish(a, xs(every))

    def split(a):
        for kind, rows in data.items():
            for col, what, ls in (("compute_s", "compute", "-"), ("checkpoint_s", "checkpoint calls", "--")):
                a.plot(xs(rows), [float(r[col]) for r in rows], **dict(LEGACY[kind], ls=ls), label=f"{kind}: {what}")
        a.set(xlabel="ranks", ylabel="seconds (slowest rank)", title="time split")
        finish(a, xs(every))

    def ratio(a):
        for kind, rows in data.items():
            a.plot(xs(rows), [float(r["ratio_to_full"]) for r in rows], **LEGACY[kind], label=kind)
        a.set(xlabel="ranks", ylabel="Full's bytes ÷ stored bytes", title="checkpoint size vs Full")
        finish(a, xs(every))

    title = [f"{name}: heat — {machine}, {run_date(every, date)}", "; ".join(sizes)]
    return {f"{name}.png": figure([overhead, split, ratio], title)}


def figures(path, machine, date, name=None):
    """{file name: figure} of the study's CSV at `path` (or of the legacy CSVs beside it)."""
    path = Path(path)
    name = name or path.stem
    if not path.exists():
        return legacy(path.parent, name, machine, date)
    rows = list(csv.DictReader(open(path)))
    for r in rows:
        r.pop(None, None)  # a row longer than its header (a newer column appended to an older CSV)
    out = {}
    for ex in sorted({r["example"] for r in rows}):
        fig = example_figure(rows, ex, name, machine, date)
        if fig:
            out[f"{name}-{ex}.png"] = fig
    return out


def example_figure(rows, ex, name, machine, date):
    mine = [r for r in rows if r["example"] == ex]
    modes = [m for m in (*STYLE, *sorted({r["mode"] for r in mine} - set(STYLE))) if m in {r["mode"] for r in mine}]

    def of(study, mode=None):
        return [r for r in mine if r["study"] == study and mode in (None, r["mode"])]

    def series(study, mode, key, x="ranks"):
        pts = sorted((int(r[x]), i, r) for i, r in enumerate(of(study, mode)))
        return [p for p, _, _ in pts], [key(r) for _, _, r in pts]

    def per_ckpt(r):
        return int(r["stored_bytes"]) / max(1, int(r["checkpoints"]) * int(r["ranks"])) / 2**20

    def plot_modes(a, study, key, x="ranks", label=lambda m: m):
        xs = []
        for mode in modes:
            px, py = series(study, mode, key, x)
            if px:
                a.plot(px, py, **STYLE.get(mode, {}), label=label(mode))
                xs += px
        return xs

    # Stored bytes and the time split come from the weak study, or the strong one where there is no weak.
    base = "weak" if of("weak") else "strong"
    panels = []

    def overhead(study):
        def draw(a):
            xs = plot_modes(a, study, lambda r: float(r["overhead_per_step_ms"]))
            a.set(title=f"{study} scaling", xlabel="ranks", ylabel="checkpoint ms per step (app waits)")
            finish(a, xs)
        return draw

    def stored(a):
        xs = plot_modes(a, base, per_ckpt)
        a.set(title=f"stored per checkpoint and rank ({base})", xlabel="ranks", ylabel="MiB")
        finish(a, xs)

    def ratios(a):
        by = defaultdict(dict)
        for r in of(base):
            by[int(r["ranks"])][r["mode"]] = int(r["stored_bytes"])
        ps = sorted(p for p in by if "collective" in by[p])
        for other in (m for m in modes if m != "collective"):
            pts = [(p, by[p][other] / by[p]["collective"]) for p in ps if other in by[p]]
            if pts:
                a.plot([p for p, _ in pts], [v for _, v in pts], **STYLE.get(other, {}), label=f"{other} ÷ collective")
        a.set(title=f"bytes stored ÷ collective's ({base})", xlabel="ranks", ylabel="× collective's bytes")
        finish(a, ps)

    def split(a):
        x, runs = series(base, "collective", lambda r: r)
        dedup = [float(r["dedup_s"]) for r in runs]
        reduce = [float(r["reduce_s"]) for r in runs]
        first = [float(r["first_call_s"]) for r in runs]
        rest = [max(0.0, float(r["checkpoint_s"]) - d - e - f) for r, d, e, f in zip(runs, dedup, reduce, first)]
        drain = [float(r["drain_s"]) for r in runs]
        a.stackplot(x, dedup, reduce, first, rest, drain, alpha=0.55, colors=["C4", "C1", "C2", "C3", "C7"],
                    labels=["de-dup", "reduction", "first call", "rest of calls", "drain at finalize"])
        a.set(title=f"time split, collective runs ({base})", xlabel="ranks", ylabel="seconds (slowest rank)")
        finish(a, x, loc="upper left", fontsize=7)

    def sweep(study, key, xlabel, what):
        ranks = span(int(r["ranks"]) for r in of(study))

        def draw(a):
            if what == "stored":
                xs = plot_modes(a, study, per_ckpt, key)
                a.set(title=f"{xlabel}: stored ({ranks} ranks)", xlabel=xlabel, ylabel="MiB per checkpoint and rank")
            else:
                xs = plot_modes(a, study, lambda r: float(r["overhead_per_step_ms"]), key)
                a.set(title=f"{xlabel} ({ranks} ranks)", xlabel=xlabel, ylabel="checkpoint ms per step")
            finish(a, xs)
        return draw

    for study in ("strong", "weak"):
        if of(study):
            panels.append(overhead(study))
    if of(base):
        panels.append(stored)
    if of(base, "collective") and len({r["mode"] for r in of(base)}) > 1:
        panels.append(ratios)
    if of(base, "collective"):
        panels.append(split)
    if of("chunk"):
        panels += [sweep("chunk", "chunk_size", "chunk bytes", what) for what in ("time", "stored")]
    if of("every"):
        panels.append(sweep("every", "every", "steps between checkpoints", "time"))
    if not panels:
        return None

    # The sizes, from the CSV, of the strong and weak runs (the sweeps' panels name theirs).
    sizes = []
    if of("strong"):
        r0 = min(of("strong"), key=lambda r: int(r["ranks"]))
        sizes.append(f"strong: {mib(int(r0['state_bytes_per_rank']) * int(r0['ranks']))} over "
                     f"{span(int(r['ranks']) for r in of('strong'))} ranks")
    if of("weak"):
        state = sorted({int(r["state_bytes_per_rank"]) for r in of("weak")})
        sizes.append(f"weak: {'–'.join(mib(b) for b in sorted({state[0], state[-1]}))} a rank, "
                     f"{span(int(r['ranks']) for r in of('weak'))} ranks")
    sw = of("strong") + of("weak") or mine
    sizes.append(f"{span(int(r['steps']) for r in sw)} steps, a checkpoint every {span(int(r['every']) for r in sw)}, "
                 f"chunk {span((int(r['chunk_size']) for r in sw), ' B')}")
    return figure(panels, [f"{name}: {ex} — {machine}, {run_date(mine, date)}", "; ".join(sizes)])


def save(figs, out):
    for fname, fig in figs.items():
        fig.savefig(Path(out) / fname, dpi=100)
        plt.close(fig)
        print(f"wrote {Path(out) / fname}")


# --- the rules ---------------------------------------------------------------------------------------

PLAIN = re.compile(r"^[−-]?\d+(\.\d+)?$")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def pixels(ax, ln):
    """The line's points inside the view, in display pixels."""
    xy = np.column_stack([np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float)])
    xy = xy[np.isfinite(xy).all(1)]
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    inside = xy[(xy[:, 0] >= x0) & (xy[:, 0] <= x1) & (xy[:, 1] >= y0) & (xy[:, 1] <= y1)]
    return ln.get_transform().transform(inside) if len(inside) else np.zeros((0, 2))


def covers(top, low, pix_low, pix_top, tol=1.5):
    """Whether `top` (drawn over `low`) passes through every point of `low` and hides its marker and line."""
    if len(pix_low) == 0 or len(pix_top) == 0:
        return False
    d = np.min(np.hypot(*(pix_low[:, None, :] - pix_top[None, :, :]).transpose(2, 0, 1)), axis=1)
    if d.max() > tol:
        return False
    low_marker = low.get_marker() not in (None, "", " ", "None", "none")
    top_marker = top.get_marker() not in (None, "", " ", "None", "none")
    low_line = low.get_linestyle() not in ("None", "", " ", "none")
    hides_marker = not low_marker or (top_marker and str(top.get_markerfacecolor()) != "none"
                                      and top.get_markersize() >= low.get_markersize())
    same_dashes = getattr(top, "_dash_pattern", 0) == getattr(low, "_dash_pattern", 1)  # offset, on-off (scaled)
    hides_line = not low_line or (top.get_linewidth() >= low.get_linewidth() and
                                  (top.get_linestyle() == "-" or same_dashes))
    return hides_marker and hides_line


def check(fig, label):
    """The rules' broken instances in `fig` (a list of strings, empty when it keeps them all)."""
    bad = []
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    t = fig.get_suptitle() if hasattr(fig, "get_suptitle") else (fig._suptitle.get_text() if fig._suptitle else "")
    if not t:
        bad.append("no title")
    else:
        if t.count("\n") > 1:
            bad.append(f"title of {t.count(chr(10)) + 1} lines")
        if fig._suptitle.get_window_extent(r).width > fig.bbox.width:
            bad.append("title wider than the figure")
        if not DATE.search(t):
            bad.append("title names no date")
    for i, ax in enumerate(fig.axes):
        where = f"panel {i + 1} '{ax.get_title() or ax.get_ylabel()}'"
        if "\n" in ax.get_title():
            bad.append(f"{where}: title of several lines")
        data = [ln for ln in ax.lines if ln.get_gid() != "guide"]
        has_data = bool(data or ax.collections)
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if not axis.get_visible() or not has_data:
                continue
            if data and axis.get_scale() == "linear" and wide(line_data(ax, which)):
                bad.append(f"{where}: {which} spans more than 10x on a linear axis")
            lo, hi = sorted(axis.get_view_interval())
            labels = [tk.get_text() for loc, tk in zip(axis.get_majorticklocs(), axis.get_ticklabels())
                      if lo <= loc <= hi and tk.get_text()]
            labels += [tk.get_text() for tk in axis.get_ticklabels(minor=True) if tk.get_text()]
            odd = [s for s in labels if not PLAIN.match(s)]
            if odd:
                bad.append(f"{where}: {which} tick labels not plain: {odd[:4]}")
            if len(labels) < 2:
                bad.append(f"{where}: {which} axis has {len(labels)} tick label(s)")
            if axis.get_offset_text().get_text():
                bad.append(f"{where}: {which} axis has an offset or exponent '{axis.get_offset_text().get_text()}'")
        order = sorted(range(len(data)), key=lambda k: (data[k].get_zorder(), k))
        pix = {k: pixels(ax, data[k]) for k in order}
        for k in order:
            ln, name = data[k], data[k].get_label()
            if not ln.get_visible() or ln.get_alpha() == 0 or (ln.get_linestyle() in ("None", "") and
                                                               ln.get_marker() in ("None", "", None)):
                bad.append(f"{where}: line '{name}' not drawn")
            elif np.isfinite(np.asarray(ln.get_ydata(), float)).any() and not len(pix[k]):
                bad.append(f"{where}: line '{name}' outside the view")
        for a, k in enumerate(order):
            for top in order[a + 1:]:
                if covers(data[top], data[k], pix[k], pix[top]):
                    bad.append(f"{where}: line '{data[k].get_label()}' hidden under '{data[top].get_label()}'")
                    break
    return [f"{label}: {b}" for b in bad]


def broken_figure():
    """A figure that breaks every rule: the checker must find each."""
    fig, ax = plt.subplots(layout="constrained")
    x = [1, 2, 4, 8]
    ax.plot(x, [1, 10, 100, 1000], "o-", label="a")
    ax.plot(x, [1, 10, 100, 1000], "o-", label="b")  # the same points, the same look: a is hidden
    ax.set_xscale("log", base=2)  # labels 2^0 .. 2^3
    fig.suptitle("one\ntwo\nthree")
    return fig


def self_test():
    found = "\n".join(check(broken_figure(), "broken"))
    expect = ["title of 3 lines", "title names no date", "spans more than 10x on a linear axis",
              "tick labels not plain", "hidden under"]
    missing = [e for e in expect if e not in found]
    plt.close("all")
    return [f"the checker misses a broken rule: '{m}' (found: {found!r})" for m in missing]


def cost_model():
    sys.dont_write_bytecode = True  # no scripts/__pycache__
    spec = importlib.util.spec_from_file_location("cost_model", ROOT / "scripts" / "cost-model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_check():
    bad = self_test()
    pngs = {str(p.relative_to(ROOT)) for d in ("docs/bench/scaling", "docs/bench/gpu-cache")
            for p in (ROOT / d).rglob("*.png")}
    drawn = set(OTHER_PNGS)
    n = 0
    for out, name, machine, date in COMMITTED:
        for fname, fig in figures(ROOT / out / f"{name}.csv", machine, date, name).items():
            drawn.add(f"{out}/{fname}")
            bad += check(fig, f"{out}/{fname}")
            plt.close(fig)
            n += 1
    bad += [f"{p}: committed, but no entry of COMMITTED (scripts/plot-scaling.py) draws it"
            for p in sorted(pngs - drawn)]
    cm = cost_model()
    fig = cm.figure(cm.analyse())
    bad += check(fig, "docs/bench/scaling/cost-model.png")
    plt.close(fig)
    for b in bad:
        print(f"plot check: {b}", file=sys.stderr)
    print(f"plot check: {n + 1} figures, {'FAILED: ' + str(len(bad)) + ' broken' if bad else 'every rule kept'}")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="?", help="the study's CSV (OUT/NAME.csv)")
    ap.add_argument("--out", help="where the PNGs go (default: the CSV's folder)")
    ap.add_argument("--name", help="NAME of the PNGs (default: the CSV's stem)")
    ap.add_argument("--machine", default="", help="what the title names as the machine")
    ap.add_argument("--date", default=datetime.date.today().isoformat(), help="the run's date, where the CSV has none")
    ap.add_argument("--committed", action="store_true", help="redraw every committed plot (COMMITTED)")
    ap.add_argument("--check", action="store_true", help="check the rules on every committed plot, in memory")
    a = ap.parse_args()
    if a.check:
        return run_check()
    if a.committed:
        for out, name, machine, date in COMMITTED:
            save(figures(ROOT / out / f"{name}.csv", machine, date, name), ROOT / out)
        return 0
    if not a.csv:
        ap.error("a CSV, --committed or --check")
    csv_path = Path(a.csv)
    out = Path(a.out) if a.out else csv_path.parent
    name = a.name or csv_path.stem
    figs = figures(csv_path, a.machine, a.date, name)
    out.mkdir(parents=True, exist_ok=True)
    save(figs, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
