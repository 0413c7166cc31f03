#!/usr/bin/env bash
# Packs a CUDA build's GPU-side binaries (kiln, the GPU tests, the serving load client) and the
# non-system shared libraries they link into one archive for tools/gpu/run-prebuilt.sh, compressed
# hard: the archive travels with a checkout whose size is limited.
#   tools/gpu/make-bundle.sh BUILD_DIR OUT.tar.xz
set -euo pipefail
build=$1 out=$2
stage=$(mktemp -d)
cp "$build/kiln" "$build/tests/kiln_gpu_tests" "$build/tests/kiln_serve_load" "$stage/"
mkdir "$stage/lib"
for lib in $(ldd "$build/kiln" | awk '/=>/ {print $3}' | grep -E 'spdlog|fmt|openblas|gfortran|quadmath|icu|pcre2|httplib|brotli|libssl|libcrypto'); do
  cp -L "$lib" "$stage/lib/"
done
strip "$stage/kiln" "$stage/kiln_gpu_tests" "$stage/kiln_serve_load"
grep -m1 'CMAKE_HOME_DIRECTORY' "$build/CMakeCache.txt" | cut -d= -f2 > "$stage/SOURCE_DIR"
tar cf - -C "$stage" . | xz -9e -T0 > "$out"
rm -rf "$stage"
