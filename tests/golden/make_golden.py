#!/usr/bin/env python3
"""Golden files for model/nn/golden_test.cc: a tiny random Hugging Face
BertForMaskedLM on a ReLM-layout batch, float32, CPU.

Developer-run, never in CI or ctest:
    pip install torch --index-url https://download.pytorch.org/whl/cpu \
        transformers safetensors numpy
    python3 tests/golden/make_golden.py          # writes tests/golden/*.safetensors

Writes
  model.safetensors   every parameter under its HF BertForMaskedLM name
                      (the tied decoder weight appears once, as
                      bert.embeddings.word_embeddings.weight)
  golden.safetensors  the batch (ids stored as F32), the sizes, the logits on
                      the gathered rows (target slots in slot order, then MFT
                      positions in position order), the losses, and
                      "grad.<name>" for every parameter: the gradient of
                      loss = fusion + mft, where fusion is the mean CE over the
                      target slots (== HF's own MLM loss with labels on the
                      target slots, asserted below) and mft the mean CE over
                      the MFT-masked source positions.

Dropout is off (both probabilities 0), as in the C++ model's default
ModelConfig: its masks are its own hash (model/core/dropout.h), not
PyTorch's RNG, so only dropout-free runs compare bit for bit.
"""
import os

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import BertConfig, BertForMaskedLM

HERE = os.path.dirname(os.path.abspath(__file__))

V, H, LAYERS, HEADS, FFN, MAXPOS = 120, 32, 2, 4, 64, 64
B, L, P = 3, 24, 2
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SOURCE_LENGTHS = [4, 7, 9]  # (L - 2 - 2P) / 2 = 9 at most; rows 0 and 1 are padded


def build_batch(rng):
    input_ids = np.full((B, L), PAD, np.int64)
    attention_mask = np.zeros((B, L), np.int64)
    token_type_ids = np.zeros((B, L), np.int64)
    prompt_slot = np.full((B, L), -1, np.int64)
    labels = np.full((B, L), -100, np.int64)
    mft_labels = np.full((B, L), -100, np.int64)
    slot_index, slot_source, slot_target = [], [], []
    for b, n in enumerate(SOURCE_LENGTHS):
        src = rng.integers(5, V, size=n)
        trg = src.copy()
        # One or two spelling errors per row.
        for i in rng.choice(n, size=1 + b % 2, replace=False):
            trg[i] = rng.integers(5, V)
        row = [CLS] + [CLS] * P + list(src) + [SEP] * P + [MASK] * n + [SEP]
        input_ids[b, : len(row)] = row
        attention_mask[b, : len(row)] = 1
        for k in range(P):
            prompt_slot[b, 1 + k] = k
            prompt_slot[b, 1 + P + n + k] = P + k
        for i in range(n):
            pos = 2 * P + n + 1 + i
            labels[b, pos] = trg[i]
            slot_index.append(b * L + pos)
            slot_source.append(src[i])
            slot_target.append(trg[i])
        # MFT: mask one correct source character per row (rows 1 and 2).
        if b > 0:
            ok = [i for i in range(n) if src[i] == trg[i]]
            i = ok[0]
            input_ids[b, P + 1 + i] = MASK
            mft_labels[b, P + 1 + i] = src[i]
    return dict(
        input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
        prompt_slot=prompt_slot, labels=labels, mft_labels=mft_labels,
        slot_index=np.array(slot_index), slot_source_id=np.array(slot_source),
        slot_target_id=np.array(slot_target))


def main():
    torch.manual_seed(1234)
    rng = np.random.default_rng(1234)
    config = BertConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=FFN, max_position_embeddings=MAXPOS, type_vocab_size=2,
        hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-12, pad_token_id=PAD)
    config._attn_implementation = "eager"  # the explicit additive-mask path
    model = BertForMaskedLM(config).float().eval()
    # Spread the weights well beyond BERT's N(0, 0.02) init so that attention
    # is far from uniform and every bias and LayerNorm gain matters.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif "embeddings" in name:
                p.copy_(0.5 * torch.randn_like(p))
            elif "query" in name or "key" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.25 * torch.randn_like(p))

    batch = build_batch(rng)
    t = {k: torch.from_numpy(v) for k, v in batch.items()}
    out = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                token_type_ids=t["token_type_ids"], labels=t["labels"])
    logits = out.logits.reshape(B * L, V)
    slot_rows = t["slot_index"]
    mft_rows = torch.nonzero(t["mft_labels"].reshape(-1) != -100).reshape(-1)
    ce = torch.nn.functional.cross_entropy
    fusion = ce(logits[slot_rows], t["slot_target_id"])
    mft = ce(logits[mft_rows], t["mft_labels"].reshape(-1)[mft_rows])
    assert torch.allclose(fusion, out.loss), (fusion, out.loss)
    total = fusion + mft
    total.backward()

    params = dict(model.named_parameters())
    assert "cls.predictions.decoder.weight" not in params  # tied, listed once
    weights = {n: p.detach().numpy().astype(np.float32) for n, p in params.items()}
    save_file(weights, os.path.join(HERE, "model.safetensors"))

    gold = {k: v.astype(np.float32) for k, v in batch.items()}
    gold["sizes"] = np.array([V, H, LAYERS, HEADS, FFN, MAXPOS, B, L, P], np.float32)
    gold["logits"] = torch.cat([logits[slot_rows], logits[mft_rows]]).detach().numpy()
    gold["loss"] = np.array([total.item(), fusion.item(), mft.item()], np.float32)
    for n, p in params.items():
        gold["grad." + n] = p.grad.numpy().astype(np.float32)
    save_file(gold, os.path.join(HERE, "golden.safetensors"))
    print("loss total %.6f fusion %.6f mft %.6f; %d slots, %d MFT rows; %d tensors"
          % (total.item(), fusion.item(), mft.item(), len(slot_rows), len(mft_rows), len(params)))


if __name__ == "__main__":
    main()
