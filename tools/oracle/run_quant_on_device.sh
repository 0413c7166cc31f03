#!/usr/bin/env bash
# Records the quantized fixtures' references on a machine with torch + transformers; results go to
# $OUT/quant_fixtures/<name>/{logits.npy,greedy.json,oracle.json} and $OUT/quant_fixtures.tgz.
set -u
OUT=${OUT:-/tmp/oracle-out}
mkdir -p "$OUT"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
PYTHONUNBUFFERED=1 python3 tools/oracle/make_quant_fixtures.py "$OUT/quant_fixtures" "$@" > "$OUT/quant_oracle.log" 2>&1
echo "exit $?"
grep -E "^===|FAILED|Error" "$OUT/quant_oracle.log" | head -40
tar czf "$OUT/quant_fixtures.tgz" -C "$OUT" quant_fixtures
