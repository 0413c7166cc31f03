#!/usr/bin/env python3
"""Trains the demo model's byte-level BPE tokenizer on the training split of the corpus.

Uses only features kiln's tokenizer implements: a Split pre-tokenizer with Qwen 2's regex followed
by ByteLevel (no regex of its own), a BPE model without byte fallback, a ByteLevel decoder.
Special tokens come first, so their ids are fixed: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2.
The template is ChatML, as Qwen's: "<|im_start|>{role}\\n{content}<|im_end|>\\n" per message and
"<|im_start|>assistant\\n" as the generation prompt. Generation stops on <|im_end|>.

The trainer is run twice and the two results are compared (determinism check, reported).

Usage: train_tokenizer.py --data-dir tools/train-demo/data --out-dir DIR [--vocab-size 8192]
"""

import argparse
import hashlib
import json
import os
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen 2 / Qwen 3.5 pre-tokenizer split (letters, single digits, punctuation runs, newlines, spaces)
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def training_texts(path):
    """Chapters of the training split (blank-line separated), each one text."""
    with open(path, encoding="utf-8") as f:
        return [c.strip("\n") + "\n" for c in f.read().split("\n\n") if c.strip()]


def train(texts, vocab_size):
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def tokenizer_config(tok):
    added = {}
    for name in SPECIAL_TOKENS:
        added[str(tok.token_to_id(name))] = {
            "content": name, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--vocab-size", type=int, default=8192)
    args = ap.parse_args()

    texts = training_texts(os.path.join(args.data_dir, "train.txt"))
    dumps = []
    for _ in range(2):
        tok = train(texts, args.vocab_size)
        dumps.append(tok.to_str(pretty=True))
    deterministic = dumps[0] == dumps[1]
    if not deterministic:
        print("WARNING: tokenizer training is not deterministic: two runs differ; keeping the first")

    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            sys.exit(f"{name} has id {tok.token_to_id(name)}, expected {i}")
    sample = "In the beginning God created the heaven and the earth.\nAnd God said, Let there be light: 1611."
    enc = tok.encode(sample, add_special_tokens=False)
    if tok.decode(enc.ids, skip_special_tokens=False) != sample:
        sys.exit("round trip failed: " + repr(tok.decode(enc.ids)))
    chat = "<|im_start|>user\nBlessed are<|im_end|>\n<|im_start|>assistant\n"
    chat_ids = tok.encode(chat, add_special_tokens=False).ids
    if chat_ids[0] != 1 or chat_ids.count(1) != 2 or chat_ids.count(2) != 1:
        sys.exit(f"special tokens not matched in {chat!r}: {chat_ids}")

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(dumps[0])
    with open(os.path.join(args.out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(tok), f, indent=2, ensure_ascii=False)
        f.write("\n")

    n_tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    print(f"tokenizer: vocab {tok.get_vocab_size()}, train split {n_tokens} tokens "
          f"({n_bytes / n_tokens:.2f} bytes/token), sha256 {hashlib.sha256(dumps[0].encode()).hexdigest()[:16]}")
    print(f"sample: {enc.tokens}")
    with open(os.path.join(args.out_dir, "tokenizer_report.json"), "w") as f:
        json.dump({"vocab_size": tok.get_vocab_size(), "train_tokens": n_tokens,
                   "bytes_per_token": n_bytes / n_tokens, "deterministic_two_runs": deterministic,
                   "sha256": hashlib.sha256(dumps[0].encode()).hexdigest()}, f, indent=2)


if __name__ == "__main__":
    main()
