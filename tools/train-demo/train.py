#!/usr/bin/env python3
"""Trains kiln's demo model: a small Qwen 3.5 hybrid (Gated DeltaNet + gated full attention) on the KJV.

Runs where torch and transformers (5.x, with Qwen 3.5) are installed; made for one H200, works
(slowly) on a CPU for --smoke. Inputs: the corpus from extract_corpus.sh (train.txt, valid.txt)
and the tokenizer from train_tokenizer.py. Writes to --out-dir:
  model/          config.json, model.safetensors (bf16), generation_config.json, tokenizer.json,
                  tokenizer_config.json: loadable by transformers and by kiln
  log.csv         step, lr, train loss, and valid loss where evaluated
  loss.png        the loss curve (plot_png.py, no plotting package needed)
  metrics.json    final validation loss and perplexity of the saved (bf16) weights, steps, timing
  samples.txt     greedy and sampled continuations of fixed prompts
  samples.json    the same, with token ids (greedy ids are what a test can compare against)

Everything random is drawn from --seed (weights, batch order, sampling). Training stops at
--steps, or earlier when --max-minutes of training time is spent; after --fit-after steps the
planned step count is lowered, once, to what fits in --max-minutes at the measured speed, so the
learning-rate schedule still ends at its minimum. metrics.json records the steps actually run;
`--steps N --no-fit` repeats such a run. Validation loss is measured every --eval-every steps on
the held-out chapters, and the weights with the lowest validation loss are the ones saved
(--keep best; --keep last saves the final weights).

Usage: train.py --data-dir D --tokenizer-dir T --out-dir O [--smoke] [--max-minutes M] ...
"""

import argparse
import csv
import json
import math
import os
import random
import shutil
import sys
import time

T_START = time.time()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_png  # noqa: E402

EOT, IM_START, IM_END = 0, 1, 2  # ids fixed by train_tokenizer.py

# Every matrix dimension is a multiple of 64, so MLX 4-bit quantization with group size 64 applies
# to all of them. About 31 M parameters: ~62 MB in bf16, ~18 MB as MLX 4-bit.
MODEL = dict(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    linear_conv_kernel_dim=4,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    max_position_embeddings=2048,
)

# --smoke: the same code path on a model small enough for a few CPU steps
SMOKE_MODEL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    linear_conv_kernel_dim=4,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    max_position_embeddings=2048,
)

PROMPTS = [
    "In the beginning",
    "And the LORD said unto Moses,",
    "Blessed are the",
    "And it came to pass, when the king",
    "The heart of a wise man",
]
CHAT_PROMPTS = [
    "And God said, Let there be light: and there was light.",
    "Blessed are the meek: for they shall inherit the earth.",
]


def log(msg):
    print(f"[{time.time() - T_START:7.1f}s] {msg}", flush=True)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--epochs", type=float, default=24.0,
                    help="plan this many passes over the training tokens (sets --steps); 0: use --steps")
    ap.add_argument("--steps", type=int, default=1000, help="planned optimizer steps when --epochs is 0")
    ap.add_argument("--batch", type=int, default=32, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr as a fraction of the peak")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=0, help="0: about 25 evaluations per run")
    ap.add_argument("--max-minutes", type=float, default=6.0, help="wall-clock limit for the training loop")
    ap.add_argument("--fit-after", type=int, default=30, help="measure speed over this many steps, then fit")
    ap.add_argument("--no-fit", action="store_true", help="run exactly --steps (unless --max-minutes stops it)")
    ap.add_argument("--keep", choices=["best", "last"], default="best")
    ap.add_argument("--chat-every", type=int, default=10,
                    help="every Nth training chapter is wrapped as a ChatML exchange (0: none)")
    ap.add_argument("--sample-tokens", type=int, default=48)
    ap.add_argument("--smoke", action="store_true", help="tiny model, a few steps, to test the pipeline")
    return ap.parse_args()


# ---------------------------------------------------------------------------------------- data


def read_chapters(path):
    with open(path, encoding="utf-8") as f:
        return [c.strip("\n") + "\n" for c in f.read().split("\n\n") if c.strip()]


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def chapter_ids(tok, chapter, as_chat):
    """Token ids of one chapter document, ended by <|endoftext|>.

    As chat: the first verse is the user's message and the rest of the chapter the assistant's
    reply, in the ChatML layout of the tokenizer's chat template. Special tokens are inserted by id.
    """
    if not as_chat:
        return encode(tok, chapter) + [EOT]
    first, _, rest = chapter.partition("\n")
    if not rest.strip():
        return encode(tok, chapter) + [EOT]
    ids = [IM_START] + encode(tok, "user\n" + first) + [IM_END] + encode(tok, "\n")
    ids += [IM_START] + encode(tok, "assistant\n" + rest.rstrip("\n")) + [IM_END] + encode(tok, "\n")
    return ids + [EOT]


def build_tokens(tok, chapters, chat_every):
    ids = []
    for i, ch in enumerate(chapters):
        ids += chapter_ids(tok, ch, chat_every > 0 and i % chat_every == chat_every - 1)
    return torch.tensor(ids, dtype=torch.long)


def valid_windows(tokens, seq_len):
    """Non-overlapping windows of seq_len + 1 tokens covering the validation split (last one dropped if short)."""
    n = (len(tokens) - 1) // seq_len
    return torch.stack([tokens[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])


# ---------------------------------------------------------------------------------------- model


def build_config(vocab_size, smoke):
    from transformers import AutoConfig

    dims = dict(SMOKE_MODEL if smoke else MODEL)
    return AutoConfig.for_model(
        "qwen3_5_text",
        vocab_size=vocab_size,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        attention_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [3, 3, 2] if not smoke else [2, 1, 1], "mrope_interleaved": True},
        bos_token_id=None,
        eos_token_id=IM_END,
        pad_token_id=EOT,
        initializer_range=0.02,
        use_cache=True,
        **dims,
    )


def count_params(model):
    total = sum(p.numel() for p in model.parameters())
    matrices = sum(p.numel() for n, p in model.named_parameters() if p.ndim == 2)
    return total, matrices


def lr_at(step, total, args, warmup):
    if step < warmup:
        return args.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = args.lr * args.min_lr_ratio
    return floor + (args.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def autocast(device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def loss_of(model, batch, device):
    x, y = batch[:, :-1], batch[:, 1:]
    with autocast(device):
        logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model, windows, batch_size, device):
    """Mean next-token loss (nats) over all validation windows."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        batch = windows[i:i + batch_size].to(device)
        n = batch[:, 1:].numel()
        total += loss_of(model, batch, device).item() * n
        count += n
    model.train(was_training)
    return total / count


def manual_continue(model, ids, device, max_new, greedy, seed):
    """Token-by-token decoding with full forwards (no cache): the fallback if generate() fails."""
    g = torch.Generator(device=device).manual_seed(seed)
    seq = list(ids)
    for _ in range(max_new):
        x = torch.tensor([seq], dtype=torch.long, device=device)
        with autocast(device):
            logits = model(input_ids=x, use_cache=False).logits[0, -1].float()
        if greedy:
            nxt = int(torch.argmax(logits))
        else:
            logits = logits / 0.8
            kth = torch.topk(logits, 40).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g))
        seq.append(nxt)
        if nxt in (IM_END, EOT):
            break
    return seq[len(ids):]


@torch.no_grad()
def generate_samples(model, tok, device, seed, max_new):
    """Greedy and sampled continuations of the fixed prompts (plain text, then chat)."""
    model.eval()
    runs = [("text", p, encode(tok, p)) for p in PROMPTS]
    for p in CHAT_PROMPTS:
        prompt = f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n"
        runs.append(("chat", prompt, [IM_START] + encode(tok, f"user\n{p}") + [IM_END] + encode(tok, "\n")
                     + [IM_START] + encode(tok, "assistant\n")))
    out = []
    for kind, prompt, ids in runs:
        x = torch.tensor([ids], dtype=torch.long, device=device)
        entry = {"kind": kind, "prompt": prompt, "prompt_ids": ids}
        for mode in ("greedy", "sampled"):
            greedy = mode == "greedy"
            try:
                torch.manual_seed(seed)
                extra = {} if greedy else {"temperature": 0.8, "top_k": 40, "top_p": 1.0}
                y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new,
                                   do_sample=not greedy, eos_token_id=[IM_END, EOT], pad_token_id=EOT, **extra)
                new = y[0, len(ids):].tolist()
                entry[mode + "_by"] = "generate"
            except Exception as e:  # keep the run's other outputs; say which path made the sample
                log(f"generate() failed ({type(e).__name__}: {e}); decoding with full forwards instead")
                new = manual_continue(model, ids, device, max_new, greedy, seed)
                entry[mode + "_by"] = "full-forward loop"
            entry[mode + "_ids"] = new
            # ids past the tokenizer's vocabulary (padding rows of the embedding) decode to nothing
            entry[mode] = tok.decode([i for i in new if i < tok.get_vocab_size()], skip_special_tokens=False)
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------- main


def main():
    args = parse_args()
    if args.smoke:
        args.steps, args.epochs, args.batch, args.seq_len, args.warmup = 20, 0, 4, 128, 5
        args.eval_every, args.fit_after, args.sample_tokens = 10, 5, 12
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}"
        + (f" ({torch.cuda.get_device_name(0)})" if device.type == "cuda" else ""))
    os.makedirs(args.out_dir, exist_ok=True)

    tok = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    for name, want in (("<|endoftext|>", EOT), ("<|im_start|>", IM_START), ("<|im_end|>", IM_END)):
        if tok.token_to_id(name) != want:
            sys.exit(f"tokenizer: {name} is {tok.token_to_id(name)}, expected {want}")
    vocab = tok.get_vocab_size()
    vocab_padded = (vocab + 63) // 64 * 64

    train_chapters = read_chapters(os.path.join(args.data_dir, "train.txt"))
    valid_chapters = read_chapters(os.path.join(args.data_dir, "valid.txt"))
    train_tokens = build_tokens(tok, train_chapters, args.chat_every)
    valid_tokens = build_tokens(tok, valid_chapters, 0)
    if args.smoke:
        valid_tokens = valid_tokens[: 8 * args.seq_len + 1]
    windows = valid_windows(valid_tokens, args.seq_len)
    log(f"data: {len(train_chapters)} train chapters, {len(train_tokens)} tokens; "
        f"{len(valid_chapters)} valid chapters, {len(valid_tokens)} tokens, {len(windows)} windows; "
        f"vocab {vocab} (model {vocab_padded})")

    if args.epochs > 0:
        args.steps = math.ceil(args.epochs * len(train_tokens) / (args.batch * args.seq_len))
        log(f"{args.epochs} epochs of {len(train_tokens)} tokens at {args.batch}x{args.seq_len} tokens/step: "
            f"{args.steps} steps planned")

    config = build_config(vocab_padded, args.smoke)
    torch.manual_seed(args.seed)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config).float().to(device)
    model.train()
    n_total, n_mat = count_params(model)
    log(f"model: {type(model).__name__}, {n_total / 1e6:.2f} M parameters ({n_mat / 1e6:.2f} M in matrices), "
        f"layer_types {config.layer_types}")

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if device.type == "cuda" else {}))

    gen = torch.Generator().manual_seed(args.seed + 1)
    train_dev = train_tokens.to(device)
    span = args.seq_len + 1
    offsets = torch.arange(span)

    planned = args.steps
    warmup = max(1, args.warmup)
    eval_every = args.eval_every or max(10, planned // 25)
    budget_s = args.max_minutes * 60.0
    history = []  # dicts: step, lr, train_loss, valid_loss
    best = {"valid_loss": float("inf"), "step": -1, "state": None}

    def do_eval(step):
        t0 = time.time()
        vl = evaluate(model, windows, args.batch, device)
        if vl < best["valid_loss"]:
            best.update(valid_loss=vl, step=step,
                        state={k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        return vl, time.time() - t0

    v0, eval_s = do_eval(0)
    history.append({"step": 0, "lr": 0.0, "train_loss": None, "valid_loss": v0})
    log(f"step 0: valid loss {v0:.4f} (eval took {eval_s:.2f}s)")

    t_loop = time.time()
    t_fit_from = None
    step = 0
    stopped_by_clock = stopped_by_nan = False
    recent = []
    while step < planned:
        if time.time() - t_loop > budget_s:
            stopped_by_clock = True
            log(f"wall-clock limit of {args.max_minutes} min reached at step {step}")
            break
        lr = lr_at(step, planned, args, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_tokens) - span, (args.batch,), generator=gen)
        batch = train_dev[(starts[:, None] + offsets[None, :]).to(device)]
        loss = loss_of(model, batch, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        loss_v = loss.item()  # syncs, so step timing below is real
        if not math.isfinite(loss_v):
            stopped_by_nan = True
            log(f"loss is {loss_v} at step {step}: stopping; the best weights so far are kept")
            break
        recent.append(loss_v)
        row = {"step": step, "lr": lr, "train_loss": loss_v, "valid_loss": None}

        if step <= 3 or step in (10, 20):
            log(f"step {step}: loss {loss_v:.4f}, {time.time() - t_loop:.2f}s since loop start")
        if step == 5:
            t_fit_from = time.time()
        if not args.no_fit and step == max(args.fit_after, 6):
            per_step = (time.time() - t_fit_from) / (step - 5)
            row["valid_loss"], eval_s = do_eval(step)  # a warm evaluation, timed for the fit
            per_step_with_eval = per_step + eval_s / eval_every
            left = budget_s - (time.time() - t_loop) - 2 * eval_s
            fit = step + int(left / per_step_with_eval)
            log(f"speed: {per_step * 1000:.1f} ms/step ({args.batch * args.seq_len / per_step:,.0f} tokens/s), "
                f"eval {eval_s:.2f}s; {fit} steps fit in {args.max_minutes} min")
            if fit < planned:
                planned = max(step + 1, fit)
                eval_every = args.eval_every or max(10, planned // 25)
                log(f"planned steps lowered to {planned} (eval every {eval_every})")
        if (step % eval_every == 0 or step == planned) and row["valid_loss"] is None:
            vl, eval_s = do_eval(step)
            row["valid_loss"] = vl
            log(f"step {step}/{planned}: train {sum(recent) / len(recent):.4f}, valid {vl:.4f}, lr {lr:.2e}, "
                f"{time.time() - t_loop:.0f}s")
            recent = []
        history.append(row)

    loop_s = time.time() - t_loop
    if history[-1]["valid_loss"] is None:
        vl, _ = do_eval(step)
        history[-1]["valid_loss"] = vl
    last_valid = history[-1]["valid_loss"]
    log(f"training done: {step} steps in {loop_s:.0f}s; last valid {last_valid:.4f}, "
        f"best valid {best['valid_loss']:.4f} at step {best['step']}")

    # -------- save the kept weights in bf16, in the layout kiln's fixtures use
    kept_step = step
    if args.keep == "best" and best["state"] is not None:
        model.load_state_dict(best["state"])
        kept_step = best["step"]
    model_dir = os.path.join(args.out_dir, "model")
    shutil.rmtree(model_dir, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer_dir, name), os.path.join(model_dir, name))
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": None, "eos_token_id": [IM_END, EOT], "pad_token_id": EOT,
                   "do_sample": False, "max_new_tokens": 256}, f, indent=2)
        f.write("\n")
    del model, opt, best["state"]
    if device.type == "cuda":
        torch.cuda.empty_cache()

    # -------- reload what was saved: proves transformers loads it; metrics are of the bf16 weights
    saved = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).float().to(device)
    saved.eval()
    final_valid = evaluate(saved, windows, args.batch, device)
    log(f"saved model reloaded: valid loss {final_valid:.4f} (bf16 weights, fp32 compute; bf16 autocast on CUDA), "
        f"perplexity {math.exp(final_valid):.2f}")
    # -------- logs, metrics, plot, samples
    with open(os.path.join(args.out_dir, "log.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "lr", "train_loss", "valid_loss"])
        for r in history:
            w.writerow([r["step"], f"{r['lr']:.6g}",
                        "" if r["train_loss"] is None else f"{r['train_loss']:.5f}",
                        "" if r["valid_loss"] is None else f"{r['valid_loss']:.5f}"])

    tr = [(r["step"], r["train_loss"]) for r in history if r["train_loss"] is not None]
    width = max(1, min(50, len(tr) // 40))  # trailing mean over this many steps
    smooth = [(tr[i][0], sum(v for _, v in tr[max(0, i - width + 1):i + 1]) / (i + 1 - max(0, i - width + 1)))
              for i in range(len(tr))]
    va = [(r["step"], r["valid_loss"]) for r in history if r["valid_loss"] is not None]
    plot_png.line_plot(
        os.path.join(args.out_dir, "loss.png"),
        [(f"train (mean of {width})" if width > 1 else "train", [s for s, _ in smooth], [v for _, v in smooth], (31, 119, 180)),
         ("valid", [s for s, _ in va], [v for _, v in va], (214, 39, 40))],
        title="kiln demo model: loss", xlabel="step", ylabel="loss (nats/token)",
        ylim=(min(v for _, v in smooth + va), min(max(v for _, v in va), 10.0)) if smooth else None)

    n_params = n_total  # tied: parameters() counts the shared embedding once
    metrics = {
        "seed": args.seed,
        "smoke": args.smoke,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "parameters": n_params,
        "parameters_in_matrices": n_mat,
        "vocab_size": vocab,
        "model_vocab_size": vocab_padded,
        "train_tokens": len(train_tokens),
        "valid_tokens": int(windows[:, 1:].numel()),
        "batch": args.batch,
        "seq_len": args.seq_len,
        "tokens_per_step": args.batch * args.seq_len,
        "steps_requested": args.steps,
        "steps_planned": planned,
        "steps_run": step,
        "stopped_by_clock": stopped_by_clock,
        "stopped_by_nan": stopped_by_nan,
        "warmup": warmup,
        "lr": args.lr,
        "min_lr_ratio": args.min_lr_ratio,
        "weight_decay": args.weight_decay,
        "epochs": step * args.batch * args.seq_len / len(train_tokens),
        "train_seconds": loop_s,
        "kept": args.keep,
        "kept_step": kept_step,
        "valid_loss_last_step": last_valid,
        "valid_loss_best": min(v for _, v in va),
        "valid_loss": final_valid,
        "valid_perplexity": math.exp(final_valid),
        "reproduce": f"train.py --seed {args.seed} --epochs 0 --steps {planned} --no-fit --batch {args.batch} "
                     f"--seq-len {args.seq_len} --lr {args.lr} --warmup {warmup}"
                     if not args.smoke else "the smoke run is a pipeline test, not a model",
    }
    with open(os.path.join(args.out_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
        f.write("\n")
    samples = generate_samples(saved, tok, device, args.seed, args.sample_tokens)
    with open(os.path.join(args.out_dir, "samples.json"), "w") as f:
        json.dump(samples, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(args.out_dir, "samples.txt"), "w", encoding="utf-8") as f:
        f.write(f"# kiln demo model, step {kept_step}; greedy, then sampled (temperature 0.8, top-k 40, "
                f"seed {args.seed}); {args.sample_tokens} new tokens at most\n\n")
        for s in samples:
            f.write(f"=== {s['kind']} prompt: {s['prompt']!r}\n")
            f.write(f"--- greedy:\n{s['prompt'] if s['kind'] == 'text' else ''}{s['greedy']}\n")
            f.write(f"--- sampled:\n{s['prompt'] if s['kind'] == 'text' else ''}{s['sampled']}\n\n")
    log("metrics: " + json.dumps({k: metrics[k] for k in ("steps_run", "kept_step", "valid_loss",
                                                          "valid_perplexity", "epochs")}))
    log("greedy: " + repr(PROMPTS[0] + samples[0]["greedy"]))
    log(f"done; outputs in {args.out_dir}")


if __name__ == "__main__":
    main()
