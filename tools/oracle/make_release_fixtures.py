#!/usr/bin/env python3
"""Builds tiny release-form checkpoints of every wrapper with transformers' own multimodal classes
(tiny towers, real tensor names) and records reference logits, as make_fixtures.py does for the
text-only fixtures.

Each fixture is the directory `save_pretrained` writes for the wrapper class
(Gemma4ForConditionalGeneration, Gemma4UnifiedForConditionalGeneration,
Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration): the language model under
`model.language_model.`, the towers and embedders beside it; Qwen 3.5 checkpoints also get the
`mtp.*` tensors the released checkpoints carry (transformers itself does not build the MTP head).
The `mlx` storage rewrites the directory the way the MLX conversions ship it (mlx-vlm names, the
MTP head in an `mtp.safetensors` sidecar, the vision tower in `optiq_vision.safetensors`,
`kv_config.json` and `optiq_metadata.json`).

The MoE fixtures draw their routers with the spread of the other matrices instead of the decisive
routers of make_fixtures.py, so that near-ties in expert choice occur as in trained models.

Writes, per fixture: the model directory, ids.json, logits.npy (text-only forward of the wrapper,
f32, eager attention), greedy.json, oracle.json (see make_fixtures.py).

Usage: make_release_fixtures.py OUT_DIR [--only NAME ...]
"""

import argparse
import json
import os
import shutil
import sys
import traceback

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForImageTextToText

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

# Tiny towers. Sizes only: every other setting is the tower config class's default.
GEMMA4_VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, head_dim=16, global_head_dim=16)
GEMMA4_AUDIO = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                    output_proj_dims=32, conf_num_hidden_layers=1)
GEMMA4_UNIFIED_VISION = dict(patch_size=4, pooling_kernel_size=2, mm_embed_dim=32, mm_posemb_size=16)
GEMMA4_UNIFIED_AUDIO = dict(audio_embed_dim=16)
QWEN3_5_VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                      patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                      deepstack_visual_indexes=[])


def sized(cfg_class, sizes):
    """The class's defaults with the sizes that it has set; unknown names are dropped (reported)."""
    base = cfg_class().to_dict()
    out = {}
    for k, v in sizes.items():
        if k in base:
            out[k] = v
        else:
            print(f"  note: {cfg_class.__name__} has no '{k}'")
    return out


def gemma_text(**over):
    kw = mf.gemma_base(**over)
    kw.pop("max_position_embeddings", None)
    return kw


def qwen_text(**over):
    return mf.qwen_base(**over)


# name -> settings
RELEASE = {
    # e2b-like (per-layer inputs, KV sharing) inside gemma4 with vision and audio towers, bf16.
    "rel_gemma4_e2b": dict(outer="gemma4", family="gemma",
                           text=gemma_text(num_hidden_layers=8, hidden_size_per_layer_input=16,
                                           num_kv_shared_layers=3, use_double_wide_mlp=True,
                                           layer_types=["sliding_attention"] * 4 + ["full_attention"]
                                           + ["sliding_attention"] * 2 + ["full_attention"]),
                           towers=dict(vision_config=GEMMA4_VISION, audio_config=GEMMA4_AUDIO),
                           storage="hf", dtype="bf16"),
    # 26B-A4B-like MoE with k_eq_v and a vision tower; routers as spread as the other matrices.
    "rel_gemma4_moe": dict(outer="gemma4", family="gemma",
                           text=gemma_text(enable_moe_block=True, num_experts=8, top_k_experts=2,
                                           moe_intermediate_size=32, attention_k_eq_v=True,
                                           num_global_key_value_heads=1),
                           towers=dict(vision_config=GEMMA4_VISION), storage="hf", dtype="bf16",
                           natural_routing=True),
    # The 12B's form: encoder-free vision and audio embedders, k_eq_v, softcapping, f32.
    "rel_gemma4_unified": dict(outer="gemma4_unified", family="gemma",
                               text=dict((k, v) for k, v in gemma_text(
                                   attention_k_eq_v=True, num_global_key_value_heads=1).items()
                                   if k not in ("hidden_size_per_layer_input", "vocab_size_per_layer_input",
                                                "enable_moe_block")),
                               towers=dict(vision_config=GEMMA4_UNIFIED_VISION, audio_config=GEMMA4_UNIFIED_AUDIO),
                               storage="hf", dtype="f32"),
    # qwen3_5 dense whose top-level tie_word_embeddings differs from its text_config's.
    "rel_qwen3_5_tie": dict(outer="qwen3_5", family="qwen",
                            text=qwen_text(tie_word_embeddings=True),
                            top=dict(tie_word_embeddings=False),
                            towers=dict(vision_config=QWEN3_5_VISION), storage="hf", dtype="bf16", mtp=True),
    # qwen3_5_moe with a vision tower and the MTP head, natural routing, f32.
    "rel_qwen3_5_moe": dict(outer="qwen3_5_moe", family="qwen",
                            text=qwen_text(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=48, norm_topk_prob=True,
                                           tie_word_embeddings=False),
                            towers=dict(vision_config=QWEN3_5_VISION), storage="hf", dtype="f32", mtp=True,
                            natural_routing=True),
    # An MLX conversion of a qwen3_5 release: mlx-vlm names, sidecars, kv_config.json.
    "rel_qwen3_5_mlx": dict(outer="qwen3_5", family="qwen", text=qwen_text(),
                            towers=dict(vision_config=QWEN3_5_VISION), storage="mlx", dtype="bf16", mtp=True),
    # An MLX conversion of a gemma4 release (mlx-vlm names, optiq vision sidecar).
    "rel_gemma4_mlx": dict(outer="gemma4", family="gemma", text=gemma_text(),
                           towers=dict(vision_config=GEMMA4_VISION), storage="mlx", dtype="bf16"),
}
SEEDS = {name: 2000 + i for i, name in enumerate(RELEASE)}


def build_config(spec):
    outer_cls = AutoConfig.for_model(spec["outer"]).__class__
    kw = {"text_config": dict(spec["text"])}
    for key, sizes in spec.get("towers", {}).items():
        kw[key] = sized(outer_cls.sub_configs[key], sizes)
    for key in outer_cls.sub_configs:  # towers not asked for are left out
        if key not in kw:
            kw[key] = None
    kw.update(spec.get("top", {}))
    cfg = AutoConfig.for_model(spec["outer"], **kw)
    cfg._attn_implementation = "eager"
    cfg.get_text_config()._attn_implementation = "eager"
    return cfg


def mtp_tensors(text, dtype):
    """The MTP head's tensors as the released Qwen 3.5 checkpoints name them (random values)."""
    g = torch.Generator().manual_seed(7)
    H, hd, Hq, kv = text["hidden_size"], text["head_dim"], text["num_attention_heads"], text["num_key_value_heads"]
    shapes = {
        "mtp.fc.weight": [H, 2 * H],
        "mtp.pre_fc_norm_embedding.weight": [H],
        "mtp.pre_fc_norm_hidden.weight": [H],
        "mtp.norm.weight": [H],
        "mtp.layers.0.input_layernorm.weight": [H],
        "mtp.layers.0.post_attention_layernorm.weight": [H],
        "mtp.layers.0.self_attn.q_proj.weight": [2 * Hq * hd, H],
        "mtp.layers.0.self_attn.k_proj.weight": [kv * hd, H],
        "mtp.layers.0.self_attn.v_proj.weight": [kv * hd, H],
        "mtp.layers.0.self_attn.o_proj.weight": [H, Hq * hd],
        "mtp.layers.0.self_attn.q_norm.weight": [hd],
        "mtp.layers.0.self_attn.k_norm.weight": [hd],
    }
    if text.get("num_experts", 0):
        E, I = text["num_experts"], text["moe_intermediate_size"]
        shapes["mtp.layers.0.mlp.gate.weight"] = [E, H]
        shapes["mtp.layers.0.mlp.experts.gate_up_proj"] = [E, 2 * I, H]
        shapes["mtp.layers.0.mlp.experts.down_proj"] = [E, H, I]
    else:
        I = text["intermediate_size"]
        for p, s in (("gate_proj", [I, H]), ("up_proj", [I, H]), ("down_proj", [H, I])):
            shapes[f"mtp.layers.0.mlp.{p}.weight"] = s
    return {k: (torch.randn(s, generator=g) * 0.02).to(mf.TORCH_DTYPE[dtype]) for k, s in shapes.items()}


def to_mlx(out_dir, spec, tensors, config):
    """The directory as an MLX conversion ships it."""
    lm, vision, mtp = {}, {}, {}
    for k, v in tensors.items():
        if k.startswith("mtp."):
            mtp[k] = v
        elif k.startswith("model.language_model."):
            name = "language_model.model." + k[len("model.language_model."):]
            if spec["family"] == "qwen":
                if "conv1d.weight" in name:
                    v = v.transpose(1, 2).contiguous()
                if v.ndim == 1 and any(name.endswith(s) for s in (
                        ".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                        ".q_norm.weight", ".k_norm.weight")):
                    v = (v.float() + 1.0).to(v.dtype)
            lm[name] = v
        elif k.startswith("lm_head."):
            lm["language_model." + k] = v
        elif k.startswith("model.visual."):
            vision["vision_tower." + k[len("model.visual."):]] = v
        elif k.startswith("model."):
            vision[k[len("model."):]] = v
        else:
            raise ValueError(k)
    save_file({k: v.contiguous() for k, v in lm.items()}, os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "mlx"})
    if vision:
        save_file({k: v.contiguous() for k, v in vision.items()}, os.path.join(out_dir, "optiq_vision.safetensors"),
                  metadata={"format": "mlx"})
    if mtp:
        save_file({k: v.contiguous() for k, v in mtp.items()}, os.path.join(out_dir, "mtp.safetensors"),
                  metadata={"format": "mlx"})
        config["mlx_lm_extra_tensors"] = {"mtp_file": "mtp.safetensors"}
    layers = spec["text"]["num_hidden_layers"]
    with open(os.path.join(out_dir, "kv_config.json"), "w") as f:
        json.dump([{"layer_idx": i, "bits": 8, "group_size": 64} for i in range(layers)], f)
    with open(os.path.join(out_dir, "optiq_metadata.json"), "w") as f:
        json.dump({"method": "kl-sensitivity", "target_bits": 4.5}, f)


def build(name, out_root):
    spec = RELEASE[name]
    family = spec["family"]
    dtype = spec["dtype"]
    torch.manual_seed(SEEDS[name])
    gen = torch.Generator().manual_seed(SEEDS[name])
    cfg = build_config(spec)
    model = AutoModelForImageTextToText.from_config(cfg).float().eval()
    mf.redraw_weights(model, family, gen, dtype)
    if spec.get("natural_routing"):
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith("router.proj.weight") or pname.endswith("mlp.gate.weight"):
                    p.copy_(mf.exactly_representable(torch.randn(p.shape, generator=gen) * 0.08, dtype))

    vocab = spec["text"]["vocab_size"]
    ids = torch.randint(0, vocab, (mf.PROMPT_LEN,), generator=torch.Generator().manual_seed(SEEDS[name] + 7)).tolist()
    logits = mf.full_logits(model, ids)
    inc = mf.incremental_logits(model, ids, mf.PROMPT_LEN // 2)
    scale = logits.abs().max().item()
    top2 = torch.topk(logits, 2, dim=-1).values
    prompt, gen_tokens, greedy_gap = mf.robust_greedy(model, ids)

    out_dir = os.path.join(out_root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    st = os.path.join(out_dir, "model.safetensors")
    tensors = {k: (v.to(mf.TORCH_DTYPE[dtype]) if v.is_floating_point() else v) for k, v in load_file(st).items()}
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    print(f"--- {name} saved config.json ---\n{json.dumps(config, indent=1)}")
    print(f"--- {name} saved tensors ---\n" + "\n".join(f"{k} {list(v.shape)}" for k, v in sorted(tensors.items())))
    if spec.get("mtp"):
        tensors.update(mtp_tensors(spec["text"], dtype))
    os.remove(st)
    if spec["storage"] == "mlx":
        to_mlx(out_dir, spec, tensors, config)
    else:
        mf.write_sharded(tensors, out_dir, 2)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)

    np.save(os.path.join(out_dir, "logits.npy"), logits.numpy().astype(np.float32))
    with open(os.path.join(out_dir, "ids.json"), "w") as f:
        json.dump(ids, f)
    with open(os.path.join(out_dir, "greedy.json"), "w") as f:
        json.dump({"prompt": prompt, "tokens": gen_tokens, "min_relative_top2_gap": greedy_gap}, f)
    report = {
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "class": type(model).__name__,
        "max_abs_logit": scale,
        "incremental_vs_full_max_abs": (inc - logits).abs().max().item(),
        "min_top2_gap": (top2[:, 0] - top2[:, 1]).min().item(),
        "model_type": spec["outer"],
        "storage": spec["storage"],
        "dtype": dtype,
        "tie_word_embeddings": {"top": getattr(cfg, "tie_word_embeddings", None),
                                "text": getattr(cfg.get_text_config(), "tie_word_embeddings", None),
                                "lm_head_is_embed": model.get_output_embeddings().weight.data_ptr()
                                == model.get_input_embeddings().weight.data_ptr()},
    }
    with open(os.path.join(out_dir, "oracle.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"=== {name}: {json.dumps(report)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    failed = []
    for name in RELEASE:
        if args.only and name not in args.only:
            continue
        try:
            build(name, args.out_dir)
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        print("FAILED:", failed)
        sys.exit(1)


if __name__ == "__main__":
    main()
