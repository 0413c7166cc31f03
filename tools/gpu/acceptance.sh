#!/usr/bin/env bash
# The GPU figures the CUDA and quantization work is judged by, in one run, most important first,
# each step skipped when what is left of a time budget would not cover it:
#   tools/gpu/acceptance.sh BUNDLE_DIR OUT_DIR SCRATCH [BUDGET_SECONDS [STEPS]]
# STEPS picks some of: suite memcheck 4b 12b 26b 27b serve (default: all, in that order), so the
# whole list can be split over runs that each fit a time limit.
# BUNDLE_DIR is an unpacked tools/gpu/make-bundle.sh archive (kiln, kiln_gpu_tests,
# kiln_serve_load, lib/); SCRATCH holds the synthetic models (tmpfs is fastest; the 26B and 27B
# need ~55 GB). Writes gpu_tests.log, memcheck.txt, bench-NAME-TAG.json per run and summary.txt.
#   1. the GPU suite;                     2. compute-sanitizer memcheck over the suite;
#   3. bf16 decode, prompt 512 / 128 generated, and prefill of 4096 tokens, per geometry;
#   4. the same models quantized to 4-bit g64: decode and the 4096-token prefill ratio;
#   5. serving: 32 concurrent clients against one (tools/gpu/serve-load.sh).
# With COMPARE_KILN=PATH (another build of kiln), each 4-bit decode is also run with that build and
# then with this one again, on the same model in the same run: an A/B of two builds.
set -u
bundle=$1 out=$2 scratch=$3 budget=${4:-1500} steps=${5:-suite memcheck 4b 12b 26b 27b serve}
root=$(cd "$(dirname "$0")/../.." && pwd)
export LD_LIBRARY_PATH=$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
kiln=$bundle/kiln
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
# runs the rest of the line when at least $1 seconds of the budget are left
step() {
  local need=$1
  shift
  if [ "$(left)" -lt "$need" ]; then
    echo "skipped (needs ~${need} s, $(left) s left): $*" | tee -a "$out/summary.txt"
    return 1
  fi
  "$@"
}
mkdir -p "$out" "$scratch"
: > "$out/summary.txt"

suite() {
  timeout 300 "$bundle/kiln_gpu_tests" > "$out/gpu_tests.log" 2>&1
  echo "GPU suite: exit $? — $(grep -E '^\[  (PASSED|FAILED) ' "$out/gpu_tests.log" | tr '\n' ' ')" | tee -a "$out/summary.txt"
}
memcheck() {
  timeout $(($(left) - 60)) compute-sanitizer --tool memcheck --print-limit 10 "$bundle/kiln_gpu_tests" \
    > "$out/memcheck.txt" 2>&1
  echo "memcheck: exit $? — $(grep -E 'ERROR SUMMARY' "$out/memcheck.txt" | tail -1)" | tee -a "$out/summary.txt"
}
# bench MODEL_DIR NAME TAG ARGS...: one kiln bench run, its JSON kept and its key figures printed
bench() {
  local model=$1 name=$2 tag=$3
  shift 3
  timeout 180 "$kiln" bench "$model" --device cuda --json "$@" > "$out/bench-$name-$tag.json" 2> "$out/bench-$name-$tag.err"
  python3 - "$out/bench-$name-$tag.json" "$name $tag" <<'PY' | tee -a "$out/summary.txt"
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    print(f"{sys.argv[2]}: no result"); sys.exit()
print(f"{sys.argv[2]}: prefill {j['prefill_ms']:.1f} ms ({100 * j['prefill_share_of_matmul_peak']:.1f}% of "
      f"{j['matmul_peak_tflop_s']:.0f} TFLOP/s), decode {j['decode_step_ms']:.3f} ms/step = "
      f"{100 * j['decode_share_of_roofline']:.1f}% of {j['copy_bandwidth_gb_s']:.0f} GB/s")
PY
}
# geometry CONFIG SYNTH_SECONDS: bf16 decode and 4096-token prefill, then the same at 4-bit g64
geometry() {
  local config=$1 synth=$2 name
  name=$(basename "$config" .json)
  rm -rf "$scratch/bf16" "$scratch/q4"
  "$kiln" synth-model "$config" "$scratch/bf16" --dtype bf16 > /dev/null 2>&1 || return
  bench "$scratch/bf16" "$name" bf16-decode --prompt-len 512 --gen 128 --no-matmul-peak
  step $((synth / 2 + 30)) bench "$scratch/bf16" "$name" bf16-prefill4096 --prompt-len 4096 --gen 8 --runs 2
  if [ "${QUANTIZED:-1}" = 1 ] && step $((synth + 60)) "$kiln" quantize "$scratch/bf16" "$scratch/q4" --bits 4 \
    --group-size 64 > /dev/null 2>&1; then
    bench "$scratch/q4" "$name" q4-decode --prompt-len 512 --gen 128 --no-matmul-peak
    if [ -n "${COMPARE_KILN:-}" ]; then
      kiln=$COMPARE_KILN bench "$scratch/q4" "$name" q4-decode-compare --prompt-len 512 --gen 128 --no-matmul-peak
      bench "$scratch/q4" "$name" q4-decode-again --prompt-len 512 --gen 128 --no-matmul-peak
    fi
    step 60 bench "$scratch/q4" "$name" q4-prefill4096 --prompt-len 4096 --gen 8 --runs 2 --no-matmul-peak &&
      python3 -c 'import json, sys; q, b = (json.load(open(f))["prefill_ms"] for f in sys.argv[1:3]);
print(f"{sys.argv[3]}: 4-bit / bf16 prefill of 4096 tokens = {q / b:.3f}")' \
        "$out/bench-$name-q4-prefill4096.json" "$out/bench-$name-bf16-prefill4096.json" "$name" 2>&1 |
      tee -a "$out/summary.txt"
  fi
  rm -rf "$scratch/bf16" "$scratch/q4"
}

serve() {
  "$root/tools/gpu/serve-load.sh" "$kiln" "$bundle/kiln_serve_load" "$out" "$scratch/serve" \
    "$root/models/configs/qwen3.5-4b.json" invariant > "$out/serve-load.log" 2>&1
  grep -E "aggregate|identical|second turn" "$out/serve-load-invariant.txt" | tee -a "$out/summary.txt"
}

wanted() { [[ " $steps " == *" $1 "* ]]; }
wanted suite && step 60 suite
wanted memcheck && step 120 memcheck
wanted 4b && step 90 geometry "$root/models/configs/qwen3.5-4b.json" 20
wanted 12b && step 150 geometry "$root/models/configs/gemma4-12b.json" 45
wanted 26b && QUANTIZED=0 step 240 geometry "$root/models/configs/gemma4-26b-a4b.json" 100
wanted 27b && QUANTIZED=0 step 240 geometry "$root/models/configs/qwen3.5-27b.json" 90
wanted serve && step 150 serve
echo "took $(($(date +%s) - start)) s" | tee -a "$out/summary.txt"
