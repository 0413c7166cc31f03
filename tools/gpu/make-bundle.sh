#!/usr/bin/env bash
# Packs a CUDA build's GPU-side binaries (kiln, the GPU tests, the serving load client) and the
# non-system shared libraries they link into one archive for tools/gpu/run-prebuilt.sh, compressed
# hard: the archive travels with a checkout whose size is limited.
#   tools/gpu/make-bundle.sh BUILD_DIR OUT.tar.xz [BINARY...]
# BINARY: some of kiln, kiln_gpu_tests, kiln_serve_load (default: all three), for a smaller archive.
set -euo pipefail
build=$1 out=$2
shift 2
binaries=("$@")
[ $# -gt 0 ] || binaries=(kiln kiln_gpu_tests kiln_serve_load)
stage=$(mktemp -d)
paths=()
for b in "${binaries[@]}"; do
  if [ -e "$build/$b" ]; then paths+=("$build/$b"); else paths+=("$build/tests/$b"); fi
done
cp "${paths[@]}" "$stage/"
mkdir "$stage/lib"
# every library but the C runtime's own and CUDA's (the GPU machine has its driver's and toolkit's)
for lib in $(ldd "${paths[@]}" | awk '/=>/ {print $3}' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*)\.so|/libcu(da|blas|blasLt|dart)[^/]*\.so'); do
  cp -L "$lib" "$stage/lib/"
done
for b in "${binaries[@]}"; do strip "$stage/$b"; done
grep -m1 'CMAKE_HOME_DIRECTORY' "$build/CMakeCache.txt" | cut -d= -f2 > "$stage/SOURCE_DIR"
tar cf - -C "$stage" . | xz -9e -T0 > "$out"
rm -rf "$stage"
