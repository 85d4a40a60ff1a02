#!/usr/bin/env python3
"""Train the PyTorch DGCA-ReLM peer (bench/torch_dgca.py) on an ECSpell-format
corpus the way dgca's trainer does, and evaluate it the way dgca does.

Mirrors model/train/trainer.cc + model/core/data.cc for what matters to the
loss curve: vocabulary built from the training file (ids 0..103 reserved as in
BERT, then characters by descending count, ties by code point), pairs of
unequal length skipped, sources truncated to (L-2-2P)/2 characters, a fresh
shuffle every epoch, MFT `noerror` (each source character equal to its target
masked with probability `rate`, redrawn every batch), candidates {x} + the
first K-1 entries of a confusion JSON (those in the vocabulary), HF-style init
(N(0,0.02), heads as dgca), AdamW (wd 0) with HF linear warmup/decay.
The random streams differ from dgca's (different RNGs), so curves agree in
distribution, not bit for bit.

Prints one JSON document: losses every step, the eval metrics (sentence-level
detection/correction P/R/F1, false-positive rate, char-level correction F1).
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
from torch_dgca import DgcaRelm, PAD, UNK, CLS, SEP, MASK  # noqa: E402


def read_pairs(path):
    out = []
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if "\t" not in line:
            continue
        s, t = line.split("\t", 1)
        s, t = s.split(), t.split()
        if len(s) != len(t) or not s:
            continue
        out.append((s, t))
    return out


def build_vocab(path):
    counts = {}
    for line in open(path, encoding="utf-8"):
        for ch in line:
            if not ch.isspace():
                counts[ch] = counts.get(ch, 0) + 1
    chars = sorted(counts, key=lambda c: (-counts[c], ord(c)))
    return {c: 104 + i for i, c in enumerate(chars)}, 104 + len(chars)


def encode(pairs, vocab, nmax):
    return [([vocab.get(c, UNK) for c in s[:nmax]], [vocab.get(c, UNK) for c in t[:nmax]])
            for s, t in pairs]


def build_batch(exs, L, P, K, conf, mft_rate, g):
    B = len(exs)
    ids = torch.zeros(B, L, dtype=torch.long)
    att = torch.zeros(B, L, dtype=torch.long)
    slot = torch.full((B, L), -1, dtype=torch.long)
    slot_index, src_all, trg_all, cand, mft_pos, mft_lab = [], [], [], [], [], []
    for r, (s, t) in enumerate(exs):
        n = len(s)
        ids[r, 0] = CLS
        ids[r, 1:1 + P] = CLS
        slot[r, 1:1 + P] = torch.arange(P)
        st = torch.tensor(s)
        if mft_rate > 0:
            m = (torch.tensor(s) == torch.tensor(t)) & (torch.rand(n, generator=g) < mft_rate)
            m &= st >= 104
            st = torch.where(m, torch.full_like(st, MASK), st)
            for i in m.nonzero().flatten().tolist():
                mft_pos.append(r * L + 1 + P + i)
                mft_lab.append(s[i])
        ids[r, 1 + P:1 + P + n] = st
        ids[r, 1 + P + n:1 + 2 * P + n] = SEP
        slot[r, 1 + P + n:1 + 2 * P + n] = torch.arange(P, 2 * P)
        ids[r, 1 + 2 * P + n:1 + 2 * P + 2 * n] = MASK
        ids[r, 1 + 2 * P + 2 * n] = SEP
        att[r, :2 + 2 * P + 2 * n] = 1
        for i in range(n):
            slot_index.append(r * L + 1 + 2 * P + n + i)
            src_all.append(s[i])
            trg_all.append(t[i])
            c = [s[i]] + conf.get(s[i], [])[:K - 1]
            cand.append(c + [-1] * (K - len(c)))
    return dict(input_ids=ids, attention_mask=att, prompt_slot=slot,
                slot_index=torch.tensor(slot_index), slot_source=torch.tensor(src_all),
                slot_target=torch.tensor(trg_all), candidates=torch.tensor(cand),
                mft_index=torch.tensor(mft_pos, dtype=torch.long),
                mft_labels=torch.tensor(mft_lab, dtype=torch.long))


@torch.no_grad()
def predict(model, b):
    """argmax P_i per target slot (the fused distribution), as DgcaModel::Predict."""
    emb = model.bert.bert.embeddings.word_embeddings(b["input_ids"])
    prompt = model.prompt()
    slot = b["prompt_slot"]
    emb = torch.where((slot >= 0).unsqueeze(-1), prompt[slot.clamp(min=0)], emb)
    hidden = model.bert.bert(inputs_embeds=emb, attention_mask=b["attention_mask"],
                             token_type_ids=torch.zeros_like(b["input_ids"])).last_hidden_state
    h = hidden.reshape(-1, model.H)[b["slot_index"]]
    z = model.bert.cls(h)
    cand = b["candidates"]
    valid = cand >= 0
    e = model.detector(h).squeeze(-1)
    u = model.cand_ln(torch.nn.functional.gelu(model.cand_dense(h)))
    E = model.bert.bert.embeddings.word_embeddings.weight
    s = torch.einsum("th,tkh->tk", u, E[cand.clamp(min=0)]).masked_fill(~valid, float("-inf"))
    q = torch.softmax(s, -1)
    g = torch.sigmoid(model.gate(h).squeeze(-1) + model.gate_det_scale * e)
    P = (1 - g).unsqueeze(-1) * torch.softmax(z, -1)
    P = P.scatter_add(1, cand.clamp(min=0), (g.unsqueeze(-1) * q).masked_fill(~valid, 0))
    pred = P.argmax(-1)
    # Alternative decoding (not dgca's): keep x_i unless the detector says
    # p(error) > 0.5; shows how much of the false-positive rate is decoding.
    keep = torch.sigmoid(e) <= 0.5
    return pred, torch.where(keep, b["slot_source"], pred)


def f1(p, r):
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def metrics(rows):
    """rows: (src, trg, pred) id lists. Sentence-level as docs/model.md."""
    pos = sum(1 for s, t, p in rows if s != t)
    neg = len(rows) - pos
    pred_pos = sum(1 for s, t, p in rows if p != s)
    cor_tp = sum(1 for s, t, p in rows if s != t and p == t)
    det_tp = 0
    for s, t, p in rows:
        if s != t:
            err = [i for i in range(len(s)) if s[i] != t[i]]
            chg = [i for i in range(len(s)) if s[i] != p[i]]
            det_tp += err == chg
    fp = sum(1 for s, t, p in rows if s == t and p != s)
    cp, cr = (cor_tp / pred_pos if pred_pos else 0.0), (cor_tp / pos if pos else 0.0)
    dp, dr = (det_tp / pred_pos if pred_pos else 0.0), (det_tp / pos if pos else 0.0)
    # char level correction: changed positions that equal the target / errors
    ch_pred = sum(sum(1 for a, c in zip(s, p) if a != c) for s, t, p in rows)
    ch_err = sum(sum(1 for a, c in zip(s, t) if a != c) for s, t, p in rows)
    ch_tp = sum(sum(1 for a, b_, c in zip(s, t, p) if a != c and c == b_) for s, t, p in rows)
    ccp, ccr = (ch_tp / ch_pred if ch_pred else 0.0), (ch_tp / ch_err if ch_err else 0.0)
    return dict(sentences=len(rows), sentence_correction_precision=cp,
                sentence_correction_recall=cr, sentence_correction_f1=f1(cp, cr),
                sentence_detection_f1=f1(dp, dr), false_positive_rate=fp / neg if neg else 0.0,
                char_correction_f1=f1(ccp, ccr))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--confusion", required=True, help="confusion JSON (char -> [chars])")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--seq", type=int, default=96)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--schedule", default="linear", choices=["linear", "constant"])
    ap.add_argument("--mft", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clip", type=float, default=0.0, help="global grad-norm clip (0 = off)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="hidden and attention dropout (configs/quickstart.yaml's model.dropout is 0; "
                         "a job spec that leaves it out gets 0.1)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed)
    P, K = 3, 8
    nmax = (a.seq - 2 - 2 * P) // 2
    vocab, V = build_vocab(a.train)
    raw = json.load(open(a.confusion, encoding="utf-8"))
    conf = {}
    for k, lst in raw.items():
        if k in vocab:
            ids = []
            for c in lst:
                if c in vocab and c != k and vocab[c] not in ids:
                    ids.append(vocab[c])
            conf[vocab[k]] = ids
    train = encode(read_pairs(a.train), vocab, nmax)
    test = encode(read_pairs(a.eval), vocab, nmax)
    model = DgcaRelm(a.preset, vocab_size=V, dropout=a.dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0, eps=1e-8)

    def lr_at(step):
        if a.warmup and step < a.warmup:
            return a.lr * step / a.warmup
        if a.schedule == "constant":
            return a.lr
        return max(0.0, a.lr * (a.steps - step) / max(1, a.steps - a.warmup))

    losses, parts_log = [], []
    perm, pos, epoch = torch.randperm(len(train), generator=g).tolist(), 0, 0
    t0 = time.time()
    for step in range(a.steps):
        idx = []
        while len(idx) < a.batch:
            if pos == len(perm):
                epoch += 1
                perm, pos = torch.randperm(len(train), generator=g).tolist(), 0
            idx.append(perm[pos])
            pos += 1
        b = build_batch([train[i] for i in idx], a.seq, P, K, conf, a.mft, g)
        for pg in opt.param_groups:
            pg["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss, parts = model(b)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        losses.append(loss.item())
        parts_log.append({k: v.item() for k, v in parts.items()})
        if (step + 1) % 30 == 0 or step == 0:
            print(f"step {step+1}/{a.steps} loss {loss.item():.4f} " +
                  " ".join(f"{k} {v.item():.4f}" for k, v in parts.items()), file=sys.stderr)
    train_s = time.time() - t0
    model.eval()
    rows, rows_det = [], []
    for i in range(0, len(test), 32):
        exs = test[i:i + 32]
        b = build_batch(exs, a.seq, P, K, conf, 0.0, g)
        pred, pred_det = predict(model, b)
        pred, pred_det = pred.tolist(), pred_det.tolist()
        off = 0
        for s, t in exs:
            rows.append((s, t, pred[off:off + len(s)]))
            rows_det.append((s, t, pred_det[off:off + len(s)]))
            off += len(s)
    print(json.dumps(dict(impl="pytorch", steps=a.steps, train_seconds=train_s, vocab=V,
                          losses=losses, parts=parts_log, eval=metrics(rows),
                          eval_detector_gated=metrics(rows_det))))


if __name__ == "__main__":
    main()
