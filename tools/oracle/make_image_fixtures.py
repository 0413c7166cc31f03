#!/usr/bin/env python3
"""Records transformers' image processing of the test images in tests/fixtures/images/.

Runs where torch, torchvision and transformers (5.17) are installed. For every image and every
processor setting below it loads the file as AutoProcessor does (transformers.image_utils.load_image:
PIL, EXIF transpose, convert("RGB")), runs the HF image processor class (torchvision backend) and
writes oracle/<setting>/<image>/:
  meta.json       the settings (the processor's JSON, as kiln reads it), the decoded image's size and
                  FNV-1a 64 hash of its RGB bytes, the resized size, the grid, the soft tokens, the
                  patch count and width, which rows were sampled, versions
  rows.npy        float32 [sampled rows, values per patch]: whole patch rows, HF's layout
  row_sums.npy    float32 [patches]: each patch row's sum (in float64), to catch order errors
HF's padding (Gemma 4 pads to max_soft_tokens x k^2 patches) is dropped: only real patches count.

It also runs each family's HF *processor* (Gemma4Processor, Qwen3VLProcessor) on a sample prompt
with two images, with a tiny word-level tokenizer holding the family's special tokens, and writes
oracle/expansion_<family>.json: the prompt, the images, the tokenizer's vocabulary and specials,
and the input_ids the processor returns.

Fixtures stay small (sampled rows, not whole arrays); the whole set is about 1 MB.

Usage: make_image_fixtures.py [--images DIR] [--out DIR]   (defaults: the repository's folders)
On the device machine: python3 tools/oracle/make_image_fixtures.py --out "$OUT/oracle"
"""

import argparse
import json
import os
import shutil
import sys
import traceback

import numpy as np
import torch
import transformers
from transformers.image_utils import load_image

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = os.path.join(HERE, "..", "..", "tests", "fixtures", "images")

# Qwen 3.5's released preprocessor_config.json (as Qwen3-VL's): patch 16, mean/std 0.5,
# 256x256 .. 4096x4096 pixels.
QWEN_RELEASE = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
}
FEW = ["video_420.jpg", "exif6.jpg", "alpha.webp", "palette4.png"]

# name -> (family, class name, settings, images (None: all), sampled rows)
SETTINGS = {
    "gemma4": ("gemma4", "Gemma4ImageProcessor", {"image_processor_type": "Gemma4ImageProcessor"}, None, 4),
    "gemma4_70": ("gemma4", "Gemma4ImageProcessor",
                  {"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 70}, FEW, 4),
    "gemma4_unified": ("gemma4", "Gemma4UnifiedImageProcessor",
                       {"image_processor_type": "Gemma4UnifiedImageProcessor"}, FEW, 2),
    "qwen3_5": ("qwen3_5", "Qwen2VLImageProcessor", QWEN_RELEASE, None, 4),
    "qwen3_5_class": ("qwen3_5", "Qwen2VLImageProcessor", {"image_processor_type": "Qwen2VLImageProcessor"}, FEW, 4),
    "qwen3_5_small": ("qwen3_5", "Qwen2VLImageProcessor",
                      {**QWEN_RELEASE, "size": {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 24}}, None, 4),
}


def processor_class(name):
    if name == "Gemma4ImageProcessor":
        from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
        return Gemma4ImageProcessor
    if name == "Gemma4UnifiedImageProcessor":
        from transformers.models.gemma4_unified.image_processing_gemma4_unified import Gemma4UnifiedImageProcessor
        return Gemma4UnifiedImageProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    return Qwen2VLImageProcessor


def make_processor(class_name, settings):
    kwargs = {k: v for k, v in settings.items() if k != "image_processor_type"}
    return processor_class(class_name)(**kwargs)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def run_one(name, family, class_name, settings, image_name, sample, out_dir):
    path = os.path.join(args.images, image_name)
    image = load_image(path)
    raw = np.asarray(image, dtype=np.uint8)
    proc = make_processor(class_name, settings)
    out = proc(images=image, return_tensors="pt")
    pixels = out["pixel_values"]
    if family == "gemma4":
        pixels = pixels[0]
        pos = out["image_position_ids"][0]
        real = (pos[:, 0] >= 0)
        pixels, pos = pixels[real], pos[real]
        rows, cols = int(pos[:, 1].max()) + 1, int(pos[:, 0].max()) + 1
        assert rows * cols == pixels.shape[0], "Gemma positions are not a full grid"
        grid = [rows, cols]
        soft = int(out["num_soft_tokens_per_image"][0])
        side = proc.patch_size * (proc.pooling_kernel_size if class_name.startswith("Gemma4Unified") else 1)
        resized = [rows * side, cols * side]
    else:
        grid = [int(v) for v in out["image_grid_thw"][0]]
        soft = grid[0] * grid[1] * grid[2] // proc.merge_size ** 2
        resized = [grid[1] * proc.patch_size, grid[2] * proc.patch_size]
    values = pixels.to(torch.float32).numpy()
    n = values.shape[0]
    picks = sorted(set(int(round(v)) for v in np.linspace(0, n - 1, num=min(n, sample))))
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, "rows.npy"), values[picks].astype(np.float32))
    np.save(os.path.join(out_dir, "row_sums.npy"), values.astype(np.float64).sum(axis=1).astype(np.float32))
    meta = {
        "setting": name,
        "family": family,
        "class": class_name,
        "image": image_name,
        "settings": settings,
        "decoded": {"width": image.size[0], "height": image.size[1], "fnv1a64": fnv1a64(raw.tobytes()),
                    "channel_sums": [int(raw[..., c].sum()) for c in range(3)]},
        "resized": {"height": resized[0], "width": resized[1]},
        "grid": grid,
        "soft_tokens": soft,
        "patches": n,
        "values": int(values.shape[1]),
        "sampled_rows": picks,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{name}/{image_name}: {image.size[0]}x{image.size[1]} -> {resized[1]}x{resized[0]}, grid {grid}, "
          f"{soft} soft tokens")


def tiny_tokenizer(words, specials, named):
    """A word-level tokenizer: the specials split out first, the rest on whitespace."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0}
    for t in specials + words:
        vocab.setdefault(t, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", extra_special_tokens=named)
    fast.add_special_tokens({"additional_special_tokens": specials})
    return fast, vocab


def expansion(family, out_path):
    if family == "gemma4":
        from transformers.models.gemma4 import processing_gemma4, feature_extraction_gemma4, video_processing_gemma4
        named = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                 "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}
        specials = list(named.values()) + ["<|video|>"]
        text = "describe <|image|> and <|image|> briefly"
        images, setting = ["video_420.jpg", "exif6.jpg"], "gemma4"
        tok, vocab = tiny_tokenizer(["describe", "and", "briefly"], specials, named)
        fe = next(getattr(feature_extraction_gemma4, n) for n in dir(feature_extraction_gemma4)
                  if n.endswith("FeatureExtractor") and n.startswith("Gemma4"))
        vp = next(getattr(video_processing_gemma4, n) for n in dir(video_processing_gemma4)
                  if n.endswith("VideoProcessor") and n.startswith("Gemma4"))
        proc = processing_gemma4.Gemma4Processor(feature_extractor=fe(), image_processor=make_processor(
            "Gemma4ImageProcessor", SETTINGS[setting][2]), tokenizer=tok, video_processor=vp())
    else:
        from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
        named = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                 "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"}
        specials = list(named.values())
        text = "<|vision_start|><|image_pad|><|vision_end|> what is this and <|vision_start|><|image_pad|><|vision_end|> ?"
        images, setting = ["video_420.jpg", "exif6.jpg"], "qwen3_5_small"
        tok, vocab = tiny_tokenizer(["what", "is", "this", "and", "?"], specials, named)
        proc = Qwen3VLProcessor(image_processor=make_processor("Qwen2VLImageProcessor", SETTINGS[setting][2]),
                                tokenizer=tok, video_processor=Qwen3VLVideoProcessor())
    pil = [load_image(os.path.join(args.images, n)) for n in images]
    out = proc(text=[text], images=pil)
    ids = [int(i) for i in out["input_ids"][0]]
    record = {"family": family, "setting": setting, "text": text, "images": images, "vocab": tok.get_vocab(),
              "specials": specials, "unk": "<unk>", "input_ids": ids, "transformers": transformers.__version__}
    with open(out_path, "w") as f:
        json.dump(record, f, indent=1)
    print(f"expansion {family}: {len(ids)} ids")


def main():
    global args
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", default=IMAGES)
    parser.add_argument("--out", default=os.path.join(IMAGES, "oracle"))
    args = parser.parse_args()
    print("transformers", transformers.__version__, "torch", torch.__version__)
    names = sorted(n for n in os.listdir(args.images) if n.rsplit(".", 1)[-1] in ("jpg", "png", "webp", "gif"))
    if os.path.isdir(args.out):
        shutil.rmtree(args.out)
    failed = 0
    for name, (family, class_name, settings, only, sample) in SETTINGS.items():
        for image_name in names:
            if only is not None and image_name not in only:
                continue
            try:
                run_one(name, family, class_name, settings, image_name, sample,
                        os.path.join(args.out, name, image_name.replace(".", "_")))
            except Exception:
                failed += 1
                print(f"FAILED {name}/{image_name}")
                traceback.print_exc()
    for family in ("gemma4", "qwen3_5"):
        try:
            expansion(family, os.path.join(args.out, f"expansion_{family}.json"))
        except Exception:
            failed += 1
            print(f"FAILED expansion {family}")
            traceback.print_exc()
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
