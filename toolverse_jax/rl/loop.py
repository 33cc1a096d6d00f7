"""The training run: SFT warm-start on gold chains, then RL over live MCP rollouts.

Reads only the config. Writes WORKDIR/metrics.jsonl (one JSON object per logged step),
tensorboard events, orbax checkpoints (resume = rerun the same command) and a learning-curve PNG.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from toolverse_jax.envs import Catalog, EnvPool, episode_tools
from toolverse_jax.models import get_preset, init_params, load_hf_checkpoint, load_tokenizer
from toolverse_jax.models.config import ModelConfig
from toolverse_jax.models.tokenizer import ByteTokenizer, train_bpe_tokenizer
from toolverse_jax.rl.batching import (compute_advantages, demonstration_row,
                                       trajectory_rows)
from toolverse_jax.rl.checkpoint import RunCheckpointer
from toolverse_jax.rl.rollout import (RolloutConfig, SamplerPolicy, gold_demonstration,
                                      observation_text, prompt_tool_specs, run_rollouts)
from toolverse_jax.rl.trainer import (LossConfig, init_train_state, make_optimizer,
                                      make_train_step, score_jit)
from toolverse_jax.sampling import SamplingParams
from toolverse_jax.sharding import make_mesh, shard_params, sharding_context
from toolverse_jax.sharding import distributed
from toolverse_jax.sharding.distributed import barrier, gather_rows, local_params, process_slice
from toolverse_jax.tasks import Task, load_or_generate_quickstart_tasks, read_tasks, split_tasks


def build_tokenizer(config: ConfigDict, train_tasks: list[Task], catalog: Catalog,
                    workdir: str):
    """Returns the run's tokenizer. config.model.tokenizer == "trained": a byte-level BPE with
    config.model.tokenizer_vocab ids, trained on the train split's gold demonstrations (their
    servers' full tool lists) and saved to WORKDIR/tokenizer; a resumed run loads that copy."""
    m = config.model
    if m.tokenizer != "trained":
        return load_tokenizer(m.tokenizer)
    path = os.path.join(workdir, "tokenizer")
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return load_tokenizer(path)
    byte, rcfg = ByteTokenizer(), _rollout_config(config)
    texts, tools = [], {}
    for task in train_tasks:
        if task.servers not in tools:
            tools[task.servers] = episode_tools(catalog, task.servers)[0]
        toks, _, _ = gold_demonstration(task, tools[task.servers], byte, rcfg)
        texts.append(byte.decode(toks))
    tok = train_bpe_tokenizer(texts, int(m.get("tokenizer_vocab", 1024)), path)
    print(f"tokenizer: trained {tok.num_ids} ids on {len(texts)} gold chains -> {path}",
          flush=True)
    return tok


def build_model(config: ConfigDict, tokenizer) -> tuple[ModelConfig, Any]:
    """Returns (ModelConfig, initial params) from an HF checkpoint or a preset. With a trained
    tokenizer the preset's vocab_size becomes the tokenizer's (padded) size."""
    m = config.model
    if m.checkpoint:
        cfg, params = load_hf_checkpoint(m.checkpoint, dtype=jnp.dtype(m.dtype))
        cfg = cfg.replace(remat=m.remat)
    else:
        cfg = get_preset(m.preset, dtype=m.dtype, param_dtype=m.dtype, remat=m.remat)
        if m.tokenizer == "trained":
            cfg = cfg.replace(vocab_size=tokenizer.vocab_size)
        params = init_params(cfg, jax.random.key(config.seed))
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"tokenizer {m.tokenizer!r} has {tokenizer.vocab_size} ids but model vocab_size is "
            f"{cfg.vocab_size}; pick a matching preset or tokenizer")
    return cfg, params


def load_tasks(config: ConfigDict, workdir: str) -> dict[str, list[Task]]:
    """Returns {"train", "eval"} task lists."""
    t = config.tasks
    if t.source == "quickstart":
        tasks = load_or_generate_quickstart_tasks(
            os.path.join(workdir, "tasks"), num_tasks=t.num_tasks, horizons=tuple(t.horizons),
            seed=t.gen_seed, servers=tuple(t.servers) if t.servers else None)
    elif t.source == "search":
        from toolverse_jax.tasks.search_tasks import (TEMPLATES, generate_search_tasks,
                                                      load_browsecomp_plus)
        if t.get("corpus_dir"):
            # The search server processes read their corpus from this variable.
            os.environ[config.env.get("corpus_env", "TOOLVERSE_SEARCH_CORPUS")] = t.corpus_dir
            tasks = load_browsecomp_plus(t.corpus_dir, limit=t.num_tasks or None)
        else:
            tasks = generate_search_tasks(t.num_tasks, seed=t.gen_seed,
                                          kinds=tuple(t.get("search_kinds") or TEMPLATES))
    elif t.source == "gust":
        if not t.path:
            raise ValueError("config.tasks.path must name a GUST shard directory when "
                             "config.tasks.source='gust'")
        tasks = read_tasks(t.path)
    else:
        raise ValueError(f"config.tasks.source={t.source!r}; use 'quickstart', 'search' or 'gust'")
    tasks = _filter_tasks(tasks, config)
    if t.split_by == "task":
        order = np.random.default_rng(t.gen_seed).permutation(len(tasks))
        n_eval = max(1, int(round(t.eval_fraction * len(tasks))))
        return {"train": [tasks[i] for i in order[n_eval:]],
                "eval": [tasks[i] for i in order[:n_eval]]}
    splits = split_tasks(tasks, by=t.split_by, fractions=(1 - t.eval_fraction, 0.0,
                                                           t.eval_fraction), seed=t.gen_seed)
    return {"train": splits["train"], "eval": splits["test"]}


def max_literal_chars(task: Task) -> int:
    """Returns the length of the longest JSON-encoded argument value in the task's gold chain."""
    return max((len(json.dumps(v, ensure_ascii=False)) for stage in task.stages for step in stage
                for v in step.arguments.values()), default=0)


def answer_visible(task: Task, rcfg: RolloutConfig) -> bool:
    """Returns whether an exact/set gold answer appears in the final stage's observations as the
    policy will see them (cut at rcfg.max_observation_chars); state-verified tasks always pass."""
    v = task.verifier
    if v["kind"] not in ("exact", "set") or not task.stages:
        return True
    seen = " ".join(observation_text(s.observation, rcfg) for s in task.stages[-1])
    values = [v["value"]] if v["kind"] == "exact" else v["values"]
    return all(str(x) in seen for x in values)


def _filter_tasks(tasks: list[Task], config: ConfigDict) -> list[Task]:
    """Drops tasks the configured rollouts cannot solve (answer cut from the observation) and,
    when config.tasks.max_literal_chars > 0, tasks whose gold calls need longer literals
    (a curriculum knob: a tiny byte-level model learns to copy short ids before long strings)."""
    rcfg = _rollout_config(config)
    limit = int(config.tasks.get("max_literal_chars", 0) or 0)
    kept = [t for t in tasks if answer_visible(t, rcfg) and
            (limit <= 0 or max_literal_chars(t) <= limit)]
    if len(kept) < len(tasks):
        print(f"tasks: kept {len(kept)} of {len(tasks)} (answer visible within "
              f"max_observation_chars={rcfg.max_observation_chars}"
              + (f", literals <= {limit} chars" if limit > 0 else "") + ")", flush=True)
    return kept


def phase_pools(train: list[Task], sft_fraction: float) -> tuple[list[Task], list[Task]]:
    """Returns (SFT tasks, RL tasks) from the train split. sft_fraction >= 1: both phases use
    the whole split (the same list); below 1: the first fraction of the (already shuffled)
    split gives the SFT demonstrations and the rest the RL tasks, so RL trains on tasks the
    warm start never saw (as the held-out ones are)."""
    if sft_fraction >= 1.0:
        return train, train
    n = int(round(sft_fraction * len(train)))
    if not 0 < n < len(train):
        raise ValueError(f"config.tasks.sft_fraction={sft_fraction} leaves an empty SFT or RL "
                         f"pool of the {len(train)} train tasks; use a value in (0, 1]")
    return train[:n], train[n:]


def run_catalog(config: ConfigDict) -> Catalog:
    """Returns the catalog a training run serves: built-in servers, hidden ones if opted in."""
    return Catalog.default(kinds=("builtin",),
                           include_hidden=bool(config.env.get("include_hidden", False)))


def phase_optimizers(config: ConfigDict):
    """Returns (sft optimizer, rl optimizer) from config.sft and config.rl."""
    sft, rl = config.sft, config.rl
    return (make_optimizer(sft.lr, sft.warmup_steps, max(sft.steps, 1)),
            make_optimizer(rl.lr, rl.warmup_steps, max(rl.steps, 1),
                           weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm))


def _rollout_config(config: ConfigDict) -> RolloutConfig:
    r = config.rollout
    return RolloutConfig(max_turns=r.max_turns, max_context=r.max_context,
                         tool_format=r.tool_format, prompt_tools=r.prompt_tools,
                         num_distractors=r.num_distractors,
                         max_observation_chars=r.max_observation_chars,
                         ok_call_bonus=config.rl.get("ok_call_bonus", 0.0),
                         gold_turn_bonus=config.rl.get("gold_turn_bonus", 0.0),
                         arg_match_bonus=config.rl.get("arg_match_bonus", 0.0))


def _loss_config(config: ConfigDict, name: str) -> LossConfig:
    r = config.rl
    return LossConfig(name=name, clip_eps_low=r.clip_eps_low, clip_eps_high=r.clip_eps_high,
                      kl_coef=r.kl_coef, entropy_coef=r.entropy_coef, tis_cap=r.tis_cap,
                      aggregation=r.aggregation, neg_adv_scale=r.get("neg_adv_scale", 1.0),
                      temperature=config.rollout.temperature if name != "sft" else 1.0)


class MetricsLog:
    """metrics.jsonl + tensorboard scalars; on resume, drops lines past the restored step."""

    def __init__(self, workdir: str, resume_step: int | None):
        self.path = os.path.join(workdir, "metrics.jsonl")
        if os.path.exists(self.path):
            keep = []
            with open(self.path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut by a kill
                    if resume_step is not None and rec.get("step", 0) <= resume_step:
                        keep.append(line if line.endswith("\n") else line + "\n")
            with open(self.path, "w") as f:
                f.writelines(keep)
        from tensorboardX import SummaryWriter
        self.tb = SummaryWriter(os.path.join(workdir, "tb"))

    def write(self, step: int, metrics: dict) -> None:
        rec = {"step": int(step)}
        for k, v in metrics.items():
            v = float(v) if isinstance(v, (np.floating, np.integer, jax.Array, float, int)) else v
            rec[k] = v
            if isinstance(v, float) and np.isfinite(v):
                self.tb.add_scalar(k, v, step)
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.tb.flush()

    def records(self) -> list[dict]:
        with open(self.path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def close(self) -> None:
        self.tb.close()


_STATUSES = ("ok", "tool_error", "invalid_call", "timeout", "server_crashed", "truncated")
_STAT_COLS = 8  # present, success, reward, turns, answered, infra_failed, policy tokens, truncated


def trajectory_stats(trajs) -> np.ndarray:
    """Returns per-trajectory summary numbers [n, 8 + len(_STATUSES)] (present, success,
    reward, turns, answered, infra_failed, policy tokens, ended by max_new_tokens, call-status
    counts): the form that processes all-gather so metrics are computed over the global batch."""
    out = np.zeros((len(trajs), _STAT_COLS + len(_STATUSES)), np.float64)
    for i, t in enumerate(trajs):
        statuses = [s for turn in t.turn_statuses for s in turn]
        out[i, :_STAT_COLS] = (1.0, t.success, t.reward, t.num_turns, t.finished,
                               t.infra_failed, sum(t.policy_mask),
                               bool(t.turns) and t.turns[-1].kind == "truncated")
        out[i, _STAT_COLS:] = [statuses.count(s) for s in _STATUSES]
    return out


def metrics_from_stats(stats: np.ndarray, prefix: str) -> dict[str, float]:
    """Returns summary scalars from `trajectory_stats` rows (rows with present == 0 are
    padding from an uneven split over processes)."""
    stats = stats[stats[:, 0] > 0]
    valid = stats[stats[:, 5] == 0]
    mean = lambda col, rows: float(np.mean(rows[:, col])) if len(rows) else 0.0
    out = {
        f"{prefix}/success_rate": mean(1, valid),
        f"{prefix}/reward": mean(2, valid),
        f"{prefix}/turns": mean(3, stats),
        f"{prefix}/answered": mean(4, stats),
        f"{prefix}/infra_failed": float(np.sum(stats[:, 5])),
        f"{prefix}/policy_tokens": mean(6, stats),
        f"{prefix}/truncated_frac": mean(7, stats),
    }
    counts = stats[:, _STAT_COLS:].sum(0)
    n_calls = max(float(counts.sum()), 1.0)
    for j, status in enumerate(_STATUSES):
        out[f"{prefix}/rate_{status}"] = float(counts[j]) / n_calls
    return out


def advantage_stats(trajs, rows: list[dict]) -> np.ndarray:
    """Returns per-trajectory advantage numbers [n, 5] (present, group id, sum and sum of
    squares of its policy tokens' advantages, policy tokens) for `advantage_metrics`; `rows`
    are `trajectory_rows(trajs, ...)` (infrastructure failures have no row and count 0)."""
    out = np.zeros((len(trajs), 5), np.float64)
    it = iter(rows)
    for i, t in enumerate(trajs):
        # Group ids restart at 0 on every process: tell the processes' groups apart.
        out[i, :2] = (1.0, t.group_id + 1_000_000 * jax.process_index())
        if t.infra_failed:
            continue
        r = next(it)
        a = np.asarray(r["advantages"], np.float64)[np.asarray(r["policy_mask"], bool)]
        out[i, 2:] = (a.sum(), (a * a).sum(), a.size)
    return out


def advantage_metrics(stats: np.ndarray) -> dict[str, float]:
    """Returns adv/mean, adv/std over policy tokens and adv/zero_group_frac (the fraction of
    groups whose every policy token has advantage 0: groups that teach nothing this step)."""
    stats = stats[stats[:, 0] > 0]
    n = max(float(stats[:, 4].sum()), 1.0)
    mean = float(stats[:, 2].sum()) / n
    var = max(float(stats[:, 3].sum()) / n - mean * mean, 0.0)
    groups = np.unique(stats[:, 1])
    zero = [np.all(stats[stats[:, 1] == g, 3] <= 1e-12) for g in groups]
    return {"adv/mean": mean, "adv/std": float(np.sqrt(var)),
            "adv/zero_group_frac": float(np.mean(zero)) if len(zero) else 1.0}


def rollout_metrics(trajs, prefix: str) -> dict[str, float]:
    """Returns summary scalars of a batch of trajectories (all processes' when multi-host)."""
    return metrics_from_stats(gather_rows(trajectory_stats(trajs)), prefix)


SMOOTH_WINDOW = 10


def smooth(values, window: int = SMOOTH_WINDOW) -> np.ndarray:
    """Returns the trailing mean over up to `window` values at each position."""
    v = np.asarray(values, np.float64)
    c = np.concatenate([[0.0], np.cumsum(v)])
    idx = np.arange(1, len(v) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def plot_curve(records: list[dict], path: str) -> None:
    """Writes a PNG of eval success rate and train reward against the step.

    Draws on a bare `Figure` with the Agg canvas: no pyplot state, and the caller's matplotlib
    backend (a notebook's inline one) is left as it was."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ev = [(r["step"], r["eval/success_rate"]) for r in records if "eval/success_rate" in r]
    tr = [(r["step"], r["rollout/success_rate"]) for r in records if "rollout/success_rate" in r]
    pr = [(r["step"], r["probe/success_rate"]) for r in records if "probe/success_rate" in r]
    if ev:
        ax.plot(*zip(*ev), "o-", label="held-out success (greedy)")
    if pr:
        ax.plot(*zip(*pr), "s-", color="tab:green", label="probe RL tasks (sampled, fixed set)")
    if tr:
        steps, vals = zip(*tr)
        ax.plot(steps, vals, ".", alpha=0.3, color="tab:orange",
                label="train rollout success (sampled)")
        ax.plot(steps, smooth(vals), "-", color="tab:orange",
                label=f"train rollout success ({SMOOTH_WINDOW}-step mean)")
    sft_end = [r["step"] for r in records if r.get("phase") == "sft"]
    if sft_end:
        ax.axvline(max(sft_end) + 0.5, color="gray", ls="--", lw=1, label="SFT -> RL")
    ax.set_xlabel("update step")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _task_batch(ds, start: int, n: int) -> list[Task]:
    return [ds[start + i] for i in range(n)]


def _empty_row(pad_id: int) -> dict:
    return {"tokens": [pad_id, pad_id], "policy_mask": [False, False],
            "advantages": np.zeros(2, np.float32), "sample_logprobs": np.zeros(2, np.float32)}


def ppo_update(state, rows: list[dict], step_fn, *, cfg: ModelConfig, mesh, num_micro: int,
               pad_id: int, temperature: float, ref_params=None, epochs: int = 1,
               num_minibatches: int = 1, rng: np.random.Generator | None = None):
    """Returns (state, metrics) after `epochs` passes over `rows` in `num_minibatches` shuffled
    minibatches (PPO's reuse of one rollout batch). π_old (and the reference, when given) score
    every minibatch once, before the first update, so the clip ratio of later passes is taken
    against the policy that sampled. Metrics are the mean over updates; timings are summed."""
    rng = rng or np.random.default_rng(0)
    # Multi-host: every process splits its own rows; a process with none (all its episodes
    # failed) contributes one loss-free row per minibatch.
    order = rng.permutation(len(rows))
    parts = [[rows[j] for j in order[k::num_minibatches]] for k in range(num_minibatches)]
    t1 = time.time()
    batches = []
    for part in parts:
        batch = distributed.global_batch(part or [_empty_row(pad_id)], pad_id, mesh, num_micro)
        old_lp, _ = score_jit(state.params, batch, cfg=cfg, temperature=temperature)
        ref_lp = old_lp if ref_params is None else score_jit(
            ref_params, batch, cfg=cfg, temperature=temperature)[0]
        batches.append(batch._replace(old_logprobs=old_lp, ref_logprobs=ref_lp))
    jax.block_until_ready(batches)
    t2 = time.time()
    sums: dict[str, float] = {}
    updates = 0
    for _ in range(max(int(epochs), 1)):
        for k in rng.permutation(len(batches)):
            state, m = step_fn(state, batches[k])
            for name, v in jax.device_get(m).items():
                v = float(v)
                sums[name] = (max(sums.get(name, v), v) if name.endswith("_max")
                              else sums.get(name, 0.0) + v)
            updates += 1
    out = {k: v if k.endswith("_max") else v / updates for k, v in sums.items()}
    if ref_params is None:
        out.pop("kl", None)  # would be KL to the pre-update policy, not to the reference
    out.update({"time/scoring_s": t2 - t1, "time/update_s": time.time() - t2,
                "ppo/updates": float(updates)})
    return state, out


def seed_from_warm_start(src: str, workdir: str, sft_steps: int) -> bool:
    """Copies a finished SFT phase of run `src` into a fresh `workdir`; returns True if copied.

    Copied: the checkpoint at step `sft_steps`, the trained tokenizer, the task cache and the
    metrics up to that step, so the run resumes into its RL phase (the checkpoint's model
    config, sft_steps and seed are still checked against this run's). A workdir that already
    has a checkpoint is left alone (that run resumes itself)."""
    import shutil
    own = os.path.join(workdir, "checkpoints")
    if os.path.isdir(own) and any(n.isdigit() for n in os.listdir(own)):
        return False
    ckpt = os.path.join(src, "checkpoints", str(sft_steps))
    if not os.path.isdir(ckpt):
        have = sorted(os.listdir(os.path.join(src, "checkpoints"))) if os.path.isdir(
            os.path.join(src, "checkpoints")) else []
        raise FileNotFoundError(
            f"config.train.warm_start={src!r} has no checkpoint at the SFT end (step "
            f"{sft_steps}; it has {have}); run its SFT phase with the same config.sft.steps")
    shutil.copytree(ckpt, os.path.join(workdir, "checkpoints", str(sft_steps)))
    for name in ("tokenizer", "tasks"):
        if os.path.isdir(os.path.join(src, name)) and not os.path.exists(
                os.path.join(workdir, name)):
            shutil.copytree(os.path.join(src, name), os.path.join(workdir, name))
    metrics = os.path.join(src, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as f, open(os.path.join(workdir, "metrics.jsonl"), "w") as out:
            out.writelines(line for line in f if line.strip() and
                           json.loads(line).get("step", 0) <= sft_steps)
    print(f"warm start: copied SFT step {sft_steps} of {src}", flush=True)
    return True


def run_training(config: ConfigDict, workdir: str) -> dict:
    """Runs (or resumes) the configured training; returns the final summary dict.

    Multi-host (config.distributed or TOOLVERSE_* env vars, see sharding.distributed): every
    process runs its own env pool on its slice of each step's tasks, the train step runs on the
    global batch, and process 0 writes the logs (all processes write the checkpoints together).
    """
    nproc = distributed.initialize(config)
    pid = jax.process_index()
    lead = pid == 0
    os.makedirs(workdir, exist_ok=True)
    if lead and config.train.get("warm_start"):
        seed_from_warm_start(config.train.warm_start, workdir, config.sft.steps)
    if not lead:
        barrier("tasks")  # process 0 generates the task cache and trains the tokenizer first
    tasks = load_tasks(config, workdir)
    if not tasks["train"] or not tasks["eval"]:
        raise ValueError(f"task split is empty: {len(tasks['train'])} train, "
                         f"{len(tasks['eval'])} eval; raise config.tasks.num_tasks")
    catalog = run_catalog(config)
    tokenizer = build_tokenizer(config, tasks["train"], catalog, workdir)
    if lead:
        barrier("tasks")
    cfg, params0 = build_model(config, tokenizer)
    mesh = make_mesh(tuple(config.mesh.shape))
    # Multi-host: each process samples with a local copy of the params on its own device.
    local_mesh = make_mesh((1, 1, 1), jax.local_devices()[:1]) if nproc > 1 else None
    on_local = (lambda: sharding_context(local_mesh)) if nproc > 1 else contextlib.nullcontext
    sft_pool, rl_pool = phase_pools(tasks["train"], config.tasks.get("sft_fraction", 1.0))
    sft_ds = grain.MapDataset.source(sft_pool).shuffle(seed=config.seed).repeat()
    rl_ds = sft_ds if rl_pool is sft_pool else grain.MapDataset.source(rl_pool).shuffle(
        seed=config.seed).repeat()
    eval_tasks = tasks["eval"][:config.train.eval_tasks][pid::nproc]
    # A fixed probe of RL tasks sampled like training rollouts at every eval: train-rollout
    # success moves with which tasks a step drew (every arm of a sweep sees the same order),
    # the probe's does not. At most train.eval_tasks of them (a smoke run's eval stays small).
    n_probe = min(int(config.train.get("probe_tasks", 0) or 0), config.train.eval_tasks)
    probe_tasks = list(rl_pool[:n_probe])[pid::nproc]
    rcfg = _rollout_config(config)
    stop_ids = tuple(tokenizer.stop_ids_for(["<|im_end|>", "<|endoftext|>"]))
    sampling = SamplingParams(max_new_tokens=config.rollout.max_new_tokens,
                              temperature=config.rollout.temperature, top_p=config.rollout.top_p,
                              top_k=config.rollout.top_k, stop_token_ids=stop_ids,
                              pad_id=tokenizer.pad_id)
    greedy = dataclasses.replace(sampling, temperature=0.0, top_k=0, top_p=1.0)
    sft_steps, rl_steps = config.sft.steps, config.rl.steps
    total = sft_steps + rl_steps
    sft_opt, rl_opt = phase_optimizers(config)
    num_micro = config.train.num_micro

    with sharding_context(mesh):
        params0 = shard_params(params0, cfg, mesh)
        state = init_train_state(params0, sft_opt if sft_steps else rl_opt)
        ref_params = None
        ckpt = RunCheckpointer(workdir, keep=config.train.keep_checkpoints,
                               preserve=(sft_steps,) if sft_steps and rl_steps else ())
        expect = {"model_config": dataclasses.asdict(cfg), "sft_steps": sft_steps,
                  "seed": config.seed}
        start = 0
        latest = ckpt.latest_step()
        if latest is not None:
            state, ref_params, meta = ckpt.restore(
                latest, state, params0, expect,
                defaults={"model_config": dataclasses.asdict(type(cfg)())})
            start = meta["global_step"]
            print(f"resumed from {ckpt.directory}/{latest} at step {start}", flush=True)
        log = MetricsLog(workdir, start if latest is not None else None) if lead else None
        sft_step_fn = make_train_step(cfg, _loss_config(config, "sft"), sft_opt, num_micro)
        rl_step_fn = make_train_step(cfg, _loss_config(config, config.rl.loss), rl_opt, num_micro)
        tasks_by_id = {t.id: t for split in tasks.values() for t in split}
        # The reference scores every RL batch only when the loss uses it (k3 KL); TRACE scores
        # its own states with ref_params in readiness_for_trajectories.
        needs_ref = config.rl.kl_coef > 0 or bool(config.train.get("log_ref_kl", False))
        tool_cache: dict[tuple, list[dict]] = {}
        ref_local = None

        def evaluate(params, pool) -> dict:
            local = local_params(params)

            def measure(tasks_, sp, key, seed, prefix) -> dict:
                t0 = time.time()
                with on_local():
                    trajs = run_rollouts(SamplerPolicy(local, cfg, sp), tasks_, 1, pool,
                                         tokenizer, rcfg, jax.random.key(key), seed=seed)
                return {**rollout_metrics(trajs, prefix), f"{prefix}/time_s": time.time() - t0}

            m = measure(eval_tasks, greedy, 0, 10_000, "eval")
            if distributed.global_any(bool(probe_tasks)):
                m.update(measure(probe_tasks, sampling, 1, 20_000, "probe"))
            return m

        def sft_rows(step: int) -> list[dict]:
            rows = []
            start = step * config.sft.batch_size
            # Per-task distractor draws, so a task's demonstration does not depend on which
            # process (or batch position) builds it.
            for i, task in process_slice(list(enumerate(_task_batch(
                    sft_ds, start, config.sft.batch_size)))):
                rng = np.random.default_rng([config.seed, start + i])
                key = task.servers
                if key not in tool_cache:
                    tool_cache[key] = episode_tools(catalog, task.servers)[0]
                tools = prompt_tool_specs(task, tool_cache[key], rcfg, rng)
                toks, mask, _ = gold_demonstration(task, tools, tokenizer, rcfg)
                if len(toks) > rcfg.max_context:
                    continue
                rows.append(demonstration_row(toks, mask))
            if not rows:
                raise ValueError("no SFT demonstration fits config.rollout.max_context="
                                 f"{rcfg.max_context}; raise it")
            return rows

        pbar = None
        if config.train.progress and lead:
            from tqdm import tqdm
            pbar = tqdm(total=total, initial=start, desc="train", dynamic_ncols=True)
        with EnvPool(catalog, num_workers=config.env.num_workers,
                     call_timeout_s=config.env.call_timeout_s) as pool:
            if start == 0 and config.train.eval_every > 0:
                m0 = evaluate(state.params, pool)
                if lead:
                    log.write(0, {**m0, "phase": "init"})
            for step in range(start, total):
                t0 = time.time()
                if step < sft_steps:
                    batch = distributed.global_batch(sft_rows(step), tokenizer.pad_id, mesh,
                                                     num_micro)
                    state, m = sft_step_fn(state, batch)
                    metrics = {k: float(v) for k, v in jax.device_get(m).items()}
                    metrics["phase"] = "sft"
                    metrics["time/update_s"] = time.time() - t0
                else:
                    if step == sft_steps and ref_params is None:
                        # The warm-started policy is the frozen reference (KL, TRACE) and the
                        # RL optimizer starts fresh.
                        ref_params = jax.tree.map(jnp.copy, state.params)
                        state = init_train_state(state.params, rl_opt)
                    rl_step = step - sft_steps
                    tasks_now = process_slice(_task_batch(
                        rl_ds, rl_step * config.rl.tasks_per_step, config.rl.tasks_per_step))
                    policy = SamplerPolicy(local_params(state.params), cfg, sampling)
                    with on_local():
                        key = jax.random.fold_in(jax.random.key(config.seed), step)
                        if nproc > 1:
                            key = jax.random.fold_in(key, pid)
                        trajs = run_rollouts(policy, tasks_now, config.rl.group_size, pool,
                                             tokenizer, rcfg, key,
                                             seed=config.seed * 1_000_003 + step + 7919 * pid)
                    t_roll = time.time() - t0
                    readiness = None
                    if config.rl.advantage == "trace":
                        from toolverse_jax.rl.trace import (readiness_for_trajectories,
                                                            readiness_metrics)
                        tr_cfg = config.trace
                        if ref_local is None:
                            ref_local = local_params(ref_params)
                        with on_local():
                            readiness = readiness_for_trajectories(
                                ref_local, cfg, trajs, tasks_by_id, tokenizer,
                                rcfg.max_turns + 1, tr_cfg.answer_prefix, tr_cfg.scorer,
                                pad_to=tr_cfg.pad_to)
                    turn_adv = compute_advantages(trajs, config.rl.advantage,
                                                  dict(config.rl.adv), rcfg.max_turns + 1,
                                                  readiness)
                    rows = trajectory_rows(trajs, turn_adv)
                    metrics = rollout_metrics(trajs, "rollout")
                    metrics.update(advantage_metrics(gather_rows(advantage_stats(trajs, rows))))
                    metrics["phase"] = "rl"
                    if readiness is not None:
                        metrics.update(readiness_metrics(readiness,
                                                         [t.num_call_turns for t in trajs]))
                    if distributed.global_any(bool(rows)):
                        state, m = ppo_update(
                            state, rows, rl_step_fn, cfg=cfg, mesh=mesh, num_micro=num_micro,
                            pad_id=tokenizer.pad_id, temperature=config.rollout.temperature,
                            ref_params=ref_params if needs_ref else None,
                            epochs=config.rl.ppo_epochs, num_minibatches=config.rl.num_minibatches,
                            rng=np.random.default_rng([config.seed, step]))
                        metrics.update(m)
                    sampled = float(np.sum(gather_rows(np.asarray(
                        [sum(t.policy_mask) for t in trajs], np.float64))))
                    metrics["time/rollout_s"] = t_roll
                    metrics["rollout/tokens_per_s"] = sampled / max(t_roll, 1e-9)
                    metrics["rollout/num_adv_nonzero"] = float(np.sum(gather_rows(
                        np.asarray([np.sum(np.abs(turn_adv) > 1e-8)], np.float64))))
                done = step + 1
                metrics["time/step_s"] = time.time() - t0
                last = done == total
                rl_done = done - sft_steps
                sft_every = int(config.train.get("sft_eval_every", 0) or 0)
                if config.train.eval_every > 0 and (
                        last or done == sft_steps or
                        (rl_done > 0 and rl_done % config.train.eval_every == 0) or
                        (rl_done < 0 and sft_every > 0 and done % sft_every == 0)):
                    metrics.update(evaluate(state.params, pool))
                if lead:
                    log.write(done, metrics)
                if last or done % config.train.checkpoint_every == 0 or done == sft_steps:
                    ckpt.save(done, state, ref_params,
                              {**expect, "global_step": done, "has_ref": ref_params is not None,
                               "data_index": {"sft": min(done, sft_steps) * config.sft.batch_size,
                                              "rl": max(done - sft_steps, 0) *
                                              config.rl.tasks_per_step}})
                if pbar is not None:
                    pbar.update(1)
                    shown = {k.split("/")[-1]: round(v, 3) for k, v in metrics.items()
                             if k in ("loss", "rollout/success_rate", "eval/success_rate")}
                    pbar.set_postfix(shown)
        if pbar is not None:
            pbar.close()
        ckpt.close()
        if not lead:
            return {"final_step": total, "process_index": pid}
        records = log.records()
        log.close()
    plot_curve(records, os.path.join(workdir, "learning_curve.png"))
    evals = [(r["step"], r["eval/success_rate"]) for r in records if "eval/success_rate" in r]
    summary = {"final_step": total, "eval_curve": evals,
               "warm_start_success": next((v for s, v in evals if s == sft_steps), None),
               "final_success": evals[-1][1] if evals else None}
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary
