#!/usr/bin/env bash
# Builds the release-form fixtures (tools/oracle/make_release_fixtures.py) on a machine with torch +
# transformers, and lists, for each models/configs/release/*.json, the tensors transformers' wrapper
# class holds (names and shapes, meta device) to check kiln's tower listings against. Results go to
# $OUT: release.log, release_fixtures.tgz (unpack into tests/fixtures/), listing.tgz.
set -u
OUT=${OUT:-/tmp/oracle-out}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
PYTHONUNBUFFERED=1 python3 "$root/tools/oracle/make_release_fixtures.py" /tmp/release_fixtures "$@" > "$OUT/release.log" 2>&1
echo "exit $?"
grep -E "^===|FAILED|Error|note:" "$OUT/release.log" | head -40
tar czf "$OUT/release_fixtures.tgz" -C /tmp release_fixtures
PYTHONUNBUFFERED=1 python3 - "$root" "$OUT/listing" <<'PY'
import glob, json, os, sys, torch
from transformers import AutoConfig, AutoModelForImageTextToText
root, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for path in sorted(glob.glob(os.path.join(root, "models/configs/release/*.json"))):
    try:
        d = json.load(open(path))
        cfg = AutoConfig.for_model(d.pop("model_type"), **d)
        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(cfg)
        tied = {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()
        listing = {k: list(v.shape) for k, v in model.state_dict().items() if k not in tied}
        json.dump(listing, open(os.path.join(out, os.path.basename(path)), "w"), indent=0, sort_keys=True)
        print(os.path.basename(path), len(listing), "tensors")
    except Exception as e:
        print(os.path.basename(path), "fails:", repr(e)[:300])
PY
tar czf "$OUT/listing.tgz" -C "$OUT" listing && rm -rf "$OUT/listing"
