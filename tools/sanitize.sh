#!/usr/bin/env bash
# Builds every host target with AddressSanitizer and UndefinedBehaviorSanitizer
# into build-asan/ (no CUDA, no CUDA emulator: see DGCA_SANITIZE in
# CMakeLists.txt) and runs ctest there. Slow (a full build without ccache
# hits, tests about 2x slower); a developer's check, not part of make test.
# Usage: tools/sanitize.sh [ctest args...]   e.g. tools/sanitize.sh -R spec
set -euo pipefail
cd "$(dirname "$0")/.."
export BUILD_DIR=build-asan
export CMAKE_FLAGS="-DDGCA_SANITIZE=address,undefined -DDGCA_WITH_CUDA=OFF -DDGCA_CUDA_EMULATOR=OFF ${CMAKE_FLAGS:-}"
tools/build.sh
# detect_leaks: gRPC and protobuf keep process-lifetime singletons; leaks
# are reported but only real ones (in our code) should be fixed.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
DGCA_SHARED_DATA=${DGCA_SHARED_DATA:-$(cd .. && pwd)/shared/data} \
  ctest --test-dir build-asan --output-on-failure -j "${JOBS:-2}" "$@"
