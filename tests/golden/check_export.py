#!/usr/bin/env python3
"""Holds Hugging Face transformers' BertForMaskedLM, loaded from a `dgca
export` directory, against dgca's own CPU code on the same sentences.

A developer's check, never run by the build or at run time (it needs CPU
PyTorch and transformers, e.g. `pip install torch transformers safetensors`):

    build/cli/dgca export JOB --out /tmp/model        # or the quickstart's .dgca/model
    python3 tests/golden/check_export.py --model /tmp/model \
        --tool build/model/dgca-bert-dump --data ../shared/data/ecspell/test_law.txt

What it checks (docs/cli.md, "The export directory"):
  1. BertForMaskedLM.from_pretrained(DIR) loads model.safetensors with every
     parameter found (only the tied decoder copies, which HF ties to the
     word embeddings, may be reported missing) and nothing unexpected.
  2. plain: input_ids "[CLS] s [SEP]" (token type 0, padding masked): the
     last hidden states and MLM logits of both, at every real position.
  3. relm: the ReLM rows dgca decodes with, whose prompt slots take the
     prompt encoder's rows (dgca_heads.safetensors, not BERT) instead of
     their word embeddings: passed to HF as inputs_embeds. This is the part
     of DGCA-ReLM that is BERT; the detector, candidate head and fusion on
     top are not BERT and are not compared.
Each with the max |difference| of dgca and transformers (float32 both), and
each against transformers in float64: the two float32 results differ by
rounding (sums in another order), each about as far from float64.
Exit 1 when any max |difference| exceeds --tol (default 1e-4). Measured
2026-11-29 on the quickstart's model (3200 steps, hidden 64): hidden states
3.2e-05, MLM logits 8.5e-05 (|logit| up to 17.6; against float64 dgca
3.3e-05, transformers 6.9e-05).
"""
import argparse
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import BertForMaskedLM


def sentences_from(path, n, max_chars):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            src = line.rstrip("\n").split("\t")[0].split(" ")
            if 0 < len(src) <= max_chars:
                out.append("".join(src))
            if len(out) == n:
                break
    return out


def compare(name, ours, theirs, mask):
    """max |ours - theirs| over the rows where mask is 1."""
    keep = mask.bool()
    d = (ours[keep] - theirs[keep]).abs().max().item()
    scale = theirs[keep].abs().max().item()
    print(f"  {name:14s} max |diff| {d:.3e}  (max |value| {scale:.3g}, {int(keep.sum())} positions)")
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a dgca export directory")
    ap.add_argument("--tool", default="build/model/dgca-bert-dump", help="dgca-bert-dump")
    ap.add_argument("--data", required=True, help="an ECSpell file: sentences from its source side")
    ap.add_argument("-n", type=int, default=8, help="sentences")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()

    model, info = BertForMaskedLM.from_pretrained(args.model, output_loading_info=True)
    model.eval()
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    missing = set(info["missing_keys"]) - tied
    print(f"transformers: missing {sorted(info['missing_keys'])}, unexpected {sorted(info['unexpected_keys'])}")
    ok = not missing and not info["unexpected_keys"] and not info.get("mismatched_keys")
    if not ok:
        print("FAIL: the export does not load cleanly into BertForMaskedLM")
    # The tied decoder must be the word embeddings (and its bias ours).
    assert torch.equal(model.cls.predictions.decoder.weight, model.bert.embeddings.word_embeddings.weight)

    cfg = model.config
    max_chars = (cfg.dgca["max_seq_len"] - 2 - 2 * cfg.dgca["prompt_length"]) // 2
    sents = sentences_from(args.data, args.n, max_chars)
    with tempfile.TemporaryDirectory() as tmp:
        dump = tmp + "/dump.safetensors"
        subprocess.run([args.tool, "--model", args.model, "--out", dump] + sents, check=True)
        d = load_file(dump)

    # The same forward in float64 too: the reference both float32
    # computations are rounded from, so dgca's error can be set beside
    # PyTorch's own (sums in another order round differently).
    model64 = BertForMaskedLM.from_pretrained(args.model).double().eval()

    def run(m, d, prefix, dtype):
        ids = d[prefix + ".input_ids"].long()
        mask = d[prefix + ".attention_mask"].long()
        types = d[prefix + ".token_type_ids"].long()
        emb = m.bert.embeddings.word_embeddings(ids)
        if prefix + ".prompt_rows" in d:
            slot = d[prefix + ".prompt_slot"].long()
            at = slot >= 0
            emb[at] = d[prefix + ".prompt_rows"].to(dtype)[slot[at]]
        out = m(inputs_embeds=emb, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        return mask, out.hidden_states[-1], out.logits

    worst = 0.0
    with torch.no_grad():
        for prefix, title in (("plain", "plain BERT input ([CLS] s [SEP]): input_ids alone"),
                              ("relm", "ReLM rows, the prompt encoder's rows in the prompt slots (inputs_embeds)")):
            mask, h32, z32 = run(model, d, prefix, torch.float32)
            _, h64, z64 = run(model64, d, prefix, torch.float64)
            if prefix == "plain":  # inputs_embeds from the ids is what input_ids does
                assert torch.equal(model(input_ids=d["plain.input_ids"].long(), attention_mask=mask,
                                         token_type_ids=d["plain.token_type_ids"].long()).logits, z32)
            print(f"{title}, {mask.shape[0]} sentences, seq {mask.shape[1]}:")
            worst = max(worst, compare("hidden states", d[prefix + ".hidden"], h32, mask))
            worst = max(worst, compare("MLM logits", d[prefix + ".logits"], z32, mask))
            print(f"    against float64: dgca {((d[prefix + '.logits'].double() - z64)[mask.bool()]).abs().max():.3e},"
                  f" transformers float32 {((z32.double() - z64)[mask.bool()]).abs().max():.3e} (MLM logits)")

    print(f"max |diff| overall {worst:.3e} (tolerance {args.tol:g})")
    if worst > args.tol or not ok:
        print("FAIL")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
