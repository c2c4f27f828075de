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
        "monitor": 4, "dist": 5, "engine": 6, "inference": 6, "hybrid": 7, "serve": 7, "rlhf": 8, "plan": 9}
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
        return parts[1]
    if parts[0] in RANK and len(parts) > 1:
        return parts[0]
    return None


def check(root):
    errors = []
    files = [p for d in ("src", "include/dschat", "kernels", "tools")
             for p in (root / d).rglob("*") if p.suffix in (".h", ".hpp", ".cpp", ".cu", ".cuh")]
    for path in files:
        rel = path.relative_to(root).parts
        top = rel[0]
        own = rel[2] if top == "include" else (rel[1] if top == "src" else top)
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
            if target is None or own not in RANK:
                continue
            if RANK[target] > RANK[own] or (own, target) in FORBIDDEN:
                errors.append(f"{where}: layer '{own}' (L{RANK[own]}) may not include '{target}' (L{RANK[target]})")
    unknown = [p.name for p in (root / "src").iterdir() if p.is_dir() and p.name not in RANK]
    errors += [f"src/{name}: folder missing from the layer table in tools/check_layers.py" for name in unknown]
    arch = (root / "docs" / "architecture.md")
    text = arch.read_text() if arch.exists() else ""
    errors += [f"docs/architecture.md: does not mention src/{p.name}" for p in (root / "src").iterdir()
               if p.is_dir() and f"src/{p.name}" not in text]
    return errors


if __name__ == "__main__":
    problems = check(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    for line in problems:
        print(line)
    print(f"layering: {len(problems)} violation(s)")
    sys.exit(1 if problems else 0)
