#!/usr/bin/env python3
"""Builds tiny release-form checkpoints with vision towers (transformers' own multimodal classes,
as make_release_fixtures.py does) and records the reference logits of prompts holding real images.

For each fixture below: the wrapper model with a tiny vision tower (f32 weights drawn as
make_fixtures.py draws them), its image processor with settings that fit the tiny tower (written
as preprocessor_config.json, which kiln reads), two or three of the test images of
tests/fixtures/images/ loaded as AutoProcessor loads them (transformers.image_utils.load_image),
and a prompt of text ids with each image's placeholder run expanded as the family's processor
expands it (Gemma 4: boi, image_token x soft tokens, eoi; Qwen 3.5: vision_start, image_pad x soft
tokens, vision_end). The image token ids are moved into the tiny vocabulary through the wrapper
config's own fields (image_token_id, boi_token_id, ...).

Writes, per fixture (tests/fixtures/<name>/): the model directory, images/ (the image files, in
prompt order), images.json (file, soft tokens, grid per image), image_ids.json (the expanded ids),
image_logits.npy (float32 [ids, vocab]: the wrapper's forward with pixel values, f32, eager
attention), pixel_sums.json (each image's pixel-value row sums, to check kiln's processor on the
same settings), oracle.json. No logits.npy: the text-only fixture tests leave these alone.

Usage: make_prompt_image_fixtures.py OUT_DIR [--only NAME ...]
"""

import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText
from transformers.image_utils import load_image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402
import make_release_fixtures as rf  # noqa: E402

IMAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "images")

# Tiny vision towers; position tables cut to what the processors' settings reach.
GEMMA_VISION = dict(rf.GEMMA4_VISION, position_embedding_size=64)
QWEN_VISION = dict(rf.QWEN3_5_VISION, num_position_embeddings=64)

# Special ids inside the tiny vocabulary (320): the text ids are drawn below 300.
GEMMA_IDS = dict(image_token_id=310, boi_token_id=311, eoi_token_id=312, audio_token_id=313, boa_token_id=314,
                 eoa_token_index=315, video_token_id=316)
QWEN_IDS = dict(image_token_id=310, vision_start_token_id=311, vision_end_token_id=312, video_token_id=313)

FIXTURES = {
    # e2b-like text model (per-layer inputs) with the vision tower; causal attention over images.
    "vis_gemma4": dict(base="rel_gemma4_e2b", towers=dict(vision_config=GEMMA_VISION), ids=GEMMA_IDS,
                       processor=("gemma4", dict(max_soft_tokens=70, patch_size=16, pooling_kernel_size=3)),
                       images=["video_420.jpg", "exif6.jpg"]),
    # the same with image tokens attending to each other (use_bidirectional_attention "vision").
    "vis_gemma4_bidir": dict(base="rel_gemma4_moe", towers=dict(vision_config=GEMMA_VISION), ids=GEMMA_IDS,
                             text=dict(use_bidirectional_attention="vision"),
                             processor=("gemma4", dict(max_soft_tokens=70, patch_size=16, pooling_kernel_size=3)),
                             images=["palette4.png", "alpha.webp"]),
    # the 12B's form: the encoder-free embedder, bidirectional image spans as released.
    "vis_gemma4_unified": dict(base="rel_gemma4_unified", towers=dict(vision_config=rf.GEMMA4_UNIFIED_VISION),
                               ids=GEMMA_IDS, text=dict(use_bidirectional_attention="vision"),
                               processor=("gemma4_unified", dict(patch_size=4, pooling_kernel_size=2,
                                                                 max_soft_tokens=70)),
                               images=["video_420.jpg", "triangle.gif"]),
    # dense Qwen 3.5 with its vision transformer and multimodal RoPE.
    "vis_qwen3_5": dict(base="rel_qwen3_5_tie", towers=dict(vision_config=QWEN_VISION), ids=QWEN_IDS,
                        processor=("qwen3_5", dict(patch_size=4, merge_size=2, temporal_patch_size=2,
                                                   image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                                   size={"shortest_edge": 16 * 16, "longest_edge": 64 * 64})),
                        images=["video_420.jpg", "exif6.jpg", "rgba.png"]),
    # the MoE wrapper.
    "vis_qwen3_5_moe": dict(base="rel_qwen3_5_moe", towers=dict(vision_config=QWEN_VISION), ids=QWEN_IDS,
                            processor=("qwen3_5", dict(patch_size=4, merge_size=2, temporal_patch_size=2,
                                                       image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                                       size={"shortest_edge": 16 * 16, "longest_edge": 48 * 48})),
                            images=["gray.jpg", "lossy.webp"]),
}
SEEDS = {name: 3000 + i for i, name in enumerate(FIXTURES)}


def image_processor(kind, settings):
    if kind == "gemma4":
        from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor as cls
    elif kind == "gemma4_unified":
        from transformers.models.gemma4_unified.image_processing_gemma4_unified import (
            Gemma4UnifiedImageProcessor as cls)
    else:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor as cls
    return cls(**settings)


def build_spec(fixture):
    spec = dict(rf.RELEASE[fixture["base"]])
    spec["text"] = dict(spec["text"], **fixture.get("text", {}))
    spec["towers"] = dict(fixture["towers"])
    spec["top"] = dict(spec.get("top", {}), **fixture["ids"])
    spec["dtype"] = "f32"
    spec["storage"] = "hf"
    return spec


def build(name, out_root):
    fixture = FIXTURES[name]
    spec = build_spec(fixture)
    family = spec["family"]
    torch.manual_seed(SEEDS[name])
    gen = torch.Generator().manual_seed(SEEDS[name])
    cfg = rf.build_config(spec)
    model = AutoModelForImageTextToText.from_config(cfg).float().eval()
    mf.redraw_weights(model, family, gen, "f32")

    kind, settings = fixture["processor"]
    proc = image_processor(kind, settings)
    files = fixture["images"]
    pil = [load_image(os.path.join(IMAGES, f)) for f in files]
    out = proc(images=pil, return_tensors="pt")
    ids_cfg = fixture["ids"]
    if family == "gemma":
        soft = [int(n) for n in out["num_soft_tokens_per_image"]]
        pos = out["image_position_ids"]
        grids = []
        for i in range(len(files)):
            real = pos[i][(pos[i] >= 0).all(dim=-1)]
            grids.append([int(real[:, 1].max()) + 1, int(real[:, 0].max()) + 1])
        opening, closing = [ids_cfg["boi_token_id"]], [ids_cfg["eoi_token_id"]]
    else:
        grids = [[int(v) for v in g] for g in out["image_grid_thw"]]
        soft = [g[0] * g[1] * g[2] // (proc.merge_size ** 2) for g in grids]
        opening, closing = [ids_cfg["vision_start_token_id"]], [ids_cfg["vision_end_token_id"]]

    # text, image, text, image (, image), text
    rng = torch.Generator().manual_seed(SEEDS[name] + 7)
    text = lambda n: torch.randint(0, 300, (n,), generator=rng).tolist()  # noqa: E731
    ids = text(9)
    for i, n in enumerate(soft):
        ids += opening + [ids_cfg["image_token_id"]] * n + closing + text(5 + 3 * i)
    mm = [1 if t == ids_cfg["image_token_id"] else 0 for t in ids]

    kwargs = dict(input_ids=torch.tensor([ids]), pixel_values=out["pixel_values"],
                  mm_token_type_ids=torch.tensor([mm]), use_cache=False)
    if family == "gemma":
        kwargs["image_position_ids"] = out["image_position_ids"]
    else:
        kwargs["image_grid_thw"] = out["image_grid_thw"]
    with torch.no_grad():
        logits = model(**kwargs).logits[0].float()
    top2 = torch.topk(logits, 2, dim=-1).values

    out_dir = os.path.join(out_root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    st = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(st)
    os.remove(st)
    mf.write_sharded(tensors, out_dir, 2)
    proc.save_pretrained(out_dir)  # preprocessor_config.json
    os.makedirs(os.path.join(out_dir, "images"))
    for f in files:
        shutil.copy(os.path.join(IMAGES, f), os.path.join(out_dir, "images", f))
    pixels = out["pixel_values"].float()
    sums = []
    for i in range(len(files)):
        p = pixels[i] if family == "gemma" else None
        if family == "gemma":
            real = (out["image_position_ids"][i] >= 0).all(dim=-1)
            sums.append(p[real].double().sum(dim=1).tolist())
        else:
            begin = sum(g[0] * g[1] * g[2] for g in grids[:i])
            n = grids[i][0] * grids[i][1] * grids[i][2]
            sums.append(pixels[begin:begin + n].double().sum(dim=1).tolist())
    with open(os.path.join(out_dir, "pixel_sums.json"), "w") as f:
        json.dump(sums, f)
    with open(os.path.join(out_dir, "images.json"), "w") as f:
        json.dump([{"file": "images/" + fl, "soft_tokens": n, "grid": g} for fl, n, g in zip(files, soft, grids)], f,
                  indent=1)
    with open(os.path.join(out_dir, "image_ids.json"), "w") as f:
        json.dump(ids, f)
    np.save(os.path.join(out_dir, "image_logits.npy"), logits.numpy().astype(np.float32))
    report = {
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "class": type(model).__name__,
        "processor": type(proc).__name__,
        "max_abs_logit": logits.abs().max().item(),
        "min_top2_gap": (top2[:, 0] - top2[:, 1]).min().item(),
        "ids": len(ids),
        "soft_tokens": soft,
        "grids": grids,
    }
    mf.write_report(out_dir, name, report)


def main():
    mf.run_all(FIXTURES, build)


if __name__ == "__main__":
    main()
