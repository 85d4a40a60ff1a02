#!/usr/bin/env bash
# Fuzzes the readers of files and specs a user hands us, with libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer (clang; not part of `make
# test`: a fuzz run is open-ended; `make test` replays each target over its
# seeds and fixed mutations instead, tests/fuzz/replay_main.cc). Each target runs SECONDS (default 60)
# from a seed corpus of real inputs (the repo's configs and golden files,
# ../shared/data); a crash, a leak, a timeout or an out-of-memory input is
# written to build-fuzz/artifacts/ and fails the script.
#   tools/fuzz.sh [SECONDS] [TARGET...]   targets: json safetensors ecspell
#                                         vocab batch_records confusion spec
#                                         nvidia_smi_topo
# The spec and nvidia_smi_topo targets link the control plane's Debian
# libraries (`make build` first: they use build/'s generated protobuf code).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(json safetensors ecspell vocab batch_records confusion spec
                                     nvidia_smi_topo)
DATA=${DGCA_SHARED_DATA:-$(cd .. && pwd)/shared/data}
OUT=build-fuzz
mkdir -p "$OUT/obj" "$OUT/artifacts"
CXX=${CXX_FUZZ:-clang++}
FLAGS=(-std=c++17 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -I.)

# model/core, instrumented once.
CORE=()
for f in model/core/*.cc; do
  case "$f" in *_test.cc) continue ;; esac
  o="$OUT/obj/$(basename "${f%.cc}").o"
  if [ ! -f "$o" ] || [ "$f" -nt "$o" ]; then
    "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer-no-link -c "$f" -o "$o"
  fi
  CORE+=("$o")
done

seed() {  # target -> seed corpus directory
  local d="$OUT/corpus/$1"
  mkdir -p "$d"
  case "$1" in
    json) cp configs/*.yaml "$d/" 2>/dev/null || true
          printf '{"a":[1,2.5e3,-0,true,null,"\\u00e9\\ud83d\\ude00"],"b":{}}' > "$d/seed.json"
          head -c 4000 "$DATA/confusion/pinyin_sam.json" > "$d/confusion.json" ;;
    safetensors) cp tests/golden/*.safetensors "$d/" ;;
    ecspell) head -20 "$DATA/ecspell/train_law.txt" > "$d/law.txt" ;;
    vocab) head -300 "$DATA/vocab/vocab.txt" > "$d/vocab.txt" ;;
    batch_records) printf 'DGCABAT1' > "$d/magic" ;;
    confusion) head -c 4000 "$DATA/confusion/pinyin_sam.json" > "$d/head.json" ;;
    spec) cp configs/*.yaml "$d/" ;;
    nvidia_smi_topo) for f in tests/fixtures/*/nvidia-smi-topo-m.txt; do
                       cp "$f" "$d/$(basename "$(dirname "$f")").txt"; done ;;
  esac
  echo "$d"
}

export DGCA_FUZZ_VOCAB="$DATA/vocab/vocab.txt"
failed=()
for t in "${TARGETS[@]}"; do
  extra=()
  case "$t" in spec | nvidia_smi_topo)
    [ -f build/proto/libdgca_proto.a ] || { echo "fuzz: $t needs 'make build' first"; exit 2; }
    src=spec/spec.cc
    [ "$t" = nvidia_smi_topo ] && src=topology/topo_matrix.cc
    "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer-no-link -Ibuild/proto -c "$src" -o "$OUT/obj/$t.o"
    extra=("$OUT/obj/$t.o" build/proto/libdgca_proto.a -lprotobuf -lyaml-cpp
           $(pkg-config --libs absl_strings absl_str_format absl_status absl_statusor))
  esac
  "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer -Ibuild/proto "tests/fuzz/${t}_fuzz.cc" "${extra[@]}" \
    "${CORE[@]}" -lpthread -lbz2 -o "$OUT/${t}_fuzz"
  corpus=$(seed "$t")
  echo "fuzz: $t for ${SECONDS_EACH} s"
  # timeout: a fuzzer stuck in an input that loops (as yaml-cpp's LoadAll
  # did) kept running after it reported the out-of-memory.
  if ! timeout --kill-after=10 $((SECONDS_EACH + 120)) \
       "$OUT/${t}_fuzz" -max_total_time="$SECONDS_EACH" -max_len=4096 -timeout=10 \
       -rss_limit_mb=2048 -artifact_prefix="$OUT/artifacts/${t}-" "$corpus" \
       > "$OUT/${t}.log" 2>&1; then
    failed+=("$t")
    grep -E "ERROR|SUMMARY" "$OUT/${t}.log" | head -5
  else
    grep -E "^Done" "$OUT/${t}.log" || true
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (logs: $OUT/<target>.log; inputs: $OUT/artifacts/)"
  exit 1
fi
echo "fuzz: ok (${TARGETS[*]})"
