#!/usr/bin/env bash
# Builds every host target with AddressSanitizer, LeakSanitizer and
# UndefinedBehaviorSanitizer into build-asan/ (no CUDA, no CUDA emulator: see
# DGCA_SANITIZE in CMakeLists.txt; -O1 -g with assert() on) and runs ctest
# there. Any report fails its test, a leak included. Slow (a full build
# without ccache hits, ~13 min here); a developer's check, not part of make test.
# Usage: tools/sanitize.sh [ctest args...]   e.g. tools/sanitize.sh -R spec
#        tools/sanitize.sh --emu [ctest args...]
# --emu: model/ alone with the CUDA emulator under UBSan only (ASan cannot
# follow the emulator's fiber stacks; the emulator guards memory itself)
# into build-ubsan-emu/, then its ctest: the CUDA kernels' index arithmetic,
# shifts and (vector) load alignment checked on the CPU (~10 min here).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --emu ]; then
  shift
  export BUILD_DIR=build-ubsan-emu
  cmake -S . -B "$BUILD_DIR" -G Ninja -DDGCA_MODEL_ONLY=ON -DDGCA_WITH_CUDA=OFF -DDGCA_CUDA_EMULATOR=ON \
    -DDGCA_SANITIZE=undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" \
    ${CMAKE_FLAGS:-} > /dev/null
  tools/build.sh
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  DGCA_SHARED_DATA=${DGCA_SHARED_DATA:-$(cd .. && pwd)/shared/data} \
    exec ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-2}" "$@"
fi
export BUILD_DIR=build-asan
# Configured every time, so the flags here win over an older cache.
cmake -S . -B "$BUILD_DIR" -G Ninja -DDGCA_SANITIZE=address,undefined -DDGCA_WITH_CUDA=OFF \
  -DDGCA_CUDA_EMULATOR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g" \
  ${CMAKE_FLAGS:-} > /dev/null
tools/build.sh
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
DGCA_SHARED_DATA=${DGCA_SHARED_DATA:-$(cd .. && pwd)/shared/data} \
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-2}" "$@"
