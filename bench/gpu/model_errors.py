"""PyTorch's own low-precision error on dgca-model-check's whole-model checks.

The accuracy rule (docs/benchmarks.md): dgca's bf16/fp16 results must be within 2x the error that
PyTorch's own low-precision run has against fp32 (flash-attention's test
rule: PyTorch computing in the low dtype, mode "pure"; mode "autocast", as
bench/gpu/torch_reference.py trains, is measured for information). The op
rows of dgca-model-check get their PyTorch error from torch_reference.py's
op measurements; this module measures the rows built from the whole model,
by building what those checks build:

  bert check  (model/cuda_check/bert_check.cc): BERT alone at its config (vocab
              300, hidden 64, 2 layers, 4 heads, ffn 128, token types,
              prompt rows), its weight redraw, its two micro-steps
              (B, L, R) = (3, 24, 16), (2, 19, 11) with random dlogits and
              the extra gathered-row gradient, gradients ADDED over both;
  heads check (model/cuda_check/heads_check.cc CheckHeads): the DGCA heads
              alone, heads_errors() says how;
  model check (model/cuda_check/model_check.cc): the DGCA-ReLM model at
              CheckConfig (prompt 2, LSTM prompt encoder, detector, top-4
              candidates, gated fusion, lambdas 0.7 / 0.4), its init
              (non-decayed tensors + U(-0.1, 0.1)), its batch layout with
              rows of 9/12/6/13 and 7/10/5 characters at L = 32, two
              micro-batches at grad scale 0.5, fp16 with loss scale 1024,
              then one AdamW step (lr 1e-2, weight decay 0.01 on dgca's
              decayed tensors) from the fp32 gradients and a forward from
              the updated weights (the low copy rounds them, as dgca's
              16-bit weight copy does).
In the pure run the head outputs go to fp32 before the losses
(DgcaRelm.upcast_logits), as dgca computes its losses in fp32.

Weights and inputs are drawn fresh here (this side cannot draw dgca's);
the error of a class of outputs is a property of the arithmetic at that
shape and scale, not of one draw. Every weight and input is rounded to the
low precision first, so fp32 and autocast see the same values, as the
dgca check's CPU reference and GPU do.

The measure is dgca-model-check's: max|out - ref| / max|ref| per tensor
(gradients of the key bias, the detector bias and the gate's scalars
scaled by their partner tensor, as model_check.cc's kScalePartners;
the q/k/v biases as one block, as bert_check.cc), |out - ref| / |ref| for
a loss. A class of rows gets its worst member's error (every gradient
tensor; the five losses of a forward): dgca's rows are each held to 2x
that, i.e. dgca's worst to 2x PyTorch's worst, the same statistic on both
sides (one tensor's error in one draw is noise). Over `seeds` draws
(default 3): tensors and activations take the median (a rare
ill-conditioned draw says nothing of the arithmetic: seen, the prompt
encoder's gradients 1.5e-1 off in one draw of three, 2e-3 in the others);
losses and the prompt rows' gradient take the largest (a loss is one
scalar whose error swings 7x between draws: PyTorch's own fp16 detector
loss after the AdamW step read 2e-5, 2e-5 and 1.4e-4 in three; dprompt is
a sum over the batch's prompt positions with as much cancellation: dgca's
bf16 read 1.3e-2 to 1.9e-2 over six draws, against a PyTorch median of
9.1e-3).

model_errors(device, low_dtype, seed, mode, seeds) -> {row prefix: error}
with the prefixes dgca-model-check's rows start with (ApplyPeerTolerance
matches the longest prefix, so a tensor's key wins over its class's).
"""
import contextlib
import copy
import random
import statistics
import sys

import torch

from torch_dgca import DgcaRelm, bert_config, dgca_decays, dgca_name

# model_check.cc kScalePartners: dgca name suffix -> partner suffix.
SCALE_PARTNERS = {
    "attention.self.key.bias": "attention.self.value.bias",
    "detector.bias": "detector.weight",
    "fusion.gate.bias": "fusion.gate.weight",
    "fusion.gate.det_scale": "fusion.gate.weight",
}

# Keys whose PyTorch error is the largest over the draws, not the median
# (besides every " loss." key): see the module's docstring.
LARGEST_OVER_DRAWS = {"bert.dprompt"}

CHECK_SHAPE = dict(layers=2, hidden=64, heads=4, ffn=128)  # CheckConfig / bert_check's cfg
CHECK_VOCAB, CHECK_MAX_POSITION, CHECK_PROMPT = 300, 64, 2
CLS, SEP, MASK = 2, 3, 4  # model_check.cc's token ids


def rel_err(out, ref, scale=None):
    """max|out - ref| / max(max|ref|, scale); inf for a non-finite value."""
    out, ref = out.detach().double(), ref.detach().double()
    if not (torch.isfinite(out).all() and torch.isfinite(ref).all()):
        return float("inf")
    s = float(ref.abs().max()) if ref.numel() else 0.0
    if scale is not None:
        s = max(s, scale)
    d = float((out - ref).abs().max()) if ref.numel() else 0.0
    return d / s if s > 0 else d


def scalar_err(got, want):
    got, want = float(got), float(want)
    if want != want or got != got:
        return float("inf")
    return abs(got) if want == 0 else abs(got - want) / abs(want)


def lowered(model, low, mode):
    """The low-precision copy of `model`: its parameters in `low` (mode
    "pure", the flash-attention rule's PyTorch run) or fp32 parameters run
    under autocast (mode "autocast", as torch_reference.py trains)."""
    m = copy.deepcopy(model)
    return m.to(low) if mode == "pure" else m


def low_precision(device, low, mode, is_low):
    """The context the low-precision copy runs in: autocast for mode
    "autocast", nothing otherwise (the pure copy's tensors are `low`)."""
    if is_low and mode == "autocast":
        return torch.autocast(device_type=device.type, dtype=low)
    return contextlib.nullcontext()


def round_params(model, low):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(low).float())


# ---------------------------------------------------------------- bert check

def bert_step_input(B, L, R, gen, low):
    """bert_check.cc MakeStep: row 0 unpadded, the others a random length in
    (L/2, L]; token type 1 on each row's second half; prompt slots 0..P-1 at
    positions 1..P and P..2P-1 just before the last real token; R distinct
    gathered rows; dlogits and the extra rows' gradient in +-0.05."""
    P = CHECK_PROMPT
    ids = torch.zeros(B, L, dtype=torch.long)
    types = torch.zeros(B, L, dtype=torch.long)
    slot = torch.full((B, L), -1, dtype=torch.long)
    mask = torch.zeros(B, L, dtype=torch.long)
    for b in range(B):
        n = L if b == 0 else int(torch.randint(L // 2 + 1, L + 1, (1,), generator=gen))
        mask[b, :n] = 1
        ids[b, :n] = torch.randint(5, CHECK_VOCAB, (n,), generator=gen)
        types[b, n // 2:n] = 1
        slot[b, 1:1 + P] = torch.arange(P)
        second = n - 1 - P
        slot[b, second:n - 1] = torch.arange(P, 2 * P)
    rows = torch.randperm(B * L, generator=gen)[:R]
    extra_rows = R // 2

    def rnd(*shape):
        return ((torch.rand(*shape, generator=gen) - 0.5) * 0.1).to(low).float()

    return dict(ids=ids, types=types, slot=slot, mask=mask, rows=rows,
                dlogits=rnd(R, CHECK_VOCAB), extra=rnd(extra_rows, CHECK_SHAPE["hidden"]))


def bert_errors(device, low, seed, mode="pure"):
    from transformers import BertForMaskedLM
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ref = BertForMaskedLM(bert_config(CHECK_SHAPE, CHECK_VOCAB, CHECK_MAX_POSITION))
    with torch.no_grad():  # bert_check.cc's redraw of every value
        for name, p in ref.named_parameters():
            lo, hi = -0.15, 0.15
            if name.endswith(".bias"):
                lo, hi = -0.1, 0.1
            elif name.endswith("LayerNorm.weight"):
                lo, hi = 0.8, 1.2
            elif "embeddings" in name:
                lo, hi = -0.5, 0.5
            p.copy_(torch.rand(p.shape, generator=gen) * (hi - lo) + lo)
    round_params(ref, low)
    ref = ref.to(device)
    lowm = lowered(ref, low, mode)
    S, H = 2 * CHECK_PROMPT, CHECK_SHAPE["hidden"]
    # The C++ compares every row of hidden, the padding rows too.
    prompt0 = (torch.rand(S, H, generator=gen) - 0.5).to(low).float().to(device)
    prompts = [prompt0.clone().requires_grad_(), prompt0.to(lowm.dtype).clone().requires_grad_()]
    errs = {"bert.hidden": 0.0, "bert.gathered": 0.0, "bert.logits": 0.0}
    for B, L, R in ((3, 24, 16), (2, 19, 11)):
        x = {k: v.to(device) for k, v in bert_step_input(B, L, R, gen, low).items()}
        outs = []
        for m, prompt, is_low in ((ref, prompts[0], False), (lowm, prompts[1], True)):
            with low_precision(device, low, mode, is_low):
                emb = m.bert.embeddings.word_embeddings(x["ids"])
                emb = torch.where((x["slot"] >= 0).unsqueeze(-1), prompt[x["slot"].clamp(min=0)].to(emb.dtype), emb)
                hidden = m.bert(inputs_embeds=emb, attention_mask=x["mask"],
                                token_type_ids=x["types"]).last_hidden_state.reshape(B * L, H)
                gathered = hidden[x["rows"]]
                logits = m.cls(gathered)
                n = x["extra"].shape[0]
                loss = (logits.float() * x["dlogits"]).sum() + (gathered[:n].float() * x["extra"]).sum()
            loss.backward()
            outs.append((hidden, gathered, logits))
        for k, i in (("bert.hidden", 0), ("bert.gathered", 1), ("bert.logits", 2)):
            errs[k] = max(errs[k], rel_err(outs[1][i], outs[0][i]))
    ref_p, low_p = dict(ref.named_parameters()), dict(lowm.named_parameters())
    worst = 0.0
    for name, p in ref_p.items():
        if name.endswith("attention.self.key.bias") or name.endswith("attention.self.value.bias"):
            continue  # one [3H] block with the query bias, as bert_check.cc compares them
        names = [name]
        if name.endswith("attention.self.query.bias"):
            stem = name[:-len("query.bias")]
            names = [stem + "query.bias", stem + "key.bias", stem + "value.bias"]
        g_ref = torch.cat([ref_p[n].grad.reshape(-1) for n in names])
        g_low = torch.cat([low_p[n].grad.reshape(-1) for n in names])
        worst = max(worst, rel_err(g_low, g_ref))
    errs["bert.grad "] = worst
    errs["bert.dprompt"] = rel_err(prompts[1].grad, prompts[0].grad)
    return errs


# --------------------------------------------------------------- model check

def check_batch(lengths, L, rnd, device):
    """model/nn/synthetic_batch.cc SyntheticBatch (mft on) in torch_dgca's batch dict: [CLS] prompt*P
    source (MFT-masked where correct and odd) prompt*P [MASK]*n [SEP]; one
    or two errors per row; K = 4 candidates: the source, the target for
    even slots, padding (-1) last for every third slot."""
    P, K, V = CHECK_PROMPT, 4, CHECK_VOCAB
    B = len(lengths)
    ids = torch.zeros(B, L, dtype=torch.long)
    att = torch.zeros(B, L, dtype=torch.long)
    slot = torch.full((B, L), -1, dtype=torch.long)
    slot_index, src_all, trg_all, cands, mft_index, mft_labels = [], [], [], [], [], []

    def tok():
        return rnd.randrange(5, V)

    for r, n in enumerate(lengths):
        src = [tok() for _ in range(n)]
        trg = list(src)
        trg[r % n] = tok()
        if n > 3:
            trg[n - 1] = tok()
        pos = 0
        ids[r, pos] = CLS
        pos += 1
        for k in range(P):
            slot[r, pos], ids[r, pos] = k, CLS
            pos += 1
        for i in range(n):
            ids[r, pos] = src[i]
            if src[i] == trg[i] and i % 2 == 1:
                ids[r, pos] = MASK
                mft_index.append(r * L + pos)
                mft_labels.append(src[i])
            pos += 1
        for k in range(P):
            slot[r, pos], ids[r, pos] = P + k, SEP
            pos += 1
        for i in range(n):
            ids[r, pos] = MASK
            slot_index.append(r * L + pos)
            src_all.append(src[i])
            trg_all.append(trg[i])
            c = [src[i]]
            for k in range(1, K):
                if k == 1 and i % 2 == 0:
                    c.append(trg[i])
                elif k == K - 1 and i % 3 == 0:
                    c.append(-1)
                else:
                    c.append(tok())
            cands.append(c)
            pos += 1
        ids[r, pos] = SEP
        pos += 1
        att[r, :pos] = 1
    t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    out = dict(input_ids=ids, attention_mask=att, prompt_slot=slot, slot_index=t(slot_index),
               slot_source=t(src_all), slot_target=t(trg_all), candidates=t(cands),
               mft_index=t(mft_index), mft_labels=t(mft_labels))
    return {k: v.to(device) for k, v in out.items()}


def tensor_errs(low_grads, ref_grads):
    """dgca name -> model_check.cc TensorErr of the low-precision gradient."""
    out = {}
    for name, g_ref in ref_grads.items():
        scale = None
        for suffix, partner in SCALE_PARTNERS.items():
            if name.endswith(suffix):
                pn = name[:-len(suffix)] + partner
                if pn in ref_grads:
                    scale = float(ref_grads[pn].abs().max())
        out[name] = rel_err(low_grads[name], g_ref, scale)
    return out


def whole_model_errors(device, low, seed, mode="pure"):
    fp16 = low == torch.float16
    loss_scale = 1024.0 if fp16 else 1.0
    torch.manual_seed(seed)
    ref = DgcaRelm(dict(CHECK_SHAPE), vocab_size=CHECK_VOCAB, prompt_length=CHECK_PROMPT, top_k=4,
                   max_position=CHECK_MAX_POSITION, lambda_detector=0.7, lambda_candidate=0.4)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # model_check.cc: non-trivial biases and LayerNorm parameters
        for n, p in ref.named_parameters():
            if not dgca_decays(dgca_name(n)):
                p.add_((torch.rand(p.shape, generator=gen) - 0.5) * 0.2)
    round_params(ref, low)
    ref = ref.to(device).train()
    lowm = lowered(ref, low, mode)
    lowm.upcast_logits = mode == "pure"
    rnd = random.Random(seed)
    batches = [check_batch([9, 12, 6, 13], 32, rnd, device), check_batch([7, 10, 5], 32, rnd, device)]

    def forward_err(m_low, b, backward):
        """The worst loss error of one forward (and backward, at grad scale
        0.5 as the C++ check) of `b` on ref and m_low."""
        parts = []
        for m, is_low in ((ref, False), (m_low, True)):
            with low_precision(device, low, mode, is_low):
                loss, p = m(b)
            if backward:
                (loss.float() * 0.5 * (loss_scale if is_low else 1.0)).backward()
            parts.append({k: float(v.detach()) for k, v in dict(p, total=loss).items()})
        return max(scalar_err(parts[1][k], parts[0][k]) for k in parts[0])

    out, loss_err = {}, 0.0
    for step, b in enumerate(batches, 1):
        loss_err = max(loss_err, forward_err(lowm, b, backward=True))
        gr = {dgca_name(n): p.grad.detach().clone() for n, p in ref.named_parameters()}
        gl = {dgca_name(n): p.grad.detach().float() / loss_scale for n, p in lowm.named_parameters()}
        errs = tensor_errs(gl, gr)
        if step == 1:
            out["cuda_model micro1 grads"] = max(errs.values())
        else:
            out["cuda_model micro2 accumulated grad"] = max(errs.values())
            out["cuda_model unscaled grads"] = max(errs.values())
    sq_ref = sum(float((g.double() ** 2).sum()) for g in gr.values())
    sq_low = sum(float((g.double() ** 2).sum()) for g in gl.values())
    out["cuda_model micro1 loss."] = out["cuda_model micro2 loss."] = loss_err
    out["cuda_model unscaled grad squared norm"] = scalar_err(sq_low, sq_ref)
    # AdamW from the fp32 gradients (model_check.cc: both sides step from
    # the same gradients), then a forward of the first batch from the
    # updated weights: the low copy rounds them.
    decay = [p for n, p in ref.named_parameters() if dgca_decays(dgca_name(n))]
    no_decay = [p for n, p in ref.named_parameters() if not dgca_decays(dgca_name(n))]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=0.01), dict(params=no_decay, weight_decay=0.0)],
                            lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    opt.step()
    updated = lowered(ref, low, mode)
    updated.upcast_logits = mode == "pure"
    with torch.no_grad():
        out["cuda_model after adamw loss."] = forward_err(updated, batches[0], backward=False)
    return out


# ------------------------------------------------------------- heads check

HEADS_CASES = (  # heads_check.cc: row prefix, detector, gated fusion
    ("heads gated: ", True, True),
    ("heads gated no-detector: ", False, True),
    ("heads fusion none: ", True, False),
)


def heads_errors(device, low, seed, mode="pure"):
    """heads_check.cc CheckHeads: the heads alone on given slot states h,
    logits z and embedding table E (H 32, V 200, K 4, 10 slots, lambdas 0.7
    / 1.3, loss scale 1.7), parameters redrawn (gains in [0.5, 1.5], the
    rest in [-0.5, 0.5]; candidate.dense.weight rounded for both sides, as
    the C++ gives its 16-bit GEMM), slot kinds by t % 5 (correct; error
    with y a candidate; error with y outside; y a duplicated candidate;
    padding). Rows: the four losses as one vector, dz, dh, dE and every
    head parameter's gradient (the class's worst)."""
    H, V, K, T = 32, 200, 4, 10
    out = {}
    for prefix, det, gated in HEADS_CASES:
        gen = torch.Generator().manual_seed(seed)
        rnd = random.Random(seed)
        torch.manual_seed(seed)
        ref = DgcaRelm(dict(layers=1, hidden=H, heads=2, ffn=2 * H), vocab_size=V, prompt_length=1, top_k=K,
                       detector=det, fusion=gated, lambda_detector=0.7, lambda_candidate=1.3)
        heads = {"detector.weight": ref.detector.weight, "detector.bias": ref.detector.bias,
                 "fusion.gate.weight": ref.gate.weight, "fusion.gate.bias": ref.gate.bias,
                 "fusion.gate.det_scale": ref.gate_det_scale, "candidate.dense.weight": ref.cand_dense.weight,
                 "candidate.dense.bias": ref.cand_dense.bias, "candidate.LayerNorm.weight": ref.cand_ln.weight,
                 "candidate.LayerNorm.bias": ref.cand_ln.bias}
        with torch.no_grad():
            for name, p in heads.items():
                lo, hi = (0.5, 1.5) if name in ("candidate.LayerNorm.weight", "fusion.gate.det_scale") else (-0.5, 0.5)
                p.copy_(torch.rand(p.shape, generator=gen) * (hi - lo) + lo)
            heads["candidate.dense.weight"].copy_(heads["candidate.dense.weight"].to(low).float())
        ref = ref.to(device)
        lowm = lowered(ref, low, mode)
        lowm.upcast_logits = mode == "pure"

        def rand(*shape, lo, hi):
            return (torch.rand(*shape, generator=gen) * (hi - lo) + lo).to(low).float().to(device)

        h, z, E = rand(T, H, lo=-1, hi=1), rand(T, V, lo=-4, hi=4), rand(V, H, lo=-0.5, hi=0.5)
        x, y, cand = [], [], []
        for t in range(T):
            c = [rnd.randrange(V)]
            while len(c) < K:
                i = rnd.randrange(V)
                if i not in c:
                    c.append(i)
            kind = t % 5
            if kind == 0:
                yt = c[0]
            elif kind == 1:
                yt = c[2]
            elif kind == 2:
                yt = rnd.randrange(V)
                while yt in c:
                    yt = rnd.randrange(V)
            elif kind == 3:
                c[3] = c[1]
                yt = c[1]
            else:
                c[2] = c[3] = -1
                yt = c[0]
            x.append(c[0])
            y.append(yt)
            cand.append(c)
        x, y, cand = (torch.tensor(v, dtype=torch.long, device=device) for v in (x, y, cand))
        res = []
        for m, is_low in ((ref, False), (lowm, True)):
            # The inputs are activations: 16-bit in an autocast run too.
            dt = low if is_low else torch.float32
            leaves = [t.to(dt).detach().requires_grad_() for t in (h, z, E)]
            with low_precision(device, low, mode, is_low):
                zz = leaves[1].float() if m.upcast_logits else leaves[1]
                parts = m.heads(leaves[0], zz, x, y, cand, leaves[2])
                total = sum(m.lambdas.get(k, 1.0) * v for k, v in parts.items())
            (total.float() * 1.7).backward()
            losses = torch.stack([total.float()] + [parts[k].float() if k in parts else torch.zeros((), device=device)
                                                    for k in ("fusion", "detector", "candidate")])
            named = dict(m.named_parameters())
            grads = {d: named[n].grad for n, d in (("detector.weight", "detector.weight"),
                                                    ("detector.bias", "detector.bias"),
                                                    ("gate.weight", "fusion.gate.weight"),
                                                    ("gate.bias", "fusion.gate.bias"),
                                                    ("gate_det_scale", "fusion.gate.det_scale"),
                                                    ("cand_dense.weight", "candidate.dense.weight"),
                                                    ("cand_dense.bias", "candidate.dense.bias"),
                                                    ("cand_ln.weight", "candidate.LayerNorm.weight"),
                                                    ("cand_ln.bias", "candidate.LayerNorm.bias"))}
            res.append((losses.detach(), [t.grad for t in leaves], grads))
        (l_ref, d_ref, g_ref), (l_low, d_low, g_low) = res
        out[prefix + "losses (total, fusion, det, cand)"] = rel_err(l_low, l_ref)
        out[prefix + "dz"] = rel_err(d_low[1], d_ref[1])
        out[prefix + "dh (increment)"] = rel_err(d_low[0], d_ref[0])
        out[prefix + "dE (increment)"] = rel_err(d_low[2], d_ref[2])
        out[prefix + "grad "] = max(rel_err(g_low[k], g) for k, g in g_ref.items()
                                    if g is not None and g_low[k] is not None)
    return out


def model_errors(device, low, seed, mode="pure", seeds=3):
    """Both checks' PyTorch errors as {dgca-model-check row prefix: error},
    each over `seeds` draws (seed, seed + 1, ...; the median, the largest
    for losses: see the module's docstring); a check
    PyTorch cannot run at this dtype on this device (fp16 LSTM on the CPU)
    is left out, its reason printed to stderr."""
    out = {}
    for fn in (bert_errors, whole_model_errors, heads_errors):
        try:
            draws = [fn(device, low, s, mode) for s in range(seed, seed + seeds)]
        except (RuntimeError, NotImplementedError) as e:
            print(f"model errors: {fn.__name__} {low} {mode}: {e}", file=sys.stderr)
            continue
        for k in draws[0]:
            values = [d[k] for d in draws]
            largest = k in LARGEST_OVER_DRAWS or " loss." in k or k.endswith(" losses (total, fusion, det, cand)")
            out[k] = max(values) if largest else statistics.median(values)
    return out
