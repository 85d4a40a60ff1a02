"""DGCA-ReLM in PyTorch: the peer our C++ trainer is measured against.

The same model as docs/model.md ("The DGCA-ReLM model") and model/nn: transformers'
BertForMaskedLM (post-LN BERT, exact erf GELU, tied decoder), ReLM prompts
(Embedding(2P,H) -> 2-layer BiLSTM -> Linear(2H,H) -> ReLU -> Linear(H,H),
scattered into the prompt slots), the MLM head applied only at target slots
and MFT positions, detector, candidate head and detection-guided gated fusion.

Used by bench/cpu/torch_cpu_bench.py and (later) bench/gpu/torch_reference.py.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM

PRESETS = {
    "tiny": dict(layers=2, hidden=128, heads=2, ffn=512),
    # configs/quickstart.yaml's custom model (tiny at hidden 64, ffn 128).
    "quickstart": dict(layers=2, hidden=64, heads=2, ffn=128),
    "small": dict(layers=4, hidden=256, heads=4, ffn=1024),
    "bert-base": dict(layers=12, hidden=768, heads=12, ffn=3072),
}

PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103


def bert_config(s, vocab_size, max_position=512, type_vocab=2, dropout=0.0):
    """transformers' BertConfig for a PRESETS entry: post-LN, exact erf GELU,
    dropout `dropout` on hidden states and attention probabilities (0 by
    default, for exact comparisons; dgca's masks are its own hash, so with
    dropout only speed compares), LayerNorm eps 1e-12 (model/nn/bert.cc). The attention is
    transformers' default for BERT (SDPA in current versions: PyTorch's
    fused attention kernels, the fastest peer a user gets)."""
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                     num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                     hidden_act="gelu", hidden_dropout_prob=dropout,
                     attention_probs_dropout_prob=dropout, max_position_embeddings=max_position,
                     type_vocab_size=type_vocab, layer_norm_eps=1e-12)
    return cfg


HEADS = {  # DgcaRelm name -> dgca name (model/nn/heads.cc)
    "detector.weight": "detector.weight",
    "detector.bias": "detector.bias",
    "gate.weight": "fusion.gate.weight",
    "gate.bias": "fusion.gate.bias",
    "gate_det_scale": "fusion.gate.det_scale",
    "cand_dense.weight": "candidate.dense.weight",
    "cand_dense.bias": "candidate.dense.bias",
    "cand_ln.weight": "candidate.LayerNorm.weight",
    "cand_ln.bias": "candidate.LayerNorm.bias",
}


def dgca_name(torch_name):
    """dgca's parameter name for a DgcaRelm parameter (None: not one of dgca's)."""
    if torch_name in HEADS:
        return HEADS[torch_name]
    if torch_name.startswith("bert."):  # DgcaRelm.bert is a BertForMaskedLM: HF names below it
        return torch_name[len("bert."):]
    if torch_name.startswith("prompt."):  # same names (model/nn/prompt_encoder.cc)
        return torch_name
    return None


def dgca_decays(name):
    """dgca's weight-decay flag (ParamInfo::weight_decay): matrices and gate scalars, not biases
    (the LSTM's bias_ih_l0 ... too, model/nn/prompt_encoder.cc) or LayerNorm parameters."""
    return not (name.rsplit(".", 1)[-1].startswith("bias") or "LayerNorm" in name)


class PromptEncoder(nn.Module):
    def __init__(self, P, H):
        super().__init__()
        self.embedding = nn.Embedding(2 * P, H)
        self.lstm = nn.LSTM(H, H, num_layers=2, bidirectional=True, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(2 * H, H), nn.ReLU(), nn.Linear(H, H))
        self.P = P

    def forward(self):
        x = self.embedding.weight.unsqueeze(0)          # [1, 2P, H]
        out, _ = self.lstm(x)                            # [1, 2P, 2H]
        return self.mlp(out.squeeze(0))                  # [2P, H]


class DgcaRelm(nn.Module):
    """preset: a PRESETS name or a dict of the same keys (layers, hidden,
    heads, ffn). lambda_detector / lambda_candidate weigh those losses in
    the total as model/nn/heads.cc does (ModelConfig's defaults: 1)."""

    def __init__(self, preset="small", vocab_size=21128, prompt_length=3, top_k=8,
                 detector=True, candidate=True, fusion=True, max_position=512,
                 lambda_detector=1.0, lambda_candidate=1.0, dropout=0.0):
        super().__init__()
        s = PRESETS[preset] if isinstance(preset, str) else preset
        H = s["hidden"]
        cfg = bert_config(s, vocab_size, max_position, dropout=dropout)
        self.bert = BertForMaskedLM(cfg)
        self.H, self.P, self.K = H, prompt_length, top_k
        self.prompt = PromptEncoder(prompt_length, H)
        self.use_det, self.use_cand, self.use_fusion = detector, candidate, fusion
        self.lambdas = dict(detector=lambda_detector, candidate=lambda_candidate)
        # True: the head outputs (logits, detector and gate logits, candidate
        # scores) go to fp32 before the losses, as dgca computes its losses
        # (bench/gpu/model_errors.py sets it on a model run in bf16/fp16).
        self.upcast_logits = False
        self.detector = nn.Linear(H, 1)
        self.gate = nn.Linear(H, 1)
        self.gate_det_scale = nn.Parameter(torch.ones(1))
        self.cand_dense = nn.Linear(H, H)
        self.cand_ln = nn.LayerNorm(H, eps=1e-12)
        # Heads initialised as model/nn/heads.cc DgcaHeads::InitParams does:
        # N(0, 0.02) weights, zero biases, a (det_scale) = 1. The prompt
        # encoder keeps PyTorch's defaults, as model/nn/prompt_encoder.cc.
        with torch.no_grad():
            for lin in (self.detector, self.gate, self.cand_dense):
                lin.weight.normal_(0.0, 0.02)
                lin.bias.zero_()

    def forward(self, b):
        """b: dict of tensors from make_batch(). Returns (loss, parts)."""
        emb = self.bert.bert.embeddings.word_embeddings(b["input_ids"])
        prompt = self.prompt()
        slot = b["prompt_slot"]
        emb = torch.where((slot >= 0).unsqueeze(-1), prompt[slot.clamp(min=0)], emb)
        hidden = self.bert.bert(inputs_embeds=emb, attention_mask=b["attention_mask"],
                                token_type_ids=torch.zeros_like(b["input_ids"])).last_hidden_state
        up = (lambda t: t.float()) if self.upcast_logits else (lambda t: t)  # noqa: E731
        flat = hidden.reshape(-1, self.H)
        h = flat[b["slot_index"]]                        # [T, H]
        z = up(self.bert.cls(h))                         # [T, V]
        parts = self.heads(h, z, b["slot_source"], b["slot_target"], b["candidates"],
                           self.bert.bert.embeddings.word_embeddings.weight)
        if b["mft_index"].numel() > 0:
            zm = up(self.bert.cls(flat[b["mft_index"]]))
            parts["mft"] = F.cross_entropy(zm, b["mft_labels"])
        loss = sum(self.lambdas.get(k, 1.0) * v for k, v in parts.items())
        return loss, parts

    def heads(self, h, z, x, y, cand, E):
        """The DGCA heads' losses on slot states h [T, H], MLM logits z
        [T, V] (already upcast where upcast_logits), sources x, targets y,
        candidates cand [T, K] (-1 = padding) and the embedding table E:
        {"detector", "candidate", "fusion"} as model/nn/heads.cc (the gate
        adds the detector logit only when the detector is on)."""
        up = (lambda t: t.float()) if self.upcast_logits else (lambda t: t)  # noqa: E731
        parts = {}
        e = up(self.detector(h).squeeze(-1))
        if self.use_det:
            parts["detector"] = F.binary_cross_entropy_with_logits(e, (x != y).float())
        valid = cand >= 0
        q = None
        if self.use_cand:
            u = self.cand_ln(F.gelu(self.cand_dense(h)))
            s = up(torch.einsum("th,tkh->tk", u, E[cand.clamp(min=0)]))
            s = s.masked_fill(~valid, float("-inf"))
            q = torch.softmax(s, dim=-1)
            hit = (cand == y.unsqueeze(-1)) & valid
            has = hit.any(-1)
            # Mean over the slots whose target is a candidate, without a
            # data-dependent branch or boolean index: those would cost a
            # host sync per forward in eager mode and a graph break under
            # torch.compile (0 when no slot has its target among them).
            logq = torch.log_softmax(s, dim=-1)
            parts["candidate"] = -(logq.masked_fill(~hit, 0).sum(-1) * has).sum() / has.sum().clamp_min(1)
        if self.use_fusion and q is not None:
            gate = up(self.gate(h).squeeze(-1))
            if self.use_det:
                gate = gate + up(self.gate_det_scale) * e
            g = torch.sigmoid(gate)
            # P(y) = (1 - g) softmax(z)_y + g sum_k q_k [c_k = y]: only the
            # target's probability, so no [T, V] probability table exists
            # beyond the logits (as dgca's fused path; building the table
            # and scattering into it cost PyTorch ~10 GB of memory traffic
            # per bert-base step).
            p_mlm = torch.exp(z.gather(1, y.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1))
            # masked_fill, not a product: a slot with no valid candidate has
            # a NaN row of q (softmax of all -inf), which 0 x NaN would keep.
            p_cand = q.masked_fill(~((cand == y.unsqueeze(-1)) & valid), 0).sum(-1)
            P_y = (1 - g) * p_mlm + g * p_cand.to(p_mlm.dtype)
            parts["fusion"] = -torch.log(P_y.clamp_min(1e-12)).mean()
        else:
            parts["fusion"] = F.cross_entropy(z, y)
        return parts


def make_batch(batch, seq_len, prompt_length=3, top_k=8, vocab_size=21128, chars=None,
               seed=0, device="cpu"):
    """A synthetic ReLM batch with the layout of model/core/batch.h.

    Every row has `chars` characters (default: as many as fit), ids drawn from
    the CJK range of the BERT-Chinese vocab, 10% of positions with an error,
    30% of correct source positions MFT-masked, K candidates per slot. The C++
    benchmark builds the same layout with the same sizes.
    """
    g = torch.Generator().manual_seed(seed)
    P = prompt_length
    n = chars if chars else (seq_len - 2 - 2 * P) // 2
    L = seq_len
    lo, hi = 670, 8000
    src = torch.randint(lo, hi, (batch, n), generator=g)
    err = torch.rand(batch, n, generator=g) < 0.1
    trg = torch.where(err, torch.randint(lo, hi, (batch, n), generator=g), src)
    ids = torch.zeros(batch, L, dtype=torch.long)
    slot = torch.full((batch, L), -1, dtype=torch.long)
    ids[:, 0] = CLS
    ids[:, 1:1 + P] = CLS
    slot[:, 1:1 + P] = torch.arange(P)
    mft = (~err) & (torch.rand(batch, n, generator=g) < 0.3)
    ids[:, 1 + P:1 + P + n] = torch.where(mft, torch.full_like(src, MASK), src)
    ids[:, 1 + P + n:1 + 2 * P + n] = SEP
    slot[:, 1 + P + n:1 + 2 * P + n] = torch.arange(P, 2 * P)
    ids[:, 1 + 2 * P + n:1 + 2 * P + 2 * n] = MASK
    ids[:, 1 + 2 * P + 2 * n] = SEP
    att = torch.zeros(batch, L, dtype=torch.long)
    att[:, :2 + 2 * P + 2 * n] = 1
    rows = torch.arange(batch).unsqueeze(-1) * L
    slot_index = (rows + torch.arange(1 + 2 * P + n, 1 + 2 * P + 2 * n)).reshape(-1)
    mft_pos = rows + torch.arange(1 + P, 1 + P + n)
    cand = torch.randint(lo, hi, (batch * n, top_k), generator=g)
    cand[:, 0] = src.reshape(-1)
    cand[:, 1] = trg.reshape(-1)     # the target is usually among the homophones
    out = dict(input_ids=ids, attention_mask=att, prompt_slot=slot, slot_index=slot_index,
               slot_source=src.reshape(-1), slot_target=trg.reshape(-1), candidates=cand,
               mft_index=mft_pos[mft], mft_labels=src[mft])
    return {k: v.to(device) for k, v in out.items()}


# The MLM head also runs on the MFT-masked source characters: in
# make_batch's batches (and dgca-bench's), 90% of characters are correct and
# 30% of those are masked, 0.27 of the slots on average.
MFT_ROWS_PER_SLOT = 0.27


def flops_per_sample(preset, seq_len, vocab_size=21128, slots=None):
    """Approximate training FLOPs per sample (forward + backward = 3x
    forward): the encoder's GEMMs and attention, and the MLM head (dense +
    vocabulary projection) on the target slots and the MFT rows. The
    prompt encoder and the candidate head (~0.2 GFLOP for bert-base) are
    left out. About 75 GFLOP for bert-base at seq 128 (dgca_bench.cc has
    the same formula, so MFU is comparable)."""
    s = PRESETS[preset]
    H, Lyr, F_ = s["hidden"], s["layers"], s["ffn"]
    T = seq_len
    per_layer = 2 * T * (4 * H * H + 2 * H * F_) + 2 * 2 * T * T * H
    n = slots if slots is not None else (seq_len - 8) // 2
    head_rows = n * (1 + MFT_ROWS_PER_SLOT)
    head = 2 * head_rows * (H * H + H * vocab_size)
    return 3 * (Lyr * per_layer + head)
