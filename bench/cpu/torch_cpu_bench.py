#!/usr/bin/env python3
"""PyTorch CPU training throughput of DGCA-ReLM (the peer for dgca's CPU trainer).

Prints one JSON line: {"samples_per_second": ..., "step_seconds": ..., ...}.
Same model (bench/torch_dgca.py), batch layout and sizes as dgca-bench-cpu.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
from torch_dgca import DgcaRelm, make_batch  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--preset", default="small")
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--dropout", type=float, default=0.0, help="hidden and attention dropout")
a = ap.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
model = DgcaRelm(a.preset, dropout=a.dropout)  # train mode: dropout active
opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0)
batch = make_batch(a.batch, a.seq)
times = []
for i in range(a.warmup + a.steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss, _ = model(batch)
    loss.backward()
    opt.step()
    dt = time.perf_counter() - t0
    if i >= a.warmup:
        times.append(dt)
    print(f"torch step {i+1}/{a.warmup + a.steps} {dt:.3f}s loss {loss.item():.4f}", file=sys.stderr)
step = sorted(times)[len(times) // 2]
print(json.dumps({"impl": "pytorch", "preset": a.preset, "batch": a.batch, "seq": a.seq,
                  "threads": a.threads, "dropout": a.dropout, "step_seconds": step,
                  "samples_per_second": a.batch / step, "torch": torch.__version__}))
