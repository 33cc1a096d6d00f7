"""The one training loop: a method's phases make each step's rows; the driver does the rest.

    run_training(config, workdir)  ->  RunSpec.from_config  ->  the method's Program
        for each global step: phase.rows(...) -> global batch -> train step (SFT) or
        ppo_update (RL) -> eval on schedule -> metrics.jsonl / tensorboard -> checkpoint

A `Program` (`rl/tool_use.py` for ToolVerse / TRACE, `memory/train.py` for Memory-R2) builds
the model, tokenizer and data, and gives one `Phase` per PhaseSpec (its `rows` for a step), its
eval, checkpoint metadata and summary. The driver owns, once for every method: multi-host
initialization, the mesh and train state, the per-phase optimizer switch, the frozen reference
(the policy when RL starts; reloaded from the preserved SFT-end checkpoint, or rebuilt from the
initial params, on resume: never saved again), async checkpoints and bit-exact resume, the
eval/checkpoint schedule, logging, the progress bar and the learning curve.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from typing import Any, Callable, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from toolverse_jax.models import get_preset, init_params, load_hf_checkpoint
from toolverse_jax.models.config import ModelConfig
from toolverse_jax.registry import Registry
from toolverse_jax.rl.batching import global_batch
from toolverse_jax.rl.checkpoint import RunCheckpointer
from toolverse_jax.rl.metrics import MetricsLog, plot_curve
from toolverse_jax.rl.spec import ModelSpec, PhaseSpec, RunSpec
from toolverse_jax.rl.trainer import init_train_state, make_train_step, ppo_update
from toolverse_jax.rl.types import Row
from toolverse_jax.sharding import distributed, make_mesh, shard_params, sharding_context


class Phase(Protocol):
    """Makes the rows of one step of a phase."""

    spec: PhaseSpec

    def rows(self, step: int, params: Any, ref_params: Any, pool: Any
             ) -> tuple[Sequence[Row], dict[str, float]]:
        """Returns (this process's rows, metrics) for phase-local step `step` under the
        current `params` (and the frozen reference, None before RL). The driver calls it once
        per step, in order, then updates (donating `params`); a phase may also have close()."""


class Program(Protocol):
    """What a method gives the driver; built by its factory after multi-host initialization."""

    cfg: ModelConfig
    params0: Any                    # initial params (a preset's init or a loaded checkpoint)
    pad_id: int
    score_reference: bool           # the RL loss reads reference log-probs (k3 KL / logged)
    checkpoint_meta: dict           # extra metadata the checkpoints must match (e.g. method)

    def phase(self, spec: PhaseSpec, mesh: Any) -> Phase: ...

    def env_pool(self) -> contextlib.AbstractContextManager: ...

    def evaluate(self, params: Any, pool: Any, done: int) -> dict[str, float]: ...

    def state_meta(self) -> dict: ...
    def load_state_meta(self, meta: dict) -> None: ...
    def summary(self, records: list[dict], workdir: str) -> dict: ...


# method name -> factory(spec, workdir, nproc) -> Program
PROGRAMS: Registry[Callable[..., Program]] = Registry("training method", plural="methods",
                                                      hint="(config.method)")


def _programs() -> Registry:
    # Importing a method's module registers it; imported here so the driver has no import-time
    # dependency on any method (and a method may import the driver).
    import toolverse_jax.memory.train  # noqa: F401
    import toolverse_jax.rl.tool_use  # noqa: F401
    return PROGRAMS


def build_model(model: ModelSpec, seed: int, tokenizer) -> tuple[ModelConfig, Any]:
    """Returns (ModelConfig, initial params) from an HF/GGUF checkpoint or a preset. With a
    trained tokenizer the preset's vocab_size becomes the tokenizer's (padded) size."""
    if model.checkpoint:
        cfg, params = load_hf_checkpoint(model.checkpoint, dtype=jnp.dtype(model.dtype))
        cfg = cfg.replace(remat=model.remat)
    else:
        cfg = get_preset(model.preset, dtype=model.dtype, param_dtype=model.dtype,
                         remat=model.remat)
        if model.tokenizer == "trained":
            cfg = cfg.replace(vocab_size=tokenizer.vocab_size)
        params = init_params(cfg, jax.random.key(seed))
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"tokenizer {model.tokenizer!r} has {tokenizer.vocab_size} ids but model vocab_size "
            f"is {cfg.vocab_size}; pick a matching preset or tokenizer")
    return cfg, params


def run_training(config: ConfigDict, workdir: str) -> dict:
    """Runs (or resumes) the configured training in `workdir`; returns the summary dict.

    Multi-host (config.distributed or TOOLVERSE_* env vars, see sharding.distributed): every
    process makes its own slice of each step's rows, the train step runs on the global batch,
    and process 0 writes the logs (all processes write the checkpoints together)."""
    spec = RunSpec.from_config(config)
    record_config(config, workdir)
    return run(spec, workdir)


def record_config(config: ConfigDict, workdir: str) -> None:
    """Writes the run's resolved config to WORKDIR/config.json and appends it, with the time, to
    WORKDIR/config_history.jsonl (one line per invocation: a resumed run shows what changed)."""
    os.makedirs(workdir, exist_ok=True)
    text = config.to_json_best_effort(sort_keys=True)
    tmp = os.path.join(workdir, f".config.json.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, os.path.join(workdir, "config.json"))
    with open(os.path.join(workdir, "config_history.jsonl"), "a") as f:
        f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                            "config": json.loads(text)}, sort_keys=True) + "\n")


def use_compilation_cache(path: str) -> None:
    """Points JAX's persistent compilation cache at `path` ("" leaves JAX's setting alone);
    programs that took at least half a second to compile are kept. An environment's
    JAX_COMPILATION_CACHE_DIR wins."""
    if not path or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def run(spec: RunSpec, workdir: str) -> dict:
    """Runs (or resumes) `spec` in `workdir`; returns the summary dict (process 0) or
    {"final_step", "process_index"} (other processes)."""
    nproc = distributed.initialize(spec.distributed)
    use_compilation_cache(spec.compilation_cache_dir)
    pid = jax.process_index()
    lead = pid == 0
    os.makedirs(workdir, exist_ok=True)
    program = _programs().get(spec.method)(spec, workdir, nproc)
    cfg, sched = program.cfg, spec.schedule
    mesh = make_mesh(spec.mesh_shape)
    phases = {p.name: program.phase(p, mesh) for p in spec.phases if p.steps > 0}

    with sharding_context(mesh):
        params0 = shard_params(program.params0, cfg, mesh)
        ckpt = RunCheckpointer(workdir, keep=sched.keep_checkpoints,
                               preserve=(sched.sft_steps,) if sched.sft_steps and sched.rl_steps
                               else ())
        expect = {"model_config": dataclasses.asdict(cfg), "sft_steps": sched.sft_steps,
                  "seed": spec.seed, **program.checkpoint_meta}
        start, ref_params = 0, None
        latest = ckpt.latest_step()
        # The optimizer state of the phase the saved step is in (the SFT end is saved before
        # RL's optimizer replaces SFT's).
        state = init_train_state(params0, spec.phase_at(max((latest or 0) - 1, 0)).optimizer)
        if latest is not None:
            state, ref_params, meta = ckpt.restore(
                latest, state, params0, expect,
                defaults={"model_config": dataclasses.asdict(type(cfg)())})
            start = meta["global_step"]
            program.load_state_meta(meta)
            if start > sched.sft_steps and ref_params is None:
                ref_params = (ckpt.restore_params(sched.sft_steps, params0)
                              if sched.sft_steps else jax.tree.map(jnp.copy, params0))
            print(f"resumed from {ckpt.directory}/{latest} at step {start}", flush=True)
        log = MetricsLog(workdir, start if latest is not None else None) if lead else None
        step_fns = {name: make_train_step(cfg, p.spec.loss, p.spec.optimizer, spec.num_micro)
                    for name, p in phases.items()}
        more_micro: dict[tuple[str, int], Any] = {}  # (phase, micro-batches) -> train step

        def step_for(name: str):
            def get(n: int):
                if (name, n) not in more_micro:
                    p = phases[name].spec
                    more_micro[name, n] = make_train_step(cfg, p.loss, p.optimizer, n)
                return more_micro[name, n]
            return get

        pbar = None
        if spec.progress and lead:
            from tqdm import tqdm
            pbar = tqdm(total=sched.total, initial=start, desc=spec.method, dynamic_ncols=True)
        with program.env_pool() as pool:
            if start == 0 and sched.eval_every > 0 and sched.eval_at_start:
                m0 = program.evaluate(state.params, pool, 0)
                if lead:
                    log.write(0, {**m0, "phase": "init"})
            for step in range(start, sched.total):
                t0 = time.time()
                pspec = spec.phase_at(step)
                local = step - (0 if pspec.name == "sft" else sched.sft_steps)
                if pspec.name == "rl" and local == 0 and ref_params is None:
                    # The warm-started policy is the frozen reference (KL, TRACE) and the RL
                    # optimizer starts fresh.
                    ref_params = jax.tree.map(jnp.copy, state.params)
                    state = init_train_state(state.params, pspec.optimizer)
                rows, metrics = phases[pspec.name].rows(local, state.params, ref_params, pool)
                state, m = _update(state, rows, step_fns[pspec.name], pspec, spec, program,
                                   mesh, ref_params, step, step_for(pspec.name))
                metrics.update(m)
                metrics["phase"] = pspec.name
                done = step + 1
                metrics["time/step_s"] = time.time() - t0
                if sched.eval_due(done):
                    metrics.update(program.evaluate(state.params, pool, done))
                if lead:
                    log.write(done, metrics)
                if sched.checkpoint_due(done):
                    ckpt.save(done, state, None,
                              {**expect, **program.state_meta(), "global_step": done,
                               "has_ref": False})
                if pbar is not None:
                    pbar.update(1)
                    pbar.set_postfix({k.split("/")[-1]: round(v, 3) for k, v in metrics.items()
                                      if k in ("loss", "rollout/success_rate",
                                               "eval/success_rate")})
            for phase in phases.values():
                if hasattr(phase, "close"):
                    phase.close()  # e.g. joins an async rollout thread
        if pbar is not None:
            pbar.close()
        ckpt.close()
        if not lead:
            return {"final_step": sched.total, "process_index": pid}
        records = log.records()
        log.close()
    plot_curve(records, os.path.join(workdir, "learning_curve.png"))
    summary = program.summary(records, workdir)
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def _update(state, rows: Sequence[Row], step_fn, pspec: PhaseSpec, spec: RunSpec,
            program: Program, mesh, ref_params, step: int, step_for=None) -> tuple[Any, dict]:
    """Returns (state, metrics) after the phase's update on this step's rows (all processes')."""
    t0 = time.time()
    if not distributed.global_any(bool(rows)):
        return state, {}  # every rollout of the step failed (RL): nothing to learn from
    if pspec.loss.name == "sft":
        batch = global_batch(rows, program.pad_id, mesh, spec.num_micro)
        state, m = step_fn(state, batch)
        out = {k: float(v) for k, v in jax.device_get(m).items()}
        out["time/update_s"] = time.time() - t0
        return state, out
    return ppo_update(state, rows, step_fn, cfg=program.cfg, mesh=mesh,
                      num_micro=spec.num_micro, pad_id=program.pad_id,
                      temperature=pspec.loss.temperature,
                      ref_params=ref_params if program.score_reference else None,
                      epochs=pspec.epochs, num_minibatches=pspec.num_minibatches,
                      rng=np.random.default_rng([pspec.seed, step]), backend=pspec.loss.backend,
                      score_old=not pspec.loss.old_from_current,
                      skip_no_signal=pspec.skip_no_signal,
                      aggregation=pspec.loss.aggregation, share_prefix=pspec.share_prefix,
                      micro_tokens=spec.micro_tokens if step_for is not None else 0,
                      step_for=step_for)
