"""One GRPO step, ours vs TRL's `GRPOTrainer`, on the same tiny Qwen3 weights: seconds per step.

    python -m benchmarks.grpo_trl            # 2 layers, d=256, 4 prompts x 8 completions x 64 tokens
    python -m benchmarks.grpo_trl --quick    # 2 layers, d=128, 2 prompts x 4 completions x 16 tokens

Both sides run the same single-turn GRPO step: sample G completions of each prompt at
temperature 1, score them with one reward function, group-normalize, one PPO-clip update with
token-mean aggregation (TRL's loss_type="dapo"), AdamW with global-norm clipping at 1.0, no KL
(beta = 0), one update per generation. The weights are one random HF `Qwen3ForCausalLM`, saved
and loaded into ours with `load_hf_checkpoint`; the tokenizer is a byte-level BPE trained here on
the shipped quickstart instructions (it is both sides' `processing_class`). Completions have a
fixed length (min_new_tokens = max_new_tokens; our sampler gets no stop ids) so both sides do the
same work. TRL needs `pip install trl` (it is not a test dependency); without it the baseline is
recorded as skipped with the reason.

Ours runs as our RL loop does: the sampler prefills each distinct prompt once and copies its
KV cache to the prompt's G rows (`sampling.generate`), the advantages are the loop's jitted
estimator (`rl.registry.jitted_advantage`). Ours runs twice: as the RL loop's default (`ours`,
`rl.share_prefix`: the update runs each prompt once, as a shared prefix whose keys and values
the G rows attend to), and with `rl.share_prefix=False` (`ours_plain`: every row holds its
prompt; same loss and gradient over more tokens). Each is split into rollout (jitted KV-cache
sampler, rewards, advantages, packing), scoring (the trainer's log-probs of the sampled tokens
before the update = PPO's old log-probs) and update (the jitted train step).
TRL with one update per generation takes the old log-probs from the same forward as the loss,
so `ours_step_no_scoring_s` is the like-for-like figure. Medians over the steps after the first
(compile / warm-up); ours and TRL run one after the other in one process, torch with as many
threads as XLA's CPU client.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np


def _log(msg: str) -> None:
    print(f"[grpo_trl] {msg}", file=sys.stderr, flush=True)


def reward_text(text: str) -> float:
    """Returns the benchmark's reward of a completion: its fraction of vowels (varies per sample,
    so group advantages are non-zero; the value is irrelevant to the timing)."""
    return sum(c in "aeiouAEIOU" for c in text) / max(len(text), 1)


def quickstart_instructions() -> list[str]:
    """Returns the distinct instructions of the shipped quickstart tasks, in file order."""
    from toolverse_jax.tasks.gust import QUICKSTART_FILE
    out: list[str] = []
    with open(QUICKSTART_FILE) as f:
        for line in f:
            text = json.loads(line)["instruction"]
            if text not in out:
                out.append(text)
    return out


def fixed_length_prompts(tok, n: int, length: int) -> list[str]:
    """Returns `n` prompts of exactly `length` tokens: instruction prefixes cut at `length` ids
    whose text re-encodes to the same ids (so TRL, which gets text, sees the same tokens). One
    length = one compiled shape on our side, so the timed steps are not recompiles."""
    out = []
    for text in quickstart_instructions():
        ids = tok.encode(text)[:length]
        cut = tok.decode(ids)
        if len(ids) == length and tok.encode(cut) == ids:
            out.append(cut)
    if len(out) < n:
        raise ValueError(f"only {len(out)} shipped instructions give {length}-token prompts, "
                         f"need {n} (lower --prompt-len, --prompts or --steps)")
    return [out[i % len(out)] for i in range(n)]


def build_models(a: argparse.Namespace, tmp: str):
    """Returns (our tokenizer, HF tokenizer, HF model, our ModelConfig, our params)."""
    import jax.numpy as jnp
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from toolverse_jax.models import load_hf_checkpoint
    from toolverse_jax.models.tokenizer import padded_vocab_size, train_bpe_tokenizer

    texts = quickstart_instructions()
    tok = train_bpe_tokenizer(texts, a.tokenizer_vocab, os.path.join(tmp, "tokenizer"))
    hf_tok = AutoTokenizer.from_pretrained(os.path.join(tmp, "tokenizer"))
    if hf_tok.pad_token is None:
        hf_tok.pad_token = hf_tok.convert_ids_to_tokens(tok.pad_id)
    torch.manual_seed(a.seed)
    cfg = Qwen3Config(vocab_size=padded_vocab_size(tok.vocab_size), hidden_size=a.d_model,
                      intermediate_size=a.mlp_dim, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      head_dim=a.head_dim, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, max_position_embeddings=1024,
                      pad_token_id=tok.pad_id, eos_token_id=tok.eos_id, bos_token_id=None)
    hf = Qwen3ForCausalLM(cfg)
    hf.save_pretrained(os.path.join(tmp, "model"), safe_serialization=True)
    ours_cfg, params = load_hf_checkpoint(os.path.join(tmp, "model"), dtype=jnp.float32)
    return tok, hf_tok, hf, ours_cfg, params


def bench_ours(a, tok, cfg, params, prompts: list[str], share_prefix: bool) -> dict:
    """Returns our per-step times (rollout / scoring / update) over a.steps GRPO steps;
    share_prefix: the update runs each prompt once (rl.share_prefix)."""
    import jax
    import jax.numpy as jnp

    from toolverse_jax.rl.registry import AdvantageInputs, jitted_advantage
    from toolverse_jax.rl.types import Row
    from toolverse_jax.rl.batching import pack_rows
    from toolverse_jax.rl.trainer import (LossConfig, init_train_state, make_optimizer,
                                          make_train_step, score_jit)
    from toolverse_jax.sampling import SamplingParams, generate

    opt = make_optimizer(a.lr, 1, a.steps)
    # A copy: the train step donates its state, and each run starts from the same weights.
    state = init_train_state(jax.tree.map(jnp.copy, params), opt)
    step_fn = make_train_step(cfg, LossConfig(name="ppo_clip", aggregation="token_mean"), opt)
    sp = SamplingParams(max_new_tokens=a.new_tokens, temperature=1.0, stop_token_ids=(),
                        pad_id=tok.pad_id)
    advantage = jitted_advantage("grpo", {})
    key = jax.random.key(a.seed)
    times = {"rollout_s": [], "scoring_s": [], "update_s": []}
    rewards_mean = []
    for s in range(a.steps):
        batch_prompts = [tok.encode(p) for p in prompts[s * a.prompts:(s + 1) * a.prompts]]
        rep = [p for p in batch_prompts for _ in range(a.group)]
        group_ids = np.repeat(np.arange(a.prompts), a.group)
        key, sub = jax.random.split(key)
        t0 = time.perf_counter()
        out = generate(state.params, cfg, rep, sp, sub)
        texts = [tok.decode(list(map(int, t[:n]))) for t, n in zip(out.tokens, out.lengths)]
        rewards = np.array([reward_text(t) for t in texts], np.float32)
        n = len(rewards)
        adv = np.asarray(advantage(AdvantageInputs(
            rewards=rewards, group_ids=group_ids, valid=np.ones(n, bool),
            turn_mask=np.ones((n, 1), bool))))[:, 0]
        rows = []
        for p, t, lp, n, A in zip(rep, out.tokens, out.logprobs, out.lengths, adv):
            comp = list(map(int, t[:n]))
            rows.append(Row(p + comp, [0] * len(p) + [1] * n,
                            [0.0] * len(p) + [float(A)] * n,
                            [0.0] * len(p) + list(map(float, lp[:n]))))
        batch = pack_rows(rows, tok.pad_id, share_prefix=share_prefix)
        t1 = time.perf_counter()
        old, _ = score_jit(state.params, batch, cfg=cfg)
        old = jax.block_until_ready(old)
        t2 = time.perf_counter()
        state, m = step_fn(state, batch._replace(old_logprobs=old, ref_logprobs=old))
        jax.block_until_ready(m)
        t3 = time.perf_counter()
        for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
            times[k].append(v)
        rewards_mean.append(float(rewards.mean()))
        _log(f"ours{'' if share_prefix else ' plain'} step {s}: "
             f"rollout {t1 - t0:.3f} s, scoring {t2 - t1:.3f} s, "
             f"update {t3 - t2:.3f} s, loss {float(m['loss']):.4f}")
    med = {k: float(np.median(v[1:])) for k, v in times.items()}
    return {**{k: round(v, 4) for k, v in med.items()},
            "step_s": round(sum(med.values()), 4),
            "step_no_scoring_s": round(med["rollout_s"] + med["update_s"], 4),
            "first_step_s": round(sum(v[0] for v in times.values()), 3),
            "reward_mean": round(float(np.mean(rewards_mean)), 4)}


def bench_trl(a, hf_tok, hf, prompts: list[str]) -> dict:
    """Returns TRL GRPOTrainer's per-step times over a.steps steps on the same prompts."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class Timer(TrainerCallback):
        def __init__(self):
            self.starts, self.times = [], []

        def on_step_begin(self, args, state, control, **kw):
            self.starts.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.starts[-1])
            _log(f"trl step {len(self.times) - 1}: {self.times[-1]:.3f} s")

    def reward(completions, **kw):
        return [reward_text(c) for c in completions]

    timer = Timer()
    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, report_to="none",
            per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
            steps_per_generation=1, num_iterations=1, gradient_accumulation_steps=1,
            max_completion_length=a.new_tokens, temperature=1.0, top_k=0, top_p=1.0,
            generation_kwargs={"min_new_tokens": a.new_tokens}, beta=0.0, loss_type="dapo",
            epsilon=0.2, learning_rate=a.lr, weight_decay=0.0, max_grad_norm=1.0,
            lr_scheduler_type="constant", warmup_steps=0, max_steps=a.steps,
            gradient_checkpointing=False, logging_steps=1, save_strategy="no",
            shuffle_dataset=False, dataloader_num_workers=0, seed=a.seed, disable_tqdm=True)
        trainer = GRPOTrainer(model=hf, reward_funcs=reward, args=args,
                              train_dataset=Dataset.from_dict({"prompt": prompts}),
                              processing_class=hf_tok, callbacks=[timer])
        trainer.train()
        hist = trainer.state.log_history
        lengths = [r["completions/mean_length"] for r in hist if "completions/mean_length" in r]
        seen = [r["num_tokens"] for r in hist if "num_tokens" in r]
    return {"step_s": round(float(np.median(timer.times[1:])), 4),
            "first_step_s": round(timer.times[0], 3),
            "completion_mean_length": round(float(np.mean(lengths)), 2) if lengths else None,
            # prompt + completion tokens per step as TRL counts them (== ours when prompts match)
            "tokens_per_step": float(np.median(np.diff([0.0] + seen))) if seen else None,
            "torch_threads": torch.get_num_threads()}


def run(a: argparse.Namespace) -> dict:
    import jax

    try:
        threads = len(os.sched_getaffinity(0))
    except AttributeError:
        threads = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        tok, hf_tok, hf, cfg, params = build_models(a, tmp)
        prompts = fixed_length_prompts(tok, a.prompts * a.steps, a.prompt_len)
        ours = bench_ours(a, tok, cfg, params, prompts, share_prefix=True)
        plain = bench_ours(a, tok, cfg, params, prompts, share_prefix=False)
        try:
            import torch
            import trl
        except ImportError as e:
            theirs, version = {"skipped": f"TRL not installed ({e}); pip install trl"}, None
        else:
            torch.set_num_threads(threads)
            theirs, version = bench_trl(a, hf_tok, hf, prompts), trl.__version__
    ours["tokens_per_step"] = float(a.prompts * a.group * (a.prompt_len + a.new_tokens))
    plain["tokens_per_step"] = ours["tokens_per_step"]
    rec = {"benchmark": "grpo_trl", "ours": ours, "ours_plain": plain, "trl": theirs}
    if "step_s" in theirs:
        rec["speedup_vs_trl"] = round(theirs["step_s"] / ours["step_no_scoring_s"], 3)
        rec["speedup_vs_trl_with_scoring"] = round(theirs["step_s"] / ours["step_s"], 3)
        rec["speedup_vs_trl_plain"] = round(theirs["step_s"] / plain["step_no_scoring_s"], 3)
    rec["config"] = {"layers": a.layers, "d_model": a.d_model, "heads": a.heads,
                     "kv_heads": a.kv_heads, "head_dim": a.head_dim, "mlp_dim": a.mlp_dim,
                     "vocab": int(cfg.vocab_size), "prompts": a.prompts, "group": a.group,
                     "prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "steps": a.steps, "lr": a.lr,
                     "dtype": "float32", "loss": "ppo_clip token-mean (TRL dapo), beta 0"}
    rec["versions"] = {"jax": jax.__version__, "trl": version}
    rec["threads"] = threads
    rec["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    rec["quick"] = bool(a.quick)
    return rec


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--mlp-dim", type=int, default=768)
    p.add_argument("--tokenizer-vocab", type=int, default=1024)
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (all prompts)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=5, help="GRPO steps per side (first excluded)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="d=128, 2 prompts x 4 completions, 16 + 16 tokens, 3 steps")
    a = p.parse_args(argv)
    if a.quick:
        a.d_model, a.heads, a.kv_heads, a.head_dim, a.mlp_dim = 128, 4, 2, 32, 256
        a.tokenizer_vocab, a.prompts, a.group, a.new_tokens, a.steps = 512, 2, 4, 16, 3
        a.prompt_len = 16
    if a.steps < 2:
        p.error("--steps must be >= 2 (the first step is excluded from the medians)")
    return a


def main(argv=None) -> dict:
    out = run(parse_args(argv))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
