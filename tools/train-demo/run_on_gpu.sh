#!/usr/bin/env bash
# Trains kiln's demo model on one GPU (made for an H200) in about 8 minutes in all, and writes
# everything it makes under $OUT:
#   run_on_gpu.log          this script's whole log
#   tokenizer/              tokenizer.json, tokenizer_config.json, tokenizer_report.json
#   smoke/                  the smoke run's outputs (tiny model, 20 steps)
#   run/model/              the trained model: config.json, model.safetensors (bf16),
#                           generation_config.json, tokenizer.json, tokenizer_config.json
#   run/log.csv, run/loss.png, run/metrics.json, run/samples.txt, run/samples.json
#   corpus_manifest.json    the corpus manifest (packages, versions, licence, checksums)
#
# Run from the repository root with OUT set, after extract_corpus.sh has filled
# tools/train-demo/data (the corpus is not in git). A tokenizer committed as
# tools/train-demo/tokenizer/ is used as is; without one it is trained here first.
set -euo pipefail

start=$(date +%s)
total_budget=510   # seconds for the whole script; a caller's limit of ~9 minutes (540 s) stays clear
post_train=90      # reserved after the training loop: save, reload, evaluation, samples
here=tools/train-demo
data=$here/data
out="${OUT:?set OUT to the output folder}"
mkdir -p "$out"
exec > >(tee "$out/run_on_gpu.log") 2>&1

export PYTHONHASHSEED=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=true PYTHONUNBUFFERED=1
elapsed() { echo $(( $(date +%s) - start )); }

echo "== versions ($(date -u +%FT%TZ))"
nvidia-smi -L || true
python3 - <<'PY'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "transformers", "tokenizers", "safetensors", "numpy"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "?"))
    except Exception as e:
        print(name, "MISSING", e)
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
try:
    import fla  # noqa: F401
    print("flash-linear-attention present")
except Exception:
    print("flash-linear-attention absent: transformers' torch gated-delta path is used")
PY

echo "== corpus"
for f in train.txt valid.txt manifest.json; do
  [ -s "$data/$f" ] || { echo "missing $data/$f: run tools/train-demo/extract_corpus.sh and carry tools/train-demo/data"; exit 1; }
done
python3 - "$data" <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
for name, want in m["files"].items():
    got = hashlib.sha256(open(os.path.join(d, name), "rb").read()).hexdigest()
    if got != want["sha256"]:
        sys.exit(f"{name}: sha256 {got} differs from the manifest's {want['sha256']}")
print("corpus checksums match the manifest:", m["packages"], m["chapters"])
PY
cp "$data/manifest.json" "$out/corpus_manifest.json"

echo "== tokenizer (t=$(elapsed)s)"
if [ -s "$here/tokenizer/tokenizer.json" ] && [ -s "$here/tokenizer/tokenizer_config.json" ]; then
  tok="$here/tokenizer"
  echo "using the committed tokenizer in $tok"
else
  tok="$out/tokenizer"
  python3 "$here/train_tokenizer.py" --data-dir "$data" --out-dir "$tok" --vocab-size 8192
fi

echo "== smoke run (t=$(elapsed)s)"
if ! timeout 150 python3 "$here/train.py" --smoke --data-dir "$data" --tokenizer-dir "$tok" \
     --out-dir "$out/smoke" --max-minutes 1; then
  echo "SMOKE RUN FAILED: the real run was not started"
  exit 1
fi
python3 - "$out/smoke" <<'PY'
import json, os, sys
d = sys.argv[1]
for f in ("model/config.json", "model/model.safetensors", "model/tokenizer.json", "log.csv", "loss.png",
          "metrics.json", "samples.txt"):
    if not os.path.exists(os.path.join(d, f)):
        sys.exit(f"smoke run did not write {f}")
m = json.load(open(os.path.join(d, "metrics.json")))
print("smoke ok:", {k: m[k] for k in ("steps_run", "valid_loss", "train_seconds")})
PY

left=$(( total_budget - $(elapsed) - post_train - 30 ))   # 30 s: imports and tokenizing the corpus
minutes=$(python3 -c "print(f'{max(0.0, min(6.0, $left / 60)):.2f}')")
echo "== real run (t=$(elapsed)s): training loop limited to $minutes minutes"
if python3 -c "import sys; sys.exit(0 if $minutes >= 1.0 else 1)"; then :; else
  echo "not enough time left for the real run"; exit 1
fi
hard_limit=$(( 570 - $(elapsed) ))
timeout "$hard_limit" python3 "$here/train.py" --data-dir "$data" --tokenizer-dir "$tok" \
  --out-dir "$out/run" --max-minutes "$minutes"

echo "== outputs (t=$(elapsed)s)"
ls -la "$out/run" "$out/run/model"
cat "$out/run/metrics.json"
cat "$out/run/samples.txt"
echo "== done in $(elapsed)s"
