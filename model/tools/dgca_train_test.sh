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
echo "PASS"
