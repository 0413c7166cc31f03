#!/usr/bin/env bash
# The serving figures on a GPU: a synthetic Qwen 3.5 4B behind `kiln serve`, loaded by 32
# concurrent streaming clients x 4 requests (outputs checked against single runs), plus the
# second-turn prefill of a 2,000-token conversation.
#   tools/gpu/serve-load.sh KILN KILN_SERVE_LOAD OUT_DIR SCRATCH [CONFIG]
# With a bundle from tools/gpu/make-bundle.sh unpacked in /tmp/kiln-bundle:
#   tools/gpu/serve-load.sh /tmp/kiln-bundle/kiln /tmp/kiln-bundle/kiln_serve_load OUT /tmp/scratch
set -u
kiln=$1 load=$2 out=$3 scratch=$4 config=${5:-models/configs/qwen3.5-4b.json}
mkdir -p "$out" "$scratch"
rm -rf "$scratch/model"
"$kiln" synth-model "$config" "$scratch/model" --dtype bf16 2>&1 | tail -1
dir=$(dirname "$0")
"$dir/../../tests/server_harness.sh" "$kiln" "$scratch/model" \
  "--device cuda --max-batch 32 --ctx 4096 --prompt-cache-bytes 8000000000" \
  "$load" --clients 32 --requests 4 --prompt-len 64 --max-tokens 128 --second-turn 2000 2>&1 | tee "$out/serve-load.txt"
status=${PIPESTATUS[0]}
rm -rf "$scratch/model"
exit "$status"
