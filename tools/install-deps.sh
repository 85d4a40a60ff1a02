#!/usr/bin/env bash
# Installs the Debian packages the build, the tests and the quickstart need,
# only when one is missing. Safe to run again. See docs/build.md.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build ccache pkg-config
  # clang++ for the thread-safety analysis test (tools/thread_safety_check.py).
  clang
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libyaml-cpp-dev libabsl-dev prometheus-cpp-dev libgloo-dev libsqlite3-dev
  libspdlog-dev libcli11-dev libopenblas-dev libgtest-dev
  # libcrypto's HMAC for the rank tokens (coordinator/credentials.h).
  libssl-dev
  prometheus docker-compose bzip2 gzip
  # systemd-analyze, for the deploy check of deploy/systemd (not run as init here).
  systemd
  # A real one-node Slurm cluster for the Slurm tests and benchmark
  # (tools/slurm-local.sh, docs/slurm.md; iproute2 for its second node).
  slurm-wlm munge iproute2
  # Source text and readings for `dgca data synth` (the quickstart corpus).
  unicode-data debian-reference-zh-cn manpages-zh
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "install-deps: missing packages (${missing[*]}) and not root; install them and retry" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
