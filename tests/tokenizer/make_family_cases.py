#!/usr/bin/env python3
"""Writes parity cases for the regex-split tokenizer families, computed with `tokenizers`.

    make_family_cases.py --gpt2 assets/gpt2-bpe --out DIR [--count 1500]

DIR/manifest.json lists case sets in the format of make_tokenizer_cases.py (read it for the line
format). Each set is a tokenizer.json built here around GPT-2's vocabulary and merges, with the
normalizer, pre-tokenizer, post-processor, decoder and added-token layout of a real family:

  qwen2   Qwen2/2.5/3: NFC, Split(Qwen2 regex, Isolated) + ByteLevel(use_regex=false)
  llama3  LLaMA-3: Split(\\p{N}{1,3} regex) + ByteLevel(use_regex=false), ignore_merges,
          ByteLevel + TemplateProcessing(<|begin_of_text|> $A)
  bloom   BLOOM: Split(" ?[^(\\s|[.,!?...])]+") + ByteLevel(use_regex=false)
  neox    GPT-NeoX/Pythia: NFC + ByteLevel (GPT-2 regex), added tokens for runs of spaces
  falcon  Falcon: Punctuation(Contiguous) + ByteLevel + Digits + Split("[0-9][0-9][0-9]")
  mixed   the other components: NFKC, Lowercase, a regex Replace, Digits, and Split variants
          (a String pattern with MergedWithNext, an inverted Contiguous regex)

It also writes DIR/split_cases.jsonl: {"pre_tokenizer" (the JSON `tokenizers` saves), "text",
"pieces"} for every Split behavior, with and without invert, and for Digits, Punctuation,
Whitespace and WhitespaceSplit; {"normalizer", "text", "normalized"} lines for Lowercase, NFC/NFD/NFKC/NFKD and regex
Replace; DIR/lowercase.tsv, the Lowercase of every code point that it changes ("hex<TAB>hex
hex..."); DIR/pre_tokenizer_classes.bin, how Whitespace and Punctuation treat every code point
(see pre_tokenizer_classes); and DIR/normalized.tsv, each code point NFC/NFD/NFKC/NFKD change.
"""

import argparse
import json
import os
import random

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from make_tokenizer_cases import (ENDOFTEXT, case_lines, decode_lines, edge_strings, fast_oracle, fragment,
                                  generated_strings, write_set)

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BLOOM = " ?[^(\\s|[.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c])]+"

# Strings aimed at the regexes: case-insensitive contractions (and U+017F/U+212A, which fold to
# s/k), digit runs around the {1,3} boundary, newline runs, BLOOM's punctuation, the
# non-letter-before-letters rule.
FAMILY_EDGES = ["'S", "'ſ", "I'M", "WE'LL", "'Ll", "x'D", "'\u212a", "1234567", "12 345 6789", "١٢٣٤", "a\r\n\r\nb",
                "x \n\n y", "  \n", "\n  x", "end.\n", "a...b", "…。，、।۔،", "Hello, world! ¿Qué?", "$abc", "@@xyz",
                "\u00a0abc", "\tabc", "a\u3000\u3000b", "((x|y))", "a  ", " a", "ﬁ ＡＢＣ ①", "ΣΑΣ İstanbul",
                "<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|>x", "   x    y", "def f():\n    return 1\n"]


def byte_level_bpe(args, ignore_merges=False):
    model = models.BPE.from_file(os.path.join(args.gpt2, "vocab.json"), os.path.join(args.gpt2, "merges.txt"))
    tok = Tokenizer(model)
    if ignore_merges:  # not settable through the Python constructor of a file-backed BPE
        spec = json.loads(tok.to_str())
        spec["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(spec))
    return tok


def family(args, name):
    if name == "qwen2":
        tok = byte_level_bpe(args)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in (ENDOFTEXT, "<|im_start|>", "<|im_end|>")])
    elif name == "llama3":
        tok = byte_level_bpe(args, ignore_merges=True)
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>")])
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
        tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    elif name == "bloom":
        tok = byte_level_bpe(args)
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(BLOOM), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False)
        tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True)
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>", "<pad>")])
    elif name == "neox":
        tok = byte_level_bpe(args)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True)
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=True)
        tok.add_special_tokens([AddedToken(ENDOFTEXT, special=True, normalized=False),
                                AddedToken("<|padding|>", special=True, normalized=False)])
        # gpt-neox-20b's runs of 24 down to 2 spaces: normalized, not special
        tok.add_tokens([AddedToken(" " * n, normalized=True) for n in range(24, 1, -1)])
    elif name == "falcon":
        tok = byte_level_bpe(args)
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Punctuation(behavior="contiguous"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            pre_tokenizers.Digits(individual_digits=False),
            pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated", invert=False)])
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in (">>TITLE<<", ">>ABSTRACT<<", ENDOFTEXT)])
    else:  # mixed
        tok = byte_level_bpe(args)
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(),
                                               normalizers.Replace(Regex(r"[\t ]{2,}"), " ")])
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split("-", behavior="merged_with_next"),
            pre_tokenizers.Split(Regex(r"\p{L}+|\p{N}+"), behavior="contiguous", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(ENDOFTEXT, special=True, normalized=False)])
    return tok


def family_sets(args, rng, manifest):
    for name in ("qwen2", "llama3", "bloom", "neox", "falcon", "mixed"):
        tok_dir = os.path.join(args.out, name)
        os.makedirs(tok_dir)
        family(args, name).save(os.path.join(tok_dir, "tokenizer.json"))
        tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        encode, decode = fast_oracle(tok)
        texts = edge_strings() + FAMILY_EDGES + generated_strings(rng, args.count)
        texts += [" ".join(fragment(rng) for _ in range(rng.randint(2, 12))) + rng.choice(["", "\n", "  ", "\r\n"])
                  for _ in range(200)]
        lines = list(case_lines(encode, decode, texts)) + list(decode_lines(decode, rng, tok.get_vocab_size(), 100))
        write_set(args.out, manifest, name, tok_dir, lines)


def saved(component, key):
    """The JSON `tokenizers` writes for a pre-tokenizer or normalizer."""
    tok = Tokenizer(models.BPE())
    setattr(tok, key, component)
    return json.loads(tok.to_str())[key]


SPLIT_PATTERNS = [Regex(r"\s+"), Regex(r"\s+(?!\S)"), Regex(r"\d*"), Regex(r"x*"), Regex(r"(?<=a)b"), Regex(r"\b"),
                  Regex(r"^a|a$"), Regex(r"\p{N}{1,3}"), Regex(QWEN2), Regex(BLOOM), "-", " ", "..", "a.b", "[x]"]
SPLIT_TEXTS = ["", "a", "-", "hello  world ", "the-final--countdown-", "-a-", "a1b22c333", "aab ba", "  \n\t x",
               "\u00e9\u00e9--\u00fc", "ab-ba-", "I'M you're", "1234567 x", "a.b..a+b", "[x]x[x]", "axxbxc",
               "\u4e2d\u6587 \u0661\u0662\u0663\u0664", "\U0001F600 \U0001F600", "aaa", " a b "]
# Marks and compatibility characters newer than `tokenizers`' Unicode 11.0 normalization tables,
# next to ones it knows: they must block reordering and composition as unassigned characters do.
NF_TEXTS = ["a\u0898\u0316", "a\u0316\u0898", "e\u0301\U00011938\u0301", "\U0001E030\u0301x\u32ff",
            "\u1100\U00010781\u1161", "A\u030a\U0001F16C\u00c5\ufb01", "\u0915\u093c\U00011F41\u0958"]
BEHAVIORS = ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]


def split_lines():
    for pattern in SPLIT_PATTERNS:
        for behavior in BEHAVIORS:
            for invert in (False, True):
                split = pre_tokenizers.Split(pattern, behavior=behavior, invert=invert)
                spec = saved(split, "pre_tokenizer")
                for text in SPLIT_TEXTS:
                    yield {"pre_tokenizer": spec, "text": text, "pieces": [p for p, _ in split.pre_tokenize_str(text)]}
    for other in (pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.Digits(individual_digits=False),
                  pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Whitespace(),
                  pre_tokenizers.Punctuation(), pre_tokenizers.Punctuation(behavior="contiguous"),
                  pre_tokenizers.Punctuation(behavior="merged_with_previous")):
        spec = saved(other, "pre_tokenizer")
        for text in SPLIT_TEXTS + ["\u00bd\u2167x\U0001D7D8\U00011DE0", "a_b\u0301c\u200d!? \u0897x..y",
                                   "\u00bfS\u00ed?! \u00ab$1+1=2\u00bb \u3001\u166d\U00011B00 end..."]:
            yield {"pre_tokenizer": spec, "text": text, "pieces": [p for p, _ in other.pre_tokenize_str(text)]}
    for normalizer in (normalizers.Lowercase(), normalizers.Replace(Regex(r"\s+"), "_"),
                       normalizers.Replace(Regex(r"x*"), "-"), normalizers.Replace(Regex(r"(?i)ab"), ""),
                       normalizers.NFC(), normalizers.NFD(), normalizers.NFKC(), normalizers.NFKD()):
        spec = saved(normalizer, "normalizer")
        for text in SPLIT_TEXTS + ["\u03a3\u0391\u03a3 \u0130 \u1e9e \u2c6f \u0041\u030a \U00010400 \u1c89"] + NF_TEXTS:
            yield {"normalizer": spec, "text": text, "normalized": normalizer.normalize_str(text)}


def lowercase_table(path):
    # Lowercase works code point by code point and no lowercase contains U+0000, so one call over
    # every code point joined by U+0000 gives each one's mapping.
    code_points = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    lowered = normalizers.Lowercase().normalize_str("\0".join(map(chr, code_points))).split("\0")
    assert len(lowered) == len(code_points)
    with open(path, "w") as f:
        for c, low in zip(code_points, lowered):
            if low != chr(c):
                f.write(f"{c:X}\t{' '.join(f'{ord(x):X}' for x in low)}\n")


def normalized_table(path):
    """Each code point that NFC, NFD, NFKC or NFKD changes: "FORM<TAB>hex<TAB>hex hex..."."""
    code_points = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    with open(path, "w") as f:
        for form in ("NFC", "NFD", "NFKC", "NFKD"):
            out = getattr(normalizers, form)().normalize_str("\0".join(map(chr, code_points))).split("\0")
            assert len(out) == len(code_points)
            for c, normalized in zip(code_points, out):
                if normalized != chr(c):
                    f.write(f"{form}\t{c:X}\t{' '.join(f'{ord(x):X}' for x in normalized)}\n")


def pre_tokenizer_classes(path):
    """Two bytes per code point c, how pre-tokenizers treat "a" + c. Whitespace: w (c joins the
    word), s (removed), o (a piece of its own); Punctuation: p (isolated) or n. Surrogates: 0."""
    whitespace, punctuation = pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()
    table = bytearray(2 * 0x110000)
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue
        text = "a" + chr(c)
        pieces = [p for p, _ in whitespace.pre_tokenize_str(text)]
        table[2 * c] = ord("w") if pieces == [text] else ord("s") if pieces == ["a"] else ord("o")
        table[2 * c + 1] = ord("p") if len(punctuation.pre_tokenize_str(text)) == 2 else ord("n")
    with open(path, "wb") as f:
        f.write(bytes(table))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpt2", required=True, help="directory with GPT-2's vocab.json and merges.txt")
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--count", type=int, default=1500, help="generated strings per family")
    parser.add_argument("--seed", type=int, default=20260601)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    manifest = []
    family_sets(args, random.Random(args.seed), manifest)
    with open(os.path.join(args.out, "split_cases.jsonl"), "w", encoding="utf-8") as f:
        for line in split_lines():
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    lowercase_table(os.path.join(args.out, "lowercase.tsv"))
    pre_tokenizer_classes(os.path.join(args.out, "pre_tokenizer_classes.bin"))
    normalized_table(os.path.join(args.out, "normalized.tsv"))
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
