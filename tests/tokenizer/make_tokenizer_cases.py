#!/usr/bin/env python3
"""Writes tokenizer parity cases computed with Hugging Face `tokenizers` / `transformers`.

    make_tokenizer_cases.py --gpt2 assets/gpt2-bpe --out DIR [--count 10000]

DIR/manifest.json lists case sets: {"name", "dir" (a tokenizer directory), "cases" (a JSON Lines
file)}. Each case line has "text" (or "bytes_hex" for invalid UTF-8 input, encoded by HF after
bytes.decode("utf-8", "replace")), "ids" (add_special_tokens=True), "ids_plain"
(add_special_tokens=False), "decoded" and "decoded_skip" (`tokenizers`' decode of "ids", without
and with skip_special_tokens); decode-only lines have "decode_ids" instead of a text.

Sets: gpt2 (vocab.json + merges.txt through transformers' GPT2Tokenizer; --count generated strings
plus hand-picked edge cases), opt (the same files with an OPT-style tokenizer_config.json, through
AutoTokenizer), gpt2_flags (a tokenizer.json with added tokens using lstrip/rstrip/single_word/
normalized), and three LLaMA-style byte-fallback BPE tokenizer.json files trained here with
BpeTrainer (Prepend+Replace normalizer; Metaspace prepend_scheme "first"; Metaspace split + NFKC).
Everything is seeded: the same arguments give the same files.
"""

import argparse
import json
import os
import random
import shutil

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ENDOFTEXT = "<|endoftext|>"

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Le cœur déçu mais l'âme plutôt naïve, Louÿs rêva de crapaüter en canoë au delà des îles.",
    "Falsches Üben von Xylophonmusik quält jeden größeren Zwerg.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Τάχιστη αλώπηξ βαφής ψημένη γη, δρασκελίζει υπέρ νωθρού κυνός.",
    "الحمد لله رب العالمين، الرحمن الرحيم.",
    "שָׁלוֹם עֲלֵיכֶם, מה שלומך היום?",
    "नमस्ते दुनिया, आप कैसे हैं? १२३४५",
    "สวัสดีครับ ยินดีต้อนรับสู่ประเทศไทย",
    "你好，世界！今天天气很好。",
    "안녕하세요 세계, 반갑습니다.",
    "こんにちは世界、カタカナとひらがな。",
    "I'm sure they'll say it's fine, but we'd rather you've checked what's DON'T and I'M.",
    "Prices: $1,234.56 (≈ €1.100) — 50% off!!! Call +1-800-555-0199 now…",
    "def main():\n\treturn {'a': [1, 2, 3]}  # comment\r\n",
]

LETTER_RANGES = [
    (0x61, 0x7A), (0x41, 0x5A), (0xC0, 0xFF), (0x100, 0x17F), (0x391, 0x3C9), (0x410, 0x44F),
    (0x621, 0x64A), (0x5D0, 0x5EA), (0x905, 0x939), (0xE01, 0xE2E), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
    (0x3041, 0x3096), (0x30A1, 0x30FA), (0x1E00, 0x1EFF),
]
MARKS = [0x300, 0x301, 0x308, 0x64B, 0x650, 0x5B8, 0x93E, 0x94D, 0x93F, 0xE31, 0xE48, 0x3099]
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹", "½¼¾", "ⅠⅡⅫↀ", "①②⑳", "𝟘𝟙𝟚"]
SPACES = [" ", "  ", "   ", "\n", "\n\n", "\t", "\t\t", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\u0085",
          "\u2028", "\u2029", "\u200b", "\u1680", "\u202f", "\u205f", "\u000b", "\u000c", " \n ", "\n \n",
          "\u00a0 ", " \u00a0", "\u3000\u3000", "        ", "\u180e", "\ufeff"]
PUNCT = list(".,!?;:'\"()[]{}<>-_/\\@#$%^&*+=~`|") + ["…", "—", "–", "“", "”", "«", "»", "¿", "¡", "€", "£",
                                                     "¥", "₹", "©", "®", "™", "§", "¶", "•", "→", "∑", "√", "∞"]
EMOJI = ["😀", "🎉", "👍", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "👩🏾‍💻", "🏳️‍🌈", "🇯🇵", "🇺🇸", "1️⃣", "❤️", "❤", "🧑‍🤝‍🧑",
         "🤷‍♀️", "😶‍🌫️", "🐈‍⬛", "✌🏻", "🫠", "🀄", "🃏"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "'Re",
                "'lL", "’s", "’t", "'", "''", "'x", "don't", "I'M", "they'll", "you've", "we'd", "it's", "O'Neil",
                "rock'n'roll", "'tis", "'sss", "''s"]
CONTROLS = [chr(c) for c in list(range(0, 9)) + list(range(14, 32)) + [0x7F] + list(range(0x80, 0xA0))] + \
           ["\u200e", "\u200f", "\u2066", "\u00ad", "\u034f"]
# Letters and digits that Unicode 15.1/16.0 added (see src/tokenizer/unicode.cpp).
NEWER = [0x1C89, 0xA7CB, 0xA7DC, 0x105C0, 0x10D40, 0x10D4A, 0x10EC2, 0x11380, 0x116D0, 0x11BC0, 0x13460,
         0x16100, 0x16D40, 0x18CFF, 0x1CCF0, 0x1E5D0, 0x1E5F1, 0x2EBF0, 0x31350, 0x323AF]
SPECIALS = [ENDOFTEXT, ENDOFTEXT + ENDOFTEXT, " " + ENDOFTEXT + " ", "<|endoftext|", "<|ENDOFTEXT|>", "<|endof",
            "<||endoftext|>>", "<s>", "</s>", "<pad>", "<unk>", "<mask>", "[user]", "hello", "HELLO"]


def random_code_point(rng):
    while True:
        cp = rng.randrange(0x20, 0x110000) if rng.random() < 0.5 else rng.randrange(0x80, 0x3000)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def word(rng):
    lo, hi = rng.choice(LETTER_RANGES)
    n = rng.choice([1, 2, 3, 4, 5, 6, 8, 12])
    out = "".join(chr(rng.randint(lo, hi)) for _ in range(n))
    if rng.random() < 0.15:
        out += chr(rng.choice(MARKS))
    return out


def fragment(rng):
    kind = rng.random()
    if kind < 0.30:
        return word(rng)
    if kind < 0.38:
        return "".join(rng.choice(rng.choice(DIGITS)) for _ in range(rng.randint(1, 7)))
    if kind < 0.48:
        return rng.choice(SPACES)
    if kind < 0.56:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 3)))
    if kind < 0.62:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 3)))
    if kind < 0.70:
        return rng.choice(CONTRACTIONS)
    if kind < 0.74:
        return rng.choice(CONTROLS)
    if kind < 0.78:
        return chr(rng.choice(NEWER))
    if kind < 0.84:
        return random_code_point(rng)
    if kind < 0.88:
        return rng.choice(SPECIALS)
    if kind < 0.90:
        n = rng.randint(101, 400)
        return rng.choice(["a" * n, word(rng) * (n // 4 + 1), "9" * n, " " * n, "😀" * (n // 4), "-" * n,
                           "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(n))])
    return rng.choice(SENTENCES)


def generated_strings(rng, count):
    out = []
    for _ in range(count):
        n = rng.choice([0, 1, 1, 2, 3, 4, 6, 10, 16])
        glue = rng.choice(["", " ", " ", "", "\n"])
        out.append(glue.join(fragment(rng) for _ in range(n)))
    return out


def edge_strings():
    out = ["", " ", "  ", "\n", "a", "A", "é", "'", "'s", "'S", "a's", "A'S", "you're", "YOU'RE", "  hello",
           "hello  ", "hello   world", "hello\n\nworld", "\t\tx", " \u00a0x", "x\u00a0\u00a0y", "\u3000x",
           "1 2  3   4", "abc123def", " 123", "...", " ...", "a\u200bb", "\u2028x", "x\u0085y"]
    out += SENTENCES + SPECIALS + EMOJI + CONTRACTIONS + CONTROLS + [chr(c) for c in NEWER] + DIGITS
    out += ["a" * 150, "ab" * 200, "é" * 120, " " * 130, "\n" * 101, ENDOFTEXT * 3, "x" + ENDOFTEXT,
            ENDOFTEXT + "x", "a " + ENDOFTEXT + " b", "\n" + ENDOFTEXT + "\n"]
    return out


def invalid_byte_strings(rng, count):
    pieces = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xc2", b"\xe0\x80\x80", b"\xe0\xa0", b"\xed\xa0\x80",
              b"\xf0\x90\x80", b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\xfe\xff", b"\xe2\x82", b"\xf0\x9f\x98"]
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append(rng.choice(pieces) if rng.random() < 0.4 else fragment(rng).encode("utf-8"))
        out.append(b"".join(parts))
    return out


def case_lines(encode, decode, texts):
    """encode(texts, add_special) -> list of id lists; decode(ids, skip) -> str."""
    with_special = encode(texts, True)
    plain = encode(texts, False)
    for text, ids, ids_plain in zip(texts, with_special, plain):
        yield {"text": text, "ids": ids, "ids_plain": ids_plain, "decoded": decode(ids, False),
               "decoded_skip": decode(ids, True)}


def write_set(out_dir, manifest, name, tok_dir, lines):
    path = os.path.join(out_dir, name + ".jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    manifest.append({"name": name, "dir": os.path.abspath(tok_dir), "cases": os.path.abspath(path)})


def fast_oracle(tok):
    def encode(texts, special):
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=special)]

    def decode(ids, skip):
        return tok.decode(ids, skip_special_tokens=skip)

    return encode, decode


def transformers_oracle(hf):
    def encode(texts, special):
        return hf(texts, add_special_tokens=special)["input_ids"]

    def decode(ids, skip):
        return hf.backend_tokenizer.decode(ids, skip_special_tokens=skip)

    return encode, decode


def decode_lines(decode, rng, vocab_size, count):
    for _ in range(count):
        ids = [rng.randrange(vocab_size) for _ in range(rng.randint(0, 12))]
        yield {"decode_ids": ids, "decoded": decode(ids, False), "decoded_skip": decode(ids, True)}


def gpt2_sets(args, rng, manifest):
    from transformers import AutoTokenizer, GPT2Tokenizer

    hf = GPT2Tokenizer.from_pretrained(args.gpt2)
    encode, decode = transformers_oracle(hf)
    texts = edge_strings() + generated_strings(rng, args.count)
    write_set(args.out, manifest, "gpt2", args.gpt2, case_lines(encode, decode, texts))

    bad = invalid_byte_strings(rng, 400)
    fixed = [b.decode("utf-8", "replace") for b in bad]
    lines = []
    for raw, line in zip(bad, case_lines(encode, decode, fixed)):
        del line["text"]
        line["bytes_hex"] = raw.hex()
        lines.append(line)
    lines += list(decode_lines(decode, rng, len(hf), 400))
    # byte-level tokens that split multi-byte characters decode to U+FFFD
    lines += list(decode_lines(decode, random.Random(7), 256, 200))
    write_set(args.out, manifest, "gpt2_bytes", args.gpt2, lines)

    opt_dir = os.path.join(args.out, "opt")
    os.makedirs(opt_dir)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(args.gpt2, name), opt_dir)
    # facebook/opt-*'s files: GPT2Tokenizer with "</s>" as bos/eos/unk, prepended as bos.
    token = lambda s: {"content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
                       "__type": "AddedToken"}
    config = {"errors": "replace", "unk_token": token("</s>"), "bos_token": token("</s>"), "eos_token": token("</s>"),
              "pad_token": token("<pad>"), "add_prefix_space": False, "add_bos_token": True,
              "tokenizer_class": "GPT2Tokenizer", "model_max_length": 1000000000000000019884624838656}
    with open(os.path.join(opt_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(opt_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": token("</s>"), "eos_token": token("</s>"), "unk_token": token("</s>"),
                   "pad_token": token("<pad>")}, f)
    hf_opt = AutoTokenizer.from_pretrained(opt_dir)
    encode, decode = transformers_oracle(hf_opt)
    texts = edge_strings() + generated_strings(rng, 1000) + ["</s>", "a</s>b", "<pad><pad>", " </s> "]
    lines = list(case_lines(encode, decode, texts))
    # The last line also carries the special-token ids and the size transformers reports.
    lines[-1].update(bos=hf_opt.bos_token_id, eos=hf_opt.eos_token_id, pad=hf_opt.pad_token_id,
                     unk=hf_opt.unk_token_id, vocab_size=len(hf_opt))
    write_set(args.out, manifest, "opt", opt_dir, lines)

    flags_dir = os.path.join(args.out, "gpt2_flags")
    os.makedirs(flags_dir)
    tok = Tokenizer(models.BPE.from_file(os.path.join(args.gpt2, "vocab.json"), os.path.join(args.gpt2, "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single=f"{ENDOFTEXT} $A {ENDOFTEXT}",
                                                       special_tokens=[(ENDOFTEXT, 50256)])
    tok.add_special_tokens([AddedToken(ENDOFTEXT, special=True, normalized=False),
                            AddedToken("<mask>", lstrip=True, special=True, normalized=False),
                            AddedToken("<pad>", rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("[user]", lstrip=True, rstrip=True, normalized=True),
                    AddedToken("hello", single_word=True, normalized=False),
                    AddedToken("wor", single_word=True, normalized=True),
                    AddedToken(" sp ace", normalized=False)])
    tok.save(os.path.join(flags_dir, "tokenizer.json"))
    encode, decode = fast_oracle(tok)
    flag_words = ["<mask>", "<pad>", "[user]", "hello", "wor", " sp ace", "world", "helloworld", "é", "_"]
    texts = []
    for _ in range(2000):
        parts = [rng.choice(flag_words) if rng.random() < 0.5 else fragment(rng) for _ in range(rng.randint(1, 8))]
        texts.append(rng.choice(["", " ", "  ", "\n", "\u3000"]).join(parts))
    lines = list(case_lines(encode, decode, texts)) + list(decode_lines(decode, rng, tok.get_vocab_size(), 200))
    write_set(args.out, manifest, "gpt2_flags", flags_dir, lines)


def train_llama_model(rng):
    """A small byte-fallback BPE in LLaMA's layout: <unk> <s> </s>, <0x00>..<0xFF>, then merges."""
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.normalizer = normalizers.Replace(" ", "\u2581")
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    corpus = SENTENCES[:3] + SENTENCES[12:] + [" ".join(word(random.Random(i)) for _ in range(8)) for i in range(50)]
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False, limit_alphabet=120)
    trainer_tok.train_from_iterator(corpus * 3, trainer=trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for token, _ in sorted(trained["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    return vocab, merges


def llama_tokenizer(vocab, merges, style):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if style == "legacy":  # LlamaTokenizerFast as converted from sentencepiece (transformers 4.x)
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    elif style == "metaspace":  # transformers 5 LlamaTokenizer
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="\u2581", prepend_scheme="first"),
                                         decoders.ByteFallback(), decoders.Fuse()])
    else:  # split Metaspace with a Unicode normalizer
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="\u2581"),
                                         decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    if style != "metaspace":
        tok.add_tokens([AddedToken("[user]", lstrip=True, normalized=True), AddedToken("<tool>", normalized=False)])
    return tok


def llama_sets(args, rng, manifest):
    vocab, merges = train_llama_model(rng)
    for style in ("legacy", "metaspace", "split"):
        tok_dir = os.path.join(args.out, "llama_" + style)
        os.makedirs(tok_dir)
        tok = llama_tokenizer(vocab, merges, style)
        tok.save(os.path.join(tok_dir, "tokenizer.json"))
        encode, decode = fast_oracle(Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json")))
        texts = edge_strings() + generated_strings(rng, 1200) + [
            "<s>hello", "a <s> b", "<s> <s>", " [user] x", "x<tool>y", "</s>", "\u4e2d\u6587", "\u2581", "\u2581x"]
        lines = list(case_lines(encode, decode, texts)) + list(decode_lines(decode, rng, tok.get_vocab_size(), 150))
        write_set(args.out, manifest, "llama_" + style, tok_dir, lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpt2", required=True, help="directory with GPT-2's vocab.json and merges.txt")
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument("--count", type=int, default=10000, help="generated GPT-2 strings")
    parser.add_argument("--seed", type=int, default=20240601)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    manifest = []
    gpt2_sets(args, rng, manifest)
    llama_sets(args, rng, manifest)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
