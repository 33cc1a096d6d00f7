"""The run spec: everything a training run needs from its ConfigDict, read in one place.

`RunSpec.from_config(config)` is the only code that reads a training ConfigDict: it fills the
keys a config file leaves out from `configs/common.py` (so an older file keeps working when a
knob is added), checks the values, and returns frozen, typed settings: the model, mesh and env
pool, the phases (SFT, RL: steps, optimizer, loss with its kernel backend, PPO epochs), the
eval/checkpoint schedule, the stop strings, and the method's own block (`tool_use` for the
ToolVerse / TRACE runs, `memory` for Memory-R2). Everything downstream takes these.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import optax
from ml_collections import ConfigDict

from configs import common
from toolverse_jax.memory.rollout import MemoryRolloutConfig
from toolverse_jax.models.template import CHAT_TEMPLATE_CHOICES
from toolverse_jax.rl.rollout import RolloutConfig
from toolverse_jax.rl.trainer import LossConfig, make_optimizer
from toolverse_jax.sampling import SamplingParams

# Strings that end a generation (the chat template's turn end, the tokenizer's EOS).
STOP_STRINGS = ("<|im_end|>", "<|endoftext|>")


def stop_ids(tokenizer, template=None) -> tuple[int, ...]:
    """Returns the ids of STOP_STRINGS that `tokenizer` has as single tokens, plus the end
    token of `template` (a models.template.ChatTemplate) when it is another one."""
    ids = tuple(tokenizer.stop_ids_for(list(STOP_STRINGS)))
    if template is not None and template.end_id not in ids:
        ids += (template.end_id,)
    return ids


def sampling_params(tokenizer, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                    top_k: int = 0, template=None) -> SamplingParams:
    """Returns SamplingParams stopping at STOP_STRINGS (and `template`'s end token);
    temperature 0 = greedy (no top-p/k)."""
    greedy = temperature <= 0
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=max(temperature, 0.0),
                          top_p=1.0 if greedy else top_p, top_k=0 if greedy else top_k,
                          stop_token_ids=stop_ids(tokenizer, template), pad_id=tokenizer.pad_id)


def resolve(config: ConfigDict) -> ConfigDict:
    """Returns a copy of `config` with every key it leaves out taken from the defaults of its
    method (configs/common.py); keys the defaults do not know are kept (a config may add its
    own, e.g. `distributed`)."""
    method = config.get("method", "toolverse")
    out = common.defaults(method)

    def merge(dst: ConfigDict, src: ConfigDict) -> None:
        for k, v in src.items():
            # rl.adv is one estimator's constant set: a config's block replaces the default
            # whole (merging would leak GRPO/TARA defaults into, e.g., TRACE's constants).
            if isinstance(v, ConfigDict) and isinstance(dst.get(k), ConfigDict) and k != "adv":
                merge(dst[k], v)
            else:
                # ConfigDict keeps a field's type: a default of one type replaced by another
                # (e.g. a tuple by a list) is rebuilt rather than assigned.
                if k in dst and not isinstance(v, ConfigDict) and type(dst[k]) is not type(v):
                    del dst[k]
                dst[k] = v
    with out.unlocked():
        merge(out, config)
    return out


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    preset: str
    checkpoint: str
    tokenizer: str
    tokenizer_vocab: int
    dtype: str
    remat: bool


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    num_workers: int
    call_timeout_s: float
    include_hidden: bool
    corpus_env: str
    backend: str = "process"
    isolation: str = "auto"
    server_mem_mb: int = 4096

    def pool_kwargs(self) -> dict[str, Any]:
        """Returns the EnvPool keyword arguments (after the catalog)."""
        from toolverse_jax.envs.isolate import Isolation

        return {"num_workers": self.num_workers, "call_timeout_s": self.call_timeout_s,
                "backend": self.backend,
                "isolation": Isolation(mode=self.isolation, mem_mb=self.server_mem_mb)}


@dataclasses.dataclass(frozen=True)
class PhaseSpec:
    """One training phase: its length, optimizer and loss, and how a batch is reused."""

    name: str                       # "sft" | "rl"
    steps: int
    optimizer: optax.GradientTransformation
    loss: LossConfig
    epochs: int = 1                 # passes over each step's rows (PPO reuse)
    num_minibatches: int = 1
    seed: int = 0                   # the phase's sampling keys, task order, minibatch shuffles
    # Leave rows without an advantage signal out of the update (rescaled: the same update);
    # set only where the loss has no KL or entropy term and no reference is scored
    # (RunSpec.from_config).
    skip_no_signal: bool = False
    # Run a group's common prompt once in the update (rl/batching.py:pack_rows).
    share_prefix: bool = False


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When the loop evaluates and checkpoints. Steps are global (SFT then RL), counted as
    updates done; the SFT end and the last step always evaluate (when evals are on) and
    checkpoint."""

    sft_steps: int
    rl_steps: int
    eval_every: int                 # RL steps between evals; 0 = never evaluate
    sft_eval_every: int             # SFT steps between evals; 0 = only at the SFT end
    checkpoint_every: int
    keep_checkpoints: int
    eval_at_start: bool = True      # evaluate the initial params (step 0) too

    @property
    def total(self) -> int:
        return self.sft_steps + self.rl_steps

    def eval_due(self, done: int) -> bool:
        if self.eval_every <= 0:
            return False
        rl_done = done - self.sft_steps
        return (done == self.total or done == self.sft_steps
                or (rl_done > 0 and rl_done % self.eval_every == 0)
                or (rl_done < 0 and self.sft_eval_every > 0 and done % self.sft_eval_every == 0))

    def checkpoint_due(self, done: int) -> bool:
        return (done == self.total or done == self.sft_steps
                or done % max(self.checkpoint_every, 1) == 0)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    source: str
    path: str
    num_tasks: int
    horizons: tuple[int, ...]
    servers: tuple[str, ...]
    split_by: str
    eval_fraction: float
    gen_seed: int
    sft_fraction: float
    max_literal_chars: int
    search_kinds: tuple[str, ...]
    corpus_dir: str
    sft_servers: tuple[str, ...] = ()
    unseen_demos: int = 0
    instruction_level: str = "recipe"
    whole_chain: bool | None = None
    sft_fresh_literals: bool = False


@dataclasses.dataclass(frozen=True)
class TraceSpec:
    answer_prefix: str
    scorer: str
    pad_to: int


@dataclasses.dataclass(frozen=True)
class ToolUseSpec:
    """The tool-use method's own settings (tasks, rollouts, advantage, eval sets)."""

    tasks: TaskSpec
    rollout: RolloutConfig
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    sft_batch_size: int
    tasks_per_step: int
    group_size: int
    advantage: str
    adv_consts: dict
    trace: TraceSpec
    warm_start: str
    eval_tasks: int
    probe_tasks: int
    score_reference: bool           # score the reference on every RL batch (k3 KL, or logged)
    async_rollouts: bool = False    # rollouts on a thread, up to max_staleness versions ahead
    max_staleness: int = 0
    # models.template.CHAT_TEMPLATE_CHOICES; resolved against the run's tokenizer once it is
    # built (rl/tool_use.py: rollout_config), so `rollout.chat_template` is None here.
    chat_template: str = "auto"


@dataclasses.dataclass(frozen=True)
class MemorySpec:
    """Memory-R2's own settings (roles, rollouts, LoGo, curriculum, data, eval)."""

    rollout: MemoryRolloutConfig
    roles: tuple[str, ...]
    max_new_tokens: dict
    temperature: float
    top_p: float
    train_seed: int
    eval_seed: int
    max_questions: int
    locomo_path: str
    locomo_limit: int
    local_coef: float
    local_fraction: float
    inner_n: int
    stages: tuple[int, ...]
    threshold: float
    min_evals: int
    sft_convs_per_step: int
    sft_num_sessions: int
    sft_rows_per_step: int
    rl_convs_per_step: int
    group_size: int
    adv_eps: float
    eval_num_convs: int
    eval_horizons: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class RunSpec:
    method: str
    seed: int
    model: ModelSpec
    mesh_shape: tuple[int, ...]
    env: EnvSpec
    sft: PhaseSpec
    rl: PhaseSpec
    schedule: Schedule
    num_micro: int
    progress: bool
    distributed: dict | None        # sharding.distributed.initialize's settings (None = env)
    compilation_cache_dir: str = ""  # JAX's persistent compilation cache ("" = off)
    # RL minibatches above num_micro * micro_tokens padded token positions run in more
    # micro-batches (rl.trainer.ppo_update; 0 = never).
    micro_tokens: int = 0
    tool_use: ToolUseSpec | None = None
    memory: MemorySpec | None = None

    @property
    def phases(self) -> tuple[PhaseSpec, PhaseSpec]:
        return (self.sft, self.rl)

    def phase_at(self, step: int) -> PhaseSpec:
        """Returns the phase that global step `step` (0-based, an update to do) belongs to."""
        return self.sft if step < self.sft.steps else self.rl

    @classmethod
    def from_config(cls, config: ConfigDict) -> "RunSpec":
        c = resolve(config)
        r = c.rl
        temperature = c.rollout.temperature if c.method == "toolverse" else c.memory.temperature

        one_update = int(r.ppo_epochs) <= 1 and int(r.num_minibatches) <= 1

        def loss(name: str) -> LossConfig:
            return LossConfig(name=name, clip_eps_low=r.clip_eps_low,
                              clip_eps_high=r.clip_eps_high, kl_coef=r.kl_coef,
                              entropy_coef=r.entropy_coef, tis_cap=r.tis_cap,
                              aggregation=r.aggregation, neg_adv_scale=r.neg_adv_scale,
                              temperature=temperature if name != "sft" else 1.0,
                              backend=r.kernel_backend,
                              old_from_current=one_update and name != "sft")

        for name, steps in (("sft", c.sft.steps), ("rl", r.steps)):
            if steps < 0:
                raise ValueError(f"config.{name}.steps={steps}; use >= 0")
        sft = PhaseSpec("sft", int(c.sft.steps),
                        make_optimizer(c.sft.lr, c.sft.warmup_steps, max(c.sft.steps, 1),
                                       schedule=str(c.sft.get("schedule", "constant"))),
                        loss("sft"), seed=int(c.seed))
        rl = PhaseSpec("rl", int(r.steps),
                       make_optimizer(r.lr, r.warmup_steps, max(r.steps, 1),
                                      weight_decay=r.weight_decay,
                                      max_grad_norm=r.max_grad_norm),
                       loss(r.loss), epochs=max(int(r.ppo_epochs), 1),
                       num_minibatches=max(int(r.num_minibatches), 1),
                       seed=int(c.seed) if int(r.seed) < 0 else int(r.seed),
                       skip_no_signal=bool(r.skip_no_signal) and r.loss == "ppo_clip"
                       and r.kl_coef == 0 and r.entropy_coef == 0
                       and not bool(c.train.get("log_ref_kl", False)),
                       share_prefix=bool(r.get("share_prefix", True)))
        t = c.train
        m = c.model
        return cls(
            method=c.method, seed=int(c.seed),
            model=ModelSpec(m.preset, m.checkpoint, m.tokenizer, int(m.tokenizer_vocab),
                            m.dtype, bool(m.remat)),
            mesh_shape=tuple(c.mesh.shape),
            env=EnvSpec(int(c.env.num_workers), float(c.env.call_timeout_s),
                        bool(c.env.include_hidden), c.env.corpus_env, c.env.backend,
                        c.env.isolation, int(c.env.server_mem_mb)),
            sft=sft, rl=rl,
            schedule=Schedule(sft.steps, rl.steps, int(t.eval_every), int(t.sft_eval_every),
                              int(t.checkpoint_every), int(t.keep_checkpoints),
                              bool(t.eval_at_start)),
            num_micro=int(t.num_micro), progress=bool(t.progress),
            micro_tokens=int(t.get("micro_tokens", 0)),
            distributed=dict(c.distributed) if "distributed" in c else None,
            compilation_cache_dir=os.path.expanduser(str(t.get("compilation_cache_dir", ""))),
            tool_use=_tool_use(c) if c.method == "toolverse" else None,
            memory=_memory(c) if c.method == "memory_r2" else None)


def _tool_use(c: ConfigDict) -> ToolUseSpec:
    t, ro, r = c.tasks, c.rollout, c.rl
    if ro.chat_template not in CHAT_TEMPLATE_CHOICES:
        raise ValueError(f"config.rollout.chat_template={ro.chat_template!r}; use one of "
                         f"{CHAT_TEMPLATE_CHOICES}")
    rollout = RolloutConfig(max_turns=ro.max_turns, max_context=ro.max_context,
                            tool_format=ro.tool_format, prompt_tools=ro.prompt_tools,
                            num_distractors=ro.num_distractors,
                            max_observation_chars=ro.max_observation_chars,
                            ok_call_bonus=r.ok_call_bonus, gold_turn_bonus=r.gold_turn_bonus,
                            arg_match_bonus=r.arg_match_bonus,
                            max_invalid_streak=int(ro.max_invalid_streak),
                            max_episode_s=float(ro.max_episode_s),
                            require_answer=bool(ro.require_answer), engine=str(ro.engine),
                            engine_slots=int(ro.engine_slots),
                            engine_chunk=int(ro.engine_chunk),
                            engine_resume_lag=int(ro.engine_resume_lag))
    return ToolUseSpec(
        tasks=TaskSpec(t.source, t.path, int(t.num_tasks), tuple(t.horizons),
                       tuple(t.servers or ()), t.split_by, float(t.eval_fraction),
                       int(t.gen_seed), float(t.sft_fraction), int(t.max_literal_chars or 0),
                       tuple(t.search_kinds or ()), t.corpus_dir, tuple(t.sft_servers or ()),
                       int(t.unseen_demos), str(t.instruction_level),
                       None if t.whole_chain is None else bool(t.whole_chain),
                       bool(t.sft_fresh_literals)),
        rollout=rollout, max_new_tokens=int(ro.max_new_tokens),
        temperature=float(ro.temperature), top_p=float(ro.top_p), top_k=int(ro.top_k),
        sft_batch_size=int(c.sft.batch_size), tasks_per_step=int(r.tasks_per_step),
        group_size=int(r.group_size), advantage=r.advantage, adv_consts=dict(r.adv),
        trace=TraceSpec(c.trace.answer_prefix, c.trace.scorer, int(c.trace.pad_to)),
        warm_start=c.train.warm_start, eval_tasks=int(c.train.eval_tasks),
        probe_tasks=min(int(c.train.probe_tasks or 0), int(c.train.eval_tasks)),
        score_reference=r.kl_coef > 0 or bool(c.train.log_ref_kl),
        async_rollouts=bool(r.async_rollouts), max_staleness=max(int(r.max_staleness), 0),
        chat_template=str(ro.chat_template))


def _memory(c: ConfigDict) -> MemorySpec:
    mm, d, lg, cu = c.memory, c.data, c.logo, c.curriculum
    return MemorySpec(
        rollout=MemoryRolloutConfig(max_facts=mm.max_facts, manager_k=mm.manager_k,
                                    answer_k=mm.answer_k, max_ops=mm.max_ops,
                                    qa_metric=mm.qa_metric, comp_coef=mm.comp_coef,
                                    comp_theta=mm.comp_theta),
        roles=tuple(mm.roles), max_new_tokens=dict(mm.max_new_tokens),
        temperature=float(mm.temperature), top_p=float(mm.top_p),
        train_seed=int(d.train_seed), eval_seed=int(d.eval_seed),
        max_questions=int(d.max_questions), locomo_path=d.locomo_path,
        locomo_limit=int(d.locomo_limit or 0), local_coef=float(lg.local_coef),
        local_fraction=float(lg.local_fraction), inner_n=int(lg.inner_n),
        stages=tuple(cu.stages), threshold=float(cu.threshold), min_evals=int(cu.min_evals),
        sft_convs_per_step=int(c.sft.convs_per_step), sft_num_sessions=int(c.sft.num_sessions),
        sft_rows_per_step=int(c.sft.rows_per_step), rl_convs_per_step=int(c.rl.convs_per_step),
        group_size=int(c.rl.group_size), adv_eps=float(c.rl.adv_eps),
        eval_num_convs=int(c.eval.num_convs), eval_horizons=tuple(c.eval.horizons))
