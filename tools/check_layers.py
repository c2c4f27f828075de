#!/usr/bin/env python3
"""Fails when an #include points up a layer (docs/architecture.md has the table).

Each source folder has a rank; a file may include project headers of its own rank or lower,
except the pairs in FORBIDDEN. Public headers under include/dschat/<folder>/ have the rank of
src/<folder>. tools/ (the CLI and its app layer, tools/cli/app) may include only public headers
and its own. kernels/ may include only kernels/ and CUDA headers (no torch, no ATen).
Usage: check_layers.py REPO_ROOT   (exit 1 and one line per violation)
"""
import pathlib
import re
import sys

RANK = {"core": 0, "kernels": 1, "ops": 2, "nn": 3, "io": 3, "models": 4, "tokenizer": 4, "data": 4,
        "monitor": 4, "dist": 5, "engine": 6, "inference": 6, "hybrid": 7, "serve": 7, "plan": 9,
        # rlhf (L8) is cut along its own ladder: maths, typed configs, step setup (engines, models,
        # experience), reward sources and diagnostics, the loops and step executors, the trainers.
        "rlhf/math": 8.0, "rlhf/config": 8.1, "rlhf/setup": 8.2, "rlhf/rewards": 8.3, "rlhf/loop": 8.4,
        "rlhf/trainers": 8.5}
# Folders whose files live one level further down, in sub-folders that have ranks of their own.
SPLIT = {"rlhf"}
# Folders side by side at one rank may not include each other, and some may not reach down into
# a lower folder: io (checkpoint formats) and nn (modules) know nothing of each other; tokenizer and
# data read files through io but know no modules; monitor (reporting) sees only core and io;
# the training engine and the inference engine are independent, joined by hybrid.
FORBIDDEN = {("io", "nn"), ("nn", "io"), ("io", "ops"),
             ("tokenizer", "nn"), ("tokenizer", "models"), ("tokenizer", "ops"),
             ("data", "nn"), ("data", "models"), ("data", "ops"),
             ("models", "tokenizer"), ("models", "data"), ("models", "monitor"),
             ("tokenizer", "monitor"), ("data", "monitor"),
             ("monitor", "ops"), ("monitor", "nn"), ("monitor", "models"), ("monitor", "tokenizer"),
             ("monitor", "data"), ("monitor", "kernels"),
             ("engine", "inference"), ("inference", "engine"),
             ("serve", "hybrid"), ("hybrid", "serve"), ("serve", "engine")}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)


def folder_of(include):
    parts = include.split("/")
    if parts[0] == "dschat" and len(parts) > 2:
        parts = parts[1:]
    elif not (parts[0] in RANK or parts[0] in SPLIT) or len(parts) < 2:
        return None
    if parts[0] in SPLIT:
        return f"{parts[0]}/{parts[1]}" if len(parts) > 2 else parts[0]
    return parts[0]


def own_folder(rel):
    """The ranked folder of a file: rel is its path's parts below the repository root."""
    top = rel[0]
    if top == "include":
        rel = rel[2:]
    elif top == "src":
        rel = rel[1:]
    else:
        return top
    if rel[0] in SPLIT:
        return f"{rel[0]}/{rel[1]}" if len(rel) > 2 else rel[0]
    return rel[0]


def check(root):
    errors = []
    files = [p for d in ("src", "include/dschat", "kernels", "tools")
             for p in (root / d).rglob("*") if p.suffix in (".h", ".hpp", ".cpp", ".cu", ".cuh")]
    for path in files:
        rel = path.relative_to(root).parts
        top = rel[0]
        own = own_folder(rel)
        for inc in INCLUDE.findall(path.read_text(errors="replace")):
            target = folder_of(inc)
            where = f"{path.relative_to(root)}: #include <{inc}>"
            if top == "kernels":
                if inc.startswith(("torch/", "ATen/", "c10/", "dschat/")) or (target and target != "kernels"):
                    errors.append(f"{where}: kernels/ may include only CUDA and kernels/ headers")
                continue
            if top == "tools":
                if target and not inc.startswith("dschat/"):
                    errors.append(f"{where}: tools/ may include only public headers (dschat/...)")
                continue
            if target is None:
                continue
            if own not in RANK or target not in RANK:
                errors.append(f"{where}: '{own if own not in RANK else target}' has no rank in tools/check_layers.py")
                continue
            if RANK[target] > RANK[own] or (own, target) in FORBIDDEN:
                errors.append(f"{where}: layer '{own}' (L{RANK[own]}) may not include '{target}' (L{RANK[target]})")
    folders = [p for p in (root / "src").iterdir() if p.is_dir()]
    folders = [s for p in folders for s in (sorted(q for q in p.iterdir() if q.is_dir()) if p.name in SPLIT else [p])]
    names = [str(p.relative_to(root / "src")) for p in folders]
    errors += [f"src/{name}: folder missing from the layer table in tools/check_layers.py" for name in names
               if name not in RANK]
    for split in SPLIT:
        loose = [p.name for p in (root / "src" / split).glob("*") if p.is_file()]
        loose += [p.name for p in (root / "include" / "dschat" / split).glob("*") if p.is_file()]
        errors += [f"{split}/{name}: a file directly in {split}/ (it belongs in one of its ranked sub-folders)"
                   for name in loose]
    arch = (root / "docs" / "architecture.md")
    text = arch.read_text() if arch.exists() else ""
    errors += [f"docs/architecture.md: does not mention src/{name}" for name in names if f"src/{name}" not in text]
    return errors


if __name__ == "__main__":
    problems = check(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    for line in problems:
        print(line)
    print(f"layering: {len(problems)} violation(s)")
    sys.exit(1 if problems else 0)
