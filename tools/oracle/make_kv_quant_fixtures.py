#!/usr/bin/env python3
"""Oracle logits for quantized KV caches (tests/fixtures/kv_quant/).

transformers runs the committed tiny checkpoints (tests/fixtures/<source>/) in f32 with every key and
value that attention reads passed through MLX's affine round trip first, as a cache that stores
them quantized gives them back (mlx-lm's QuantizedKVCache; kiln's --kv-bits and kv_config.json):

  per group of `group_size` elements of a head's vector, codes from mlx's GPU quantizer (the range
  [min, max(0, max)], the larger-magnitude extreme kept exact as the bias, halves rounded away from
  zero), then value = code * f16(scale) + f16(bias).

The hook wraps the modeling module's eager_attention_forward, which receives the keys and values
after the per-head norms, RoPE and the cache, before grouped heads are repeated: exactly what a
quantized cache holds. A layer that reads another layer's cache (Gemma 4's KV sharing) would take
its own index's format here, so the per-layer variants use checkpoints without sharing.

Output per variant: logits.npy (f32 [ids, vocab]), kv_config.json where the variant is per layer,
and oracle.json (source fixture, format, and the largest logit change against unquantized caches).

  python3 tools/oracle/make_kv_quant_fixtures.py tests/fixtures/kv_quant [--only NAME ...]
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import full_logits, run_all, write_report  # noqa: E402

FIXTURE_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures")

# name: (source fixture, every layer's (bits, group) or None, per-layer {layer: (bits, group)} or None)
VARIANTS = {
    "qwen3_5_dense_kv8g32": ("qwen3_5_dense", (8, 32), None),
    "qwen3_5_dense_kv4g32": ("qwen3_5_dense", (4, 32), None),
    "qwen3_5_dense_layers": ("qwen3_5_dense", None, {3: (8, 32), 7: (4, 32)}),
    "gemma4_dense_kv8g32": ("gemma4_dense", (8, 32), None),
    "gemma4_dense_kv4g32": ("gemma4_dense", (4, 32), None),
    "gemma4_dense_layers": ("gemma4_dense", None, {0: (4, 32), 1: (4, 32), 2: (8, 64), 3: (4, 32), 4: (4, 32),
                                                   5: (8, 64)}),
    "gemma4_ple_shared_kv4g32": ("gemma4_ple_shared", (4, 32), None),
}


def round_half_away(x):
    """C's round(): halves go away from zero (torch.round takes them to even)."""
    r = torch.round(x)
    tie = (x - torch.trunc(x)).abs() == 0.5
    return torch.where(tie, torch.trunc(x) + torch.sign(x), r)


def affine_round_trip(x, bits, group_size):
    """x [..., head_dim] f32 through mlx's affine quantize (GPU kernels) and back, f16 scale and bias."""
    shape = x.shape
    g = x.reshape(-1, group_size).float()
    n_bins = float(2**bits - 1)
    lo = g.min(dim=1).values
    hi = g.max(dim=1).values.clamp(min=0.0)  # the max starts at 0
    low_side = lo.abs() > hi.abs()
    scale = torch.clamp((hi - lo) / n_bins, min=1e-7)
    scale = torch.where(low_side, scale, -scale)
    edge = torch.where(low_side, lo, hi)
    q0 = round_half_away(edge / scale)
    nonzero = q0 != 0
    scale = torch.where(nonzero, edge / torch.where(nonzero, q0, torch.ones_like(q0)), scale)
    bias = torch.where(nonzero, edge, torch.zeros_like(edge))
    codes = torch.clamp(round_half_away((g - bias[:, None]) / scale[:, None]), 0.0, n_bins)
    out = codes * scale.half().float()[:, None] + bias.half().float()[:, None]
    return out.reshape(shape).to(x.dtype)


def attention_modules(model):
    """The modeling modules whose attention layers the model runs."""
    return {type(m).__module__ for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "q_proj")}


def round_tripped(model, formats):
    """The model's logits function with the keys and values of each layer's attention round-tripped;
    formats: {layer: (bits, group)}. The modules' eager_attention_forward is wrapped for the call."""
    names = attention_modules(model)
    assert names, "no attention modules found"

    def run(ids):
        originals = {name: sys.modules[name].eager_attention_forward for name in names}
        calls = set()
        for name, original in originals.items():
            def patched(module, query, key, value, attention_mask, *args, _original=original, **kwargs):
                calls.add(module.layer_idx)
                fmt = formats.get(module.layer_idx)
                if fmt is not None:
                    key = affine_round_trip(key, *fmt)
                    value = affine_round_trip(value, *fmt)
                return _original(module, query, key, value, attention_mask, *args, **kwargs)
            sys.modules[name].eager_attention_forward = patched
        try:
            logits = full_logits(model, ids)
        finally:
            for name, original in originals.items():
                sys.modules[name].eager_attention_forward = original
        missed = set(formats) - calls
        assert not missed, f"the hook never saw layers {sorted(missed)}: attention does not go through eager_attention_forward"
        return logits
    return run


def build(name, out_root):
    source, every, per_layer = VARIANTS[name]
    src_dir = os.path.join(FIXTURE_ROOT, source)
    with open(os.path.join(src_dir, "ids.json")) as f:
        ids = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.float32, attn_implementation="eager").eval()
    attention_layers = {m.layer_idx for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "q_proj")}
    formats = {i: every for i in attention_layers} if every else dict(per_layer)
    assert set(formats) <= attention_layers, f"formats for layers without attention: {set(formats) - attention_layers}"
    plain = full_logits(model, ids)
    logits = round_tripped(model, formats)(ids)
    reference = np.load(os.path.join(src_dir, "logits.npy"))
    assert np.abs(plain.numpy() - reference).max() <= 1e-4 * np.abs(reference).max(), \
        "the source fixture's logits do not reproduce"

    out_dir = os.path.join(out_root, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    np.save(os.path.join(out_dir, "logits.npy"), logits.numpy().astype(np.float32))
    if per_layer:
        with open(os.path.join(out_dir, "kv_config.json"), "w") as f:
            json.dump([{"layer_idx": i, "bits": b, "group_size": g} for i, (b, g) in sorted(per_layer.items())], f)
    scale = logits.abs().max().item()
    report = {
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "source": source,
        "kv_bits": every[0] if every else None,
        "kv_group_size": every[1] if every else None,
        "max_abs_logit": scale,
        "max_abs_change_vs_unquantized": (logits - plain).abs().max().item(),
    }
    write_report(out_dir, name, report)


if __name__ == "__main__":
    run_all(VARIANTS, build)
