"""The ToolVerse / TRACE training program: SFT warm-start on gold chains, then RL over live MCP
rollouts, with held-out GUST evaluation (`rl/driver.py` runs it; `experiments.train` is the
entry point).

Builds the task split (generated quickstart tasks, GUST shards or search questions, filtered to
what the rollout settings can solve), the tokenizer (a BPE trained on the train split's gold
chains, saved in WORKDIR/tokenizer) and the model; its SFT phase renders gold demonstrations,
its RL phase samples groups of rollouts, scores TRACE states when asked, and turns the
estimator's per-turn advantages into rows. Eval: greedy success on the held-out split, plus a
fixed probe of RL tasks sampled like training rollouts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shutil
import threading
import time
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np

from toolverse_jax.envs import Catalog, EnvPool, episode_tools
from toolverse_jax.models import load_tokenizer
from toolverse_jax.models.template import select_chat_template
from toolverse_jax.models.tokenizer import ByteTokenizer, train_bpe_tokenizer
from toolverse_jax.rl.batching import compute_advantages, demonstration_row, trajectory_rows
from toolverse_jax.rl.driver import PROGRAMS, build_model
from toolverse_jax.rl.metrics import advantage_metrics, advantage_stats, rollout_metrics
from toolverse_jax.rl.rollout import (RolloutConfig, SamplerPolicy, gold_demonstration,
                                      observation_text, prompt_tool_specs, run_rollouts)
from toolverse_jax.rl.spec import (EnvSpec, ModelSpec, PhaseSpec, RunSpec, TaskSpec,
                                   ToolUseSpec, sampling_params)
from toolverse_jax.rl.types import Row
from toolverse_jax.sharding import distributed, make_mesh, sharding_context
from toolverse_jax.sharding.distributed import barrier, gather_rows, local_params, process_slice
from toolverse_jax.tasks import Task, load_or_generate_quickstart_tasks, read_tasks, split_tasks
from toolverse_jax.tasks.augment import swap_literals


def build_tokenizer(model: ModelSpec, rcfg: RolloutConfig, train_tasks: list[Task],
                    catalog: Catalog, workdir: str):
    """Returns the run's tokenizer. model.tokenizer == "trained": a byte-level BPE with
    model.tokenizer_vocab ids, trained on the train split's gold demonstrations (their servers'
    full tool lists) and saved to WORKDIR/tokenizer; a resumed run loads that copy."""
    if model.tokenizer != "trained":
        return load_tokenizer(model.tokenizer)
    path = os.path.join(workdir, "tokenizer")
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return load_tokenizer(path)
    byte = ByteTokenizer()
    texts, tools = [], {}
    for task in train_tasks:
        if task.servers not in tools:
            tools[task.servers] = episode_tools(catalog, task.servers)[0]
        toks, _, _ = gold_demonstration(task, tools[task.servers], byte, rcfg)
        texts.append(byte.decode(toks))
    tok = train_bpe_tokenizer(texts, model.tokenizer_vocab, path)
    print(f"tokenizer: trained {tok.num_ids} ids on {len(texts)} gold chains -> {path}",
          flush=True)
    return tok


def rollout_config(tu: ToolUseSpec, tokenizer) -> RolloutConfig:
    """Returns the run's RolloutConfig with its chat template resolved against the run's
    tokenizer (config.rollout.chat_template; "auto" keeps None for byte / trained BPE
    tokenizers, so their rollouts render exactly as before)."""
    return dataclasses.replace(tu.rollout,
                               chat_template=select_chat_template(tu.chat_template, tokenizer))


def load_tasks(t: TaskSpec, rcfg: RolloutConfig, env: EnvSpec, workdir: str
               ) -> dict[str, list[Task]]:
    """Returns {"train", "eval"} task lists: loaded or generated, filtered (`filter_tasks`),
    then split by task (a seeded shuffle) or by toolset / server."""
    if t.source == "quickstart":
        tasks = load_or_generate_quickstart_tasks(
            os.path.join(workdir, "tasks"), num_tasks=t.num_tasks, horizons=t.horizons,
            seed=t.gen_seed, servers=t.servers or None, instruction_level=t.instruction_level,
            whole_chain=t.whole_chain)
    elif t.source == "search":
        from toolverse_jax.tasks.search_tasks import (TEMPLATES, generate_search_tasks,
                                                      load_browsecomp_plus)
        if t.corpus_dir:
            # The search server processes read their corpus from this variable.
            os.environ[env.corpus_env] = t.corpus_dir
            tasks = load_browsecomp_plus(t.corpus_dir, limit=t.num_tasks or None)
        else:
            tasks = generate_search_tasks(t.num_tasks, seed=t.gen_seed,
                                          kinds=t.search_kinds or tuple(TEMPLATES))
    elif t.source == "gust":
        if not t.path:
            raise ValueError("config.tasks.path must name a GUST shard directory when "
                             "config.tasks.source='gust'")
        tasks = read_tasks(t.path)
        if t.instruction_level != "recipe":
            # whole-chain shards re-render at any level; recipe keeps each task's stored text
            from toolverse_jax.tasks.instructions import with_instruction_level
            tasks = with_instruction_level(tasks, t.instruction_level)
    else:
        raise ValueError(f"config.tasks.source={t.source!r}; use 'quickstart', 'search' or 'gust'")
    tasks = filter_tasks(tasks, rcfg, t.max_literal_chars)
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


def filter_tasks(tasks: list[Task], rcfg: RolloutConfig, limit: int = 0) -> list[Task]:
    """Drops tasks the rollouts of `rcfg` cannot solve (answer cut from the observation) and,
    when `limit` > 0 (config.tasks.max_literal_chars), tasks whose gold calls need longer
    literals (a curriculum knob: a tiny model learns to copy short ids before long strings)."""
    kept = [t for t in tasks if answer_visible(t, rcfg) and
            (limit <= 0 or max_literal_chars(t) <= limit)]
    if len(kept) < len(tasks):
        print(f"tasks: kept {len(kept)} of {len(tasks)} (answer visible within "
              f"max_observation_chars={rcfg.max_observation_chars}"
              + (f", literals <= {limit} chars" if limit > 0 else "") + ")", flush=True)
    return kept


def phase_pools(train: list[Task], sft_fraction: float, sft_servers: tuple[str, ...] = (),
                unseen_demos: int = 0) -> tuple[list[Task], list[Task]]:
    """Returns (SFT tasks, RL tasks) from the train split. With `sft_servers`, SFT gets the tasks
    whose servers all lie in it and RL every other task (RL on environments no demonstration
    showed), except that the first `unseen_demos` of those also become SFT demonstrations (and
    leave the RL pool): a few demonstrations of the new environments. Else sft_fraction >= 1: both phases use the whole split (the same list); below 1:
    the first fraction of the (already shuffled) split gives the SFT demonstrations and the
    rest the RL tasks, so RL trains on tasks the warm start never saw (as the held-out ones are)."""
    if sft_servers:
        known = set(sft_servers)
        sft = [t for t in train if set(t.servers) <= known]
        rl = [t for t in train if not set(t.servers) <= known]
        sft, rl = sft + rl[:unseen_demos], rl[unseen_demos:]
        if not sft or not rl:
            raise ValueError(f"config.tasks.sft_servers={tuple(sft_servers)} (unseen_demos="
                             f"{unseen_demos}) leaves {len(sft)} SFT and {len(rl)} RL tasks of the "
                             f"{len(train)} train tasks (their servers: "
                             f"{sorted({s for t in train for s in t.servers})})")
        return sft, rl
    if sft_fraction >= 1.0:
        return train, train
    n = int(round(sft_fraction * len(train)))
    if not 0 < n < len(train):
        raise ValueError(f"config.tasks.sft_fraction={sft_fraction} leaves an empty SFT or RL "
                         f"pool of the {len(train)} train tasks; use a value in (0, 1]")
    return train[:n], train[n:]


def run_catalog(env: EnvSpec) -> Catalog:
    """Returns the catalog a training run serves: built-in servers, hidden ones if opted in."""
    return Catalog.default(kinds=("builtin",), include_hidden=env.include_hidden)


def seed_from_warm_start(src: str, workdir: str, sft_steps: int) -> bool:
    """Copies a finished SFT phase of run `src` into a fresh `workdir`; returns True if copied.

    Copied: the checkpoint at step `sft_steps`, the trained tokenizer, the task cache and the
    metrics up to that step, so the run resumes into its RL phase (the checkpoint's model
    config, sft_steps and seed are still checked against this run's). A workdir that already
    has a checkpoint is left alone (that run resumes itself)."""
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


class _SFTPhase:
    """Gold demonstrations of the SFT pool, `sft_batch_size` a step (this process's share)."""

    def __init__(self, spec: PhaseSpec, prog: "ToolUseProgram", pool_tasks: list[Task]):
        self.spec, self.prog = spec, prog
        self.ds = grain.MapDataset.source(pool_tasks).shuffle(seed=prog.seed).repeat()

    def rows(self, step: int, params, ref_params, pool) -> tuple[list[Row], dict]:
        p, n = self.prog, self.prog.tu.sft_batch_size
        start, rows = step * n, []
        # Per-task distractor draws, so a task's demonstration does not depend on which
        # process (or batch position) builds it.
        for i, task in process_slice([(i, self.ds[start + i]) for i in range(n)]):
            tools = prompt_tool_specs(task, p.tools(task), p.rcfg,
                                      np.random.default_rng([p.seed, start + i]))
            if p.tu.tasks.sft_fresh_literals:
                task = swap_literals(task, np.random.default_rng([p.seed, start + i, 1]))
            toks, mask, _ = gold_demonstration(task, tools, p.tokenizer, p.rcfg)
            if len(toks) <= p.rcfg.max_context:
                rows.append(demonstration_row(toks, mask))
        if not rows:
            raise ValueError("no SFT demonstration fits config.rollout.max_context="
                             f"{p.rcfg.max_context}; raise it")
        return rows, {}


class _RLPhase:
    """Groups of live rollouts of the current policy on `tasks_per_step` RL tasks a step; the
    registered estimator's per-turn advantages (TRACE: from reference-scored states)."""

    def __init__(self, spec: PhaseSpec, prog: "ToolUseProgram", pool_tasks: list[Task],
                 sft_ds=None, mesh=None):
        self.spec, self.prog, self.mesh = spec, prog, mesh
        self.ds = sft_ds if sft_ds is not None else grain.MapDataset.source(
            pool_tasks).shuffle(seed=spec.seed).repeat()
        self.ref_local = None
        self.producer: _AsyncRollouts | None = None

    def rows(self, step: int, params, ref_params, pool) -> tuple[list[Row], dict]:
        tu = self.prog.tu
        if not tu.async_rollouts:
            return self.make(step, params, ref_params, pool)
        if self.producer is None:
            self.producer = _AsyncRollouts(self, step, self.prog.total - self.prog.sft_steps,
                                           tu.max_staleness, pool)
        return self.producer.take(step, params, ref_params)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()

    def make(self, step: int, params, ref_params, pool, version: int | None = None
             ) -> tuple[list[Row], dict]:
        """Returns (rows, metrics) of RL step `step` sampled with `params` (policy version
        `version`: RL updates done when they were current; default `step`)."""
        p, tu = self.prog, self.prog.tu
        version = step if version is None else version
        t0 = time.time()
        n = tu.tasks_per_step
        tasks_now = process_slice([self.ds[step * n + i] for i in range(n)])
        global_step = p.sft_steps + step
        policy = SamplerPolicy(local_params(params), p.cfg, p.sampling)
        seed = self.spec.seed
        with p.on_local(), p.pool_lock:
            key = jax.random.fold_in(jax.random.key(seed), global_step)
            if p.nproc > 1:
                key = jax.random.fold_in(key, p.pid)
            trajs = run_rollouts(policy, tasks_now, tu.group_size, pool, p.tokenizer, p.rcfg,
                                 key, seed=seed * 1_000_003 + global_step + 7919 * p.pid)
        for tr in trajs:
            for turn in tr.turns:
                turn.policy_version = version
        t_roll = time.time() - t0
        readiness, metrics = None, {}
        if tu.advantage == "trace":
            from toolverse_jax.rl.trace_scoring import (readiness_for_trajectories,
                                                        readiness_metrics)
            if self.ref_local is None:
                self.ref_local = local_params(ref_params)
            with p.on_local():
                readiness = readiness_for_trajectories(
                    self.ref_local, p.cfg, trajs, p.tasks_by_id, p.tokenizer,
                    p.rcfg.max_turns + 1, tu.trace.answer_prefix, tu.trace.scorer,
                    pad_to=tu.trace.pad_to)
            metrics.update(readiness_metrics(readiness, [t.num_call_turns for t in trajs]))
        turn_adv = compute_advantages(trajs, tu.advantage, tu.adv_consts, p.rcfg.max_turns + 1,
                                      readiness)
        rows = trajectory_rows(trajs, turn_adv)
        metrics.update(rollout_metrics(trajs, "rollout"))
        metrics.update(advantage_metrics(gather_rows(advantage_stats(trajs, rows))))
        sampled = float(np.sum(gather_rows(np.asarray(
            [sum(t.policy_mask) for t in trajs], np.float64))))
        metrics["time/rollout_s"] = t_roll
        metrics["rollout/tokens_per_s"] = sampled / max(t_roll, 1e-9)
        metrics["rollout/num_adv_nonzero"] = float(np.sum(gather_rows(
            np.asarray([np.sum(np.abs(turn_adv) > 1e-8)], np.float64))))
        metrics["rollout/staleness"] = float(step - version)
        return rows, metrics


class _AsyncRollouts:
    """A thread that makes the RL phase's rows ahead of the trainer: step s is sampled once the
    trainer has published policy version >= s - max_staleness, with the newest version
    published. max_staleness 0 = every step waits for its own version (the synchronous loop's
    rollouts, overlapped with nothing); k > 0 overlaps rollouts with the update and eval, and
    the PPO loss's TIS weight (π_old / π_sampler) corrects for the stale sampler. Params are
    published as copies (the train step donates its state)."""

    def __init__(self, phase: _RLPhase, start: int, stop: int, max_staleness: int, pool):
        if phase.prog.nproc > 1:
            raise ValueError("config.rl.async_rollouts runs on one process; multi-host runs "
                             "sample synchronously")
        self.phase, self.k, self.pool = phase, max_staleness, pool
        self.cv = threading.Condition()
        self.latest: tuple[int, Any, Any] | None = None  # (version, params, ref)
        self.out: queue.Queue = queue.Queue(maxsize=max_staleness + 1)
        self.error: BaseException | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self._run, args=(start, stop), daemon=True,
                                       name="async-rollouts")
        self.started = False

    def _run(self, start: int, stop: int) -> None:
        try:
            with sharding_context(self.phase.mesh) if self.phase.mesh is not None \
                    else contextlib.nullcontext():
                for s in range(start, stop):
                    with self.cv:
                        self.cv.wait_for(lambda: self.stopped or (
                            self.latest is not None and self.latest[0] >= s - self.k))
                        if self.stopped:
                            return
                        version, params, ref = self.latest
                    self.out.put((s, self.phase.make(s, params, ref, self.pool, version)))
        except BaseException as e:  # re-raised on the trainer's thread
            self.error = e
            self.out.put((None, None))

    def take(self, step: int, params, ref_params) -> tuple[list[Row], dict]:
        """Publishes `params` as version `step` and returns the rows made for `step`."""
        copy = (lambda t: t) if self.k == 0 else (lambda t: jax.tree.map(jnp.copy, t))
        with self.cv:
            self.latest = (step, copy(params), ref_params)  # the reference is never donated
            self.cv.notify_all()
        if not self.started:
            self.thread.start()
            self.started = True
        t0 = time.time()
        s, item = self.out.get()
        if self.error is not None:
            raise RuntimeError("async rollout thread failed") from self.error
        if s != step:
            raise RuntimeError(f"async rollouts out of order: got step {s}, expected {step}")
        rows, metrics = item
        metrics["time/rollout_wait_s"] = time.time() - t0
        return rows, metrics

    def close(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()
        if self.started:
            self.thread.join(timeout=60)


class ToolUseProgram:
    """The tool-use method for `rl.driver`: tasks, tokenizer, model, phases, eval, summary."""

    def __init__(self, spec: RunSpec, workdir: str, nproc: int):
        tu = spec.tool_use
        self.tu, self.seed, self.nproc = tu, spec.seed, nproc
        self.pid = jax.process_index()
        self.sft_steps, self.total = spec.sft.steps, spec.schedule.total
        self.rcfg = tu.rollout
        lead = self.pid == 0
        if lead and tu.warm_start:
            seed_from_warm_start(tu.warm_start, workdir, spec.sft.steps)
        if not lead:
            barrier("tasks")  # process 0 generates the task cache and trains the tokenizer first
        tasks = load_tasks(tu.tasks, self.rcfg, spec.env, workdir)
        if not tasks["train"] or not tasks["eval"]:
            raise ValueError(f"task split is empty: {len(tasks['train'])} train, "
                             f"{len(tasks['eval'])} eval; raise config.tasks.num_tasks")
        self.catalog = run_catalog(spec.env)
        self.env_spec = spec.env
        self.tokenizer = build_tokenizer(spec.model, self.rcfg, tasks["train"], self.catalog,
                                         workdir)
        if lead:
            barrier("tasks")
        # Task filtering and the trained tokenizer used the spec's rollout settings (no
        # template yet); everything rendered from here on uses the tokenizer's template.
        self.rcfg = rollout_config(tu, self.tokenizer)
        self.cfg, self.params0 = build_model(spec.model, spec.seed, self.tokenizer)
        self.pad_id = self.tokenizer.pad_id
        self.score_reference = tu.score_reference
        self.checkpoint_meta: dict = {}
        # Multi-host: each process samples with a local copy of the params on its own device.
        local_mesh = make_mesh((1, 1, 1), jax.local_devices()[:1]) if nproc > 1 else None
        self.on_local = ((lambda: sharding_context(local_mesh)) if nproc > 1
                         else contextlib.nullcontext)
        self.sft_pool, self.rl_pool = phase_pools(tasks["train"], tu.tasks.sft_fraction,
                                                  tu.tasks.sft_servers, tu.tasks.unseen_demos)
        self.sft_servers = set(tu.tasks.sft_servers)
        self.eval_tasks = tasks["eval"][:tu.eval_tasks][self.pid::nproc]
        # A fixed probe of RL tasks sampled like training rollouts at every eval: train-rollout
        # success moves with which tasks a step drew (every arm of a sweep sees the same
        # order), the probe's does not.
        self.probe_tasks = list(self.rl_pool[:tu.probe_tasks])[self.pid::nproc]
        self.tasks_by_id = {t.id: t for split in tasks.values() for t in split}
        self.sampling = sampling_params(self.tokenizer, tu.max_new_tokens, tu.temperature,
                                        tu.top_p, tu.top_k, self.rcfg.chat_template)
        self.greedy = sampling_params(self.tokenizer, tu.max_new_tokens, 0.0,
                                      template=self.rcfg.chat_template)
        self._tools: dict[tuple, list[dict]] = {}
        # Rollouts and evals share the env pool; with async rollouts they run on two threads.
        self.pool_lock = threading.Lock()
        self._sft: _SFTPhase | None = None

    def tools(self, task: Task) -> list[dict]:
        """Returns the full tool list of the task's servers (cached per server set)."""
        if task.servers not in self._tools:
            self._tools[task.servers] = episode_tools(self.catalog, task.servers)[0]
        return self._tools[task.servers]

    def phase(self, spec: PhaseSpec, mesh=None):
        if spec.name == "sft":
            self._sft = _SFTPhase(spec, self, self.sft_pool)
            return self._sft
        # One pool for both phases and one seed: RL continues the SFT shuffle's stream of tasks.
        shared = self._sft.ds if (self._sft is not None and self.rl_pool is self.sft_pool
                                  and spec.seed == self._sft.spec.seed) else None
        return _RLPhase(spec, self, self.rl_pool, shared, mesh)

    def env_pool(self):
        return EnvPool(self.catalog, **self.env_spec.pool_kwargs())

    def evaluate(self, params, pool, done: int) -> dict:
        local = local_params(params)

        def measure(tasks_, sp, key, seed, prefix) -> dict:
            t0 = time.time()
            with self.on_local(), self.pool_lock:
                trajs = run_rollouts(SamplerPolicy(local, self.cfg, sp), tasks_, 1, pool,
                                     self.tokenizer, self.rcfg, jax.random.key(key), seed=seed)
            out = {**rollout_metrics(trajs, prefix), f"{prefix}/time_s": time.time() - t0}
            if self.sft_servers and prefix == "eval":
                # tasks on servers SFT demonstrated vs on servers only RL trained on
                seen = {t.id for t in tasks_ if set(t.servers) <= self.sft_servers}
                for name, keep in (("seen", True), ("unseen", False)):
                    part = [tr for tr in trajs if (tr.task_id in seen) == keep]
                    out.update(rollout_metrics(part, f"eval_{name}"))
            return out

        m = measure(self.eval_tasks, self.greedy, 0, 10_000, "eval")
        if distributed.global_any(bool(self.probe_tasks)):
            m.update(measure(self.probe_tasks, self.sampling, 1, 20_000, "probe"))
        return m

    def state_meta(self) -> dict:
        return {}

    def load_state_meta(self, meta: dict) -> None:
        del meta

    def summary(self, records: list[dict], workdir: str) -> dict:
        evals = [(r["step"], r["eval/success_rate"]) for r in records
                 if "eval/success_rate" in r]
        return {"final_step": self.total, "eval_curve": evals,
                "warm_start_success": next((v for s, v in evals if s == self.sft_steps), None),
                "final_success": evals[-1][1] if evals else None}


PROGRAMS.register("toolverse", ToolUseProgram)


def run_training(config, workdir: str) -> dict:
    """Runs (or resumes) a tool-use training run: `rl.driver.run_training`."""
    from toolverse_jax.rl.driver import run_training as run
    return run(config, workdir)
