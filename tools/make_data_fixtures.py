#!/usr/bin/env python3
"""Writes the dataset fixtures of tests/data/datasets_test.cpp into tests/fixtures/datasets/.

Hand-written records in the real schema of every dataset dschat formats, each written three ways
(JSON array, JSON Lines, Parquet) under <format>/<org>/<name>/, plus a hub-cache copy of
Dahoas/rm-static (hub/datasets--Dahoas--rm-static/snapshots/<rev>/data/*.parquet) as HF stores it.
expected.json holds, per dataset, DeepSpeed-Chat's five views of every train and eval record
(prompt, chosen, rejected, prompt_and_chosen, prompt_and_rejected; null for None), computed here
the way DeepSpeed-Chat's raw_datasets.py computes them (Python's re for webgpt's citation clean-up,
numpy's RandomState for the 9:1 train_eval split of datasets that have no eval split).
Usage: .venv/bin/python tools/make_data_fixtures.py   (rewrites the files; the outputs are committed)
"""
import json
import pathlib
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "datasets"
SEED = 1234

HH = [  # Dahoas/rm-static and full-hh-rlhf: prompt already in the HH form
    ("\n\nHuman: What is the capital of France?\n\nAssistant:", " Paris.", " I don't know, ask someone."),
    ("\n\nHuman: Tell me a joke\n\nAssistant: Why?\n\nHuman: Please\n\nAssistant:", " A pun walks into a bar.", " No."),
    ("\n\nHuman: Ünïcödé — 日本語 🙂?\n\nAssistant:", " はい 🙂", " \t"),
    ("\n\nHuman: empty answers\n\nAssistant:", "", " x"),
]


def hh_rows(offset):
    return [{"prompt": p, "response": c, "chosen": c, "rejected": r} for p, c, r in HH[offset:] + HH[:offset]]


def synthetic_rows():
    return [{"prompt": f"Write number {i} in words.", "chosen": f"Number {i}.", "rejected": f"{i + 1}?"} for i in range(12)]


def yitingxie_rows(offset):
    rows = [
        {"prompt": "Human: hi there\n\n", "chosen": "Assistant: hello!", "rejected": "Assistant: go away"},
        {"prompt": "Human: a\n\nAssistant: b\n\nHuman: c\n\n", "chosen": "Assistant: d Assistant: e",
         "rejected": "no marker at all"},
        {"prompt": "Human: numbers\n\n", "chosen": "Assistant: 1 2 3", "rejected": "Assistant:"},
    ]
    return rows[offset:] + rows[:offset]


def webgpt_rows():
    answers = [
        ("Paris is the capital [1] of France (2).", "It is Lyon [2](3)."),
        ("Tie goes to answer 0 [1]", "answer 1 (a]"),
        ("Mixed (brackets] and [unclosed\nline] end", " [1] leading"),
        ("No citations at all.", "Nested [a [b] c] tail"),
    ]
    rows = []
    for i in range(10):
        a0, a1 = answers[i % len(answers)]
        score_0, score_1 = [(1.0, -1.0), (0.0, 0.0), (-0.5, 0.5), (2, 1)][i % 4]
        rows.append({"question": {"id": f"q{i}", "full_text": f"Question {i}: why (really)?", "dataset": "eli5"},
                     "quotes_0": {"title": ["t"], "extract": ["e"]}, "answer_0": a0, "tokens_0": [1, 2],
                     "score_0": score_0, "quotes_1": {"title": [], "extract": []}, "answer_1": a1,
                     "tokens_1": [3], "score_1": score_1})
    return rows


def shp_rows(offset):
    rows = [
        {"post_id": "a", "domain": "askscience_train", "upvote_ratio": 0.9, "history": "Why is the sky blue?",
         "c_root_id_A": "x", "c_root_id_B": "y", "created_at_utc_A": 1, "created_at_utc_B": 2, "score_A": 10,
         "score_B": 3, "human_ref_A": "Rayleigh scattering.", "human_ref_B": "Because.", "labels": 1,
         "seconds_difference": 1.0, "score_ratio": 3.3},
        {"post_id": "b", "domain": "askscience_train", "upvote_ratio": 0.5, "history": "Is water wet?",
         "c_root_id_A": "x", "c_root_id_B": "y", "created_at_utc_A": 1, "created_at_utc_B": 2, "score_A": 1,
         "score_B": 7, "human_ref_A": "No.", "human_ref_B": "It makes things wet.", "labels": 0,
         "seconds_difference": 2.0, "score_ratio": 7.0},
    ]
    return rows[offset:] + rows[:offset]


def jsonfile_rows(offset):
    rows = [{"prompt": "Human: 2 + 2? Assistant:", "chosen": "4", "rejected": "5"},
            {"prompt": "Human: say hi. Assistant:", "chosen": "hi", "rejected": None},
            {"prompt": "Human: colour of grass? Assistant:", "chosen": "green", "rejected": "blue"}]
    return rows[offset:] + rows[:offset]


def remove_citations(s):
    s = re.sub(r" [\(\[].*?[\)\]]", "", s)
    return re.sub(r"[\(\[].*?[\)\]]", "", s)


def views(p, c, r, pc, pr):
    return {"prompt": p, "chosen": c, "rejected": r, "prompt_and_chosen": pc, "prompt_and_rejected": pr}


def std(p, c, r):  # " Human: p Assistant:" / " " + answer
    P = " Human: " + p + " Assistant:"
    return views(P, " " + c, " " + r, P + " " + c, P + " " + r)


def format_hh(s):
    return views(s["prompt"], s["chosen"], s["rejected"], s["prompt"] + s["chosen"], s["prompt"] + s["rejected"])


def format_yitingxie(s):
    return views(s["prompt"] + "Assistant:", s["chosen"].split("Assistant:")[-1], s["rejected"].split("Assistant:")[-1],
                 s["prompt"] + s["chosen"], s["prompt"] + s["rejected"])


def format_webgpt(s):
    first = float(s["score_0"]) >= float(s["score_1"])
    c = remove_citations(s["answer_0"] if first else s["answer_1"])
    r = remove_citations(s["answer_1"] if first else s["answer_0"])
    return std(s["question"]["full_text"], c, r)


def format_shp(s):
    a = int(s["labels"]) == 1
    return std(s["history"], s["human_ref_A"] if a else s["human_ref_B"], s["human_ref_B"] if a else s["human_ref_A"])


def format_jsonfile(s):
    p, c, r = s["prompt"], s["chosen"], s["rejected"]
    return views(" " + p, " " + c, None if r is None else " " + r, " " + p + " " + c,
                 None if r is None else " " + p + " " + r)


def train_eval(rows):  # DeepSpeed-Chat's "train_eval" split "9,1" with the seed
    n = len(rows)
    perm = np.arange(n, dtype=np.uint32)
    np.random.RandomState(SEED).shuffle(perm)
    cut = int(round(0.9 * n))
    cut -= (cut + int(round(0.1 * n))) - n
    return [rows[i] for i in perm[:cut]], [rows[i] for i in perm[cut:]]


DATASETS = {  # name -> (train rows, eval rows or None, formatter, eval split name)
    "Dahoas/rm-static": (hh_rows(0), hh_rows(2)[:2], format_hh, "test"),
    "Dahoas/full-hh-rlhf": (hh_rows(1), hh_rows(3)[:3], format_hh, "test"),
    "Dahoas/synthetic-instruct-gptj-pairwise": (synthetic_rows(), None,
                                                lambda s: std(s["prompt"], s["chosen"], s["rejected"]), None),
    "yitingxie/rlhf-reward-datasets": (yitingxie_rows(0), yitingxie_rows(1), format_yitingxie, "test"),
    "openai/webgpt_comparisons": (webgpt_rows(), None, format_webgpt, None),
    "stanfordnlp/SHP": (shp_rows(0), shp_rows(1), format_shp, "validation"),
}


def write(path, rows, fmt):
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    expected = {}
    for name, (train, evals, fmt_fn, eval_split) in DATASETS.items():
        for fmt in ("json", "jsonl", "parquet"):
            base = OUT / fmt / name
            # SHP keeps one JSON Lines file per subreddit folder, named <split>.json.
            if name == "stanfordnlp/SHP" and fmt == "jsonl":
                base, ext = base / "askscience", "json"
            else:
                ext = fmt
            write(base / f"train.{ext}", train, fmt)
            if evals is not None:
                write(base / f"{eval_split}.{ext}", evals, fmt)
        tr, ev = (train, evals) if evals is not None else train_eval(train)
        expected[name] = {"train": [fmt_fn(s) for s in tr], "eval": [fmt_fn(s) for s in ev]}
    for fmt in ("json", "jsonl"):  # local/jsonfile reads <dir>/train.json and eval.json only
        write(OUT / fmt / "local" / "jsonfile" / "train.json", jsonfile_rows(0), fmt)
        write(OUT / fmt / "local" / "jsonfile" / "eval.json", jsonfile_rows(1), fmt)
    expected["local/jsonfile"] = {"train": [format_jsonfile(s) for s in jsonfile_rows(0)],
                                  "eval": [format_jsonfile(s) for s in jsonfile_rows(1)]}
    repo = OUT / "hub" / "datasets--Dahoas--rm-static"
    snapshot = repo / "snapshots" / "0123456789abcdef"
    write(snapshot / "data" / "train-00000-of-00001-a1b2.parquet", DATASETS["Dahoas/rm-static"][0], "parquet")
    write(snapshot / "data" / "test-00000-of-00001-c3d4.parquet", DATASETS["Dahoas/rm-static"][1], "parquet")
    (snapshot / "README.md").write_text("hand-written rows in Dahoas/rm-static's schema\n")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123456789abcdef")
    (OUT / "expected.json").write_text(json.dumps(expected, ensure_ascii=False, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
