#!/bin/sh
# Rebuild the fatbin fixtures (tests/test_fatbin.py) with a CUDA toolkit's nvcc (12.9 or later, for
# family targets): one tiny kernel, three libraries whose cubins are plain (sm_80 sm_90 sm_100
# sm_120), arch-specific (sm_90a sm_100a) and family-specific (sm_100f sm_120f), compressed as
# wheels' are, and the plain one uncompressed too. `-cudart none` keeps them a few KB.
# Made with nvcc 13.0 (V13.0.88).
set -eu
cd "$(dirname "$0")"
lib() {  # lib NAME FATBIN-FLAG ARCH...
  name=$1 flag=$2; shift 2
  gen=""
  for a in "$@"; do gen="$gen -gencode arch=compute_$a,code=sm_$a"; done
  # shellcheck disable=SC2086 # the -gencode list is split on purpose
  nvcc -shared -Xcompiler -fPIC -cudart none $gen -Xfatbin "$flag" -o "$name.so" kernel.cu
}
lib plain -compress-all 80 90 100 120
lib plain-uncompressed -compress=false 80 90 100 120
lib arch-specific -compress-all 90a 100a
lib family -compress-all 100f 120f
