#!/usr/bin/env python3
"""A bounded random campaign against the restart promise (issue #42).

Each trial runs an example (heat or labels) under mpirun on emulated nodes
(one rank a node, each with its own node-local directory, a shared
directory or not, redundancy none / partner / xor), kills it (a rank aborts
at a random step, or mpirun and its ranks are SIGKILLed at a random moment,
or it runs to the end), then damages what it left: a node's directory lost,
a node's directory replaced by an older copy of itself, bytes flipped in,
files truncated or deleted from, any file of any tier (diff files,
manifests, commit parts, region tables, partner and parity copies). The
next run must then:

  - end with the digest of an uninterrupted run (restarted from a
    checkpoint, or from the beginning on purpose), or
  - stop with an error, and run again after what the error names is done
    (`dckpt repair` where it says so), ending right.

Anything else is counted: WRONG (exit 0, another digest), HANG (no exit
within the limit), WEDGED (still failing after the fix it named). The
campaign prints its seed (`--seed` repeats it) and its counts, and exits 1
if any of the three is not 0.

    scripts/break-campaign.py [--seed N] [--budget SECONDS] [--ranks 3]
                              [--bin-dir target/release]
"""

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

EXAMPLES = {
    "heat": ["--steps", "200", "--every", "20", "--rows", "96", "--cols", "384", "--device", "cpu"],
    "labels": ["--steps", "200", "--every", "20"],
}
DIGEST = re.compile(r"digest ([0-9a-f]+)")
FROM = re.compile(r"restarted from the checkpoint of [a-z]+ (\d+)")
RUN_LIMIT = 120


def mpirun(args, ranks, bin_path, log, timeout=RUN_LIMIT, kill_after=None):
    """Runs one job; returns (rc or None on a hang, output). With
    kill_after (seconds) the job's process group is SIGKILLed then."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), bin_path] + args
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            p.wait(timeout=kill_after if kill_after is not None else timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            settle(bin_path, args)
            if kill_after is None:
                return None, open(log, errors="replace").read()
    settle(bin_path, args)
    return p.returncode, open(log, errors="replace").read()


def settle(bin_path, args):
    """Waits until no process of the job is left (SIGKILLed ranks may
    outlive mpirun for a moment): nothing writes while the next step runs."""
    pattern = args[args.index("--config") + 1] if "--config" in args else " ".join([bin_path] + args)
    for _ in range(100):
        subprocess.run(["pkill", "-KILL", "-f", pattern], capture_output=True)
        if subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode != 0:
            return
        time.sleep(0.1)


def judge(rc, out, want, right):
    """A run's verdict: HANG (no exit), `right` (exit 0, the uninterrupted
    digest), WRONG (exit 0, another digest), or None (it stopped)."""
    if rc is None:
        return "HANG"
    if rc != 0:
        return None
    m = DIGEST.search(out)
    return right if m and m.group(1) == want else "WRONG"


def config(path, work, scheme, shared):
    lines = [
        f'scratch = "{work}/node-{{node}}"',
        f'redundancy = "{scheme}"',
        "ranks_per_node = 1",
        "max_versions = 4",
        "max_chain = 8",
        'host_cache_size = "64M"',
    ]
    if shared:
        lines.append(f'persistent = "{work}/shared"')
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def files_under(root):
    out = []
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            if os.path.isfile(p) and not os.path.islink(p) and n != "LOCK":
                out.append(p)
    return sorted(out)


def damage(rng, work, ranks, snapshots):
    """One random act of damage; returns what it did."""
    kind = rng.choice(["lose", "lose", "stale", "flip", "flip", "flip", "truncate", "delete"])
    node = rng.randrange(ranks)
    node_dir = os.path.join(work, f"node-{node}")
    if kind == "lose":
        if os.path.isdir(node_dir):
            shutil.rmtree(node_dir)
        return f"node {node}'s directory lost"
    if kind == "stale":
        if node not in snapshots or not os.path.isdir(snapshots[node]):
            return "no older copy of a node to put back"
        if os.path.isdir(node_dir):
            shutil.rmtree(node_dir)
        shutil.copytree(snapshots[node], node_dir)
        return f"node {node}'s directory replaced by an older copy of itself"
    files = files_under(work)
    if not files:
        return "nothing to damage"
    path = rng.choice(files)
    rel = os.path.relpath(path, work)
    size = os.path.getsize(path)
    if kind == "flip" and size > 0:
        at = rng.randrange(size)
        with open(path, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
        return f"a bit flipped in {rel} (byte {at} of {size})"
    if kind == "truncate":
        to = rng.randrange(size + 1) if size else 0
        os.truncate(path, to)
        return f"{rel} truncated to {to} of {size} bytes"
    os.remove(path)
    return f"{rel} deleted"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--budget", type=float, default=480.0, help="seconds; no trial starts after")
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--bin-dir", default="target/release")
    ap.add_argument("--keep", action="store_true", help="keep the failed trials' directories")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)
    rng = random.Random(seed)
    dckpt = os.path.abspath(os.path.join(a.bin_dir, "dckpt"))
    bins = {e: os.path.abspath(os.path.join(a.bin_dir, "examples", e)) for e in EXAMPLES}
    print(f"break-campaign: seed {seed}, {a.ranks} ranks on {a.ranks} emulated nodes, budget {a.budget:.0f} s", flush=True)
    top = tempfile.mkdtemp(prefix="dckpt-campaign-")
    want = {}
    for e, args in EXAMPLES.items():
        clean = os.path.join(top, f"clean-{e}")
        rc, out = mpirun(args + ["--dir", clean], a.ranks, bins[e], os.path.join(top, f"clean-{e}.log"))
        m = DIGEST.search(out or "")
        if rc != 0 or not m:
            print(f"break-campaign: the uninterrupted {e} run failed (rc {rc}):\n{out}")
            return 1
        want[e] = m.group(1)
        shutil.rmtree(clean, ignore_errors=True)
    counts = {k: 0 for k in ["trials", "from-checkpoint", "from-start", "stopped-then-right", "WRONG", "HANG", "WEDGED"]}
    started = time.time()
    trial = 0
    while time.time() - started < a.budget:
        trial += 1
        e = rng.choice(list(EXAMPLES))
        scheme = rng.choice(["none", "partner", f"xor:{a.ranks}"])
        shared = rng.random() < 0.5
        work = os.path.join(top, f"t{trial}")
        os.makedirs(work)
        cfg = os.path.join(top, f"t{trial}.toml")
        config(cfg, work, scheme, shared)
        args = EXAMPLES[e] + ["--config", cfg]
        log = os.path.join(top, f"t{trial}.log")
        story = [f"{e}, redundancy {scheme}, {'a shared directory' if shared else 'node-local only'}"]
        # The run that dies (in two parts when an older copy of a node is kept).
        snapshots = {}
        if rng.random() < 0.3:
            first = rng.randrange(45, 120)
            mpirun(args + ["--crash-at", str(first)], a.ranks, bins[e], log)
            node = rng.randrange(a.ranks)
            src = os.path.join(work, f"node-{node}")
            if os.path.isdir(src):
                snapshots[node] = os.path.join(top, f"t{trial}-snap-{node}")
                shutil.copytree(src, snapshots[node])
                story.append(f"killed at step {first}, node {node}'s directory copied")
        how = rng.random()
        if how < 0.45:
            crash = rng.randrange(25, 195)
            mpirun(args + ["--crash-at", str(crash)], a.ranks, bins[e], log)
            story.append(f"rank {a.ranks - 1} aborted at step {crash}")
        elif how < 0.8:
            after = rng.uniform(0.5, 3.0)
            mpirun(args, a.ranks, bins[e], log, kill_after=after)
            story.append(f"mpirun SIGKILLed after {after:.2f} s")
        else:
            mpirun(args, a.ranks, bins[e], log)
            story.append("ran to the end")
        for _ in range(rng.randrange(0, 3)):
            story.append(damage(rng, work, a.ranks, snapshots))
        counts["trials"] += 1
        rc, out = mpirun(args, a.ranks, bins[e], log)
        runs = [out]
        verdict = judge(rc, out, want[e], "ok")
        if verdict is None:
            # A stop: run again as it is, then after what it names.
            rc, out = mpirun(args, a.ranks, bins[e], log)
            runs.append(out)
            if rc not in (0, None) and "dckpt repair" in out:
                for d in sorted(os.listdir(work)):
                    node = os.path.join(work, d)
                    for store in sorted(os.listdir(node)) if os.path.isdir(node) else []:
                        if os.path.isdir(os.path.join(node, store)):
                            subprocess.run([dckpt, "repair", "--dir", os.path.join(node, store)], capture_output=True)
                rc, out = mpirun(args, a.ranks, bins[e], log)
                runs.append(out)
            verdict = judge(rc, out, want[e], "stopped-then-right") or "WEDGED"
        if verdict == "ok":
            m = FROM.search(out)
            verdict = "from-checkpoint" if m else "from-start"
        counts[verdict] += 1
        line = f"trial {trial}: {'; '.join(story)} -> {verdict}"
        if verdict in ("WRONG", "HANG", "WEDGED"):
            errors = [l for r in runs for l in r.splitlines() if "dckpt" in l or "Error" in l or "error" in l]
            print(line + "\n    " + "\n    ".join(errors[-6:]), flush=True)
            if a.keep:
                print(f"    kept: {work}", flush=True)
                continue
        else:
            print(line, flush=True)
        shutil.rmtree(work, ignore_errors=True)
        for s in snapshots.values():
            shutil.rmtree(s, ignore_errors=True)
    print(
        f"break-campaign: seed {seed}, {time.time() - started:.0f} s: "
        + ", ".join(f"{k} {v}" for k, v in counts.items()),
        flush=True,
    )
    if not a.keep:
        shutil.rmtree(top, ignore_errors=True)
    return 1 if counts["WRONG"] or counts["HANG"] or counts["WEDGED"] else 0


if __name__ == "__main__":
    sys.exit(main())
