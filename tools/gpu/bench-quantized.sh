#!/usr/bin/env bash
# Synthetic 4-bit g64 models of released geometries against their bf16 originals, one at a time:
#   tools/gpu/bench-quantized.sh KILN OUT_DIR SCRATCH CONFIG_JSON...
# e.g. tools/gpu/bench-quantized.sh build/kiln /tmp/out /tmp/scratch models/configs/qwen3.5-4b.json
# Per config it writes bench-NAME-{bf16,q4}-prefill.json (4096-token prefill, decode of 128),
# bench-NAME-q4-memory.json (device memory of a 3-token run, less a tiny model's) and prints:
#   decode share of the bandwidth roofline (bytes = packed weights + scales + biases + caches),
#   q4 prefill time / bf16 prefill time, device and host (CPU backend) resident memory / files.
set -u
kiln=$1 out=$2 scratch=$3
shift 3
mkdir -p "$out" "$scratch"
root=$(cd "$(dirname "$0")/../.." && pwd)

# the largest device memory (MiB) nvidia-smi shows for `kiln logits MODEL` over its run
device_peak_mib() {
  "$kiln" logits "$1" --ids 1,2,3 --out "$scratch/l.npy" --device cuda > /dev/null 2>&1 &
  local pid=$! peak=0 used
  while kill -0 "$pid" 2> /dev/null; do
    used=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
      awk -F', ' -v p="$pid" '$1 == p {print $2}')
    [ -n "$used" ] && [ "$used" -gt "$peak" ] && peak=$used
    sleep 0.1
  done
  echo "$peak"
}
for config in "$@"; do
  name=$(basename "$config" .json)
  rm -rf "$scratch/bf16" "$scratch/q4"
  "$kiln" synth-model "$config" "$scratch/bf16" --dtype bf16 2>&1 | tail -1
  "$kiln" bench "$scratch/bf16" --device cuda --prompt-len 4096 --gen 128 --json > "$out/bench-$name-bf16-prefill.json" \
    2> "$out/bench-$name-bf16.err"
  "$kiln" quantize "$scratch/bf16" "$scratch/q4" --bits 4 --group-size 64 2>&1 | tail -1
  rm -rf "$scratch/bf16"
  "$kiln" bench "$scratch/q4" --device cuda --prompt-len 4096 --gen 128 --json > "$out/bench-$name-q4-prefill.json" \
    2> "$out/bench-$name-q4.err"
  files=$(cat "$scratch"/q4/*.safetensors | wc -c)
  # device memory of a process that loads the model and runs 3 tokens, less that of the same run
  # on a tiny fixture (the CUDA context, cuBLAS and its workspace)
  gpu_mib=$(device_peak_mib "$scratch/q4")
  base_mib=$(device_peak_mib "$root/tests/fixtures/q4g64_qwen3_5_dense")
  echo "{\"peak_memory_bytes\": $(( (gpu_mib - base_mib) * 1048576 ))}" > "$out/bench-$name-q4-memory.json"
  # host resident memory of the CPU backend running the quantized model (weights mapped in place)
  rss_kb=$(python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' \
    "$kiln" logits "$scratch/q4" --ids 1,2,3 --out "$scratch/l.npy" --device cpu)
  python3 - "$out" "$name" "$files" "$rss_kb" <<'PY'
import json, sys
out, name, files, rss_kb = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
b = json.load(open(f"{out}/bench-{name}-bf16-prefill.json"))
q = json.load(open(f"{out}/bench-{name}-q4-prefill.json"))
m = json.load(open(f"{out}/bench-{name}-q4-memory.json"))
rss = int(rss_kb) * 1024 if rss_kb.strip().isdigit() else 0
summary = {
    "model": name,
    "q4_files_bytes": files,
    "q4_decode_tok_s": q["decode_tok_s"],
    "q4_decode_bytes_per_step": q["decode_bytes_per_step"],
    "q4_decode_share_of_roofline": q["decode_share_of_roofline"],
    "bf16_decode_share_of_roofline": b["decode_share_of_roofline"],
    "q4_prefill_ms_4096": q["prefill_ms"],
    "bf16_prefill_ms_4096": b["prefill_ms"],
    "q4_over_bf16_prefill": q["prefill_ms"] / b["prefill_ms"],
    "q4_device_peak_over_files": m["peak_memory_bytes"] / files,
    "q4_cpu_max_rss_over_files": rss / files,
}
json.dump(summary, open(f"{out}/summary-{name}.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
PY
  rm -rf "$scratch/q4"
done
