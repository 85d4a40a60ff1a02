"""PyTorch peer of the dgca CUDA trainer: DGCA-ReLM (bench/torch_dgca.py, the
same model on transformers' BertForMaskedLM plus the ReLM prompt encoder and
the DGCA heads) trained with bf16 autocast, in eager mode or torch.compile.

Prints one JSON object on stdout: samples/s (global batch / median step
time), the median and all step times, peak device memory, achieved TFLOP/s
and MFU against the device's dense bf16 peak (flops_per_sample from
torch_dgca.py, about 75 GFLOP per sample for bert-base at seq 128),
losses. Peak memory is measured as
dgca-bench measures it (device memory in use after the timed steps less
before the model was built), with max_memory_allocated/reserved beside it.

Mode `op-errors` measures instead PyTorch's own bf16 and fp16 error against
fp32 on the ops that dgca-model-check checks, with its metric
    max|out - ref| / max|ref|
so that the bf16/fp16 tolerances can be set to 2x these (the accuracy rule, docs/benchmarks.md),
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
from model_errors import model_errors, rel_err  # noqa: E402


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_used(device):
    """Bytes in use on the device (cudaMemGetInfo: total - free)."""
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def peak_tflops_of(name):
    """Dense bf16 peak FLOP/s by device name, as dgca-bench's PeakFlops
    (0 = unknown: no MFU)."""
    if "H100" in name and "PCIe" in name:
        return 756e12
    if any(k in name for k in ("H100", "H200", "GH200")):
        return 989e12
    if "A100" in name:
        return 312e12
    return 0


def train(args, device):
    used_before = 0
    if device.type == "cuda":
        # The baseline as dgca-bench's (taken after its CudaContext made the
        # cuBLASLt handle): the CUDA context and cuBLAS's handles, made by a
        # first bf16 GEMM, are not the model's memory.
        a = torch.ones(64, 64, device=device, dtype=torch.bfloat16)
        (a @ a).sum().item()
        del a
        used_before = device_used(device)
    torch.manual_seed(args.seed)
    model = DgcaRelm(args.preset, prompt_length=args.prompt_length, top_k=args.top_k, dropout=args.dropout).to(device)
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

    t0 = time.perf_counter()
    losses = []
    for _ in range(args.warmup):  # includes torch.compile's compilation
        losses.append(float(step()))
    sync(device)
    warmup_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # the timed steps', not compile's
    times = []
    if device.type == "cuda":
        # Events back to back, one synchronization at the end (as dgca-bench
        # times): the host queues the next step while the GPU runs this one.
        events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
        events[0].record()
        step_losses = []
        for i in range(args.steps):
            step_losses.append(step())
            events[i + 1].record()
        events[-1].synchronize()
        times = [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(args.steps)]
        losses += [float(x) for x in step_losses]
    else:
        for _ in range(args.steps):
            t = time.perf_counter()
            losses.append(float(step()))
            times.append(time.perf_counter() - t)
    med = statistics.median(times)
    sps = args.batch / med
    fps = flops_per_sample(args.preset, args.seq)
    tflops = fps * sps / 1e12
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_tflops_of(name)
    cuda = device.type == "cuda"
    out = dict(
        impl="pytorch", mode=args.mode, amp="bf16 autocast", dropout=args.dropout, preset=args.preset,
        seq=args.seq, batch=args.batch, micro_batch=micro, steps=args.steps, warmup=args.warmup,
        compile_mode="default" if args.mode == "compile" else None,
        attention=getattr(model.bert.config, "_attn_implementation", None),
        samples_per_second=sps, step_seconds_median=med, step_seconds=times,
        warmup_seconds=warmup_s,
        # As dgca-bench measures: device memory in use after the timed steps
        # less in use before the model was built (cudaMemGetInfo both times),
        # so the caching allocator's reserve counts, as dgca's buffers do.
        peak_memory_bytes=(device_used(device) - used_before) if cuda else None,
        max_memory_allocated_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
        max_memory_reserved_bytes=torch.cuda.max_memory_reserved(device) if cuda else None,
        flops_per_sample=fps, achieved_tflops=tflops,
        mfu=tflops * 1e12 / peak if cuda and peak else None, peak_tflops=peak / 1e12 if peak else None,
        parameters=sum(p.numel() for p in model.parameters()),
        losses=losses,
        device=name,
        torch=torch.__version__,
    )
    if not all(math.isfinite(x) for x in losses):
        out["error"] = "non-finite loss"
    return out


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
        result["errors"][name] = finite_or_null(dtype_errors(args.seed, device, low))
        result["autocast_model_errors"][name] = finite_or_null(model_errors(device, low, args.seed, "autocast", seeds=1))
    return result


def finite_or_null(errors):
    """None (JSON null: dgca-model-check keeps its built-in tolerance) for a
    non-finite error, which JSON cannot carry."""
    return {k: v if v is not None and math.isfinite(v) else None for k, v in errors.items()}


def dtype_errors(seed, device, bf, draws=3):
    """Every op's error, the median over `draws` draws of its inputs (one
    draw's error moves by a third between draws: attention_fwd.out bf16 read
    2.8e-3 and 3.7e-3), then the whole-model errors (model_errors.py)."""
    runs = [op_draw(seed + i, device, bf) for i in range(draws)]
    rows = {}
    for k in runs[0]:
        values = [r[k] for r in runs if r.get(k) is not None]
        rows[k] = statistics.median(values) if values else None
    # The whole-model rows (CudaBert, the whole training step): PyTorch's
    # error on the same model, shapes and batch layout, run in the low
    # dtype as the ops are (bench/gpu/model_errors.py).
    rows.update(model_errors(device, bf, seed, "pure"))
    return rows


def op_draw(seed, device, bf):
    """The ops' errors for one draw of their inputs (a generator at `seed`)."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape, lo=-1.0, hi=1.0):
        return (torch.rand(*shape, generator=g) * (hi - lo) + lo).to(device)

    rows = {}

    def measure(name, fn):
        try:
            rows[name] = fn()
        except (RuntimeError, NotImplementedError) as e:  # an op without a kernel for this dtype/device
            rows[name] = None
            print(f"op-errors: {name} {bf}: {e}", file=sys.stderr)

    # The GEMMs of op_check.cc with a 16-bit output (the 16-bit-in,
    # fp32-out ones keep their built-in fp32-like tolerance): A, B in
    # [-1, 1], bias and the residual C_in rounded to the output type; the
    # bias and residual go through addmm/baddbmm (one rounding, as the
    # cuBLASLt epilogue). Keys carry the output type ("->bf16"), and
    # "fallback " keys the same error for the fallback kernel's rows.
    low_name = "bf16" if bf == torch.bfloat16 else "fp16"

    def gemm(name, ta, tb, M, N, K, bias=False, batch=1, residual=False):
        A = rand(batch, K if ta else M, M if ta else K)
        B = rand(batch, N if tb else K, K if tb else N)
        cb, cin = rand(N).to(bf), rand(batch, M, N).to(bf)
        op = lambda X, t: X.transpose(-1, -2) if t else X  # noqa: E731
        add = (cin if residual else torch.zeros_like(cin)) + (cb if bias else torch.zeros_like(cb))
        out = torch.baddbmm(add.to(bf), op(A, ta).to(bf), op(B, tb).to(bf))
        ref = add.float() + op(A, ta).to(bf).float() @ op(B, tb).to(bf).float()
        return rel_err(out, ref)

    gemms = {"bf16": [("gemm_nn_bias", False, False, 128, 96, 64, True), ("gemm_tn", True, False, 96, 128, 64),
                      ("gemm_nt_batched", False, True, 40, 40, 16, False, 3), ("gemm_nn_odd_ld", False, False, 37, 19, 21),
                      ("gemm_nt_bias_residual", False, True, 96, 64, 48, True, 1, True)],
             "fp16": [("gemm_nt", False, True, 64, 64, 64)]}
    for case in gemms[low_name]:
        M, N, K, batch = case[3], case[4], case[5], (case[7] if len(case) > 7 else 1)
        key = f"{case[0]} {M}x{N}x{K}" + (f" x{batch}" if batch > 1 else "") + f" ->{low_name}"
        measure(key, lambda case=case: gemm(*case))
        rows["fallback " + key] = rows[key]
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
    dyg = rand(10007)

    def gelu_bwd():
        xs = [xg.to(bf).detach().requires_grad_(), xg.to(bf).float().detach().requires_grad_()]
        torch.nn.functional.gelu(xs[0]).backward(dyg.to(bf))
        torch.nn.functional.gelu(xs[1]).backward(dyg.to(bf).float())
        return rel_err(xs[0].grad, xs[1].grad)

    measure("gelu_bwd", gelu_bwd)
    for cols in (300, 1000):
        xs_ = rand(33, cols, lo=-5, hi=5)
        measure(f"softmax_rows cols={cols}", lambda xs_=xs_: rel_err(torch.softmax(xs_.to(bf), -1),
                                                                   torch.softmax(xs_.to(bf).float(), -1)))
    # Adds of 16-bit tensors (op_check.cc CheckBias, CheckEmbedding): one
    # rounding; the gather alone is exact.
    xb, bb2 = rand(53, 130), rand(130)
    measure("bias_add", lambda: rel_err(xb.to(bf) + bb2.to(bf), xb.to(bf).float() + bb2.to(bf).float()))
    table, base = rand(50, 96), rand(77, 96)
    ids = torch.randint(0, 50, (77,), generator=g).to(device)
    measure("embedding_fwd", lambda: rel_err(table.to(bf)[ids], table.to(bf).float()[ids]))
    measure("embedding_add", lambda: rel_err(base.to(bf) + table.to(bf)[ids],
                                             base.to(bf).float() + table.to(bf).float()[ids]))
    B, L, H, nh = 2, 40, 64, 4
    qkv = rand(B, L, 3 * H, lo=-1.5, hi=1.5)
    mask = torch.ones(B, L, dtype=torch.bool, device=device)
    mask[1, 30:] = False

    def attn(t):
        q, k, v = t.split(H, -1)
        q, k, v = (u.view(B, L, nh, H // nh).transpose(1, 2) for u in (q, k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])

    measure("attention_fwd.out", lambda: rel_err(attn(qkv.to(bf)), attn(qkv.to(bf).float())))

    def probs(t):  # the GEMM version's stored probabilities: softmax(q k^T / sqrt(d)) over the real keys
        q, k, _ = t.split(H, -1)
        q, k = (u.view(B, L, nh, H // nh).transpose(1, 2) for u in (q, k))
        s = (q @ k.transpose(-1, -2)) * (H // nh) ** -0.5
        return torch.softmax(s.masked_fill(~mask[:, None, None, :], float("-inf")), -1)

    measure("attention_fwd.probs", lambda: rel_err(probs(qkv.to(bf)), probs(qkv.to(bf).float())))
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
    p.add_argument("--dropout", type=float, default=0.0,
                   help="hidden and attention-probability dropout (HF BERT's default is 0.1)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="dense bf16 peak in TFLOP/s for MFU, e.g. 989 (0: by device name, as dgca-bench: "
                        "H100 SXM/H200 989, H100 PCIe 756, A100 312)")
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
