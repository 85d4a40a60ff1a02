"""dgca's loss curve against PyTorch's, from the same
initial weights and the same data order.

  init     the PyTorch model (bench/torch_dgca.py) at a seed, saved under
           dgca's parameter names (F32 safetensors): `dgca-train --init-from`
           loads every tensor of it (its log line says "missing 0").
  train    trains that model on the micro-batches dgca-train recorded
           (`--dump-batches`, format: model/core/batch_io.h), step by step as
           dgca's trainer does: per optimizer step, every micro-batch of that
           step with loss / accumulation, global grad norm (before clipping),
           optional clipping, AdamW (betas 0.9/0.999, eps 1e-8; decay only on
           the tensors dgca decays), constant learning rate. --precision bf16
           = torch.autocast(bf16) as bench/gpu/torch_reference.py; fp32 = none.
  compare  a markdown table of dgca vs PyTorch (and PyTorch bf16 vs fp32: the
           "bf16 noise"), paired per step, since both saw the same batches.

Examples (bench/gpu/curve.sh runs them on the GPU machine):
  python3 bench/gpu/loss_curve.py init --preset tiny --out /tmp/init.safetensors
  dgca-train --preset tiny --init-from /tmp/init.safetensors --dump-batches /tmp/b.bin --json /tmp/dgca.json ...
  python3 bench/gpu/loss_curve.py train --preset tiny --init /tmp/init.safetensors --batches /tmp/b.bin \
      --precision fp32 --lr 1e-3 --device cpu --json /tmp/torch.json
  python3 bench/gpu/loss_curve.py compare /tmp/dgca.json /tmp/torch.json
"""
import argparse
import json
import math
import os
import statistics
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_dgca import DgcaRelm, dgca_decays, dgca_name  # noqa: E402


def build(preset, seed):
    torch.manual_seed(seed)
    return DgcaRelm(preset)


def cmd_init(a):
    from safetensors.torch import save_file
    model = build(a.preset, a.seed)
    out = {}
    for n, p in model.named_parameters():
        d = dgca_name(n)
        if d is None:
            raise SystemExit(f"init: no dgca name for parameter {n}")
        t = p.detach().float().contiguous()
        if d in ("detector.weight", "fusion.gate.weight"):
            t = t.reshape(-1)  # dgca stores [H]; torch Linear(H, 1) has [1, H]
        out[d] = t
    save_file(out, a.out)
    print(f"init: {len(out)} tensors, {sum(t.numel() for t in out.values())} values -> {a.out}")


def load_init(model, path):
    from safetensors.torch import load_file
    w = load_file(path)
    used = set()
    with torch.no_grad():
        for n, p in model.named_parameters():
            d = dgca_name(n)
            if d not in w:
                raise SystemExit(f"{path}: missing {d} (for {n})")
            p.copy_(w[d].reshape(p.shape))
            used.add(d)
    extra = sorted(set(w) - used)
    if extra:
        raise SystemExit(f"{path}: tensors with no place in the model: {extra[:5]}")


def read_batches(path):
    """Yields (step, micro, dict of numpy arrays) from a DGCABAT1 file."""
    raw = open(path, "rb").read()
    if raw[:8] != b"DGCABAT1":
        raise SystemExit(f"{path}: not a dgca batch record file")
    pos = 8
    while pos < len(raw):
        step, micro, B, L, T, K, _, _ = struct.unpack_from("<8i", raw, pos)
        pos += 32

        def take(n, dt=np.int32):
            nonlocal pos
            a = np.frombuffer(raw, dtype=dt, count=n, offset=pos)
            pos += n * np.dtype(dt).itemsize
            return a
        rec = dict(input_ids=take(B * L).reshape(B, L), attention_mask=take(B * L).reshape(B, L),
                   prompt_slot=take(B * L).reshape(B, L), labels=take(B * L).reshape(B, L),
                   mft_labels=take(B * L).reshape(B, L), slot_index=take(T), slot_source=take(T),
                   slot_target=take(T), candidates=take(T * K).reshape(T, K), row_length=take(B),
                   sample_index=take(B, np.int64))
        yield step, micro, rec


def to_torch(rec, device):
    mft = rec["mft_labels"].reshape(-1)
    idx = np.nonzero(mft != -100)[0]
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x).astype(np.int64)).to(device)  # noqa: E731
    return dict(input_ids=t(rec["input_ids"]), attention_mask=t(rec["attention_mask"]),
                prompt_slot=t(rec["prompt_slot"]), slot_index=t(rec["slot_index"]),
                slot_source=t(rec["slot_source"]), slot_target=t(rec["slot_target"]),
                candidates=t(rec["candidates"]), mft_index=t(idx), mft_labels=t(mft[idx]))


def cmd_train(a):
    device = torch.device(a.device)
    torch.manual_seed(a.seed)
    model = build(a.preset, a.seed).to(device)
    load_init(model, a.init)
    model.train()
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if dgca_decays(dgca_name(n)) else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    steps = {}
    for step, micro, rec in read_batches(a.batches):
        steps.setdefault(step, []).append((micro, rec))
    out_steps = []
    for step in sorted(steps):
        micro = sorted(steps[step], key=lambda x: x[0])
        acc = len(micro)
        opt.zero_grad(set_to_none=True)
        parts_sum = {"loss": 0.0, "fusion": 0.0, "mft": 0.0, "detector": 0.0, "candidate": 0.0}
        for _, rec in micro:
            b = to_torch(rec, device)
            if a.precision == "bf16":
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                    loss, parts = model(b)
            else:
                loss, parts = model(b)
            (loss / acc).backward()
            parts_sum["loss"] += float(loss) / acc
            for k in ("fusion", "mft", "detector", "candidate"):
                if k in parts:
                    parts_sum[k] += float(parts[k]) / acc
        sq = sum(float((p.grad.float() ** 2).sum()) for p in model.parameters() if p.grad is not None)
        gnorm = math.sqrt(sq)
        if a.clip > 0 and gnorm > a.clip:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(a.clip / (gnorm + 1e-6))
        opt.step()
        rec_out = dict(step=step, grad_norm=gnorm, lr=a.lr, **parts_sum)
        out_steps.append(rec_out)
        if step == 1 or step % 25 == 0:
            print(f"step {step} loss {parts_sum['loss']:.4f} gnorm {gnorm:.3f}", file=sys.stderr)
    d = dict(impl="pytorch", precision=a.precision, preset=a.preset, device=a.device, lr=a.lr,
             torch=torch.__version__, steps=out_steps)
    json.dump(d, open(a.json, "w"))
    print(f"train: {len(out_steps)} steps, last loss {out_steps[-1]['loss']:.4f} -> {a.json}")


def ascii_plot(steps, dg, tb, tf, rows=20, width=64):
    """One text line per sampled step, the loss as a column between the min and max."""
    srcs = [("d", dg), ("t", tb)] + ([("f", tf)] if tf else [])
    vals = [src[s]["loss"] for _, src in srcs for s in steps]
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    pick = sorted({steps[round(i * (len(steps) - 1) / max(rows - 1, 1))] for i in range(rows)})
    out = [f"{'step':>5}  {lo:<10.4f}{'':{width - 20}}{hi:>10.4f}"]
    for s in pick:
        line = [" "] * (width + 1)
        for ch, src in srcs:
            c = round((src[s]["loss"] - lo) / span * width)
            line[c] = "*" if line[c] not in (" ", ch) else ch
        out.append(f"{s:>5} |" + "".join(line))
    return out


def cmd_compare(a):
    dg = {s["step"]: s for s in json.load(open(a.dgca))["steps"]}
    tb = {s["step"]: s for s in json.load(open(a.torch))["steps"]}
    tf = {s["step"]: s for s in json.load(open(a.torch_fp32))["steps"]} if a.torch_fp32 else None
    common = sorted(set(dg) & set(tb) & (set(tf) if tf else set(dg)))
    if not common:
        raise SystemExit("compare: no common steps")
    lines = []
    hdr = "| step | dgca loss | PyTorch loss | abs diff |"
    sep = "|---|---|---|---|"
    if tf:
        hdr += " PyTorch fp32 | bf16 noise (PyTorch bf16 vs fp32) |"
        sep += "---|---|"
    lines += [hdr, sep]
    marks = [s for s in (1, 2, 5, 10, 20, 50, 100, 150, 200, 250, 300) if s in common]
    for s in marks:
        row = f"| {s} | {dg[s]['loss']:.6f} | {tb[s]['loss']:.6f} | {abs(dg[s]['loss'] - tb[s]['loss']):.2e} |"
        if tf:
            row += f" {tf[s]['loss']:.6f} | {abs(tb[s]['loss'] - tf[s]['loss']):.2e} |"
        lines.append(row)
    lines += ["", "Means over 25-step windows:", "", hdr.replace("| step |", "| steps |"), sep]
    for w0 in range(common[0], common[-1] + 1, 25):
        ws = [s for s in common if w0 <= s < w0 + 25]
        if not ws:
            continue
        m = lambda src: statistics.mean(src[s]["loss"] for s in ws)  # noqa: E731
        row = f"| {ws[0]}-{ws[-1]} | {m(dg):.6f} | {m(tb):.6f} | {abs(m(dg) - m(tb)):.2e} |"
        if tf:
            row += f" {m(tf):.6f} | {abs(m(tb) - m(tf)):.2e} |"
        lines.append(row)

    def stats(x, y, ss):  # max, mean and median of |x - y| over steps ss
        d = [abs(x[s]["loss"] - y[s]["loss"]) for s in ss]
        return max(d), statistics.mean(d), statistics.median(d)
    last = common[-100:]
    lines.append("")
    for label, ss in (("all steps", common), (f"last {len(last)} steps", last)):
        mx, mn, _ = stats(dg, tb, ss)
        txt = f"- {label}: |dgca - PyTorch| max {mx:.3e}, mean {mn:.3e}"
        if tf:
            nx, nn, _ = stats(tb, tf, ss)
            txt += f"; bf16 noise |PyTorch bf16 - fp32| max {nx:.3e}, mean {nn:.3e}"
        lines.append(txt)
    if tf:
        mn_all = stats(dg, tb, common)[1]
        nn_all = stats(tb, tf, common)[1]
        mn_last = stats(dg, tb, last)[1]
        nn_last = stats(tb, tf, last)[1]
        ok = mn_all <= 2 * nn_all and mn_last <= 2 * nn_last
        lines.append(f"- verdict: {'WITHIN' if ok else 'NOT within'} bf16 noise (rule: mean |dgca - PyTorch bf16| "
                     f"<= 2 x mean |PyTorch bf16 - PyTorch fp32|, over all steps ({mn_all:.3e} vs "
                     f"2 x {nn_all:.3e}) and over the last {len(last)} ({mn_last:.3e} vs 2 x {nn_last:.3e}))")
        # The same rule against fp32 (the flash-attention form: dgca's bf16
        # error vs PyTorch's own bf16 error), and with medians, which one
        # unstable step (a bf16 loss spike on either side) cannot dominate.
        dgf = stats(dg, tf, common)[1]
        lines.append(f"- against fp32: mean |dgca bf16 - PyTorch fp32| {dgf:.3e} vs mean |PyTorch bf16 - fp32| "
                     f"{nn_all:.3e} ({'within' if dgf <= 2 * nn_all else 'NOT within'} 2x)")
        md, mn_, mdf = stats(dg, tb, common)[2], stats(tb, tf, common)[2], stats(dg, tf, common)[2]
        lines.append(f"- medians over all steps: |dgca - PyTorch bf16| {md:.3e}, |dgca - fp32| {mdf:.3e}, "
                     f"|PyTorch bf16 - fp32| {mn_:.3e} ({'within' if md <= 2 * mn_ and mdf <= 2 * mn_ else 'NOT within'} 2x)")
    lines += ["", "Coarse plot (loss vs step; d = dgca, t = PyTorch, f = PyTorch fp32, * = same column):",
              "", "```"] + ascii_plot(common, dg, tb, tf) + ["```"]
    text = "\n".join(lines)
    print(text)
    if a.out:
        open(a.out, "w").write(text + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    i.add_argument("--preset", default="bert-base")
    i.add_argument("--seed", type=int, default=0)
    i.add_argument("--out", required=True)
    t = sub.add_parser("train")
    t.add_argument("--preset", default="bert-base")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--init", required=True)
    t.add_argument("--batches", required=True)
    t.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    t.add_argument("--lr", type=float, default=5e-5)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--clip", type=float, default=0.0)
    t.add_argument("--device", default="cuda")
    t.add_argument("--json", required=True)
    c = sub.add_parser("compare")
    c.add_argument("dgca")
    c.add_argument("torch")
    c.add_argument("torch_fp32", nargs="?")
    c.add_argument("--out")
    a = p.parse_args()
    {"init": cmd_init, "train": cmd_train, "compare": cmd_compare}[a.cmd](a)


if __name__ == "__main__":
    main()
