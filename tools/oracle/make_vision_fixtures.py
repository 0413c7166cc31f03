#!/usr/bin/env python3
"""Builds tiny random Gemma 4 models with their image front ends and records transformers' image
features and logits for prompts that hold images.

Runs where torch and transformers (5.17) are installed. Each fixture directory holds the model
(config.json, model.safetensors) and:
  ids.json             the prompt: text ids with each image's placeholders (boi, image x n, eoi)
  images.json          [{"pixels": "image0.npy", "grid": [rows, cols], "soft_tokens": n, "offset": o}]:
                       the image's patches as the processor leaves them (padding stripped), its patch
                       grid, and where its n soft tokens start in ids
  imageN.npy           float32 [patches, values per patch], values in [0, 1]
  features{N}.npy      float32 [n, text hidden]: get_image_features(...).pooler_output for the image
  logits.npy           float32 [len(ids), vocab] from one full forward with pixel_values,
                       image_position_ids and mm_token_type_ids (eager attention, f32)
  oracle.json          versions and sizes

The pixels are random (the image processor is not under test here); positions follow the
processor's (x, y) = (column, row) of each patch in row-major order. Variants:
  gemma4_vision_ple    e2b-like: per-layer inputs, KV sharing, clipped linears (finite bounds), causal
  gemma4_vision_bidir  26B-like: use_bidirectional_attention = "vision" (sliding layers, within the
                       window; an image longer than the window), k_eq_v, GQA in the tower, standardize
  gemma4_unified_vision  12B-like encoder-free embedder; bidirectional images on every layer

Usage: make_vision_fixtures.py OUT_DIR [--only NAME ...]
"""

import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import (  # noqa: E402
    VOCAB, exactly_representable, gemma_base, redraw_weights, run_all, write_report)

IMAGE_TOKEN, BOI, EOI, AUDIO_TOKEN, VIDEO_TOKEN, BOA, EOA = 300, 301, 302, 303, 304, 305, 306

# name -> (wrapper, text config kwargs, vision config kwargs, image grids in patches, sliding window)
FIXTURES = {
    "gemma4_vision_ple": (
        "gemma4",
        gemma_base(num_hidden_layers=8, hidden_size_per_layer_input=16, num_kv_shared_layers=3,
                   use_double_wide_mlp=True,
                   layer_types=["sliding_attention"] * 4 + ["full_attention"] + ["sliding_attention"] * 2
                   + ["full_attention"]),
        dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=3,
             position_embedding_size=24, use_clipped_linears=True, standardize=False,
             rope_parameters={"rope_type": "default", "rope_theta": 100.0}),
        [(6, 9), (9, 3)],
    ),
    "gemma4_vision_bidir": (
        "gemma4",
        gemma_base(attention_k_eq_v=True, num_global_key_value_heads=1, num_key_value_heads=2,
                   use_bidirectional_attention="vision", sliding_window=8),
        dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=12, patch_size=4, pooling_kernel_size=3,
             position_embedding_size=24, use_clipped_linears=False, standardize=True,
             rope_parameters={"rope_type": "default", "rope_theta": 100.0}),
        [(12, 9), (3, 6)],
    ),
    "gemma4_unified_vision": (
        "gemma4_unified",
        gemma_base(attention_k_eq_v=True, num_global_key_value_heads=1, num_key_value_heads=2,
                   sliding_window=8),
        dict(patch_size=2, pooling_kernel_size=2, mm_embed_dim=32, mm_posemb_size=16, output_proj_dims=32),
        [(3, 4), (2, 5)],  # model patches (each 2x2 of 2-pixel patches)
    ),
}
SEEDS = {name: 2000 + i for i, name in enumerate(FIXTURES)}
PROMPT_LEN = 96


def build_model(wrapper, text_kw, vision_kw):
    if wrapper == "gemma4":
        from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig, Gemma4VisionConfig
        text = Gemma4TextConfig(**text_kw)
        cfg = Gemma4Config(text_config=text, vision_config=Gemma4VisionConfig(**vision_kw), audio_config=None,
                           image_token_id=IMAGE_TOKEN, boi_token_id=BOI, eoi_token_id=EOI,
                           audio_token_id=AUDIO_TOKEN, video_token_id=VIDEO_TOKEN, boa_token_id=BOA,
                           eoa_token_index=EOA)
        cls = Gemma4ForConditionalGeneration
    else:
        from transformers import (Gemma4UnifiedConfig, Gemma4UnifiedForConditionalGeneration,
                                  Gemma4UnifiedTextConfig, Gemma4UnifiedVisionConfig)
        kw = {k: v for k, v in text_kw.items()
              if k not in ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "enable_moe_block")}
        text = Gemma4UnifiedTextConfig(**kw)
        cfg = Gemma4UnifiedConfig(text_config=text, vision_config=Gemma4UnifiedVisionConfig(**vision_kw),
                                  audio_config=None, image_token_id=IMAGE_TOKEN, boi_token_id=BOI,
                                  eoi_token_id=EOI, audio_token_id=AUDIO_TOKEN, video_token_id=VIDEO_TOKEN,
                                  boa_token_id=BOA, eoa_token_index=EOA)
        cls = Gemma4UnifiedForConditionalGeneration
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    if cfg.vision_config is not None:
        cfg.vision_config._attn_implementation = "eager"
    return cls(cfg).float().eval()


def redraw_vision(model, gen):
    """What redraw_weights leaves alone in the front ends: finite clip bounds that do clip, the
    standardisation buffers, LayerNorm and Dense biases."""
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            leaf = name.split(".")[-1]
            if leaf in ("input_min", "output_min"):
                p.fill_(-exactly_representable(torch.tensor(1.5 + torch.rand((), generator=gen).item()), "f32"))
            elif leaf in ("input_max", "output_max"):
                p.fill_(exactly_representable(torch.tensor(1.5 + torch.rand((), generator=gen).item()), "f32"))
            elif leaf == "std_bias":
                p.copy_(exactly_representable(torch.randn(p.shape, generator=gen) * 0.3, "f32"))
            elif leaf == "std_scale":
                p.copy_(exactly_representable(torch.rand(p.shape, generator=gen) + 0.5, "f32"))
            elif leaf == "bias" and ("embed_vision" in name):
                p.copy_(exactly_representable(torch.randn(p.shape, generator=gen) * 0.1, "f32"))


def image_inputs(wrapper, vision_kw, grids, gen):
    """pixel_values [images, max_patches, values] and image_position_ids [images, max_patches, 2],
    padded with zeros and (-1, -1) as the processors pad."""
    if wrapper == "gemma4":
        values = 3 * vision_kw["patch_size"] ** 2
        k2 = vision_kw["pooling_kernel_size"] ** 2
    else:
        side = vision_kw["patch_size"] * vision_kw["pooling_kernel_size"]
        values = 3 * side * side
        k2 = 1
    counts = [r * c for r, c in grids]
    longest = max(counts)
    max_patches = (longest + k2 - 1) // k2 * k2
    pixels = torch.zeros(len(grids), max_patches, values)
    positions = torch.full((len(grids), max_patches, 2), -1, dtype=torch.long)
    singles = []
    for i, (rows, cols) in enumerate(grids):
        n = rows * cols
        p = torch.rand(n, values, generator=gen)
        pixels[i, :n] = p
        ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        positions[i, :n, 0] = xs.reshape(-1)
        positions[i, :n, 1] = ys.reshape(-1)
        singles.append(p)
    soft = [n // k2 for n in counts]
    return pixels, positions, singles, soft


def build(name, out_root):
    wrapper, text_kw, vision_kw, grids = FIXTURES[name]
    torch.manual_seed(SEEDS[name])
    gen = torch.Generator().manual_seed(SEEDS[name])
    model = build_model(wrapper, text_kw, vision_kw)
    redraw_weights(model, "gemma", gen, "f32")
    redraw_vision(model, gen)

    pixels, positions, singles, soft = image_inputs(wrapper, vision_kw, grids, gen)
    ids_gen = torch.Generator().manual_seed(SEEDS[name] + 7)
    text = torch.randint(3, IMAGE_TOKEN, (PROMPT_LEN,), generator=ids_gen).tolist()
    # images after 10 and 50 text tokens
    ids, offsets, cut = [], [], 0
    for at, n in zip((10, 50), soft):
        ids += text[cut:at] + [BOI]
        offsets.append(len(ids))
        ids += [IMAGE_TOKEN] * n + [EOI]
        cut = at
    ids += text[cut:]
    mm = [1 if t == IMAGE_TOKEN else 0 for t in ids]

    with torch.no_grad():
        feats = model.model.get_image_features(pixels, positions, return_dict=True).pooler_output
        if isinstance(feats, torch.Tensor):
            feats = torch.split(feats, soft) if feats.dim() == 2 else [f[:n] for f, n in zip(feats, soft)]
        out = model(input_ids=torch.tensor([ids]), pixel_values=pixels, image_position_ids=positions,
                    mm_token_type_ids=torch.tensor([mm]), use_cache=False)
        logits = out.logits[0].float()
        # the same prompt without mm_token_type_ids: causal images (how much the mask matters)
        causal = model(input_ids=torch.tensor([ids]), pixel_values=pixels, image_position_ids=positions,
                       use_cache=False).logits[0].float()

    out_dir = os.path.join(out_root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    model.config.save_pretrained(out_dir)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.get_text_config().tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    np.save(os.path.join(out_dir, "logits.npy"), logits.numpy().astype(np.float32))
    with open(os.path.join(out_dir, "ids.json"), "w") as f:
        json.dump(ids, f)
    images = []
    for i, (p, (rows, cols), n, at) in enumerate(zip(singles, grids, soft, offsets)):
        np.save(os.path.join(out_dir, f"image{i}.npy"), p.numpy().astype(np.float32))
        np.save(os.path.join(out_dir, f"features{i}.npy"), feats[i].float().numpy().astype(np.float32))
        images.append({"pixels": f"image{i}.npy", "features": f"features{i}.npy", "grid": [rows, cols],
                       "soft_tokens": n, "offset": at})
    with open(os.path.join(out_dir, "images.json"), "w") as f:
        json.dump(images, f, indent=2)
    report = {
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "max_abs_logit": logits.abs().max().item(),
        "bidirectional_vs_causal_max_abs": (logits - causal).abs().max().item(),
        "model_type": wrapper,
        "dtype": "f32",
    }
    write_report(out_dir, name, report)
    print(f"--- {name} tensors: " + ", ".join(sorted(k for k in state if "language_model" not in k)[:60]))


def main():
    run_all(FIXTURES, build)

if __name__ == "__main__":
    main()
