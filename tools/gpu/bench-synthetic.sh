#!/usr/bin/env bash
# Writes synthetic models of released geometries and benchmarks them, one at a time.
#   tools/gpu/bench-synthetic.sh KILN OUT_DIR SCRATCH "CONFIG:ARGS" ...
# e.g. "models/configs/gemma4-12b.json:--prompt-len 512 --gen 128"
set -u
kiln=$1 out=$2 scratch=$3
shift 3
for spec in "$@"; do
  config=${spec%%:*} args=${spec#*:}
  name=$(basename "$config" .json)
  tag=$(echo "$args" | tr -dc 'a-z0-9-' | sed 's/--*/-/g')
  rm -rf "$scratch/model"
  "$kiln" synth-model "$config" "$scratch/model" --dtype bf16 2>&1 | tail -1
  "$kiln" bench "$scratch/model" --device cuda $args --json > "$out/bench-$name$tag.json" 2> "$out/bench-$name$tag.err"
  echo "== $name $args (exit $?)"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print({k: (round(v,3) if isinstance(v,float) else v) for k,v in j.items() if k not in ('model',)})" "$out/bench-$name$tag.json" 2>/dev/null || tail -3 "$out/bench-$name$tag.err"
done
rm -rf "$scratch/model"
