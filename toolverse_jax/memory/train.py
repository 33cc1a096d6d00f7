"""The Memory-R2 training run: SFT warm-start on gold memory operations, then LoGo-GRPO with the
session curriculum. `python -m experiments.train --config configs/memory_r2.py --workdir DIR`.

Writes DIR/metrics.jsonl (`eval/success_rate` = greedy QA exact match at the current curriculum
horizon; `eval/qa_em_<S>` / `eval/qa_f1_<S>` at every evaluated horizon), tensorboard events,
orbax checkpoints whose metadata holds the curriculum state (resume continues at the same
stage) and a learning-curve PNG. Reuses the RL loop's model builder, metrics log, checkpointer
and the trainer's step; only the rollout (multi-session, three roles) and the advantage
(LoGo-GRPO) differ from `toolverse_jax.rl.loop`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from toolverse_jax.envs import Catalog, EnvPool
from toolverse_jax.memory import rollout as mr
from toolverse_jax.memory.curriculum import Curriculum
from toolverse_jax.memory.data import generate_conversations, load_locomo
from toolverse_jax.memory.logo import logo_advantages, trajectory_rows
from toolverse_jax.memory.roles import ROLES, check_roles
from toolverse_jax.models import load_tokenizer
from toolverse_jax.rl.checkpoint import RunCheckpointer
from toolverse_jax.rl.loop import MetricsLog, build_model, phase_optimizers, plot_curve
from toolverse_jax.rl.rollout import SamplerPolicy
from toolverse_jax.rl.trainer import (LossConfig, TrainBatch, init_train_state,
                                      make_train_step, pack_rows, score_jit)
from toolverse_jax.sampling import SamplingParams
from toolverse_jax.sharding import batch_sharding, make_mesh, shard_params, sharding_context


def rollout_config(config: ConfigDict) -> mr.MemoryRolloutConfig:
    m = config.memory
    return mr.MemoryRolloutConfig(max_facts=m.max_facts, manager_k=m.manager_k,
                                  answer_k=m.answer_k, max_ops=m.max_ops, qa_metric=m.qa_metric,
                                  comp_coef=m.comp_coef, comp_theta=m.comp_theta)


def loss_config(config: ConfigDict, name: str) -> LossConfig:
    r = config.rl
    return LossConfig(name=name, clip_eps_low=r.clip_eps_low, clip_eps_high=r.clip_eps_high,
                      kl_coef=r.kl_coef, entropy_coef=r.entropy_coef, tis_cap=r.tis_cap,
                      aggregation=r.aggregation,
                      temperature=config.memory.temperature if name != "sft" else 1.0)


def pad_rows(rows: list[dict], pad_id: int, multiple: int) -> list[dict]:
    """Returns rows padded with empty (all-masked) rows to a power of two (>= multiple), so the
    train step compiles for a handful of batch shapes only."""
    n = max(len(rows), multiple)
    target = max(1 << (n - 1).bit_length(), multiple)
    blank = {"tokens": [pad_id, pad_id], "policy_mask": [False, False],
             "advantages": np.zeros(2, np.float32), "sample_logprobs": np.zeros(2, np.float32)}
    return rows + [blank] * (target - len(rows))


def qa_metrics(trajs, prefix: str) -> dict[str, float]:
    """Returns QA / memory-operation summary scalars of a batch of trajectories."""
    valid = [t for t in trajs if not t.infra_failed]
    out = {f"{prefix}/infra_failed": float(len(trajs) - len(valid))}
    if not valid:
        return out
    out[f"{prefix}/qa_em"] = float(np.mean([t.qa_em for t in valid]))
    out[f"{prefix}/qa_f1"] = float(np.mean([t.qa_f1 for t in valid]))
    out[f"{prefix}/reward"] = float(np.mean([t.reward for t in valid]))
    out[f"{prefix}/compression"] = float(np.mean([t.compression for t in valid]))
    kinds: dict[str, list[float]] = {}
    for t in valid:
        for k, e in zip(t.kinds, t.em):
            kinds.setdefault(k, []).append(e)
    for k, v in kinds.items():
        out[f"{prefix}/qa_em_{k}"] = float(np.mean(v))
    n_sessions = max(sum(1 for c in t.calls if c.role == "manager") for t in valid)
    for op in ("ADD", "UPDATE", "DELETE", "NOOP", "invalid", "failed"):
        out[f"{prefix}/ops_{op}"] = float(np.mean([t.op_counts[op] for t in valid])) / max(
            n_sessions, 1)
    return out


def run_memory_training(config: ConfigDict, workdir: str) -> dict:
    """Runs (or resumes) Memory-R2 training; returns the final summary dict."""
    os.makedirs(workdir, exist_ok=True)
    roles = check_roles(tuple(config.memory.roles))
    tokenizer = load_tokenizer(config.model.tokenizer)
    cfg, params0 = build_model(config, tokenizer)
    mesh = make_mesh(tuple(config.mesh.shape))
    mcfg = rollout_config(config)
    stop_ids = tuple(tokenizer.stop_ids_for(["<|im_end|>", "<|endoftext|>"]))

    def policies(params, temperature: float) -> dict:
        return {r: SamplerPolicy(params, cfg, SamplingParams(
            max_new_tokens=config.memory.max_new_tokens[r], temperature=temperature,
            top_p=config.memory.top_p if temperature > 0 else 1.0, top_k=0,
            stop_token_ids=stop_ids, pad_id=tokenizer.pad_id)) for r in ROLES}

    d, lg = config.data, config.logo
    eval_sets = {s: generate_conversations(config.eval.num_convs, s, d.eval_seed, d.max_questions)
                 for s in sorted(set(config.eval.horizons) | set(config.curriculum.stages))}
    locomo = load_locomo(d.locomo_path, d.locomo_limit or None) if d.locomo_path else []
    sft_steps, rl_steps = config.sft.steps, config.rl.steps
    total = sft_steps + rl_steps
    sft_opt, rl_opt = phase_optimizers(config)
    num_micro = config.train.num_micro
    curriculum = Curriculum(tuple(config.curriculum.stages), config.curriculum.threshold,
                            config.curriculum.min_evals)

    with sharding_context(mesh):
        params0 = shard_params(params0, cfg, mesh)
        state = init_train_state(params0, sft_opt if sft_steps else rl_opt)
        ref_params = None
        ckpt = RunCheckpointer(workdir, keep=config.train.keep_checkpoints)
        expect = {"model_config": dataclasses.asdict(cfg), "sft_steps": sft_steps,
                  "seed": config.seed, "method": "memory_r2"}
        start, latest = 0, ckpt.latest_step()
        if latest is not None:
            if latest > sft_steps or sft_steps == 0:
                state = init_train_state(state.params, rl_opt)
            state, ref_params, meta = ckpt.restore(
                latest, state, params0, expect,
                defaults={"model_config": dataclasses.asdict(type(cfg)())})
            start = meta["global_step"]
            curriculum = Curriculum.from_json(meta["curriculum"], config.curriculum.stages)
            print(f"resumed from {ckpt.directory}/{latest} at step {start}, curriculum stage "
                  f"{curriculum.stage} ({curriculum.num_sessions} sessions)", flush=True)
        log = MetricsLog(workdir, start if latest is not None else None)
        sft_step_fn = make_train_step(cfg, loss_config(config, "sft"), sft_opt, num_micro)
        rl_step_fn = make_train_step(cfg, loss_config(config, config.rl.loss), rl_opt, num_micro)
        catalog = Catalog.default(kinds=("builtin",), include_hidden=True)

        def shard_batch(batch: TrainBatch) -> TrainBatch:
            return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.ndim)), batch)

        def evaluate(params, pool, step: int) -> dict:
            t0 = time.time()
            greedy = mr.ModelActor(policies(params, 0.0))
            m = {}
            for s, convs in eval_sets.items():
                if s not in config.eval.horizons and s != curriculum.num_sessions:
                    continue
                trajs, _ = mr.rollout_conversations(greedy, convs, 1, pool, tokenizer, mcfg,
                                                    jax.random.key(0), seed=0)
                for k, v in qa_metrics(trajs, "eval").items():
                    m[f"{k}_{s}"] = v
            if locomo:
                trajs, _ = mr.rollout_conversations(greedy, locomo, 1, pool, tokenizer, mcfg,
                                                    jax.random.key(0), seed=0)
                m.update({k.replace("eval/", "eval_locomo/"): v
                          for k, v in qa_metrics(trajs, "eval").items()})
            acc = m.get(f"eval/qa_em_{curriculum.num_sessions}", 0.0)
            m["eval/success_rate"] = acc
            m["curriculum/advanced"] = float(curriculum.observe(step, acc)) \
                if step > sft_steps else 0.0
            m["eval/time_s"] = time.time() - t0
            return m

        def sft_rows(step: int, pool) -> list[dict]:
            convs = generate_conversations(config.sft.convs_per_step, config.sft.num_sessions,
                                           d.train_seed * 7919 + step, d.max_questions)
            trajs, _ = mr.rollout_conversations(mr.GoldActor(tokenizer), convs, 1, pool,
                                                tokenizer, mcfg, jax.random.key(step))
            rows = trajectory_rows(trajs, [1.0] * len(trajs), roles)
            rng = np.random.default_rng([config.seed, step])
            if len(rows) > config.sft.rows_per_step:
                rows = [rows[i] for i in sorted(rng.choice(len(rows), config.sft.rows_per_step,
                                                           replace=False))]
            return rows

        def rl_rows(step: int, params, pool) -> tuple[list[dict], dict]:
            t0 = time.time()
            s_now = curriculum.num_sessions
            convs = generate_conversations(config.rl.convs_per_step, s_now,
                                           d.train_seed * 1_000_003 + step + 1, d.max_questions)
            g = config.rl.group_size
            rng = np.random.default_rng([config.seed, step, 17])
            plan = mr.plan_locals(convs, g, lg.local_fraction, rng) if lg.local_coef > 0 else []
            key = jax.random.fold_in(jax.random.key(config.seed), step)
            k1, k2 = jax.random.split(key)
            actor = mr.ModelActor(policies(params, config.memory.temperature))
            trajs, snaps = mr.rollout_conversations(
                actor, convs, g, pool, tokenizer, mcfg, k1, seed=0,
                snapshot_at=[(r, s) for _, r, s in plan])
            t_global = time.time() - t0
            local = mr.rollout_local(actor, mr.ModelActor(policies(params, 0.0)), convs, plan,
                                     snaps, lg.inner_n, pool, tokenizer, mcfg, k2, seed=0,
                                     group_offset=len(convs)) if plan else []
            a_g, a_l = logo_advantages(
                [t.reward for t in trajs], [t.group_id for t in trajs],
                [not t.infra_failed for t in trajs], [t.reward for t in local],
                [t.group_id for t in local], [not t.infra_failed for t in local],
                lg.local_coef, config.rl.adv_eps)
            rows = trajectory_rows(trajs, a_g, roles) + trajectory_rows(local, a_l, roles, True)
            n_all = len(rows)
            # Rows with advantage 0 carry no gradient; dropping them only changes the token-mean
            # normalizer, and saves most of the update's compute when groups agree.
            rows = [r for r in rows if np.any(np.abs(r["advantages"]) > 1e-8)]
            m = qa_metrics(trajs, "rollout")
            m["rollout/success_rate"] = m.get("rollout/qa_em", 0.0)
            if local:
                lm = qa_metrics(local, "local")
                m.update({k: v for k, v in lm.items() if k in ("local/qa_em", "local/reward")})
                m["local/groups"] = float(len(plan))
                m["local/nonzero_frac"] = float(np.mean(np.abs(a_l) > 1e-8))
            m["global/nonzero_frac"] = float(np.mean(np.abs(a_g) > 1e-8))
            m["rollout/rows"] = float(n_all)
            m["rollout/rows_trained"] = float(len(rows))
            m["curriculum/sessions"] = float(s_now)
            m["time/rollout_global_s"] = t_global
            m["time/rollout_s"] = time.time() - t0
            return rows, m

        pbar = None
        if config.train.progress:
            from tqdm import tqdm
            pbar = tqdm(total=total, initial=start, desc="memory_r2", dynamic_ncols=True)
        with EnvPool(catalog, num_workers=config.env.num_workers,
                     call_timeout_s=config.env.call_timeout_s) as pool:
            if start == 0 and config.train.eval_every > 0:
                log.write(0, {**evaluate(state.params, pool, 0), "phase": "init",
                              "curriculum/sessions": float(curriculum.num_sessions)})
            for step in range(start, total):
                t0 = time.time()
                if step < sft_steps:
                    rows = sft_rows(step, pool)
                    batch = shard_batch(pack_rows(pad_rows(rows, tokenizer.pad_id, num_micro),
                                                  tokenizer.pad_id, num_micro))
                    state, m = sft_step_fn(state, batch)
                    metrics = {k: float(v) for k, v in jax.device_get(m).items()}
                    metrics["phase"] = "sft"
                else:
                    if step == sft_steps:
                        # The warm-started policy is the frozen reference; RL's optimizer
                        # starts fresh.
                        state = init_train_state(state.params, rl_opt)
                    if ref_params is None and config.rl.kl_coef > 0:
                        ref_params = jax.tree.map(jnp.copy, state.params)
                    rows, metrics = rl_rows(step, state.params, pool)
                    metrics["phase"] = "rl"
                    if rows:
                        t1 = time.time()
                        batch = shard_batch(pack_rows(pad_rows(rows, tokenizer.pad_id, num_micro),
                                                      tokenizer.pad_id, num_micro))
                        old_lp, _ = score_jit(state.params, batch, cfg=cfg,
                                              temperature=config.memory.temperature)
                        ref_lp = old_lp
                        if ref_params is not None:
                            ref_lp, _ = score_jit(ref_params, batch, cfg=cfg,
                                                  temperature=config.memory.temperature)
                        batch = batch._replace(old_logprobs=old_lp, ref_logprobs=ref_lp)
                        state, m = rl_step_fn(state, batch)
                        metrics.update({k: float(v) for k, v in jax.device_get(m).items()})
                        metrics["time/update_s"] = time.time() - t1
                done = step + 1
                last = done == total
                rl_done = done - sft_steps
                if config.train.eval_every > 0 and (
                        last or done == sft_steps or
                        (rl_done > 0 and rl_done % config.train.eval_every == 0)):
                    metrics.update(evaluate(state.params, pool, done))
                metrics["curriculum/stage"] = float(curriculum.stage)
                metrics["time/step_s"] = time.time() - t0
                log.write(done, metrics)
                if last or done % config.train.checkpoint_every == 0 or done == sft_steps:
                    ckpt.save(done, state, ref_params,
                              {**expect, "global_step": done, "has_ref": ref_params is not None,
                               "curriculum": curriculum.to_json()})
                if pbar is not None:
                    pbar.update(1)
                    pbar.set_postfix({k.split("/")[-1]: round(v, 3) for k, v in metrics.items()
                                      if k in ("loss", "rollout/qa_em", "eval/success_rate")})
        if pbar is not None:
            pbar.close()
        records = log.records()
        log.close()
        ckpt.close()
    plot_curve(records, os.path.join(workdir, "learning_curve.png"))
    curves = {s: [(r["step"], r[f"eval/qa_em_{s}"]) for r in records if f"eval/qa_em_{s}" in r]
              for s in eval_sets}
    summary = {"final_step": total, "qa_em_curves": {str(s): c for s, c in curves.items() if c},
               "final_qa_em": {str(s): c[-1][1] for s, c in curves.items() if c},
               "curriculum": curriculum.to_json(), "local_coef": lg.local_coef}
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary
