"""Train-step FLOP/s against the CPU's measured matmul peak, and the RL step's time split.

    python -m benchmarks.train_step           # 4 layers, d=512, vocab 4096, B=8 x 512 tokens
    python -m benchmarks.train_step --quick   # 2 layers, d=128, B=2 x 64 tokens; tiny RL step

Prints one JSON line with three parts:
  matmul_peak: jitted fp32 [M,K]@[K,N] (2048^3 by default), FLOP/s = 2·M·N·K / median time;
  train_step: the jitted PPO-clip step (fwd + bwd + AdamW) of a random model on random rows;
    model FLOPs per step = 6·N·B·L + 12·layers·H·hd·B·L², where N counts the parameters used in
    matmuls (attention q/k/v/o, MLP, unembedding; not the embedding lookup or norms), B·L the
    tokens and the second term the attention scores QKᵀ and AV over the full L×L (causal masking
    not discounted); utilization = (FLOPs / median step time) / matmul peak. Matmul and step
    repeats alternate so both see the same machine load.
  rl_step: rollout / advantages+packing / scoring (old + ref log-probs) / update seconds of the
    quickstart setting (configs/quickstart.py: "small" preset, byte tokenizer, built-in servers,
    GRPO, PPO-clip) on the shipped quickstart tasks, medians over the steps after one warm-up step.
    Every step uses the same tasks; rollout lengths still vary with sampling, so a timed step
    may compile a new length bucket (batch_shapes shows the packed shape of each timed step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable

import numpy as np


def _log(msg: str) -> None:
    print(f"[train_step] {msg}", file=sys.stderr, flush=True)


def seconds(fn: Callable[[], object]) -> float:
    """Returns the wall seconds one call of `fn` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def train_step_flops(cfg, batch: int, length: int) -> dict:
    """Returns {"matmul_params", "dense", "attention", "total"} model FLOPs of one train step
    (forward + backward = 3x forward) on `batch` rows of `length` tokens for ModelConfig `cfg`."""
    attn = cfg.d_model * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    mlp = 3 * cfg.d_model * cfg.mlp_dim
    n = cfg.num_layers * (attn + mlp) + cfg.vocab_size * cfg.d_model
    dense = 6 * n * batch * length
    attention = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * batch * length ** 2
    return {"matmul_params": n, "dense": dense, "attention": attention,
            "total": dense + attention}


def make_matmul(m: int, k: int, n: int, seed: int = 0) -> tuple[Callable[[], object], int]:
    """Returns (run once and block, FLOPs per run) for a jitted fp32 [m,k]@[k,n], compiled."""
    import jax
    import jax.numpy as jnp
    ka, kb = jax.random.split(jax.random.key(seed))
    a = jax.random.normal(ka, (m, k), jnp.float32)
    b = jax.random.normal(kb, (k, n), jnp.float32)
    f = jax.jit(jnp.matmul).lower(a, b).compile()
    jax.block_until_ready(f(a, b))
    return (lambda: jax.block_until_ready(f(a, b))), 2 * m * n * k


def matmul_peak(m: int, k: int, n: int, repeats: int = 3) -> float:
    """Returns the measured FLOP/s (median of `repeats`) of a jitted fp32 [m,k]@[k,n]."""
    fn, flops = make_matmul(m, k, n)
    return flops / float(np.median([seconds(fn) for _ in range(repeats)]))


def random_rows(rng: np.random.Generator, batch: int, length: int, vocab: int) -> list[dict]:
    """Returns `batch` random RL rows of `length` + 1 tokens (the first eighth is prompt)."""
    from toolverse_jax.rl.types import Row
    rows = []
    for _ in range(batch):
        n = length + 1  # pack_rows shifts by one: length inputs, length targets
        mask = np.ones(n, bool)
        mask[: n // 8] = False  # a prompt part outside the loss, as in real rows
        rows.append(Row(rng.integers(0, vocab, n).tolist(), mask.tolist(),
                        rng.standard_normal(n).astype(np.float32),
                        np.full(n, -np.log(vocab), np.float32)))
    return rows


def bench_train_step(a: argparse.Namespace) -> dict:
    """Returns the matmul peak and train-step FLOP/s, measured with alternating repeats."""
    import jax

    from toolverse_jax.models import ModelConfig, init_params
    from toolverse_jax.rl.batching import pack_rows
    from toolverse_jax.rl.trainer import (LossConfig, init_train_state, make_optimizer,
                                          make_train_step, score_jit)
    cfg = ModelConfig(vocab_size=a.vocab, d_model=a.d_model, num_layers=a.layers,
                      num_heads=a.heads, num_kv_heads=a.kv_heads, head_dim=a.head_dim,
                      mlp_dim=a.mlp_dim, rope_theta=1_000_000.0, tie_embeddings=True,
                      max_seq_len=max(4096, a.length))
    opt = make_optimizer(1e-4, 1, 1000)
    state = init_train_state(init_params(cfg, jax.random.key(0)), opt)
    step = make_train_step(cfg, LossConfig(name="ppo_clip"), opt, num_micro=1)
    batch = pack_rows(random_rows(np.random.default_rng(0), a.batch, a.length, a.vocab), 0, 1)
    if batch.tokens.shape != (a.batch, a.length):
        raise ValueError(f"packed batch is {batch.tokens.shape}, expected {(a.batch, a.length)}: "
                         "pick --length as a length bucket (a power of two >= 64)")
    old_lp, _ = score_jit(state.params, batch, cfg=cfg)
    batch = batch._replace(old_logprobs=old_lp, ref_logprobs=old_lp)
    t0 = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    mm, mm_flops = make_matmul(a.matmul, a.matmul, a.matmul)
    t_mm, t_step = [], []
    for i in range(a.repeats):
        t_mm.append(seconds(mm))
        t0 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m)
        t_step.append(time.perf_counter() - t0)
        _log(f"repeat {i}: matmul {t_mm[-1]:.3f} s, train step {t_step[-1]:.3f} s")
    peak = mm_flops / float(np.median(t_mm))
    flops = train_step_flops(cfg, a.batch, a.length)
    step_s = float(np.median(t_step))
    achieved = flops["total"] / step_s
    return {
        "matmul_peak": {"shape": [a.matmul] * 3, "dtype": "float32",
                        "flops_per_s": round(peak, 1), "median_s": round(float(np.median(t_mm)), 4)},
        "train_step": {
            "config": {"layers": a.layers, "d_model": a.d_model, "heads": a.heads,
                       "kv_heads": a.kv_heads, "head_dim": a.head_dim, "mlp_dim": a.mlp_dim,
                       "vocab": a.vocab, "batch": a.batch, "length": a.length,
                       "loss": "ppo_clip", "optimizer": "adamw + clip", "dtype": "float32"},
            "flops_formula": "6*N*B*L + 12*layers*heads*head_dim*B*L^2 "
                             "(N = matmul params incl. unembedding)",
            "matmul_params": flops["matmul_params"], "flops_per_step": flops["total"],
            "attention_flops_fraction": round(flops["attention"] / flops["total"], 4),
            "median_step_s": round(step_s, 4), "compile_s": round(compile_s, 3),
            "flops_per_s": round(achieved, 1), "utilization": round(achieved / peak, 4),
            "tokens_per_s": round(a.batch * a.length / step_s, 1),
            "final_loss": float(m["loss"]),
        },
    }


def bench_rl_step(a: argparse.Namespace) -> dict:
    """Returns median seconds per phase of the quickstart RL step (after one warm-up step)."""
    import jax
    import jax.numpy as jnp

    from configs.quickstart import get_config
    from toolverse_jax.envs import Catalog, EnvPool
    from toolverse_jax.models import get_preset, init_params, load_tokenizer
    from toolverse_jax.rl.batching import compute_advantages, pack_rows, trajectory_rows
    from toolverse_jax.rl.rollout import SamplerPolicy, run_rollouts
    from toolverse_jax.rl.spec import RunSpec, sampling_params
    from toolverse_jax.rl.trainer import (init_train_state, make_optimizer, make_train_step,
                                          score_jit)
    from toolverse_jax.tasks import load_or_generate_quickstart_tasks

    config = get_config()
    spec = RunSpec.from_config(config)
    tu = spec.tool_use
    # The run's "trained" BPE is built from its tasks by the training loop; the step-time split
    # here runs on the byte tokenizer (the tiny preset's vocab).
    tokenizer = load_tokenizer("byte" if spec.model.tokenizer == "trained"
                               else spec.model.tokenizer)
    cfg = get_preset(spec.model.preset)
    rcfg = tu.rollout
    sampling = sampling_params(tokenizer, a.rl_max_new_tokens or tu.max_new_tokens,
                               tu.temperature, tu.top_p, tu.top_k)
    tasks = load_or_generate_quickstart_tasks(None, num_tasks=64, horizons=(1, 2, 3), seed=0)
    opt = make_optimizer(config.rl.lr, config.rl.warmup_steps, 1000,
                         weight_decay=config.rl.weight_decay,
                         max_grad_norm=config.rl.max_grad_norm)
    state = init_train_state(init_params(cfg, jax.random.key(spec.seed)), opt)
    ref_params = jax.tree.map(jnp.copy, state.params)
    step_fn = make_train_step(cfg, spec.rl.loss, opt, spec.num_micro)
    temp = tu.temperature
    phases: dict[str, list[float]] = {k: [] for k in
                                      ("rollout_s", "advantages_s", "scoring_s", "update_s")}
    counts: dict[str, list[float]] = {"policy_tokens": [], "batch_shape": []}
    n_tasks, group = a.rl_tasks, a.rl_group
    with EnvPool(Catalog.default(kinds=("builtin",)), num_workers=1) as pool:
        # The same tasks every step (fresh sampling keys), so the timed steps mostly reuse the
        # length buckets the warm-up step compiled.
        tasks_now = tasks[:n_tasks]
        for s in range(1 + a.rl_steps):
            t0 = time.perf_counter()
            trajs = run_rollouts(SamplerPolicy(state.params, cfg, sampling), tasks_now, group,
                                 pool, tokenizer, rcfg, jax.random.key(s), seed=s)
            t1 = time.perf_counter()
            turn_adv = compute_advantages(trajs, "grpo", {}, rcfg.max_turns + 1)
            rows = trajectory_rows(trajs, turn_adv)
            batch = pack_rows(rows, tokenizer.pad_id, spec.num_micro)
            t2 = time.perf_counter()
            old_lp, _ = score_jit(state.params, batch, cfg=cfg, temperature=temp)
            ref_lp, _ = score_jit(ref_params, batch, cfg=cfg, temperature=temp)
            batch = batch._replace(old_logprobs=old_lp, ref_logprobs=ref_lp)
            jax.block_until_ready(batch)
            t3 = time.perf_counter()
            state, m = step_fn(state, batch)
            jax.block_until_ready(m)
            t4 = time.perf_counter()
            times = dict(zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)))
            _log(f"rl step {s}{' (warm-up)' if s == 0 else ''}: "
                 + ", ".join(f"{k} {v:.2f}" for k, v in times.items())
                 + f", batch {tuple(batch.tokens.shape)}")
            if s == 0:
                continue
            for k, v in times.items():
                phases[k].append(v)
            counts["policy_tokens"].append(sum(sum(t.policy_mask) for t in trajs))
            counts["batch_shape"].append(list(batch.tokens.shape))
    med = {k: round(float(np.median(v)), 4) for k, v in phases.items()}
    total = sum(med.values())
    return {
        "setting": {"preset": config.model.preset, "tokenizer": config.model.tokenizer,
                    "tasks": "shipped quickstart (64 tasks, horizons 1-3)",
                    "tasks_per_step": n_tasks, "group_size": group,
                    "max_new_tokens": sampling.max_new_tokens, "max_turns": rcfg.max_turns,
                    "advantage": "grpo", "loss": spec.rl.loss.name, "env_workers": 1,
                    "timed_steps": a.rl_steps},
        **med,
        "step_s": round(total, 4),
        "fractions": {k.removesuffix("_s"): round(v / total, 4) for k, v in med.items()},
        "policy_tokens_per_step": counts["policy_tokens"],
        "batch_shapes": counts["batch_shape"],
    }


def run(args: argparse.Namespace) -> dict:
    """Returns the benchmark's JSON record for parsed `args` (see `parse_args`)."""
    import jax
    out = {"benchmark": "train_step", **bench_train_step(args)}
    if not args.skip_rl:
        out["rl_step"] = bench_rl_step(args)
    out["jax_version"] = jax.__version__
    out["cpu_count"] = os.cpu_count()
    out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    out["quick"] = bool(args.quick)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--mlp-dim", type=int, default=1536)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--matmul", type=int, default=2048, help="M = K = N of the peak matmul")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rl-tasks", type=int, default=8, help="tasks per RL step")
    p.add_argument("--rl-group", type=int, default=8, help="rollouts per task")
    p.add_argument("--rl-steps", type=int, default=1, help="timed RL steps after the warm-up")
    p.add_argument("--rl-max-new-tokens", type=int, default=0, help="0 = the config's")
    p.add_argument("--skip-rl", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="d=128, B=2 x 64, 512^3 matmul; RL step 1 task x 2, 8 new tokens")
    a = p.parse_args(argv)
    if a.quick:
        a.layers, a.d_model, a.heads, a.kv_heads, a.head_dim, a.mlp_dim = 2, 128, 4, 2, 32, 256
        a.vocab, a.batch, a.length, a.matmul, a.repeats = 512, 2, 64, 512, 3
        a.rl_tasks, a.rl_group, a.rl_steps, a.rl_max_new_tokens = 1, 2, 1, 8
    return a


def main(argv=None) -> dict:
    out = run(parse_args(argv))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
