#!/usr/bin/env bash
# ctest dgca_train_cli: the dgca-train program on the CPU (the GPU machine
# runs the same program with --device cuda; bench/gpu/curve.sh): it trains,
# writes one batch record per micro-batch in step/micro order, a JSON with
# every step's losses, and refuses bad flags with exit 2 and the flag named.
# Usage: dgca_train_test.sh DGCA_TRAIN_BINARY   (DGCA_SHARED_DATA from ctest)
set -uo pipefail
BIN=$1
DATA=${DGCA_SHARED_DATA:-/work/shared/data}
if [ ! -f "$DATA/ecspell/train_law.txt" ]; then
  echo "SKIP: no ECSpell data under $DATA"
  exit 77
fi
W=$(mktemp -d /tmp/dgca_train_test.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$BIN" --train "$DATA/ecspell/train_law.txt" --preset tiny --seq 48 --micro-batch 4 \
  --accumulation 2 --steps 3 --lr 1e-3 --dump-batches "$W/b.bin" --json "$W/c.json" \
  > "$W/out.txt" 2> "$W/err.txt" || { cat "$W/err.txt"; fail "training exited $?"; }
grep -q "^device: cpu (1 thread)" "$W/err.txt" || fail "no device line in the log"
python3 - "$W/b.bin" "$W/c.json" <<'PY' || fail "outputs do not match"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
assert raw[:8] == b"DGCABAT1", raw[:8]
pos, order = 8, []
while pos < len(raw):
    step, micro, B, L, T, K, _, _ = struct.unpack_from("<8i", raw, pos)
    pos += 32 + 4 * (5 * B * L + 3 * T + T * K + B) + 8 * B
    order.append((step, micro))
    assert B == 4 and L == 48 and K == 8 and T > 0, (B, L, T, K)
assert pos == len(raw), (pos, len(raw))
assert order == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)], order
d = json.load(open(sys.argv[2]))
steps = d["steps"]
assert [s["step"] for s in steps] == [1, 2, 3], steps
for s in steps:
    parts = s["fusion"] + s["mft"] + s["detector"] + s["candidate"]
    assert abs(s["loss"] - parts) < 1e-3 * abs(s["loss"]), s
    assert s["grad_norm"] > 0, s
assert d["accumulation"] == 2 and d["micro_batch"] == 4
print("records", len(order), "losses", [round(s["loss"], 4) for s in steps])
PY

"$BIN" --train x --precision fp8 > /dev/null 2> "$W/bad.txt"
rc=$?
[ $rc = 2 ] || fail "--precision fp8 exited $rc, expected 2"
grep -qF -e "--precision: 'fp8' is not one of fp32, bf16, fp16" "$W/bad.txt" || fail "no precision message: $(cat "$W/bad.txt")"
"$BIN" --train "$DATA/ecspell/train_law.txt" --steps -3 > /dev/null 2> "$W/bad.txt"
rc=$?
[ $rc = 2 ] || fail "--steps -3 exited $rc, expected 2"
grep -q -- "--steps -3: expected a number in" "$W/bad.txt" || fail "no steps message: $(cat "$W/bad.txt")"
"$BIN" --train /nonexistent/train.txt --steps 1 > /dev/null 2> "$W/bad.txt"
rc=$?
[ $rc = 1 ] || fail "missing train file exited $rc, expected 1"
grep -q "/nonexistent/train.txt" "$W/bad.txt" || fail "missing file not named: $(cat "$W/bad.txt")"

# Inputs that are the wrong thing: each a clear error (exit 1) naming the
# file, never std::bad_alloc (a vocabulary or `latest` read without a limit)
# nor a silent start (a corrupted checkpoint resumed with NaN weights, a lost
# `latest` taken for a fresh start). The limit of 3 GB of address space keeps
# an unbounded read from taking the machine; an ASan build (tools/sanitize.sh)
# cannot start under it and gets an RSS limit instead.
T="$DATA/ecspell/train_law.txt"
SMALL=(--train "$T" --preset tiny --seq 48 --micro-batch 4 --lr 1e-3)
VLIMIT=3000000
if ! (ulimit -v $VLIMIT; exec "$BIN" --help) > /dev/null 2>&1; then
  VLIMIT=unlimited
  export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}hard_rss_limit_mb=3000"
fi
run1() {  # run1 WHAT PATTERN ARGS...: expects exit 1 and PATTERN on stderr
  local what=$1 pattern=$2
  shift 2
  (ulimit -v $VLIMIT; exec "$BIN" "${SMALL[@]}" "$@") > /dev/null 2> "$W/bad.txt"
  local rc=$?
  [ $rc = 1 ] || fail "$what exited $rc, expected 1: $(tail -c 2000 "$W/bad.txt")"
  grep -qF -e "$pattern" "$W/bad.txt" || fail "$what: no '$pattern' in: $(tail -c 2000 "$W/bad.txt")"
  if grep -q "resumed\|^step " "$W/bad.txt"; then fail "$what: trained anyway: $(cat "$W/bad.txt")"; fi
}
if [ -e /dev/zero ]; then
  run1 "--vocab /dev/zero" "/dev/zero:1: vocabulary line longer than the limit of 1024 bytes" \
    --steps 1 --vocab /dev/zero
fi
printf '[PAD]\n[UNK]\n' > "$W/v2.txt"
run1 "--vocab with [PAD] and [UNK] only" \
  "$W/v2.txt: the vocabulary (2 tokens) lacks the special tokens [CLS], [SEP], [MASK]" \
  --steps 1 --vocab "$W/v2.txt"

CK="$W/ck"
"$BIN" "${SMALL[@]}" --steps 2 --checkpoint-dir "$CK" > /dev/null 2> "$W/err.txt" \
  || fail "training with --checkpoint-dir exited $?: $(cat "$W/err.txt")"
[ "$(cat "$CK/latest")" = step-00000002 ] || fail "no checkpoint step-00000002"
mv "$CK/latest" "$CK/latest.bak"
run1 "no ck/latest with step directories" \
  "checkpoint directory $CK has no 'latest' file but holds step directories (step-00000002)" \
  --steps 3 --checkpoint-dir "$CK"
[ -e "$CK/latest" ] && fail "a run over a checkpoint directory without 'latest' rewrote it"
if [ -e /dev/zero ]; then
  ln -s /dev/zero "$CK/latest"
  run1 "ck/latest -> /dev/zero" "$CK/latest: longer than the limit of 4096 bytes" \
    --steps 3 --checkpoint-dir "$CK"
  rm "$CK/latest"
  mv "$CK/vocab.txt" "$CK/vocab.bak"
  ln -s /dev/zero "$CK/vocab.txt"
  run1 "ck/vocab.txt -> /dev/zero" "$CK/vocab.txt:1: vocabulary line longer than the limit" \
    --steps 3 --checkpoint-dir "$CK"
  rm "$CK/vocab.txt"
  mv "$CK/vocab.bak" "$CK/vocab.txt"
fi
mv "$CK/latest.bak" "$CK/latest"
M="$CK/step-00000002/model.safetensors"
python3 - "$M" <<'PY' || fail "cannot corrupt $M"
import os, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(os.path.getsize(sys.argv[1]) // 2)
    f.write(b"\xff" * 64)
PY
run1 "a corrupted model.safetensors" "$M: corrupted" --steps 3 --checkpoint-dir "$CK"
[ -e "$CK/step-00000003" ] && fail "a run from a corrupted checkpoint wrote a new one"
echo "PASS"
