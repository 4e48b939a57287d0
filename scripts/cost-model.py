#!/usr/bin/env python3
"""A cost model of the collective step and the flush (issue #11, item 3).

Usage: python3 scripts/cost-model.py [OUT_DIR]  (default docs/bench/scaling). Writes OUT_DIR/cost-model.png
(measured points and model), OUT_DIR/cost-model.json (assumptions, where and when each input was measured,
parameters, every point's residual, extrapolations) and prints a Markdown summary. numpy and matplotlib only,
from target/plot-venv (scripts/plot-scaling.py makes it and re-executes this script there).

Inputs, measured: docs/bench/collective/{h100-16core,dev2core}/reduce.csv: the reduction alone
(`collective::mpi::reduce_sets`, the binomial tree of point-to-point merges), P = 1..16 ranks on the H100's
16-core host and 1..64 on the 2-core machine (oversubscribed beyond 2 ranks), K = 2^14..2^18 entries, median
seconds; docs/bench/collective/h200x4/reduce{,-repeat}.csv (64 cores, 1..64 ranks): the reduction before the
tree (one MPI_Reduce with a user operation, fresh buffers), fitted for comparison ("h200x4-mpi").
docs/bench/scaling/{devbox-cpu,h100-cpu,h100,h200x2}.csv: whole checkpointing runs, studies strong and weak,
chunk 128 B, a checkpoint every 10 steps (h100-cpu: the CPU backend on the H100's 16-core host, 1..64 ranks,
oversubscribed beyond 16; h200x2: h200x2-placed.csv, the ranks placed by scripts/placement.sh, 1..16 ranks;
the first 2-GPU run, h200x2.csv, had its 2-rank rows bound to one core a rank and is no longer fitted).

Model. L = ceil(log2 P), the depth of the reduce and of the bcast tree; Pn = ranks on one node; S = ranks
sharing one GPU (P/G), or one core (P/C) on the CPU machine, at least 1; K entries of 40 B on the wire.
1. Reduction alone: T_red = d + e K + (a + b K) L + g K (Pn - 1). e K: encode, decode, copy (also at
   P = 1); (a + b K) L: a level of the reduce and of the bcast (latency; transfer and one top-K merge);
   g K (Pn - 1): what the ranks of a node share (memory bandwidth, cores; on 2 cores the
   oversubscription). Non-negative least squares on relative errors (times span four decades, their
   noise is proportional); the log-tree model alone (g = 0) is fitted too, for comparison.
2. Collective step per version in whole runs (reduce_s / checkpoints: the background task: tuple set,
   reduction, give-away), P > 1: T_step = s0 + s2 (S - 1) + T_red(P, K), T_red from 1 for the same
   machine class (h100-tree for the GPU machines), K = min(2^17, P x regions a rank offers at most, from the
   automatic region size). On absolute errors: its milliseconds scatter additively, up to 25x between
   examples at one P, and relative errors would pull the fit to zero.
3. Stored bytes per checkpoint, weak scaling, per mode: B(P) = U + R P (U once, R per rank).
4. Drain (the flush backlog at the end): drain_s = f0 + B_run / B_node + f2 files, B_run = the run's stored
   bytes, files = P x checkpoints (one node, one disk).
5. Application-visible steady call, weak scaling: T_call = t0 + t1 L + t2 (S - 1).
Extrapolation, "cluster": 8 ranks a node, one a GPU (Pn = min(P, 8), S = 1), each node its own disk; a tree
level between nodes costs what a level costs inside the measured node, and "network" adds a_net + 40 K /
BW_net per inter-node level (a_net = 5 us, BW_net = 25 GB/s: assumed, not measured). "node": the fitted
formula with Pn = P (all ranks on one node), to show what the node term does at scale.
"""
import csv
import importlib.util
import json
import math
import re
import sys
from pathlib import Path


def _plots():
    """scripts/plot-scaling.py (the axes rules, and target/plot-venv: loading it re-executes this script there)."""
    sys.dont_write_bytecode = True  # no scripts/__pycache__
    if "plot_scaling" not in sys.modules:
        path = Path(__file__).resolve().with_name("plot-scaling.py")
        spec = importlib.util.spec_from_file_location("plot_scaling", path)
        sys.modules["plot_scaling"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["plot_scaling"])
    return sys.modules["plot_scaling"]


plots = _plots()
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MICRO = {  # machine class -> reduction CSVs
    "h100-tree": ["docs/bench/collective/h100-16core/reduce.csv"],
    "dev2core": ["docs/bench/collective/dev2core/reduce.csv"],
    # The reduction before the binomial tree (MPI_Reduce, fresh buffers), 64 cores: for comparison.
    "h200x4-mpi": ["docs/bench/collective/h200x4/reduce.csv", "docs/bench/collective/h200x4/reduce-repeat.csv"],
}
GPU_NODE = "h100-tree"  # the reduction model of the GPU machines
RUNS = {  # machine -> scaling CSV, reduction class, cores, GPUs, rank counts left out of time fits
    "devbox-cpu": dict(csv="docs/bench/scaling/devbox-cpu.csv", micro="dev2core", cores=2, gpus=0, bad=[]),
    # 16..64 CPU ranks on 16 cores: one CPU a rank or less, where `overlap = auto` keeps the step in the call
    # (its reduce_s is then the reduction alone, not the background task): left out of the step's fit. (This
    # CSV predates the `overlapped` column, which says so by itself.)
    "h100-cpu": dict(csv="docs/bench/scaling/h100-cpu.csv", micro=GPU_NODE, cores=16, gpus=0, bad=[],
                     in_call=[16, 32, 64]),
    "h100": dict(csv="docs/bench/scaling/h100.csv", micro=GPU_NODE, cores=16, gpus=1, bad=[]),
    "h200x2": dict(csv="docs/bench/scaling/h200x2-placed.csv", micro=GPU_NODE, cores=32, gpus=2, bad=[]),
    # Issue #41 (the step beside the call, one road): the CPU backend on the 2 x H200 host's 32 cores, 1..32
    # ranks, weak; heat on 1 and 2 H200s (1 GiB a rank), weak and strong.
    "h200x2-1128-cpu": dict(csv="docs/bench/scaling/h200x2-1128-cpu.csv", micro=GPU_NODE, cores=32, gpus=0, bad=[]),
    "h200x2-1128-gpu": dict(csv="docs/bench/scaling/h200x2-1128-gpu.csv", micro=GPU_NODE, cores=32, gpus=2, bad=[]),
    # Heat on 1, 2 and 4 H200s (1 GiB a rank weak, 4 GiB in all strong), the pool at the rank's share.
    "h200x4-1128-gpu": dict(csv="docs/bench/scaling/h200x4-gpu.csv", micro=GPU_NODE, cores=64, gpus=4, bad=[]),
}
# Where and when each input was measured (BENCHMARKS.md): cost-model.json names them, the title their dates.
MEASURED = {
    "h100-tree": "the H100's 16-core host (nvidia-h100-x1), 2026-11-24",
    "dev2core": "the 2-core development VM, 2026-11-24",
    "h200x4-mpi": "the 4 × H200 node's 64 cores (nvidia-h200-x4), 2026-11-22",
    "devbox-cpu": "the 2-core development VM, CPU backend, 2026-11-23",
    "h100-cpu": "the H100's 16-core host, CPU backend, 2026-11-24",
    "h100": "one NVIDIA H100 80GB HBM3 (nvidia-h100-x1, 16 cores), 2026-11-24",
    "h200x2": "2 × NVIDIA H200 (nvidia-h200-x2, 32 cores), ranks placed, 2026-11-24",
    "h200x2-1128-cpu": "the 2 × H200 host's 32 cores, CPU backend, the step beside the call, 2026-11-28",
    "h200x2-1128-gpu": "2 × NVIDIA H200, heat 1 GiB a rank, the step beside the call, 2026-11-28",
    "h200x4-1128-gpu": "4 × NVIDIA H200 (nvidia-h200-x4, 64 cores), heat 1 GiB a rank, 2026-11-28",
}
K_DEFAULT, CHUNK, ENTRY_BYTES = 1 << 17, 128, 40
PER_NODE, A_NET, BW_NET = 8, 5e-6, 25e9
P_OUT = [64, 256, 1024, 4096]
P_LINE = np.unique(np.round(np.logspace(0, 12, 97, base=2)))
EXAMPLES, MODES = ("heat", "labels", "replicated"), ("collective", "local", "full")
COLOR = {"devbox-cpu": "C3", "h100-cpu": "C1", "h100": "C2", "h200x2": "C0", "h200x2-1128-cpu": "C4",
         "h200x2-1128-gpu": "C5", "h200x4-1128-gpu": "C6"}


def read_csv(rel):
    with open(ROOT / rel, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r.pop(None, None)  # a row longer than its header (a newer column appended to an older CSV)
        r.update({k: float(v) for k, v in r.items() if k not in ("study", "example", "mode", "case")})
        r["sweep"] = rel
    return rows


def levels(p):
    return np.ceil(np.log2(np.maximum(np.asarray(p, float), 1)))


def sharing(spec, p):
    return np.maximum(np.asarray(p, float) / (spec["gpus"] or spec["cores"]), 1)


def nnls(A, y):
    """Least squares with x >= 0: the best unconstrained fit over every support (few columns)."""
    best, n = (math.inf, np.zeros(A.shape[1])), A.shape[1]
    for mask in range(1, 2**n):
        cols = [i for i in range(n) if mask >> i & 1]
        x = np.linalg.lstsq(A[:, cols], y, rcond=None)[0]
        r = float(np.sum((A[:, cols] @ x - y) ** 2))
        if (x >= 0).all() and r < best[0]:
            best = (r, np.zeros(n))
            best[1][cols] = x
    return best[1]


def quality(y, pred):
    rel, ly, lp = pred / y - 1, np.log(y), np.log(np.maximum(pred, 1e-12))
    r2 = 1 - np.sum((ly - lp) ** 2) / np.sum((ly - ly.mean()) ** 2)
    return dict(n=len(y), r2_log=float(r2), median_rel=float(np.median(abs(rel))), max_rel=float(max(abs(rel))))


def fit(rows, y, terms, keys, use=None, fixed=None, relative=True):
    """Fits y ~ sum p_i terms_i (p >= 0, `fixed` ones given) on the rows in `use`, on relative or absolute errors."""
    use, fixed = np.ones(len(y), bool) if use is None else use, fixed or {}
    known = sum((fixed[n] * np.asarray(terms[n], float) for n in fixed), np.zeros_like(y))
    free, w = [n for n in terms if n not in fixed], (1 / y if relative else np.ones_like(y))[use]
    A = np.stack([np.broadcast_to(np.asarray(terms[n], float), y.shape) for n in free], 1)
    x = dict(zip(free, nnls(A[use] * w[:, None], (y - known)[use] * w)), **fixed)
    pred = known + A @ np.array([x[n] for n in free])
    pts = [dict({k: r[k] for k in keys}, measured=float(m), model=float(p), rel_err=float(p / m - 1), fitted=bool(u))
           for r, m, p, u in zip(rows, y, pred, use)]
    return dict(params={n: float(x[n]) for n in terms}, quality=quality(y[use], pred[use]), points=pts)


def reduce_terms(p, k, pn):
    p, k, pn = (np.asarray(v, float) for v in (p, k, pn))
    return {"d": np.ones_like(p * k), "e": k, "a": levels(p), "b": k * levels(p), "g": k * (pn - 1)}


def predict_reduce(par, p, k, variant="cluster"):
    """T_red at P ranks: 'node' (Pn = P), 'cluster' (Pn = min(P, 8)), 'network' (+ inter-node links)."""
    p = np.asarray(p, float)
    pn = p if variant == "node" else np.minimum(p, PER_NODE)
    t = sum(par.get(n, 0) * v for n, v in reduce_terms(p, k, pn).items())
    hops = np.maximum(levels(p) - levels(PER_NODE), 0)
    return t + (hops * (A_NET + ENTRY_BYTES * np.asarray(k, float) / BW_NET) if variant == "network" else 0)


def fit_reduction(files):
    rows = [r for f in files for r in read_csv(f)]
    p, k, y = (np.array([r[c] for r in rows]) for c in ("ranks", "threshold", "median_seconds"))
    full = fit(rows, y, reduce_terms(p, k, p), ("sweep", "ranks", "threshold", "case"))
    tree = fit(rows, y, {n: v for n, v in reduce_terms(p, k, p).items() if n != "g"}, ())
    return {"tree+node": full, "tree only": dict(params=tree["params"], quality=tree["quality"])}


def tuples_offered(p, state):
    """min(K, P x regions a rank offers at most): collective::auto_region_bytes, power-of-two chunks."""
    p, state = int(p), int(state)
    rb = min(max(state // (64 * p), 50 * 56 * (p - 1)), 256 * 1024)
    return min(K_DEFAULT, p * -(-state // (CHUNK << max(int(math.log2(max(rb, CHUNK) / CHUNK)), 0))))


def select(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def arr(rows, name):
    return np.array([r[name] for r in rows], float)


def fit_step(spec, rows, micro):
    rows = [r for r in select(rows, mode="collective") if r["ranks"] > 1]
    for r in rows:
        r["K_eff"] = tuples_offered(r["ranks"], r["state_bytes_per_rank"])
    p, y = arr(rows, "ranks"), arr(rows, "reduce_s") / arr(rows, "checkpoints")
    # In the call: the CSV's `overlapped` column (0) where it has one, else the rank counts the spec names.
    in_call = np.array([r.get("overlapped", 1.0) == 0 for r in rows]) | np.isin(p, spec.get("in_call", []))
    use = ~np.isin(p, spec["bad"]) & ~in_call
    t_red = predict_reduce(micro, p, arr(rows, "K_eff"), "node")
    terms = {"s0": 1, "s2": sharing(spec, p) - 1, "reduction": t_red}
    out = fit(rows, y, terms, ("study", "example", "ranks", "K_eff"), use, fixed={"reduction": 1.0}, relative=False)
    ratio = y[use] / t_red[use]
    out.update(K_eff_median=float(np.median(arr(rows, "K_eff"))), measured_over_reduction_model=dict(
        median=float(np.median(ratio)), min=float(ratio.min()), max=float(ratio.max())))
    return out


def predict_step(par, micro, p, state, spec=None):
    """The overhead plus the reduction at the K that P ranks of `state` bytes offer: on a cluster (one rank a
    GPU, 8 a node, network), or as measured (all ranks on one node, sharing as `spec`) when `spec` is given."""
    k = np.array([tuples_offered(q, state) for q in np.atleast_1d(p)], float)
    if spec:
        return par["s0"] + par["s2"] * (sharing(spec, p) - 1) + predict_reduce(micro, p, k, "node")
    return par["s0"] + predict_reduce(micro, p, k, "network")


def fit_weak(spec, rows, modes, y, terms):
    """One fit a (example, mode) of the weak study: y(rows) ~ terms(P)."""
    out = {}
    for ex in EXAMPLES:
        for mode in modes:
            sel = select(rows, study="weak", example=ex, mode=mode)
            if len(sel) < 2:
                continue  # not measured on this machine (a study of one example, or without `full`)
            p = arr(sel, "ranks")
            out[f"{ex}/{mode}"] = fit(sel, y(sel), terms(p), ("ranks",), ~np.isin(p, spec["bad"]))
    return out


def predict_stored(fits, ex, mode, p):
    par = fits[f"{ex}/{mode}"]["params"]
    return par["U"] + par["R"] * np.asarray(p, float)


def fit_drain(spec, rows):
    p = arr(rows, "ranks")
    terms = {"f0": 1, "f1": arr(rows, "stored_bytes"), "f2": p * arr(rows, "checkpoints")}
    out = fit(rows, arr(rows, "drain_s"), terms, ("study", "example", "mode", "ranks"), ~np.isin(p, spec["bad"]))
    out["node_GBps"] = 1e-9 / out["params"]["f1"] if out["params"]["f1"] else float("inf")
    return out


def predict_drain(drain, per_ckpt_bytes, p, ckpts=1, one_node=False):
    """Draining `ckpts` checkpoints on one of max(P/8, 1) nodes, each with its own disk (or all P on one)."""
    par, p = drain["params"], np.asarray(p, float)
    ranks = p if one_node else np.minimum(p, PER_NODE)
    return par["f0"] + ckpts * (par["f1"] * per_ckpt_bytes * ranks / p + par["f2"] * ranks)


def predict_call(par, p, s=1.0):
    return par["t0"] + par["t1"] * levels(p) + par["t2"] * (s - 1)


def analyse():
    res = {"reduction": {m: fit_reduction(f) for m, f in MICRO.items()}, "runs": {}}
    for m, spec in RUNS.items():
        rows = [r for r in read_csv(spec["csv"]) if r["study"] in ("strong", "weak")
                and r["chunk_size"] == 128 and r["every"] == 10]
        micro = res["reduction"][spec["micro"]]["tree+node"]["params"]
        stored = fit_weak(dict(spec, bad=[]), rows, MODES,  # bytes: every row
                          lambda sel: arr(sel, "stored_bytes") / arr(sel, "checkpoints"), lambda p: {"U": 1, "R": p})
        call = fit_weak(spec, rows, ("collective", "local"), lambda sel: arr(sel, "steady_call_ms") / 1e3,
                        lambda p: {"t0": 1, "t1": levels(p), "t2": sharing(spec, p) - 1})
        res["runs"][m] = dict(step=fit_step(spec, rows, micro), stored=stored, drain=fit_drain(spec, rows), call=call,
                              heat_weak_state=select(rows, study="weak", example="heat")[0]["state_bytes_per_rank"])
    return res


def extrapolate(res):
    ps, ex = np.array(P_OUT, float), {}
    for k in (1 << 14, K_DEFAULT, 1 << 18):
        for m in (GPU_NODE, "h200x4-mpi"):
            red = res["reduction"][m]
            ex.update({f"reduction {m} K={k} {v} (s)": predict_reduce(red["tree+node"]["params"], ps, k, v)
                       for v in ("cluster", "network", "node")})
            ex[f"reduction {m} K={k} tree only (s)"] = predict_reduce(red["tree only"]["params"], ps, k)
    for m, r in res["runs"].items():
        micro = res["reduction"][RUNS[m]["micro"]]["tree+node"]["params"]
        ex[f"step {m} heat weak (ms)"] = 1e3 * predict_step(r["step"]["params"], micro, ps, r["heat_weak_state"])
        st = r["stored"]  # (example, mode) pairs not measured on a machine are left out
        ex.update({f"stored {m} {e} {md}/coll (x)": predict_stored(st, e, md, ps) /
                   predict_stored(st, e, "collective", ps) for e in EXAMPLES for md in ("local", "full")
                   if f"{e}/{md}" in st and f"{e}/collective" in st})
        ex.update({f"drain {m} heat {md} (s, one checkpoint a node)":
                   predict_drain(r["drain"], predict_stored(st, "heat", md, ps), ps)
                   for md in MODES if f"heat/{md}" in st})
        ex.update({f"call {m} heat {md} (ms)": 1e3 * predict_call(r["call"][f"heat/{md}"]["params"], ps)
                   for md in ("collective", "local")})
    order = ["reduction", "step", "stored", "drain", "call"]
    return {k: [float(x) for x in ex[k]] for k in sorted(ex, key=lambda k: order.index(k.split()[0]))}


def decorate(ax, title, ylabel, **legend):
    ax.axvspan(64, 4096, color="0.92", zorder=0)
    ax.text(512, 0.98, "extrapolated", transform=ax.get_xaxis_transform(), ha="center", va="top", color="0.4")
    ax.set(yscale="log", xlabel="ranks P", ylabel=ylabel, title=title)
    plots.finish(ax, [1, 4, 16, 64, 256, 1024, 4096], **{"fontsize": 7, "ncol": 2, **legend})


def scatter(ax, pts, color, marker="o", label=None, y=None):
    for ok, mk in ((True, marker), (False, "x")):
        sel = [i for i, q in enumerate(pts) if q["fitted"] == ok]
        if sel:
            ys = [y[i] if y is not None else pts[i]["measured"] for i in sel]
            ax.scatter([pts[i]["ranks"] for i in sel], ys, marker=mk, s=16, color=color,
                       label=label and (label if ok else f"{label} (left out)"))


def lines(ax, cluster, node, color, label, node_to=64, ls="-"):
    """The cluster model to 4096 ranks, and the one-node model (as measured) dotted up to `node_to`."""
    ax.plot(P_LINE, cluster(P_LINE), ls, color=color, label=label)
    ax.plot(P_LINE[P_LINE <= node_to], node(P_LINE[P_LINE <= node_to]), ":", color=color, lw=0.9)


def machines(runs):
    """Legend entries: one a machine (its colour)."""
    return [Line2D([], [], color=COLOR[m], lw=2, label=m) for m in runs]


def keys(*styles):
    """Legend entries for marker or line styles, in black: (style, label)."""
    return [Line2D([], [], color="k", lw=1, ls=st, label=lab) if st in ("-", "--", ":", "-.") else
            Line2D([], [], color="k", ls="", marker=st, ms=5, label=lab) for st, lab in styles]


def suptitle(fig):
    """Two lines: what the figure shows, what is assumed, and when it was measured (where: cost-model.json)."""
    dates = sorted(d for m in MEASURED.values() for d in re.findall(r"\d{4}-\d{2}-\d{2}", m))
    plots.suptitle(fig, [
        f"dckpt cost model, measured points (× left out of the fit) and models; gray: extrapolated to {PER_NODE} "
        f"ranks a node, one a GPU, {A_NET * 1e6:g} µs + {ENTRY_BYTES} B × K / {BW_NET / 1e9:g} GB/s a network level "
        "(assumed)",
        f"Measured {dates[0]} to {dates[-1]} on the 2-core VM, the H100's 16-core host, 2 × H200 and 4 × H200 "
        f"(each input: cost-model.json, inputs); runs: chunk {CHUNK} B, a checkpoint every 10 steps"], size=10)


def figure(res):
    fig, axs = plt.subplots(2, 2, figsize=(14, 12), layout="constrained")
    suptitle(fig)
    red, runs = res["reduction"], res["runs"]
    ax, par, old = axs[0, 0], red[GPU_NODE]["tree+node"]["params"], red["h200x4-mpi"]["tree+node"]["params"]
    for i, k in enumerate((1 << 14, 1 << 16, 1 << 18)):
        for m, mk in ((GPU_NODE, "o"), ("dev2core", "^"), ("h200x4-mpi", "+")):
            scatter(ax, [q for q in red[m]["tree+node"]["points"] if q["threshold"] == k], f"C{i}", mk, f"{m} K={k}")
        lines(ax, lambda p: predict_reduce(par, p, k, "network"), lambda p: predict_reduce(par, p, k, "node"),
              f"C{i}", f"{GPU_NODE} model K={k}", 4096)
        ax.plot(P_LINE, predict_reduce(old, P_LINE, k, "network"), "-.", color=f"C{i}", lw=0.7,
                label=f"h200x4-mpi model K={k}" if i == 0 else None)
        lines(ax, lambda p: np.nan * p, lambda p: predict_reduce(red["dev2core"]["tree+node"]["params"], p, k, "node"),
              f"C{i}", None)
    decorate(ax, "Reduction alone (solid: cluster + network; dotted: one node, as measured)", "seconds")
    ax = axs[0, 1]
    for m, r in runs.items():
        mp, st, state = red[RUNS[m]["micro"]]["tree+node"]["params"], r["step"]["params"], r["heat_weak_state"]
        scatter(ax, r["step"]["points"], COLOR[m])
        lines(ax, lambda p: predict_step(st, mp, p, state), lambda p: predict_step(st, mp, p, state, RUNS[m]),
              COLOR[m], None)
    decorate(ax, "Collective step per version, whole runs (dotted: one node, as measured)", "seconds per version",
             handles=machines(runs) + keys(("o", "measured"), ("x", "left out of the fit"), ("-", "model (heat weak)"),
                                           (":", "model, one node")))
    ax = axs[1, 0]
    for m, mk in (("h100-cpu", "^"), ("h100", "o")):
        fits = runs[m]["stored"]
        for i, e in enumerate(EXAMPLES):
            coll = [q["measured"] for q in fits[f"{e}/collective"]["points"]]
            for mode, ls in (("full", "-"), ("local", "--")):
                pts = fits[f"{e}/{mode}"]["points"]
                scatter(ax, pts, f"C{i}", mk, None, [q["measured"] / c for q, c in zip(pts, coll)])
                ax.plot(P_LINE, predict_stored(fits, e, mode, P_LINE) / predict_stored(fits, e, "collective", P_LINE),
                        ls, color=f"C{i}", lw=1.2 if m == "h100" else 0.6, label=f"{m} {e} {mode}/coll")
    decorate(ax, "Stored bytes per checkpoint, weak: Full/coll (solid), local/coll (dashed); ▲ CPU, ● GPU",
             "÷ collective's bytes")
    ax = axs[1, 1]
    for m, r in runs.items():
        call, spec = r["call"]["heat/collective"], RUNS[m]
        scatter(ax, call["points"], COLOR[m], "o")
        cp = call["params"]
        lines(ax, lambda p: predict_call(cp, p), lambda p: predict_call(cp, p, sharing(spec, p)), COLOR[m], None)
        scatter(ax, [q for q in r["drain"]["points"] if (q["study"], q["example"], q["mode"]) ==
                     ("weak", "heat", "collective")], COLOR[m], "s")
        per = lambda p, s=r["stored"]: predict_stored(s, "heat", "collective", p)  # noqa: E731
        lines(ax, lambda p: predict_drain(r["drain"], per(p), p, 6),
              lambda p: predict_drain(r["drain"], per(p), p, 6, True), COLOR[m], None, ls="--")
    ax.set_ylim(1e-3, 1e3)
    decorate(ax, "heat weak, collective: steady call (●) and drain of 6 checkpoints (■)", "seconds",
             loc="upper left", handles=machines(runs) + keys(("o", "steady call"), ("s", "drain"), ("-", "call model"),
                                                             ("--", "drain model"), (":", "model, one node")))
    return fig


def plot(res, path):
    figure(res).savefig(path, dpi=110)


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return "\n".join(out + ["| " + " | ".join(map(str, r)) + " |" for r in rows]) + "\n"


def g3(x):
    return f"{x:.3g}"


def q_cells(q):
    return [q["n"], f"{q['r2_log']:.2f}", f"{100 * q['median_rel']:.0f}%", f"{100 * q['max_rel']:.0f}%"]


def misfits(name, fitted, cut=0.3, worst=4):
    """One line: how many fitted points are more than `cut` off, and the worst of them."""
    pts = [q for q in fitted["points"] if q["fitted"]]
    bad = sorted((q for q in pts if abs(q["rel_err"]) > cut), key=lambda q: -abs(q["rel_err"]))
    desc = ["{}: {} vs {} ({:+.0f}%)".format(" ".join(str(v).removesuffix(".0").split("/")[-1] for k, v in q.items()
                                                       if k not in ("measured", "model", "rel_err", "fitted")),
                                            g3(q["measured"]), g3(q["model"]), 100 * q["rel_err"]) for q in bad[:worst]]
    return bad and f"- {name}: {len(bad)} of {len(pts)} points — worst " + "; ".join(desc)


def residuals_by_ranks(fitted):
    ranks = sorted({q["ranks"] for q in fitted["points"]})
    return [f"{100 * np.median([q['rel_err'] for q in fitted['points'] if q['ranks'] == p]):+.0f}%" for p in ranks]


def markdown(res, ex):
    red, runs = res["reduction"], res["runs"]
    out = ["Reduction alone (s; K in entries):\n", table(
        ["machine", "model", "d", "e /entry", "a /level", "b /entry/level", "g /entry/rank", "n", "R² (log)",
         "median err", "max err"], [[m, n] + [g3(f["params"].get(t, 0)) for t in "deabg"] + q_cells(f["quality"])
                                    for m, r in red.items() for n, f in r.items()])]
    out += ["Median model error of the reduction by ranks (model ÷ measured − 1, tree+node):\n",
            table(["machine"] + [str(p) for p in (1, 2, 4, 8, 16, 32, 64)],
                  [[m] + residuals_by_ranks(r["tree+node"]) for m, r in red.items()])]
    rows = [[m] + [g3(1e3 * r["step"]["params"][t]) for t in ("s0", "s2")] + q_cells(r["step"]["quality"]) +
            [f"{r['step']['K_eff_median']:.0f}", "{median:.2g} ({min:.2g}–{max:.2g})".format(
                **r["step"]["measured_over_reduction_model"])] for m, r in runs.items()]
    out += ["Collective step per version in whole runs: s0 + s2·(S − 1) + T_red(P, K) (ms), and measured ÷ T_red "
            "(all ranks on one node; the h100-tree model for the GPU machines):\n",
            table(["machine", "s0", "s2 /(S−1)", "n", "R² (log)", "median err", "max err",
                   "median K", "measured ÷ reduction model"], rows)]
    rows = [[m, e] + ["{:.2f} + {:.3f} P".format(*(f["params"][t] / 2**20 for t in "UR")) if f else "—"
                      for f in (r["stored"].get(f"{e}/{md}") for md in MODES)] +
            [f"{100 * max(r['stored'][f'{e}/{md}']['quality']['max_rel'] for md in MODES if f'{e}/{md}' in r['stored']):.0f}%"]
            for m, r in runs.items() for e in EXAMPLES if f"{e}/collective" in r["stored"]]
    out += ["Stored bytes per checkpoint, weak scaling, U + R·P (MiB):\n",
            table(["machine", "example", "collective", "local-only", "Full", "max err"], rows)]
    rows = [[m, g3(r["drain"]["params"]["f0"]), g3(r["drain"]["node_GBps"]), g3(1e3 * r["drain"]["params"]["f2"])] +
            q_cells(r["drain"]["quality"]) for m, r in runs.items()]
    out += ["Drain (every mode and example, strong and weak): f0 + bytes / B_node + f2·files:\n",
            table(["machine", "f0 s", "B_node GB/s", "f2 ms/file", "n", "R² (log)", "median err", "max err"], rows)]
    rows = [[m, k] + [g3(1e3 * c["params"][t]) for t in ("t0", "t1", "t2")] + q_cells(c["quality"])
            for m, r in runs.items() for k, c in r["call"].items()]
    out += ["Steady call, weak scaling (ms): t0 + t1·L + t2·(S − 1):\n",
            table(["machine", "example/mode", "t0", "t1", "t2", "n", "R² (log)", "median err", "max err"], rows)]
    out += [f"Extrapolation ({PER_NODE} ranks a node, one rank a GPU):\n",
            table(["series"] + [f"P = {p}" for p in P_OUT], [[k] + [g3(v) for v in vals] for k, vals in ex.items()])]
    out += ["Fitted points more than 30% off their model (how many; the worst):\n"]
    named = [(f"reduction {m}", r["tree+node"]) for m, r in red.items()] + [
        (f"{kind} {m} {k}".strip(), f) for m, r in runs.items() for kind in ("step", "drain", "call", "stored")
        for k, f in (r[kind].items() if kind in ("call", "stored") else [("", r[kind])])]
    out += [line for line in (misfits(n, f) for n, f in named) if line]
    return "\n".join(out)


def main():
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs/bench/scaling"
    out_dir.mkdir(parents=True, exist_ok=True)
    res = analyse()
    ex = extrapolate(res)
    plot(res, out_dir / "cost-model.png")
    assumptions = dict(ranks_per_node=PER_NODE, a_net_s=A_NET, bw_net_Bps=BW_NET, K_default=K_DEFAULT,
                       chunk_bytes=CHUNK, entry_bytes=ENTRY_BYTES,
                       left_out_of_time_fits={m: s["bad"] for m, s in RUNS.items()})
    doc = dict(assumptions=assumptions, inputs=MEASURED, fits=res, extrapolation=dict(ranks=P_OUT, **ex))
    (out_dir / "cost-model.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(res, ex))


if __name__ == "__main__":
    main()
