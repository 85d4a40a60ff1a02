"""PyTorch peer of the dgca CUDA trainer: DGCA-ReLM (bench/torch_dgca.py, the
same model on transformers' BertForMaskedLM plus the ReLM prompt encoder and
the DGCA heads) trained with bf16 autocast, in eager mode or torch.compile.

Prints one JSON object on stdout: samples/s (global batch / median step
time), the median and all step times, peak device memory, achieved TFLOP/s
and MFU against --peak-tflops (flops_per_sample from torch_dgca.py, about
80 GFLOP per sample for bert-base at seq 128), losses.

Mode `op-errors` measures instead PyTorch's own bf16 and fp16 error against
fp32 on the ops that dgca-model-check checks, with its metric
    max|out - ref| / max|ref|
so that the bf16/fp16 tolerances can be set to 2x these (issue 6's rule),
and on its whole-model checks (bench/gpu/model_errors.py: BERT and the
whole training step at the checks' configs, autocast against fp32).

Examples (bench/gpu/run.sh runs these on the GPU machine):
  python3 bench/gpu/torch_reference.py --mode eager   --preset bert-base --seq 128 --batch 128
  python3 bench/gpu/torch_reference.py --mode compile --preset bert-base --seq 128 --batch 128
  python3 bench/gpu/torch_reference.py --mode op-errors
CPU smoke test (no GPU): --device cpu --preset tiny --batch 4 --steps 2 --warmup 1
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_dgca import DgcaRelm, flops_per_sample, make_batch  # noqa: E402
from model_errors import model_errors  # noqa: E402


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(args, device):
    torch.manual_seed(args.seed)
    model = DgcaRelm(args.preset, prompt_length=args.prompt_length, top_k=args.top_k).to(device)
    model.train()
    opt_kwargs = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if device.type == "cuda":
        opt_kwargs["fused"] = True  # PyTorch's fastest AdamW
    opt = torch.optim.AdamW(model.parameters(), **opt_kwargs)
    micro = args.micro_batch or args.batch
    if args.batch % micro != 0:
        raise SystemExit(f"--batch {args.batch} is not a multiple of --micro-batch {micro}")
    accum = args.batch // micro
    batches = [make_batch(micro, args.seq, args.prompt_length, args.top_k, seed=args.seed + i, device=device)
               for i in range(accum)]
    fwd = torch.compile(model) if args.mode == "compile" else model
    amp_dtype = torch.bfloat16

    def step():
        total = 0.0
        for b in batches:
            with torch.autocast(device_type=device.type, dtype=amp_dtype):
                loss, _ = fwd(b)
            (loss / accum).backward()
            total += loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total / accum

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    losses = []
    for _ in range(args.warmup):  # includes torch.compile's compilation
        losses.append(float(step()))
    sync(device)
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            loss = step()
            times.append(time.perf_counter() - t)
        losses.append(float(loss))
    med = statistics.median(times)
    sps = args.batch / med
    fps = flops_per_sample(args.preset, args.seq)
    tflops = fps * sps / 1e12
    out = dict(
        impl="pytorch", mode=args.mode, amp="bf16", preset=args.preset, seq=args.seq, batch=args.batch,
        micro_batch=micro, steps=args.steps, warmup=args.warmup,
        samples_per_second=sps, step_seconds_median=med, step_seconds=times,
        warmup_seconds=warmup_s,
        peak_memory_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        flops_per_sample=fps, achieved_tflops=tflops,
        mfu=tflops / args.peak_tflops if device.type == "cuda" else None, peak_tflops=args.peak_tflops,
        parameters=sum(p.numel() for p in model.parameters()),
        losses=losses,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__,
    )
    if not all(math.isfinite(x) for x in losses):
        out["error"] = "non-finite loss"
    return out


def rel_err(out, ref):
    ref = ref.double()
    return float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def op_errors(args, device):
    """PyTorch's bf16 and fp16 error against fp32 on dgca-model-check's ops
    (same shapes), on inputs rounded to the low precision first (the fp32
    reference sees the same values), as dgca-model-check measures dgca."""
    result = dict(impl="pytorch", mode="op-errors",
                  metric="max|out-ref|/max|ref| vs fp32 on low-precision-rounded inputs",
                  tolerance_rule="dgca's tolerance for a dtype = 2x these", device=str(device),
                  torch=torch.__version__, errors={})
    # For information (not a tolerance): the whole-model errors of an
    # autocast run, the way this file trains. Autocast keeps LayerNorm
    # outputs and the residual stream in fp32, so its activation errors are
    # smaller than a run whose activations are 16-bit (PyTorch's own pure
    # run, dgca's); its gradients' errors are of the same size.
    result["autocast_model_errors"] = {}
    for name, low in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        result["errors"][name] = finite_or_null(dtype_errors(args, device, low))
        result["autocast_model_errors"][name] = finite_or_null(model_errors(device, low, args.seed, "autocast", seeds=1))
    return result


def finite_or_null(errors):
    """None (JSON null: dgca-model-check keeps its built-in tolerance) for a
    non-finite error, which JSON cannot carry."""
    return {k: v if v is not None and math.isfinite(v) else None for k, v in errors.items()}


def dtype_errors(args, device, bf):
    g = torch.Generator(device="cpu").manual_seed(args.seed)

    def rand(*shape, lo=-1.0, hi=1.0):
        return (torch.rand(*shape, generator=g) * (hi - lo) + lo).to(device)

    rows = {}

    def measure(name, fn):
        try:
            rows[name] = fn()
        except (RuntimeError, NotImplementedError) as e:  # an op without a kernel for this dtype/device
            rows[name] = None
            print(f"op-errors: {name} {bf}: {e}", file=sys.stderr)

    a, b = rand(128, 64), rand(64, 96)
    bias = rand(96)
    measure("gemm_nn_bias 128x96x64", lambda: rel_err(a.to(bf) @ b.to(bf) + bias.to(bf),
                                                       a.to(bf).float() @ b.to(bf).float() + bias.to(bf).float()))
    x = rand(37, 200, lo=-2, hi=3)
    w, bb = rand(200, lo=0.5, hi=1.5), rand(200, lo=-0.5, hi=0.5)
    xr, wr, br = x.to(bf).float(), w.to(bf).float(), bb.to(bf).float()
    ln = torch.nn.functional.layer_norm
    measure("layernorm_fwd.out", lambda: rel_err(ln(x.to(bf), (200,), w.to(bf), bb.to(bf), 1e-12),
                                                 ln(xr, (200,), wr, br, 1e-12)))
    dy = rand(37, 200)

    def ln_bwd():
        xs = [t.detach().requires_grad_() for t in (x.to(bf), xr)]
        outs = [ln(xs[0], (200,), w.to(bf), bb.to(bf), 1e-12), ln(xs[1], (200,), wr, br, 1e-12)]
        outs[0].backward(dy.to(bf))
        outs[1].backward(dy.to(bf).float())
        return rel_err(xs[0].grad, xs[1].grad)

    measure("layernorm_bwd.dinp", ln_bwd)
    xg = rand(10007, lo=-4, hi=4)
    measure("gelu_fwd", lambda: rel_err(torch.nn.functional.gelu(xg.to(bf)),
                                        torch.nn.functional.gelu(xg.to(bf).float())))
    xs_ = rand(33, 1000, lo=-5, hi=5)
    measure("softmax_rows cols=1000", lambda: rel_err(torch.softmax(xs_.to(bf), -1),
                                                      torch.softmax(xs_.to(bf).float(), -1)))
    B, L, H, nh = 2, 40, 64, 4
    qkv = rand(B, L, 3 * H, lo=-1.5, hi=1.5)
    mask = torch.ones(B, L, dtype=torch.bool, device=device)
    mask[1, 30:] = False

    def attn(t):
        q, k, v = t.split(H, -1)
        q, k, v = (u.view(B, L, nh, H // nh).transpose(1, 2) for u in (q, k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])

    measure("attention_fwd.out", lambda: rel_err(attn(qkv.to(bf)), attn(qkv.to(bf).float())))
    dya = rand(B, nh, L, H // nh)

    def attn_bwd():
        qb = qkv.to(bf).detach().requires_grad_()
        qf = qkv.to(bf).float().detach().requires_grad_()
        attn(qb).backward(dya.to(bf))
        attn(qf).backward(dya.to(bf).float())
        return rel_err(qb.grad, qf.grad)

    measure("attention_bwd.dqkv", attn_bwd)
    logits = rand(20, 1000, lo=-6, hi=6)
    t = torch.randint(0, 1000, (20,), generator=g).to(device)

    def ce_bwd():
        lb = logits.to(bf).detach().requires_grad_()
        lf = logits.to(bf).float().detach().requires_grad_()
        torch.nn.functional.cross_entropy(lb, t, reduction="sum").backward()
        torch.nn.functional.cross_entropy(lf, t, reduction="sum").backward()
        return rel_err(lb.grad, lf.grad)

    measure("cross_entropy.dlogits", ce_bwd)
    # The whole-model rows (CudaBert, the whole training step): PyTorch's
    # error on the same model, shapes and batch layout, run in the low
    # dtype as the ops above are (bench/gpu/model_errors.py).
    rows.update(model_errors(device, bf, args.seed, "pure"))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["eager", "compile", "op-errors"], default="eager")
    p.add_argument("--preset", default="bert-base", choices=["tiny", "small", "bert-base"])
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=128, help="global batch (samples per optimizer step)")
    p.add_argument("--micro-batch", type=int, default=0, help="micro-batch (0 = the global batch)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--prompt-length", type=int, default=3)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for MFU (H100 SXM: 989)")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps(dict(error="no CUDA device visible to PyTorch", mode=args.mode)))
        return 2
    result = op_errors(args, device) if args.mode == "op-errors" else train(args, device)
    print(json.dumps(result))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
