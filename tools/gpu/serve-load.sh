#!/usr/bin/env bash
# The serving figures on a GPU: a synthetic Qwen 3.5 4B behind `kiln serve`, loaded by 32
# concurrent streaming clients x 4 requests (outputs checked against single runs), plus the
# second-turn prefill of a 2,000-token conversation.
#   tools/gpu/serve-load.sh KILN KILN_SERVE_LOAD OUT_DIR SCRATCH [CONFIG] [invariant|fast|both]
# "invariant" serves with batch-invariant steps (the default of kiln serve), "fast" with
# --no-batch-invariant (every row in one forward call). With a bundle from
# tools/gpu/make-bundle.sh unpacked in /tmp/kiln-bundle:
#   tools/gpu/serve-load.sh /tmp/kiln-bundle/kiln /tmp/kiln-bundle/kiln_serve_load OUT /tmp/scratch
set -u
kiln=$1 load=$2 out=$3 scratch=$4 config=${5:-models/configs/qwen3.5-4b.json} modes=${6:-both}
[ "$modes" = both ] && modes="invariant fast"
export LD_LIBRARY_PATH=$(dirname "$kiln")/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p "$out" "$scratch"
rm -rf "$scratch/model"
"$kiln" synth-model "$config" "$scratch/model" --dtype bf16 2>&1 | tail -1
dir=$(dirname "$0")
status=0
for mode in $modes; do
  flag=--batch-invariant
  [ "$mode" = fast ] && flag=--no-batch-invariant
  echo "== kiln serve $flag"
  "$dir/../../tests/server_harness.sh" "$kiln" "$scratch/model" \
    "--device cuda --max-batch 32 --ctx 4096 --prompt-cache-bytes 8000000000 $flag" \
    "$load" --clients 32 --requests 4 --prompt-len 64 --max-tokens 128 --second-turn 2000 2>&1 | tee "$out/serve-load-$mode.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
rm -rf "$scratch/model"
exit "$status"
