#!/usr/bin/env python3
"""Summarises a decode timeline (KILN_TIMELINE=FILE from a -DKILN_CUDA_TIMELINE=ON build).

    tools/gpu/timeline-summary.py FILE.csv [--skip 2] [--top 25] [--slots A:B]

Per replay, a kernel's share of the step is the time from its inputs being ready to the next
kernel's inputs being ready (the last kernel of a replay has none and is left out); "early" is how
long its first block sat resident before its inputs were ready. Prints the step, the kernels
grouped by name (calls a step, mean µs a call, µs a step) and the slowest positions in the step;
with --slots A:B, also positions A to B-1 in order (a layer, say), each with its launch shape.
"""
import argparse
import csv
import re
import shutil
import statistics
import subprocess
from collections import defaultdict


def short_names(mangled):
    """Demangled (c++filt when there is one), without namespaces and parameter lists."""
    names = list(mangled)
    if shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
        names = out.splitlines() if len(out.splitlines()) == len(names) else names
    short = []
    for n in names:
        n = re.sub(r"kiln::cuda::(\(anonymous namespace\)::)?", "", n)
        n = re.sub(r"^void ", "", n)
        depth, cut = 0, len(n)
        for i, ch in enumerate(n):  # drop the parameter list: the first '(' outside template brackets
            depth += ch == "<"
            depth -= ch == ">"
            if ch == "(" and depth == 0:
                cut = i
                break
        short.append(n[:cut].replace("__nv_bfloat16", "bf16"))
    return dict(zip(mangled, short))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--skip", type=int, default=2, help="first replays left out (one-time costs)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--slots", help="A:B: positions A to B-1 of the step, in order")
    a = ap.parse_args()
    # a process may record several graphs, each numbering its replays from 0: a replay is a run of
    # rows with one number
    runs, last = [], None
    with open(a.csv) as f:
        for row in csv.DictReader(f):
            if row["replay"] != last:
                runs.append((int(row["replay"]), []))
                last = row["replay"]
            runs[-1][1].append(row)
    names = short_names(sorted({r["kernel"] for _, rows in runs for r in rows}))
    for _, rows in runs:
        for r in rows:
            r["kernel"] = names[r["kernel"]]
    kept = [rows for k, rows in runs if k >= a.skip]
    if not kept:
        raise SystemExit("no replays left after --skip")
    mismatched = sum(1 for rows in kept for r in rows
                     if (r["blocks"], r["threads"]) != (r["marked_blocks"], r["marked_threads"]))
    by_name = defaultdict(list)
    by_slot = defaultdict(list)
    early = defaultdict(list)
    early_at = defaultdict(list)  # by position
    shape_at = {}
    steps = []
    for rows in kept:
        rows.sort(key=lambda r: int(r["slot"]))
        ready = [int(r["ready_ns"]) for r in rows]
        steps.append((ready[-1] - ready[0]) / 1e3)
        for i in range(len(rows) - 1):
            name = rows[i]["kernel"]
            d = (ready[i + 1] - ready[i]) / 1e3
            by_name[name].append(d)
            by_slot[(i, name)].append(d)
            early[name].append((ready[i] - int(rows[i]["started_ns"])) / 1e3)
            early_at[i].append((ready[i] - int(rows[i]["started_ns"])) / 1e3)
            shape_at[i] = (name, rows[i]["blocks"], rows[i]["threads"])
    n = len(kept)
    print(f"{n} replays, {len(kept[0])} kernels a step, first ready to last ready {statistics.median(steps):.1f} µs "
          f"(median); rows whose marked launch shape differs from the recorded one: {mismatched}")
    print(f"{'kernel':70s} {'calls':>6s} {'µs/call':>8s} {'µs/step':>8s} {'early µs':>9s}")
    for name, ds in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name[:70]:70s} {len(ds) / n:6.1f} {statistics.mean(ds):8.2f} {sum(ds) / n:8.1f} "
              f"{statistics.mean(early[name]):9.2f}")
    print(f"\nslowest positions (median µs over replays):")
    ranked = sorted(by_slot.items(), key=lambda kv: -statistics.median(kv[1]))[: a.top]
    for (i, name), ds in ranked:
        print(f"  #{i:4d} {name[:80]:80s} {statistics.median(ds):8.2f}")
    if a.slots:
        first, last = (int(x) for x in a.slots.split(":"))
        print(f"\npositions {first} to {last - 1} (median µs over replays):")
        print(f"  {'#':>5s} {'kernel':60s} {'blocks':>7s} {'threads':>7s} {'µs':>8s} {'early µs':>9s}")
        for i in range(first, last):
            if i not in shape_at:
                continue
            name, blocks, threads = shape_at[i]
            print(f"  #{i:4d} {name[:60]:60s} {blocks:>7s} {threads:>7s} {statistics.median(by_slot[(i, name)]):8.2f} "
                  f"{statistics.median(early_at[i]):9.2f}")


if __name__ == "__main__":
    main()
