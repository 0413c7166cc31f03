#!/usr/bin/env python3
"""Records transformers' greedy continuations of the bundled model (models/kiln-kjv-31m).

The bundled model ships MLX 4-bit weights written by `kiln quantize`. This script dequantizes them
exactly (make_quant_fixtures.load_dequantized), loads them into transformers' Qwen 3.5 model (f32,
eager attention), and for each candidate prompt runs greedy generation of NEW_TOKENS tokens,
noting the smallest gap between the two best logits along the way. The prompts whose paths are
furthest from a tie are kept, so that a correct engine in bf16 also follows them token for token.

Usage: bundled_model_greedy.py MODEL_DIR OUT.json [--keep N]
"""

import argparse
import json
import os
import sys

import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_quant_fixtures as mq  # noqa: E402

NEW_TOKENS = 64

# (kind, text): "raw" prompts are fed as they are; "chat" prompts as one user message through the
# model's chat template (ChatML, generation prompt added).
CANDIDATES = [
    ("raw", "In the beginning"),
    ("raw", "And the LORD said unto Moses,"),
    ("raw", "And it came to pass, when the king"),
    ("raw", "The heart of a wise man"),
    ("raw", "Blessed are the"),
    ("raw", "Now these are the names of the children of Israel"),
    ("raw", "And Jesus answered and said unto them,"),
    ("raw", "O give thanks unto the LORD; for he is good:"),
    ("chat", "Tell me about the land of Egypt."),
    ("chat", "What did the king say?"),
    ("chat", "And God said, Let there be light: and there was light."),
    ("chat", "Who was Moses?"),
]


def chat_text(user):
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    kw = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config", "model_type",
                                                       "architectures", "transformers_version", "dtype")}
    cfg = AutoConfig.for_model(config["model_type"], **kw)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    ours, _, n_quantized = mq.load_dequantized(model_dir)
    # kiln quantize writes mlx-lm's layout: conv weights [C, K, 1] and the norms stored as 1 + w
    mlx_norms = any(k.endswith("conv1d.weight") and v.shape[-1] == 1 for k, v in ours.items())
    used = set()
    with torch.no_grad():
        for full, p in model.named_parameters():
            v = mq.hf_tensor(mq.canonical(full), p.shape, ours, "qwen", mlx_norms, used)
            assert tuple(v.shape) == tuple(p.shape), (full, tuple(v.shape), tuple(p.shape))
            p.copy_(v.to(p.dtype))
    unused = sorted(set(ours) - used - {"lm_head.weight"})
    assert not unused, f"tensors not loaded into transformers: {unused[:8]}"
    return model, n_quantized


def greedy(model, ids):
    """Greedy continuation token by token (full forwards: no cache subtleties) and the smallest
    gap between the two best logits at each chosen token."""
    tokens, min_gap = list(ids), float("inf")
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([tokens])).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            min_gap = min(min_gap, (top2[0] - top2[1]).item())
            tokens.append(int(torch.argmax(logits)))
    return tokens[len(ids):], min_gap


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--keep", type=int, default=5)
    ap.add_argument("--valid-dir", help="the corpus folder (tools/train-demo/data): also report the "
                    "validation loss of the dequantized weights on its held-out chapters")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    model, n_quantized = load_model(args.model_dir)
    tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
    valid = None
    if args.valid_dir:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train-demo"))
        import train  # noqa: E402  the training script's own split and windows

        chapters = train.read_chapters(os.path.join(args.valid_dir, "valid.txt"))
        windows = train.valid_windows(train.build_tokens(tok, chapters, 0), 512)
        total, count = 0.0, 0
        for i in range(0, len(windows), 8):
            batch = windows[i:i + 8]
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            total += loss.item() * batch[:, 1:].numel()
            count += batch[:, 1:].numel()
        valid = {"loss": total / count, "tokens": count}
        print("validation (dequantized 4-bit weights, f32):", valid, flush=True)
    results = []
    for kind, text in CANDIDATES:
        prompt = text if kind == "raw" else chat_text(text)
        ids = tok.encode(prompt, add_special_tokens=False).ids
        out, gap = greedy(model, ids)
        # transformers' own generate must agree with the token-by-token loop
        gen = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        assert gen == out, (text, gen, out)
        results.append({"kind": kind, "text": text, "prompt_ids": ids, "tokens": out,
                        "output": tok.decode(out), "min_top2_gap": gap})
        print(f"{gap:8.4f}  {kind:4s} {text!r} -> {tok.decode(out)[:80]!r}", flush=True)
    # a continuation that ends (an end-of-text or end-of-turn token) before NEW_TOKENS is not kept
    stops = {tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")}
    for r in results:
        r["full_length"] = not stops.intersection(r["tokens"])
    results.sort(key=lambda r: (not r["full_length"], -r["min_top2_gap"]))
    kept = results[: args.keep]
    report = {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
              "quantized_modules": n_quantized, "new_tokens": NEW_TOKENS, "validation": valid, "prompts": kept,
              "candidates": [{"kind": r["kind"], "text": r["text"], "min_top2_gap": r["min_top2_gap"],
                              "full_length": r["full_length"]}
                             for r in results]}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print("kept:", [(r["text"], round(r["min_top2_gap"], 3)) for r in kept])


if __name__ == "__main__":
    main()
