#!/usr/bin/env bash
# One decode kernel examined closely by Nsight Compute: its throughput, scheduler and warp-state
# sections, and the instructions executed and warp stalls by source line (SASS and CUDA side by
# side), to find where a kernel's instructions and waits go.
#   tools/gpu/kernel-profile.sh KILN MODEL_DIR KERNEL_REGEX OUT_DIR [SKIP]
# It generates three tokens greedily from an 8-token prompt and profiles the first launch of a
# kernel matching KERNEL_REGEX (over the demangled name, template arguments included, e.g.
# 'qdot_kernel<4, 1, 4, true') after SKIP of them (default 200: past the prefill, into the decode
# steps; a kernel that runs once a layer wants fewer). OUT_DIR gets report.ncu-rep (open it in
# Nsight Compute), details.txt and source.csv.
set -eu
kiln=$1 model=$2 regex=$3 out=$4 skip=${5:-200}
mkdir -p "$out"
ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 --import-source yes \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
  --section Occupancy --section LaunchStats --section SourceCounters -f -o "$out/report" \
  "$kiln" generate "$model" --ids 1,2,3,4,5,6,7,8 --max-tokens 3 --device cuda > /dev/null
ncu --import "$out/report.ncu-rep" > "$out/details.txt"
ncu --import "$out/report.ncu-rep" --page source --csv --print-source cuda,sass > "$out/source.csv" 2> /dev/null || true
grep -E "Duration|DRAM Throughput|Issued Warp Per Scheduler|Eligible Warps|Warp Cycles Per Issued" "$out/details.txt"
