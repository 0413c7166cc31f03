#!/usr/bin/env python3
"""Compares two directories of named activations (kiln logits --dump, dump_activations.py) in the
order the network computes them, and names the first one whose difference exceeds a tolerance.

Usage: compare_activations.py REFERENCE_DIR CANDIDATE_DIR [--tol 1e-4]
Prints per name: max |a - b| / max |a|, and the first name past --tol.
"""

import argparse
import os
import re
import sys

import numpy as np


def order(name):
    if name == "embed_tokens":
        return (-1, 0, name)
    if name in ("norm", "logits"):
        return (1 << 30, 0 if name == "norm" else 1, name)
    m = re.match(r"layers\.(\d+)(\.(.*))?$", name)
    if not m:
        return (1 << 29, 0, name)
    sub = m.group(3) or ""
    rank = {"self_attn": 0, "linear_attn": 0, "mlp": 1, "router_logits": 2, "experts": 3, "": 4}.get(sub, 5)
    return (int(m.group(1)), rank, name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("reference")
    ap.add_argument("candidate")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    names = sorted({f[:-4] for f in os.listdir(args.reference) if f.endswith(".npy")}
                   & {f[:-4] for f in os.listdir(args.candidate) if f.endswith(".npy")}, key=order)
    first_bad = None
    for name in names:
        a = np.load(os.path.join(args.reference, name + ".npy")).astype(np.float64)
        b = np.load(os.path.join(args.candidate, name + ".npy")).astype(np.float64)
        if a.size != b.size:
            print(f"{name:32s} shapes differ: {a.shape} vs {b.shape}")
            first_bad = first_bad or name
            continue
        a = a.reshape(-1)
        b = b.reshape(-1)
        rel = float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))
        flag = "" if rel <= args.tol else "  <-- past tolerance"
        print(f"{name:32s} {rel:.3e}{flag}")
        if rel > args.tol and first_bad is None:
            first_bad = name
    if first_bad:
        print(f"first difference past {args.tol:g}: {first_bad}")
        sys.exit(1)
    print(f"all {len(names)} activations within {args.tol:g}")


if __name__ == "__main__":
    main()
