#!/usr/bin/env python3
"""Records transformers' reference logits for the quantized fixtures.

The quantized fixture directories are written by kiln's own quantizer
(tools/oracle/make_quant_fixture_dirs.sh, committed under tests/fixtures/). This script, run where
torch and transformers (5.17) are installed, dequantizes each one exactly (w = scale * q + bias in
f32, codes unpacked from the little-endian bit stream independently of kiln), loads the weights
into the transformers model of the fixture's source variant (make_fixtures.FIXTURES), and writes
what make_fixtures.py writes for the float fixtures:
  logits.npy   float32 [len(ids), vocab] from one full forward (eager attention, f32)
  greedy.json  {"prompt": [...], "tokens": [...]} from transformers' greedy generate
  oracle.json  self-checks of the oracle

Usage: make_quant_fixtures.py OUT_DIR [--only NAME ...]
OUT_DIR/<name>/ receives the three files; copy them into tests/fixtures/<name>/.
"""

import argparse
import json
import os
import re
import sys
import traceback

import numpy as np
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES_DIR = os.path.join(ROOT, "tests", "fixtures")


def quant_fixtures():
    """name -> source fixture, from the list in make_quant_fixture_dirs.sh."""
    text = open(os.path.join(os.path.dirname(__file__), "make_quant_fixture_dirs.sh")).read()
    block = text.split("<<'LIST'\n", 1)[1].split("\nLIST", 1)[0]
    out = {}
    for line in block.splitlines():
        if line.strip():
            name, source, _ = line.split("|", 2)
            out[name] = source
    return out


PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")


def canonical(name):
    for p in PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name


def unpack_codes(packed_u32, bits, cols):
    """Codes of a packed [..., cols * bits / 32] uint32 array: per row a little-endian bit stream,
    least significant bit first; code i is bits [i * bits, (i + 1) * bits)."""
    lead = packed_u32.shape[:-1]
    as_bytes = np.ascontiguousarray(packed_u32).astype("<u4").view(np.uint8).reshape(*lead, -1)
    stream = np.unpackbits(as_bytes, axis=-1, bitorder="little")  # [..., cols * bits]
    stream = stream.reshape(*lead, cols, bits).astype(np.int64)
    weights = (1 << np.arange(bits, dtype=np.int64))
    return (stream * weights).sum(-1)


def load_dequantized(quant_dir):
    """canonical name -> f32 torch tensor, quantized modules dequantized."""
    with open(os.path.join(quant_dir, "config.json")) as f:
        config = json.load(f)
    qcfg = config.get("quantization") or config.get("text_config", {}).get("quantization")
    assert qcfg is not None, "not a quantized fixture"
    raw = {}
    u32 = {}
    for fname in sorted(os.listdir(quant_dir)):
        if not fname.endswith(".safetensors"):
            continue
        path = os.path.join(quant_dir, fname)
        with safe_open(path, framework="numpy") as fnp, safe_open(path, framework="pt") as fpt:
            for k in fpt.keys():
                sl = fpt.get_slice(k)
                if sl.get_dtype() == "U32":
                    u32[k] = fnp.get_tensor(k)
                else:
                    raw[k] = fpt.get_tensor(k)
    out = {}
    n_quantized = 0
    for k, packed in u32.items():
        assert k.endswith(".weight"), k
        module = k[: -len(".weight")]
        spec = qcfg.get(module)
        bits = spec["bits"] if isinstance(spec, dict) else qcfg["bits"]
        group = spec["group_size"] if isinstance(spec, dict) else qcfg["group_size"]
        assert spec is not False, f"{module} is packed but configured unquantized"
        scales = raw.pop(module + ".scales").float()
        biases = raw.pop(module + ".biases").float()
        cols = packed.shape[-1] * 32 // bits
        assert scales.shape[-1] * group == cols, (k, scales.shape, cols)
        codes = torch.from_numpy(unpack_codes(packed, bits, cols)).float()
        codes = codes.reshape(*codes.shape[:-1], cols // group, group)
        w = scales.unsqueeze(-1) * codes + biases.unsqueeze(-1)
        out[canonical(k)] = w.reshape(*w.shape[:-2], cols)
        n_quantized += 1
    for k, v in raw.items():
        out[canonical(k)] = v.float()
    return out, config, n_quantized


QWEN_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight",
              ".k_norm.weight")


def hf_tensor(hf_name, shape, ours, family, mlx_norms, used):
    """The value of transformers' parameter `hf_name` (canonical) from kiln's tensors."""
    def take(k):
        used.add(k)
        return ours[k]

    if hf_name in ours:
        v = take(hf_name)
        if family == "qwen" and "conv1d.weight" in hf_name:
            v = v.reshape(shape)  # [C, K, 1] -> [C, 1, K]: the same memory order
        if family == "qwen" and mlx_norms and v.ndim == 1 and (
                hf_name == "norm.weight" or hf_name.endswith(QWEN_NORMS)):
            v = v - 1.0  # stored as 1 + w
        return v
    switch = ".experts.switch_glu." if family == "gemma" else ".switch_mlp."
    m = re.match(r"(.*)\.experts\.(gate_up_proj|down_proj)$", hf_name)
    if m:
        base = m.group(1) + switch
        if m.group(2) == "down_proj":
            return take(base + "down_proj.weight")
        return torch.cat([take(base + "gate_proj.weight"), take(base + "up_proj.weight")], dim=-2)
    m = re.match(r"(.*)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", hf_name)
    if m:
        return take(m.group(1) + switch + m.group(3) + ".weight")[int(m.group(2))]
    raise KeyError(hf_name)


def build(name, source, out_root):
    quant_dir = os.path.join(FIXTURES_DIR, name)
    model_type, kw, _, _ = mf.FIXTURES[source]
    family = "gemma" if model_type.startswith("gemma") else "qwen"
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).float().eval()

    ours, config, n_quantized = load_dequantized(quant_dir)
    mlx_norms = any(k.endswith("conv1d.weight") and v.shape[-1] == 1 for k, v in ours.items())
    used = set()
    with torch.no_grad():
        for full, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "inv_freq" in full or "embed_scale" in full:
                continue
            hf_name = canonical(full)
            try:
                v = hf_tensor(hf_name, p.shape, ours, family, mlx_norms, used)
            except KeyError:
                if full in dict(model.named_buffers()):
                    continue  # a buffer the checkpoint does not carry
                raise
            if v.ndim == 3 and tuple(v.shape) != tuple(p.shape) and tuple(v.transpose(-1, -2).shape) == tuple(p.shape):
                v = v.transpose(-1, -2)  # fused experts held [E, in, out]
            assert tuple(v.shape) == tuple(p.shape), (full, tuple(v.shape), tuple(p.shape))
            p.copy_(v.to(p.dtype))
    unused = sorted(set(ours) - used - {"lm_head.weight"})
    assert not unused, f"tensors not loaded into transformers: {unused[:8]}"

    with open(os.path.join(quant_dir, "ids.json")) as f:
        ids = json.load(f)
    logits = mf.full_logits(model, ids)
    inc = mf.incremental_logits(model, ids, len(ids) // 2)
    top2 = torch.topk(logits, 2, dim=-1).values
    prompt, gen_tokens, greedy_gap = mf.robust_greedy(model, ids)

    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, "logits.npy"), logits.numpy().astype(np.float32))
    with open(os.path.join(out_dir, "greedy.json"), "w") as f:
        json.dump({"prompt": prompt, "tokens": gen_tokens, "min_relative_top2_gap": greedy_gap}, f)
    report = {
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        "source_fixture": source,
        "quantized_modules": n_quantized,
        "quantization": {k: v for k, v in config["quantization"].items() if not isinstance(v, (dict, bool))},
        "max_abs_logit": logits.abs().max().item(),
        "incremental_vs_full_max_abs": (inc - logits).abs().max().item(),
        "min_top2_gap": (top2[:, 0] - top2[:, 1]).min().item(),
        "model_type": model_type,
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
    for name, source in quant_fixtures().items():
        if args.only and name not in args.only:
            continue
        try:
            build(name, source, args.out_dir)
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        print("FAILED:", failed)
        sys.exit(1)


if __name__ == "__main__":
    main()
