#!/usr/bin/env bash
# The kernels of one decode step, each timed alone by Nsight Compute (ncu), summed by kernel and
# launch shape: where a step's time goes, without the few microseconds that op-by-op event timing
# (`kiln bench --profile`) adds to every call.
#   tools/gpu/decode-kernels.sh KILN MODEL_DIR OUT_CSV
# It generates three tokens greedily from an 8-token prompt, so the last two forwards are decode
# steps (replayed CUDA graphs; ncu times their kernel nodes one by one, so PDL overlap is not
# seen), and prints the first of them: the kernels from one token embedding to the next. Needs ncu
# with hardware counters.
set -eu
kiln=$1 model=$2 csv=$3
ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$csv" \
  "$kiln" generate "$model" --ids 1,2,3,4,5,6,7,8 --max-tokens 3 --device cuda > /dev/null
python3 - "$csv" <<'PY'
import csv, io, re, sys
lines = open(sys.argv[1]).read().split("\n")
start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
# every forward starts by embedding its tokens: prefill, decode step, decode step
starts = [i for i, r in enumerate(rows) if "embed" in r["Kernel Name"]]
if len(starts) < 3:
    sys.exit("fewer than three forwards found: is this kiln generating three tokens?")
step = rows[starts[-2] : starts[-1]]
total = 0.0
by_kernel = {}
for r in step:
    name = re.sub(r"\(.*", "", r["Kernel Name"]).replace("void ", "").replace("unnamed>::", "")
    key = f'{name} grid {r["Grid Size"]} block {r["Block Size"]}'
    us = float(r["Metric Value"].replace(",", "")) / 1000
    total += us
    calls, time = by_kernel.get(key, (0, 0.0))
    by_kernel[key] = (calls + 1, time + us)
print(f"{len(step)} kernels, {total:.1f} us summed")
for key, (calls, time) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
    print(f"{time:9.1f} us {calls:4d} x {time / calls:8.2f}  {key}")
PY
