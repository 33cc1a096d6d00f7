"""The Memory-R2 training program: SFT warm-start on gold memory operations, then LoGo-GRPO with
the session curriculum. `python -m experiments.train --config configs/memory_r2.py --workdir DIR`
(`rl/driver.py` runs it, like the tool-use program).

Writes DIR/metrics.jsonl (`eval/success_rate` = greedy QA exact match at the current curriculum
horizon; `eval/qa_em_<S>` / `eval/qa_f1_<S>` at every evaluated horizon), and checkpoints whose
metadata holds the curriculum state (resume continues at the same stage). Only the rollout
(multi-session, three roles sharing one backbone) and the advantage (LoGo-GRPO) differ from the
tool-use program.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from toolverse_jax.envs import Catalog, EnvPool
from toolverse_jax.memory import rollout as mr
from toolverse_jax.memory.curriculum import Curriculum
from toolverse_jax.memory.data import generate_conversations, load_locomo
from toolverse_jax.memory.logo import logo_advantages, trajectory_rows
from toolverse_jax.memory.roles import ROLES, check_roles
from toolverse_jax.models import load_tokenizer
from toolverse_jax.rl.batching import pad_rows
from toolverse_jax.rl.driver import PROGRAMS, build_model
from toolverse_jax.rl.rollout import SamplerPolicy
from toolverse_jax.rl.spec import PhaseSpec, RunSpec, sampling_params
from toolverse_jax.rl.types import Row


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


class MemoryProgram:
    """The Memory-R2 method for `rl.driver` (single process)."""

    def __init__(self, spec: RunSpec, workdir: str, nproc: int):
        del workdir
        if nproc > 1:
            raise ValueError("Memory-R2 training runs on one process (multi-host is the "
                             "tool-use program's); unset config.distributed / TOOLVERSE_*")
        ms = spec.memory
        self.ms, self.seed, self.sft_steps = ms, spec.seed, spec.sft.steps
        self.total = spec.schedule.total
        self.roles = check_roles(ms.roles)
        self.tokenizer = load_tokenizer(spec.model.tokenizer)
        self.cfg, self.params0 = build_model(spec.model, spec.seed, self.tokenizer)
        self.pad_id = self.tokenizer.pad_id
        self.num_micro = spec.num_micro
        self.score_reference = spec.rl.loss.kl_coef > 0
        self.checkpoint_meta = {"method": "memory_r2"}
        self.env_spec = spec.env
        self.eval_sets = {s: generate_conversations(ms.eval_num_convs, s, ms.eval_seed,
                                                    ms.max_questions)
                          for s in sorted(set(ms.eval_horizons) | set(ms.stages))}
        self.locomo = (load_locomo(ms.locomo_path, ms.locomo_limit or None)
                       if ms.locomo_path else [])
        self.curriculum = Curriculum(ms.stages, ms.threshold, ms.min_evals)

    def policies(self, params, temperature: float) -> dict:
        """Returns one sampler per role (its own max_new_tokens) on the shared params."""
        # Role prompts are rebuilt each call (not append-only contexts): no KV to keep.
        return {r: SamplerPolicy(params, self.cfg, sampling_params(
            self.tokenizer, self.ms.max_new_tokens[r], temperature, self.ms.top_p),
            kv_reuse=False) for r in ROLES}

    def phase(self, spec: PhaseSpec, mesh):
        del mesh
        return _MemorySFT(spec, self) if spec.name == "sft" else _MemoryRL(spec, self)

    def env_pool(self):
        return EnvPool(Catalog.default(kinds=("builtin",), include_hidden=True),
                       **self.env_spec.pool_kwargs())

    def evaluate(self, params, pool, done: int) -> dict:
        t0 = time.time()
        greedy = mr.ModelActor(self.policies(params, 0.0))
        m, cur = {}, self.curriculum
        for s, convs in self.eval_sets.items():
            if s not in self.ms.eval_horizons and s != cur.num_sessions:
                continue
            trajs, _ = mr.rollout_conversations(greedy, convs, 1, pool, self.tokenizer,
                                                self.ms.rollout, jax.random.key(0), seed=0)
            for k, v in qa_metrics(trajs, "eval").items():
                m[f"{k}_{s}"] = v
        if self.locomo:
            trajs, _ = mr.rollout_conversations(greedy, self.locomo, 1, pool, self.tokenizer,
                                                self.ms.rollout, jax.random.key(0), seed=0)
            m.update({k.replace("eval/", "eval_locomo/"): v
                      for k, v in qa_metrics(trajs, "eval").items()})
        acc = m.get(f"eval/qa_em_{cur.num_sessions}", 0.0)
        m["eval/success_rate"] = acc
        m["curriculum/advanced"] = float(cur.observe(done, acc)) if done > self.sft_steps \
            else 0.0
        m["curriculum/stage"] = float(cur.stage)
        m["eval/time_s"] = time.time() - t0
        return m

    def state_meta(self) -> dict:
        return {"curriculum": self.curriculum.to_json()}

    def load_state_meta(self, meta: dict) -> None:
        self.curriculum = Curriculum.from_json(meta["curriculum"], self.ms.stages)
        print(f"curriculum stage {self.curriculum.stage} "
              f"({self.curriculum.num_sessions} sessions)", flush=True)

    def summary(self, records: list[dict], workdir: str) -> dict:
        curves = {s: [(r["step"], r[f"eval/qa_em_{s}"]) for r in records
                      if f"eval/qa_em_{s}" in r] for s in self.eval_sets}
        return {"final_step": self.total,
                "qa_em_curves": {str(s): c for s, c in curves.items() if c},
                "final_qa_em": {str(s): c[-1][1] for s, c in curves.items() if c},
                "curriculum": self.curriculum.to_json(), "local_coef": self.ms.local_coef}


class _MemorySFT:
    """Gold memory operations of fresh conversations (all trained roles), a sampled subset."""

    def __init__(self, spec: PhaseSpec, prog: MemoryProgram):
        self.spec, self.prog = spec, prog

    def rows(self, step: int, params, ref_params, pool) -> tuple[list[Row], dict]:
        p, ms = self.prog, self.prog.ms
        convs = generate_conversations(ms.sft_convs_per_step, ms.sft_num_sessions,
                                       ms.train_seed * 7919 + step, ms.max_questions)
        trajs, _ = mr.rollout_conversations(mr.GoldActor(p.tokenizer), convs, 1, pool,
                                            p.tokenizer, ms.rollout, jax.random.key(step))
        rows = trajectory_rows(trajs, [1.0] * len(trajs), p.roles)
        rng = np.random.default_rng([p.seed, step])
        if len(rows) > ms.sft_rows_per_step:
            rows = [rows[i] for i in sorted(rng.choice(len(rows), ms.sft_rows_per_step,
                                                       replace=False))]
        return pad_rows(rows, p.pad_id, p.num_micro), {
            "curriculum/stage": float(p.curriculum.stage)}


class _MemoryRL:
    """LoGo-GRPO: G global rollouts per conversation at the curriculum's horizon, plus local
    groups re-rolling sessions from snapshotted banks."""

    def __init__(self, spec: PhaseSpec, prog: MemoryProgram):
        self.spec, self.prog = spec, prog

    def rows(self, step: int, params, ref_params, pool) -> tuple[list[Row], dict]:
        p, ms = self.prog, self.prog.ms
        gstep = p.sft_steps + step
        t0 = time.time()
        s_now = p.curriculum.num_sessions
        convs = generate_conversations(ms.rl_convs_per_step, s_now,
                                       ms.train_seed * 1_000_003 + gstep + 1, ms.max_questions)
        rng = np.random.default_rng([self.spec.seed, gstep, 17])
        plan = (mr.plan_locals(convs, ms.group_size, ms.local_fraction, rng)
                if ms.local_coef > 0 else [])
        k1, k2 = jax.random.split(jax.random.fold_in(jax.random.key(self.spec.seed), gstep))
        actor = mr.ModelActor(p.policies(params, ms.temperature))
        trajs, snaps = mr.rollout_conversations(
            actor, convs, ms.group_size, pool, p.tokenizer, ms.rollout, k1, seed=0,
            snapshot_at=[(r, s) for _, r, s in plan])
        t_global = time.time() - t0
        local = mr.rollout_local(actor, mr.ModelActor(p.policies(params, 0.0)), convs, plan,
                                 snaps, ms.inner_n, pool, p.tokenizer, ms.rollout, k2, seed=0,
                                 group_offset=len(convs)) if plan else []
        a_g, a_l = logo_advantages(
            [t.reward for t in trajs], [t.group_id for t in trajs],
            [not t.infra_failed for t in trajs], [t.reward for t in local],
            [t.group_id for t in local], [not t.infra_failed for t in local],
            ms.local_coef, ms.adv_eps)
        rows = (trajectory_rows(trajs, a_g, p.roles)
                + trajectory_rows(local, a_l, p.roles, True))
        n_all = len(rows)
        # Rows with advantage 0 carry no gradient; dropping them only changes the token-mean
        # normalizer, and saves most of the update's compute when groups agree.
        rows = [r for r in rows if r.has_signal]
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
        m["curriculum/stage"] = float(p.curriculum.stage)
        m["time/rollout_global_s"] = t_global
        m["time/rollout_s"] = time.time() - t0
        return (pad_rows(rows, p.pad_id, p.num_micro) if rows else []), m


PROGRAMS.register("memory_r2", MemoryProgram)
