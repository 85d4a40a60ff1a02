#!/usr/bin/env bash
# Configures (once) and builds with Ninja and ccache. Builds are serialized
# with a lock so two never run at once on this 2-core machine.
# Usage: tools/build.sh [ninja targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
exec 9>"${TMPDIR:-/tmp}/dgca-build.lock"
flock 9
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_FLAGS:-} >/dev/null
fi
ninja -C "$BUILD_DIR" -j "${JOBS:-2}" "$@"
