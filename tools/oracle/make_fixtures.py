#!/usr/bin/env python3
"""Builds tiny random Gemma 4 and Qwen 3.5 models and records reference logits from transformers.

Runs where torch and transformers (5.17) are installed. For every fixture it writes an HF model
directory plus:
  ids.json     the prompt token ids
  logits.npy   float32 [len(ids), vocab] from one full forward (eager attention, f32)
  greedy.json  {"prompt": [...], "tokens": [...]} from transformers' greedy generate
  oracle.json  self-checks of the oracle (incremental vs full forward)

Variants are chosen so that, together, they cover every feature kiln implements: see FIXTURES.
Weights are re-drawn with a larger spread than transformers' init so that logits are far from ties.

Usage: make_fixtures.py OUT_DIR [--only NAME ...]
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
from transformers import AutoConfig, AutoModelForCausalLM

PROMPT_LEN = 200
VOCAB = 320


def gemma_base(**over):
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        global_head_dim=64,
        sliding_window=24,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
        },
        final_logit_softcapping=30.0,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=VOCAB,
        attention_k_eq_v=False,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        enable_moe_block=False,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    cfg.update(over)
    return cfg


def qwen_base(**over):
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                         "mrope_interleaved": True},
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    )
    cfg.update(over)
    return cfg


# name -> (model_type, config kwargs, storage transform, dtype stored)
FIXTURES = {
    # sliding + full, per-type head dims, proportional RoPE, softcap, tied; transformers 5.x
    # config form (per_layer_config), text-only checkpoint (model. prefix), f32.
    "gemma4_dense": ("gemma4_text", gemma_base(), "hf", "f32"),
    # attention_k_eq_v with its own KV-head count on full layers; released-checkpoint config keys
    # inside a multimodal wrapper (text_config, model.language_model. prefix, vision/audio
    # tensors to skip); sharded safetensors; bf16 storage.
    "gemma4_keqv": ("gemma4_text",
                    gemma_base(attention_k_eq_v=True, num_global_key_value_heads=1,
                               num_key_value_heads=2),
                    "gemma4_wrapper_released", "bf16"),
    # e2b-like: per-layer inputs, KV sharing, double-wide MLP on sharing layers, 4:1 pattern.
    "gemma4_ple_shared": ("gemma4_text",
                          gemma_base(num_hidden_layers=8, hidden_size_per_layer_input=16,
                                     num_kv_shared_layers=3, use_double_wide_mlp=True,
                                     layer_types=["sliding_attention"] * 4 + ["full_attention"]
                                     + ["sliding_attention"] * 2 + ["full_attention"]),
                          "hf", "f32"),
    # 26B-A4B-like MoE with k_eq_v, stored as mlx-lm does (switch_glu, language_model.model.).
    "gemma4_moe": ("gemma4_text",
                   gemma_base(enable_moe_block=True, num_experts=8, top_k_experts=2,
                              moe_intermediate_size=32, attention_k_eq_v=True,
                              num_global_key_value_heads=1),
                   "gemma4_mlx", "f16"),
    # Qwen 3.5 dense hybrid, tied, transformers layout, text-only checkpoint.
    "qwen3_5_dense": ("qwen3_5_text", qwen_base(), "hf", "f32"),
    # untied head, stored the way mlx-lm converts it (conv [C,K,1], norms stored as 1+w,
    # language_model. prefix, text_config wrapper), bf16.
    "qwen3_5_untied_mlx": ("qwen3_5_text", qwen_base(tie_word_embeddings=False),
                           "qwen_mlx", "bf16"),
    # MoE with shared expert; transformers saves its experts one tensor per expert (as the released
    # checkpoints ship them) under the multimodal wrapper prefix.
    "qwen3_5_moe": ("qwen3_5_moe_text",
                    qwen_base(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                              shared_expert_intermediate_size=48, norm_topk_prob=True,
                              tie_word_embeddings=False),
                    "qwen_wrapper", "f32"),
    # The same kind of MoE stored in mlx-lm's switch_mlp layout and conventions.
    "qwen3_5_moe_mlx": ("qwen3_5_moe_text",
                        qwen_base(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                  shared_expert_intermediate_size=48, norm_topk_prob=True,
                                  num_hidden_layers=6,
                                  layer_types=["linear_attention", "full_attention"] * 3),
                        "qwen_mlx", "f32"),
}

SEEDS = {name: 1000 + i for i, name in enumerate(FIXTURES)}
TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


# Projections that write into the residual stream, and Gemma's norms on those writes. Keeping each
# layer's contribution small next to the residual keeps these random models well conditioned: bf16
# rounding anywhere (the CUDA path) then moves the logits by well under 1%, as it does in trained
# models, while a semantic error in any block still moves them by far more than the 1e-4 tolerance.
BRANCH_OUTPUTS = ("o_proj", "out_proj", "down_proj", "per_layer_projection.weight")
GEMMA_POST_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm", "post_per_layer_input_norm")


def exactly_representable(v, dtype):
    """Rounds to values that bf16 holds exactly and the stored dtype too, so that the f32 oracle,
    the f32 CPU path and the bf16 CUDA path all run the very same weights."""
    v = v.to(torch.bfloat16).to(torch.float32)
    if dtype == "f16":
        stored = v.to(torch.float16).to(torch.float32)
        v = torch.where(stored == v, v, torch.zeros_like(v))  # f16 subnormals that lose bits
    return v


def redraw_weights(model, family, gen, dtype):
    """Re-draw every parameter and buffer that carries a weight, with a spread that keeps logits apart."""

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen) * std + mean

    def uniform(shape, lo, hi):
        return torch.rand(shape, generator=gen) * (hi - lo) + lo

    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "inv_freq" in name or "embed_scale" in name:
                continue
            leaf = name.split(".")[-1]
            if name.endswith("layer_scalar"):
                v = uniform(p.shape, 0.6, 1.4)
            elif name.endswith("A_log"):
                v = uniform(p.shape, -1.0, 1.0)
            elif name.endswith("dt_bias"):
                v = normal(p.shape, 0.5)
            elif "conv1d" in name:
                v = normal(p.shape, 0.3)
            elif name.endswith("router.scale") or name.endswith("per_expert_scale"):
                v = uniform(p.shape, 0.5, 1.5)
            elif p.ndim == 1 and leaf == "weight":
                # norms: Qwen's main norms are (1 + w); its gated norm and all Gemma norms are w
                if family == "qwen" and "linear_attn.norm" not in name:
                    # mlx-lm stores 1 + w: keep that sum exact in the stored dtype too
                    v = (1.0 + normal(p.shape, 0.3)).to(TORCH_DTYPE[dtype]).float() - 1.0
                elif family == "gemma" and ("q_norm" in name or "k_norm" in name):
                    # Gemma attends with scale 1 on normalised q and k: moderate weights keep the
                    # softmax away from near-ties that would amplify rounding
                    v = uniform(p.shape, 0.4, 0.9)
                else:
                    v = uniform(p.shape, 0.5, 1.5)
            elif "embed_tokens" in name or "lm_head" in name:
                v = normal(p.shape, 0.25)
            elif name.endswith("router.proj.weight") or name.endswith("mlp.gate.weight"):
                v = normal(p.shape, 2.4)  # decisive routing: top-k choices far from ties
            elif p.ndim >= 2 and any(s in name for s in BRANCH_OUTPUTS):
                v = normal(p.shape, 0.004)
            elif p.ndim >= 2:
                v = normal(p.shape, 0.08)
            else:
                continue
            if family == "gemma" and any(s in name for s in GEMMA_POST_NORMS):
                v = v * 0.05
            p.copy_(exactly_representable(v, dtype))


def full_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].float()


def incremental_logits(model, ids, split):
    """Prefill ids[:split] then decode one token at a time through transformers' cache."""
    with torch.no_grad():
        out = model(torch.tensor([ids[:split]]), use_cache=True)
        parts = [out.logits[0]]
        past = out.past_key_values
        for t in range(split, len(ids)):
            out = model(torch.tensor([[ids[t]]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            parts.append(out.logits[0])
        return torch.cat(parts).float()


def robust_greedy(model, ids, n_prompt=48, n_new=48):
    """A prompt (a window of ids) whose greedy continuation is well conditioned: transformers'
    generate and a full forward over the result agree on every step, and the top two logits stay
    apart by at least 1e-3 of the largest logit, so rounding cannot flip a step (nor a MoE router)."""
    best = None
    for start in range(0, len(ids) - n_prompt, 5):
        prompt = ids[start:start + n_prompt]
        tokens = greedy(model, prompt, n_new)
        logits = full_logits(model, prompt + tokens)[n_prompt - 1:-1]
        top2 = torch.topk(logits, 2, dim=-1).values
        gap = ((top2[:, 0] - top2[:, 1]) / logits.abs().max()).min().item()
        agree = logits.argmax(-1).tolist() == tokens
        if agree and gap >= 1e-3:
            return prompt, tokens, gap
        if agree and (best is None or gap > best[2]):
            best = (prompt, tokens, gap)
    if best is None:
        raise RuntimeError("no prompt window gives a greedy continuation that transformers reproduces")
    return best


def greedy(model, prompt, n):
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def write_sharded(tensors, out_dir, n_shards):
    names = sorted(tensors)
    per = (len(names) + n_shards - 1) // n_shards
    weight_map = {}
    total = 0
    for s in range(n_shards):
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {k: tensors[k].contiguous() for k in names[s * per:(s + 1) * per]}
        save_file(part, os.path.join(out_dir, fname), metadata={"format": "pt"})
        for k, v in part.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def transform_storage(out_dir, kind, dtype, text_cfg):
    """Rewrites the saved HF directory into the checkpoint form a fixture stands for."""
    st_path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(st_path)
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    tdt = TORCH_DTYPE[dtype]
    tensors = {k: (v.to(tdt) if v.is_floating_point() else v) for k, v in tensors.items()}
    shards = 1

    def strip_model_prefix(k):
        return k[len("model."):] if k.startswith("model.") else k

    if kind == "hf":
        pass
    elif kind == "gemma4_wrapper_released":
        tensors = {("model.language_model." + strip_model_prefix(k)) if k.startswith("model.") else k: v
                   for k, v in tensors.items()}
        # towers a text-only loader must skip
        tensors["model.vision_tower.patch_embedder.input_proj.weight"] = torch.zeros(8, 4, dtype=tdt)
        tensors["model.audio_tower.layers.0.fake.weight"] = torch.zeros(4, dtype=tdt)
        tensors["model.embed_vision.embedding_projection.weight"] = torch.zeros(8, 8, dtype=tdt)
        text = dict(config)
        text.pop("per_layer_config", None)
        text.pop("architectures", None)
        text["global_head_dim"] = text_cfg["global_head_dim"]
        text["num_global_key_value_heads"] = text_cfg["num_global_key_value_heads"]
        text["model_type"] = "gemma4_text"
        config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
                  "text_config": text, "vision_config": {"model_type": "gemma4_vision"},
                  "audio_config": None, "tie_word_embeddings": True}
        shards = 2
    elif kind == "gemma4_mlx":
        new = {}
        for k, v in tensors.items():
            k = "language_model.model." + strip_model_prefix(k) if k.startswith("model.") else k
            if k.endswith(".experts.gate_up_proj"):
                base = k[: -len(".gate_up_proj")]
                half = v.shape[-2] // 2
                new[base + ".switch_glu.gate_proj.weight"] = v[..., :half, :].contiguous()
                new[base + ".switch_glu.up_proj.weight"] = v[..., half:, :].contiguous()
                continue
            if k.endswith(".experts.down_proj"):
                new[k[: -len(".down_proj")] + ".switch_glu.down_proj.weight"] = v
                continue
            new[k] = v
        tensors = new
        text = dict(config)
        text.pop("architectures", None)
        config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
                  "text_config": text}
    elif kind in ("qwen_mlx", "qwen_wrapper"):
        mlx = kind == "qwen_mlx"
        norm_suffixes = (".input_layernorm.weight", ".post_attention_layernorm.weight",
                         "model.norm.weight", ".q_norm.weight", ".k_norm.weight")
        new = {}
        experts = {}
        for k, v in tensors.items():
            if k.startswith("model."):
                k = ("language_model.model." if mlx else "model.language_model.") + strip_model_prefix(k)
            elif k.startswith("lm_head."):
                k = ("language_model." if mlx else "") + k
            if mlx:
                if "conv1d.weight" in k:
                    v = v.transpose(1, 2).contiguous()  # [C,1,K] -> [C,K,1]
                if any(k.endswith(s) for s in norm_suffixes) and v.ndim == 1:
                    v = (v.float() + 1.0).to(tdt)
                if ".mlp.experts." in k:  # per-expert tensors: stacked below
                    experts.setdefault(k, v)
                    continue
            new[k] = v
        # mlx-lm stacks the per-expert projections of a layer into switch_mlp.<proj>.weight [E, out, in]
        stacked = {}
        for k, v in experts.items():
            base, rest = k.split(".mlp.experts.")
            e, proj = rest.split(".", 1)
            stacked.setdefault((base, proj), {})[int(e)] = v
        for (base, proj), parts in stacked.items():
            new[base + ".mlp.switch_mlp." + proj] = torch.stack([parts[i] for i in sorted(parts)]).contiguous()
        tensors = new
        text = dict(config)
        text.pop("architectures", None)
        if mlx:
            # mlx-lm checkpoints describe the layout by full_attention_interval alone
            types = text.pop("layer_types")
            interval = types.index("full_attention") + 1
            assert types == ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                             for i in range(len(types))]
            text["full_attention_interval"] = interval
        outer = "qwen3_5_moe" if text.get("model_type") == "qwen3_5_moe_text" else "qwen3_5"
        config = {"architectures": ["Qwen3_5MoeForConditionalGeneration" if outer == "qwen3_5_moe"
                                    else "Qwen3_5ForConditionalGeneration"],
                  "model_type": outer, "text_config": text,
                  "tie_word_embeddings": text.get("tie_word_embeddings", False)}
    else:
        raise ValueError(kind)

    os.remove(st_path)
    if shards > 1:
        write_sharded(tensors, out_dir, shards)
    else:
        save_file({k: v.contiguous() for k, v in tensors.items()}, st_path, metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def build(name, out_root):
    model_type, kw, storage, dtype = FIXTURES[name]
    family = "gemma" if model_type.startswith("gemma") else "qwen"
    torch.manual_seed(SEEDS[name])
    gen = torch.Generator().manual_seed(SEEDS[name])
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    redraw_weights(model, family, gen, dtype)

    ids_gen = torch.Generator().manual_seed(SEEDS[name] + 7)
    ids = torch.randint(0, kw["vocab_size"], (PROMPT_LEN,), generator=ids_gen).tolist()

    logits = full_logits(model, ids)
    inc = incremental_logits(model, ids, PROMPT_LEN // 2)
    scale = logits.abs().max().item()
    inc_err = (inc - logits).abs().max().item()
    top2 = torch.topk(logits, 2, dim=-1).values
    min_gap = (top2[:, 0] - top2[:, 1]).min().item()
    prompt, gen_tokens, greedy_gap = robust_greedy(model, ids)

    out_dir = os.path.join(out_root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for extra in ("generation_config.json",):
        p = os.path.join(out_dir, extra)
        if os.path.exists(p):
            os.remove(p)
    with open(os.path.join(out_dir, "config.json")) as f:
        print(f"--- {name} saved config.json ---\n{f.read()}")
    keys = sorted(load_file(os.path.join(out_dir, "model.safetensors")).keys())
    print(f"--- {name} saved tensors ({len(keys)}) ---\n" + "\n".join(keys[:80]))
    transform_storage(out_dir, storage, dtype, kw)

    np.save(os.path.join(out_dir, "logits.npy"), logits.numpy().astype(np.float32))
    with open(os.path.join(out_dir, "ids.json"), "w") as f:
        json.dump(ids, f)
    with open(os.path.join(out_dir, "greedy.json"), "w") as f:
        json.dump({"prompt": prompt, "tokens": gen_tokens, "min_relative_top2_gap": greedy_gap}, f)
    report = {
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "max_abs_logit": scale,
        "incremental_vs_full_max_abs": inc_err,
        "min_top2_gap": min_gap,
        "model_type": model_type,
        "storage": storage,
        "dtype": dtype,
    }
    write_report(out_dir, name, report)


def write_report(out_dir, name, report):
    """Writes a fixture's oracle.json and prints its one-line summary."""
    with open(os.path.join(out_dir, "oracle.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"=== {name}: {json.dumps(report)}")


def run_all(fixtures, build):
    """The oracle scripts' command line: OUT_DIR [--only NAME ...]; builds each fixture with
    build(name, out_dir), reports every failure and exits non-zero after any."""
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    failed = []
    for name in fixtures:
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


def main():
    run_all(FIXTURES, build)


if __name__ == "__main__":
    main()
