#!/usr/bin/env python3
"""Classifies every code point the way `tokenizers`' GPT-2 pre-tokenizer sees it.

    classify_hf.py OUT.bin

Writes one byte per code point U+0000..U+10FFFF: 1 letter (\\p{L}), 2 number (\\p{N}), 3 other,
0 whitespace (\\s) or surrogate. prefix + c is one pre-token exactly when c has the class of the
prefix ("a" letter, "1" number, "!" other); the word ids of a byte-level BPE without merges show it.
"""

import sys

from tokenizers import Tokenizer, models, pre_tokenizers

CLASSES = (("a", 1), ("1", 2), ("!", 3))


def main():
    out_path = sys.argv[1]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    code_points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    table = bytearray(0x110000)
    for prefix, cls in CLASSES:
        encodings = tok.encode_batch([prefix + chr(c) for c in code_points], add_special_tokens=False)
        for c, encoding in zip(code_points, encodings):
            words = encoding.word_ids
            if words[0] == words[-1]:
                table[c] = cls
    with open(out_path, "wb") as f:
        f.write(bytes(table))


if __name__ == "__main__":
    main()
