#!/usr/bin/env bash
# Runs kiln's GPU checks on a GPU machine from binaries built elsewhere.
#   tools/gpu/run-prebuilt.sh BUNDLE.tar.xz OUT_DIR [test filter]
# The bundle holds kiln, kiln_gpu_tests, kiln_serve_load and lib/ (shared libraries the build machine
# linked that the GPU machine may lack). Test binaries look for the source tree at the path they
# were built from, so that path is linked to this checkout.
set -u
bundle=$1 out=$2 filter=${3:-*}
root=$(pwd)
mkdir -p /tmp/kiln-bundle "$out"
tar xJf "$bundle" -C /tmp/kiln-bundle
export LD_LIBRARY_PATH=/tmp/kiln-bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
built_from=$(cat /tmp/kiln-bundle/SOURCE_DIR)
if [ -n "$built_from" ] && [ ! -e "$built_from" ]; then mkdir -p "$(dirname "$built_from")" && ln -s "$root" "$built_from"; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
/tmp/kiln-bundle/kiln --version
/tmp/kiln-bundle/kiln_gpu_tests --gtest_filter="$filter" > "$out/gpu_tests.log" 2>&1
echo "gpu tests exit $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran|Failure|error" "$out/gpu_tests.log" | head -60
