#!/usr/bin/env bash
# Writes the quantized oracle fixtures with kiln's own quantizer, from the float fixtures:
#   tools/oracle/make_quant_fixture_dirs.sh KILN_BINARY
# Each goes to tests/fixtures/<name>/ with the source's ids.json. Their logits.npy and greedy.json
# come from transformers running the dequantized weights: tools/oracle/make_quant_fixtures.py.
set -euo pipefail
kiln=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
fixtures=$root/tests/fixtures

# name | source fixture | kiln quantize options
while IFS='|' read -r name source options; do
  [ -z "$name" ] && continue
  rm -rf "${fixtures:?}/$name"
  # shellcheck disable=SC2086
  "$kiln" quantize "$fixtures/$source" "$fixtures/$name" $options
  cp "$fixtures/$source/ids.json" "$fixtures/$name/"
done <<'LIST'
q4g64_qwen3_5_dense|qwen3_5_dense|--bits 4 --group-size 64
q8g32_gemma4_dense|gemma4_dense|--bits 8 --group-size 32
q4g64_gemma4_moe|gemma4_moe|--bits 4 --group-size 64
q4g32_qwen3_5_moe|qwen3_5_moe|--bits 4 --group-size 32
qmixed_qwen3_5_untied|qwen3_5_untied_mlx|--bits 4 --group-size 32 --override *.mlp.down_proj=8 --override *.linear_attn.out_proj=none --override *.lm_head=6:64 --override *.embed_tokens=5
q2g32_gemma4_ple|gemma4_ple_shared|--bits 2 --group-size 32
q3g64_gemma4_keqv|gemma4_keqv|--bits 3 --group-size 64
q5g32_qwen3_5_moe_mlx|qwen3_5_moe_mlx|--bits 5 --group-size 32
q6g32_qwen3_5_dense|qwen3_5_dense|--bits 6 --group-size 32
LIST
