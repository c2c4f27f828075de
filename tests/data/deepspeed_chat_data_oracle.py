#!/usr/bin/env python3
"""Reference for tests/data/prompt_dataset_test.cpp: one phase's tokenised train/eval items built
the way DeepSpeed-Chat's create_prompt_dataset builds them (phase split over train and eval
separately, per-phase tokenisation with transformers, ConcatDataset + RandomState shuffle for
several datasets, sft_only datasets with "10,0,0" then a second shuffle), for the three record
formats the test uses: local/jsonfile, Dahoas/synthetic-instruct-gptj-pairwise (no eval split: the
9:1 train_eval split) and Dahoas/rm-static.
Writes {"train": [...], "eval": [...]}: per item the unpadded ids (phase 1 and 3) or [chosen, rejected].
"""
import argparse
import json

import numpy as np
from transformers import AutoTokenizer


def split_index(size, data_split, phase, seed):
    perm = np.arange(size, dtype=np.uint32)
    np.random.RandomState(seed).shuffle(perm)
    weights = [float(s) for s in data_split.split(",")]
    weights = [w / sum(weights) for w in weights]
    idx = [0]
    for w in weights:
        idx.append(idx[-1] + int(round(w * float(size))))
    diff = idx[-1] - size
    for i in range(1, len(idx)):
        idx[i] -= diff
    return perm[idx[phase]:idx[phase + 1]].tolist()


def read_rows(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def jsonfile_views(r):
    p, c, rej = r.get("prompt"), r.get("chosen"), r.get("rejected")
    return {"p": None if p is None else " " + p,
            "pc": None if p is None or c is None else " " + p + " " + c,
            "pr": None if p is None or rej is None else " " + p + " " + rej}


def synthetic_views(r):
    p = " Human: " + r["prompt"] + " Assistant:"
    return {"p": p, "pc": p + " " + r["chosen"], "pr": p + " " + r["rejected"]}


def hh_views(r):
    return {"p": r["prompt"], "pc": r["prompt"] + r["chosen"], "pr": r["prompt"] + r["rejected"]}


def load(kind, path, seed):
    if kind == "jsonfile":
        return [jsonfile_views(r) for r in read_rows(path + "/train.json")], \
               [jsonfile_views(r) for r in read_rows(path + "/eval.json")]
    fmt = synthetic_views if kind == "synthetic" else hh_views
    if kind == "synthetic":
        rows = [fmt(r) for r in read_rows(path + "/train.jsonl")]
        return [rows[i] for i in split_index(len(rows), "9,1", 0, seed)], \
               [rows[i] for i in split_index(len(rows), "9,1", 1, seed)]
    return [fmt(r) for r in read_rows(path + "/train.jsonl")], [fmt(r) for r in read_rows(path + "/test.jsonl")]


def unpadded(enc):
    return [i for i, m in zip(enc["input_ids"], enc["attention_mask"]) if m == 1]


def tokenize(rows, phase, tok, max_len, eot):
    out = []
    for r in rows:
        if phase == 1:
            if r["pc"] is None:
                continue
            out.append(unpadded(tok(r["pc"] + eot, max_length=max_len, padding="max_length", truncation=True)))
        elif phase == 2:
            if r["pc"] is None or r["pr"] is None:
                continue
            c = tok(r["pc"] + eot, max_length=max_len, padding="max_length", truncation=True)
            rej = tok(r["pr"] + eot, max_length=max_len, padding="max_length", truncation=True)
            out.append([unpadded(c), unpadded(rej)])
        else:
            if r["p"] is None:
                continue
            ids = tok(r["p"])["input_ids"]
            if len(ids) <= max_len:
                out.append(ids)
    return out


def shuffled(items, seed):
    perm = np.arange(len(items), dtype=np.uint32)
    np.random.RandomState(seed).shuffle(perm)
    return [items[i] for i in perm]


def build(datasets, data_split, args, tok):
    trains, evals = [], []
    for kind, path in datasets:
        train, ev = load(kind, path, args.seed)
        trains.append(tokenize([train[i] for i in split_index(len(train), data_split, args.phase - 1, args.seed)],
                               args.phase, tok, args.max_seq_len, args.eot))
        evals.append(tokenize([ev[i] for i in split_index(len(ev), data_split, args.phase - 1, args.seed)],
                              args.phase, tok, args.max_seq_len, args.eot))
    return trains, evals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--data", action="append", default=[], help="kind:path")
    ap.add_argument("--sft", action="append", default=[], help="kind:path")
    ap.add_argument("--phase", type=int, required=True)
    ap.add_argument("--split", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--max-seq-len", type=int, required=True)
    ap.add_argument("--eot", default="")
    ap.add_argument("--out", required=True, help="where the JSON goes (tokenizers may print on stdout)")
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    tok.pad_token = tok.eos_token  # DeepSpeed-Chat's get_tokenizer
    tok.padding_side = "right"
    parse = lambda specs: [tuple(s.split(":", 1)) for s in specs]
    trains, evals = build(parse(args.data), args.split, args, tok)
    concat = lambda parts: [item for part in parts for item in part]
    train = trains[0] if len(trains) == 1 else shuffled(concat(trains), args.seed)
    ev = evals[0] if len(evals) == 1 else shuffled(concat(evals), args.seed)
    if args.phase == 1 and args.sft:
        sft_trains, sft_evals = build(parse(args.sft), "10,0,0", args, tok)
        train = shuffled(train + concat(sft_trains), args.seed)
        ev = shuffled(ev + concat(sft_evals), args.seed)
    with open(args.out, "w") as f:
        json.dump({"train": train, "eval": ev}, f)


if __name__ == "__main__":
    main()
