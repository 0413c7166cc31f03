#!/usr/bin/env bash
# Regenerates the oracle fixtures on a machine with torch + transformers; results go to $OUT.
set -u
OUT=${OUT:-/tmp/oracle-out}
mkdir -p "$OUT"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
T=$(python3 -c "import transformers, os; print(os.path.dirname(transformers.__file__))")
tar czf "$OUT/hf_src.tgz" -C "$T" models/gemma4 models/qwen3_5 models/qwen3_5_moe models/qwen3_next \
  modeling_rope_utils.py masking_utils.py cache_utils.py integrations/sdpa_attention.py 2>&1 | tail -2
PYTHONUNBUFFERED=1 python3 tools/oracle/make_fixtures.py /tmp/fixtures "$@" > "$OUT/oracle.log" 2>&1
echo "exit $?"
grep -E "^===|FAILED|Error" "$OUT/oracle.log" | head -40
tar czf "$OUT/fixtures.tgz" -C /tmp fixtures
