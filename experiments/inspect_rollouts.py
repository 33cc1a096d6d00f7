"""Rollouts of a training run's checkpoint on its own task split: decoded transcripts and pass@k.

    python -m experiments.inspect_rollouts --config configs/quickstart.py --workdir runs/quickstart \
        [--split eval|train] [--n 32] [--k 6 --temperature 1.0] [--step 250] [--quiet]

Uses the training config, so tasks, split, tokenizer (WORKDIR/tokenizer) and rollout settings are
the run's own. Prints one JSON line {"step", "split", "tasks", "k", "temperature", "mean_success",
"pass_at_k"} and, unless --quiet, every transcript with its statuses. pass@k of the
warm-started policy bounds what RL can reach quickly: GRPO sharpens behaviours it samples.
"""

from __future__ import annotations

import collections
import json

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "the training config file")
_WORKDIR = flags.DEFINE_string("workdir", None, "the training run's workdir (checkpoints)")
_SPLIT = flags.DEFINE_enum("split", "eval", ["eval", "train"], "which task split")
_N = flags.DEFINE_integer("n", 32, "first N tasks of the split")
_K = flags.DEFINE_integer("k", 1, "rollouts per task")
_TEMP = flags.DEFINE_float("temperature", 0.0, "sampling temperature (0 = greedy)")
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: latest)")
_QUIET = flags.DEFINE_bool("quiet", False, "only the JSON summary line")
_SCOPE = flags.DEFINE_enum("scope", "all", ["all", "seen", "unseen"],
                           "with config.tasks.sft_servers: only tasks on those servers (seen) or "
                           "on the others (unseen)")
flags.mark_flags_as_required(["config", "workdir"])


def summarize(trajs) -> dict:
    """Returns {"tasks", "mean_success", "pass_at_k"} over rollouts grouped by task_id."""
    by = collections.defaultdict(list)
    for t in trajs:
        by[t.task_id].append(bool(t.success))
    return {"tasks": len(by),
            "mean_success": float(np.mean([np.mean(v) for v in by.values()])) if by else 0.0,
            "pass_at_k": float(np.mean([any(v) for v in by.values()])) if by else 0.0}


def inspect(config, workdir: str, split: str = "eval", n: int = 32, k: int = 1,
            temperature: float = 0.0, step: int | None = None, scope: str = "all"):
    """Returns (summary dict, trajectories, tokenizer) for `n` tasks of the run's `split`."""
    from toolverse_jax.envs import EnvPool
    from toolverse_jax.eval.policies import load_orbax_params
    from toolverse_jax.rl import tool_use
    from toolverse_jax.rl.rollout import SamplerPolicy, run_rollouts
    from toolverse_jax.rl.spec import RunSpec, sampling_params

    if k > 1 and temperature == 0.0:
        raise ValueError("--k > 1 with --temperature 0 repeats one greedy rollout; set a temperature")
    spec = RunSpec.from_config(config)
    tu = spec.tool_use
    splits = tool_use.load_tasks(tu.tasks, tu.rollout, spec.env, workdir)
    tasks = splits[split]
    if scope != "all":
        if not tu.tasks.sft_servers:
            raise ValueError(f"--scope={scope} needs config.tasks.sft_servers")
        seen = set(tu.tasks.sft_servers)
        tasks = [t for t in tasks if (set(t.servers) <= seen) == (scope == "seen")]
    tasks = tasks[:n]
    catalog = tool_use.run_catalog(spec.env)
    tokenizer = tool_use.build_tokenizer(spec.model, tu.rollout, splits["train"], catalog,
                                         workdir)
    rcfg = tool_use.rollout_config(tu, tokenizer)
    cfg, params, got_step = load_orbax_params(workdir, step)
    sampling = sampling_params(tokenizer, tu.max_new_tokens, temperature,
                               template=rcfg.chat_template)
    with EnvPool(catalog, **spec.env.pool_kwargs()) as pool:
        trajs = run_rollouts(SamplerPolicy(params, cfg, sampling), tasks, k, pool, tokenizer,
                             rcfg, jax.random.key(spec.seed), seed=10_000)
    summary = {"step": got_step, "split": split, "scope": scope, "k": k, "temperature": temperature,
               **summarize(trajs)}
    return summary, trajs, tokenizer


def main(argv):
    del argv
    summary, trajs, tok = inspect(_CONFIG.value, _WORKDIR.value, _SPLIT.value, _N.value, _K.value,
                                  _TEMP.value, _STEP.value, _SCOPE.value)
    if not _QUIET.value:
        for t in trajs:
            print("=" * 30, t.task_id, "success" if t.success else "fail", t.end_reason,
                  t.turn_statuses)
            print(tok.decode(t.tokens))
    print(json.dumps(summary))


if __name__ == "__main__":
    app.run(main)
