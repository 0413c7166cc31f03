#!/usr/bin/env python3
"""Writes transformers' named intermediate activations for a token sequence, under the names
`kiln logits MODEL --ids ... --dump DIR` uses, so that the two can be compared layer by layer
(compare_activations.py) and a mismatch found where it starts.

Names (one .npy each, float32, [tokens, ...]):
  embed_tokens          the scaled token embeddings (the first hidden state)
  layers.N.self_attn    the attention module's output (after o_proj, before any post-norm)
  layers.N.linear_attn  Qwen 3.5's Gated DeltaNet module output
  layers.N.mlp          the feed-forward module's output (Qwen MoE: routed plus shared expert)
  layers.N.experts      Gemma 4 MoE layers: the routed experts' output
  layers.N              the hidden state after layer N
  norm                  the final norm's output
  logits                the logits (after Gemma's softcapping)

Runs where torch and transformers are installed (f32, eager attention, on the CPU).
Usage: dump_activations.py MODEL_DIR --ids 1,2,3 --out DIR
"""

import argparse
import json
import os

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText


def load(model_dir):
    cfg = AutoConfig.from_pretrained(model_dir)
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "get_text_config"):
        cfg.get_text_config()._attn_implementation = "eager"
    wrapped = hasattr(cfg, "text_config") and cfg.text_config is not None and cfg.text_config is not cfg
    auto = AutoModelForImageTextToText if wrapped else AutoModelForCausalLM
    model = auto.from_pretrained(model_dir, config=cfg, torch_dtype=torch.float32).eval()
    return model


def language_model(model):
    for path in ("model.language_model", "model"):
        m = model
        for part in path.split("."):
            m = getattr(m, part, None)
            if m is None:
                break
        if m is not None and hasattr(m, "layers"):
            return m
    raise RuntimeError("no decoder layers found")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--ids", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ids = [int(x) for x in args.ids.split(",")]
    torch.set_grad_enabled(False)
    model = load(args.model_dir)
    lm = language_model(model)
    out = {}

    def keep(name):
        def hook(module, inputs, output):
            t = output[0] if isinstance(output, (tuple, list)) else output
            if torch.is_tensor(t):
                t = t.detach().float()
                if t.dim() >= 3 and t.shape[0] == 1:  # [1, tokens, ...]: the batch of one
                    t = t[0]
                out[name] = t.reshape(t.shape[0], -1).numpy()
        return hook

    lm.embed_tokens.register_forward_hook(keep("embed_tokens"))
    for i, layer in enumerate(lm.layers):
        layer.register_forward_hook(keep(f"layers.{i}"))
        for sub in ("self_attn", "linear_attn", "mlp", "experts"):
            if hasattr(layer, sub) and getattr(layer, sub) is not None:
                getattr(layer, sub).register_forward_hook(keep(f"layers.{i}.{sub}"))
    lm.norm.register_forward_hook(keep("norm"))
    logits = model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
    out["logits"] = logits
    os.makedirs(args.out, exist_ok=True)
    for name, a in out.items():
        np.save(os.path.join(args.out, name + ".npy"), a.astype(np.float32))
    print(json.dumps({"written": sorted(out)}))


if __name__ == "__main__":
    main()
