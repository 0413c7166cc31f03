#!/usr/bin/env python3
"""Builds tiny random Qwen 3.5 wrappers with a vision tower and records transformers' logits for a
prompt with two images (the fixtures tests/test_qwen_vision.cpp discovers by their images.json).

Runs where torch and transformers (5.17) are installed, in f32 on the CPU with eager attention.
For every fixture it writes the model directory (save_pretrained: config.json with text_config and
vision_config, model.safetensors under model.language_model. and model.visual.) plus:
  ids.json            the prompt, each image as its run of image_token_id placeholders
  images.json         [{"pixels": "pixel_values_K.npy", "grid_thw": [t, h, w]}, ...]
  pixel_values_K.npy  float32 [t·h·w, C·T·P·P]: image K's rows of pixel_values
  positions.npy       int32 [3, len(ids)]: Qwen3_5Model.get_rope_index's position ids
  image_embeds.npy    float32 [soft tokens, hidden]: get_image_features' pooler output, concatenated
  logits.npy          float32 [len(ids), vocab] from one full forward
  oracle.json         versions and self-checks (prefill + decode through the cache vs one forward)

Usage: make_qwen_vision_fixtures.py OUT_DIR [--only NAME ...]
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from make_fixtures import qwen_base, redraw_weights, run_all, write_report  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoConfig  # noqa: E402

IMAGE, VIDEO, START, END = 300, 301, 302, 303  # placeholder ids inside the tiny vocabulary

VISION = dict(depth=2, hidden_size=32, hidden_act="gelu_pytorch_tanh", intermediate_size=48, num_heads=2,
              in_channels=3, patch_size=4, temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
              num_position_embeddings=16)

# name -> (wrapper model_type, its transformers class, text config kwargs)
FIXTURES = {
    "qwen3_5_image": ("qwen3_5", "Qwen3_5ForConditionalGeneration", qwen_base()),
    "qwen3_5_moe_image": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration",
                          qwen_base(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=48, norm_topk_prob=True,
                                    tie_word_embeddings=False)),
}
GRIDS = [[1, 4, 6], [1, 6, 4]]  # patch grids: 2×3 and 3×2 soft tokens


def prompt(gen):
    def text(n):
        return torch.randint(0, 296, (n,), generator=gen).tolist()
    ids = text(40)
    for k, (t, h, w) in enumerate(GRIDS):
        ids += [START] + [IMAGE] * (t * h * w // 4) + [END] + text(25 if k == 0 else 30)
    return ids


def build(name, out_root):
    model_type, model_class, text = FIXTURES[name]
    gen = torch.Generator().manual_seed(7000 + sorted(FIXTURES).index(name))
    text = dict(text, model_type=model_type + "_text")
    cfg = AutoConfig.for_model(model_type, text_config=text, vision_config=VISION, image_token_id=IMAGE,
                               video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
                               tie_word_embeddings=text["tie_word_embeddings"])
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    model = getattr(transformers, model_class)(cfg).eval().float()
    redraw_weights(model, "qwen", gen, "f32")
    with torch.no_grad():  # the tower: LayerNorms around 1, biases and positions that matter
        for n, p in model.named_parameters():
            if ".visual." not in "." + n:
                continue
            if "norm" in n and n.endswith(".weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif n.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "pos_embed" in n:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif p.ndim >= 2:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen) / (p[0].numel() ** 0.5) * 4)

    ids = prompt(gen)
    values = VISION["in_channels"] * VISION["temporal_patch_size"] * VISION["patch_size"] ** 2
    pixels = [torch.randn(t * h * w, values, generator=gen) for t, h, w in GRIDS]
    grid = torch.tensor(GRIDS)
    input_ids = torch.tensor([ids])
    mm = (input_ids == IMAGE).int()
    with torch.no_grad():
        out = model(input_ids=input_ids, pixel_values=torch.cat(pixels), image_grid_thw=grid,
                    mm_token_type_ids=mm, use_cache=False)
        logits = out.logits[0].float()
        positions, deltas = model.model.get_rope_index(input_ids, mm_token_type_ids=mm, image_grid_thw=grid)
        feats = model.model.get_image_features(torch.cat(pixels), grid, return_dict=True).pooler_output
        embeds = torch.cat(list(feats)).float()
        # self-check: prefill up to after the second image, then one token at a time through the cache
        split = len(ids) - 12
        first = model(input_ids=input_ids[:, :split], pixel_values=torch.cat(pixels), image_grid_thw=grid,
                      mm_token_type_ids=mm[:, :split], use_cache=True)
        parts, past = [first.logits[0]], first.past_key_values
        for t in range(split, len(ids)):
            step = model(input_ids=input_ids[:, t:t + 1], past_key_values=past, use_cache=True)
            past = step.past_key_values
            parts.append(step.logits[0])
        incremental = torch.cat(parts).float()

    out_dir = os.path.join(out_root, name)
    model.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "ids.json"), "w") as f:
        json.dump(ids, f)
    images = []
    for k, (p, g) in enumerate(zip(pixels, GRIDS)):
        np.save(os.path.join(out_dir, f"pixel_values_{k}.npy"), p.numpy().astype(np.float32))
        images.append({"pixels": f"pixel_values_{k}.npy", "grid_thw": g})
    with open(os.path.join(out_dir, "images.json"), "w") as f:
        json.dump(images, f, indent=1)
    np.save(os.path.join(out_dir, "positions.npy"), positions[:, 0].numpy().astype(np.int32))
    np.save(os.path.join(out_dir, "image_embeds.npy"), embeds.numpy().astype(np.float32))
    np.save(os.path.join(out_dir, "logits.npy"), logits.numpy().astype(np.float32))
    report = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model_type": model_type,
        "max_abs_logit": logits.abs().max().item(),
        "rope_delta": int(deltas.flatten()[0]),
        "incremental_vs_full_max_abs": (incremental - logits).abs().max().item(),
        "dtype": "f32",
    }
    write_report(out_dir, name, report)


def main():
    run_all(FIXTURES, build)


if __name__ == "__main__":
    main()
