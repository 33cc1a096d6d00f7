"""RL sanity tasks through the real stack: a contextual bandit and a multi-turn credit task.

Both run on the built-in `buttons` MCP server (envs/builtin/buttons.py; four buttons, each
showing a per-episode one-digit code) through the same pieces as `rl.driver`'s RL
phase: `EnvPool` (a worker process talking MCP over stdio to the server process),
`run_rollouts` with `SamplerPolicy` (the jitted KV-cache sampler), `compute_advantages` from the
estimator registry, `trajectory_rows`, and `ppo_update` (π_old scored by `score_jit`, then the
jitted PPO-clip step). Nothing is mocked.

- bandit: 'Call "press_blue" and reply with its code.' One call turn (the choice of k = 4
  tools), then the answer (the code the pressed button showed; exact verifier).
- multi_turn: the press (the choice), then `confirm` and `submit` (fixed), then the answer:
  only turn 1 decides success (turn-level credit in miniature).

Warm start: SFT (the `sft` loss, the same train step) on demonstrations of two wordings. Those
in the RL wording ("Call ...") press a uniformly random button (target x pressed balanced over
all k x k pairs) and answer that button's code: format and copy right, choice at chance, so
sampled success starts near 1/k. Those in a second wording ("Use ...") press the named button:
the instruction-following skill a pretrained model brings. Without them the tiny model never
reads the instruction where it picks the button (measured: its choice logits differ by < 0.01
across targets) and no estimator learns within 35 RL steps; with them RL has a circuit to
re-weight. `flip_sign` negates the advantages: a deliberately broken update that must fail.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import tempfile
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec
from toolverse_jax.envs.builtin.buttons import COLORS
from toolverse_jax.models import get_preset, init_params
from toolverse_jax.models.config import ModelConfig
from toolverse_jax.models.tokenizer import ByteTokenizer, train_bpe_tokenizer
from toolverse_jax.rl.batching import (compute_advantages, demonstration_row, global_batch,
                                       trajectory_rows)
from toolverse_jax.rl.metrics import advantage_metrics, advantage_stats, rollout_metrics
from toolverse_jax.rl.rollout import (RolloutConfig, SamplerPolicy, gold_demonstration,
                                      run_rollouts)
from toolverse_jax.rl.trace_scoring import readiness_for_trajectories
from toolverse_jax.rl.trainer import (LossConfig, init_train_state, make_optimizer,
                                      make_train_step, ppo_update)
from toolverse_jax.sampling import SamplingParams
from toolverse_jax.sharding import make_mesh, shard_params, sharding_context
from toolverse_jax.tasks import GoldStep, Task

SERVER = "buttons"
KINDS = ("bandit", "multi_turn")
FOLLOW_UPS = {"bandit": (), "multi_turn": ("confirm", "submit")}
ANSWER_PREFIX = "<answer>"


@dataclasses.dataclass(frozen=True)
class SanityConfig:
    """One sanity run: task kind, estimator, warm start and RL constants."""

    kind: str = "bandit"                  # "bandit" | "multi_turn"
    estimator: str = "grpo"               # any name in rl.registry
    seed: int = 0
    flip_sign: bool = False               # negate advantages: the broken update
    adv_consts: tuple = ()                # (key, value) pairs for the estimator (registry defaults)
    # warm start
    tokenizer_vocab: int = 512
    num_demos: int = 256                  # distinct demonstration episodes
    follow_fraction: float = 0.5          # of them: "follow"-worded, named button pressed
    sft_steps: int = 200
    sft_batch: int = 16
    sft_lr: float = 6e-3                  # cosine decay (a constant lr's last batches tilt
                                          # the random choice away from uniform)
    # RL
    rl_steps: int = 20
    tasks_per_step: int = 8
    group_size: int = 8
    rl_lr: float = 1e-3                   # 3e-3 breaks the tool-call format
    ppo_epochs: int = 1
    num_minibatches: int = 1
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    temperature: float = 1.0
    max_new_tokens: int = 24
    engine: str = "sync"                  # RolloutConfig.engine: "sync" | "continuous"
    num_workers: int = 1                  # env pool worker processes (0 = in-process servers)
    # reporting
    thresholds: tuple = (0.8, 0.9)
    window: int = 2                       # steps averaged when testing a threshold
    stop_at: float | None = None          # end RL once this threshold is reached

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"SanityConfig.kind={self.kind!r}; use one of {KINDS}")

    @property
    def warm_key(self) -> tuple:
        """Returns the fields the warm start depends on (runs that share them share it)."""
        return (self.kind, self.seed, self.tokenizer_vocab, self.num_demos, self.follow_fraction,
                self.sft_steps, self.sft_batch, self.sft_lr)


class WarmStart(NamedTuple):
    """The SFT warm start shared by RL runs (params are never donated: RL trains a copy)."""

    tokenizer: Any
    cfg: ModelConfig
    params: Any
    sft_losses: list
    seconds: float


def rollout_config(kind: str, engine: str = "sync") -> RolloutConfig:
    """Returns the rollout settings of a task kind: exactly the gold chain's turns (calls, then
    the answer), so a rollout that strays ends unanswered and the sampler sees few shapes;
    `engine` is the rollout engine (RolloutConfig.engine)."""
    return RolloutConfig(max_turns=2 + len(FOLLOW_UPS[kind]), max_context=512,
                         tool_format="minimal", prompt_tools="all", max_observation_chars=200,
                         engine=engine)


def instruction(kind: str, color: str, style: str = "task") -> str:
    """Returns the text naming target button `color`: "task" is what RL trains on (and what
    the random-choice demonstrations say); "follow" is the other wording of the warm start's
    instruction-following demonstrations (see `demo_tasks`)."""
    name = f'"press_{color}"'
    verb = "Use" if style == "follow" else "Call"
    if kind == "bandit":
        return f"{verb} {name} and reply with its code."
    return f"{verb} {name}, then confirm and submit. Reply with its code."


def sanity_catalog() -> Catalog:
    """Returns a catalog holding only the (hidden) buttons server."""
    return Catalog([Catalog.default(kinds=("builtin",), include_hidden=True).entry(SERVER)])


def ground_tasks(pool: EnvPool, kind: str, targets: Sequence[int], presses: Sequence[int],
                 seeds: Sequence[int], prefix: str, style: str = "task") -> list[Task]:
    """Returns tasks whose gold chain (press `presses[i]`, then the fixed follow-ups) was run in
    live episodes; the answer is the pressed button's code (`presses == targets`: gold tasks;
    otherwise SFT demonstrations of a wrong choice in the right format).

    Gold observations keep the text the pool returned, so a demonstration shows exactly what
    a rollout sees (the pool's indented JSON, not the compact form of a parsed dict).
    """
    episodes = pool.reset([EpisodeSpec((SERVER,), int(s)) for s in seeds])
    try:
        names = [[f"press_{COLORS[p]}", *FOLLOW_UPS[kind]] for p in presses]
        stages: list[list[list[GoldStep]]] = [[] for _ in episodes]
        codes = [""] * len(episodes)
        for turn in range(len(names[0])):
            obs = pool.step([(ep, n[turn], {}) for ep, n in zip(episodes, names)])
            for i, o in enumerate(obs):
                if o.status != "ok":
                    raise RuntimeError(f"buttons server: {names[i][turn]} -> {o.status}: "
                                       f"{o.content}")
                if turn == 0:
                    codes[i] = o.structured["code"]
                stages[i].append([GoldStep(SERVER, names[i][turn], names[i][turn], {},
                                           o.content)])
    finally:
        pool.close(episodes)
    return [Task(f"{prefix}-{kind}-{i}-{COLORS[t]}", instruction(kind, COLORS[t], style),
                 EpisodeSpec((SERVER,), int(s)), st, code, {"kind": "exact", "value": code},
                 {"target": COLORS[t], "pressed": COLORS[p]})
            for i, (t, p, s, st, code) in enumerate(zip(targets, presses, seeds, stages, codes))]


def _seeds(rng: np.random.Generator, n: int) -> list[int]:
    return [int(x) for x in rng.integers(0, 2**31 - 1, size=n)]


def demo_tasks(pool: EnvPool, kind: str, n: int, seed: int,
               follow_fraction: float = 0.5) -> list[Task]:
    """Returns n SFT demonstrations in a seeded random order.

    (1 - follow_fraction) of them say the RL wording ("task") and press a uniformly random
    button: (target, pressed) balanced over all k x k pairs, answered with the pressed code.
    The rest say the "follow" wording and press the named button (targets balanced): the
    instruction-following skill a pretrained model would bring. Without them the tiny model
    is blind to the instruction where it picks the button (its choice logits differ by < 0.01
    across targets after SFT on random choices) and no estimator learns within 35 RL steps.
    """
    rng = np.random.default_rng([seed, 1])
    k = len(COLORS)
    n_follow = int(round(follow_fraction * n))
    pairs = list(itertools.product(range(k), repeat=2))
    random = [pairs[j % len(pairs)] for j in range(n - n_follow)]
    seeds = _seeds(rng, n)
    tasks = ground_tasks(pool, kind, [t for t, _ in random], [p for _, p in random],
                         seeds[:n - n_follow], f"demo{seed}")
    follow = [j % k for j in range(n_follow)]
    tasks += ground_tasks(pool, kind, follow, follow, seeds[n - n_follow:], f"follow{seed}",
                          style="follow")
    return [tasks[j] for j in rng.permutation(n)]


def gold_tasks(pool: EnvPool, kind: str, n: int, seed: int) -> list[Task]:
    """Returns n RL tasks: targets balanced (every run of k tasks names each button once, so a
    step's batch holds no preference for one button), fresh episode seeds, gold = the target."""
    rng = np.random.default_rng([seed, 2])
    k = len(COLORS)
    targets = [int(x) for _ in range(-(-n // k)) for x in rng.permutation(k)][:n]
    return ground_tasks(pool, kind, targets, targets, _seeds(rng, n), f"rl{seed}")


def train_tokenizer(demos: Sequence[Task], tools: list[dict], rcfg: RolloutConfig,
                    vocab: int, path: str):
    """Returns a byte-level BPE trained on the rendered demonstrations (as rl.tool_use does)."""
    byte = ByteTokenizer()
    texts = [byte.decode(gold_demonstration(t, tools, byte, rcfg)[0]) for t in demos]
    return train_bpe_tokenizer(texts, vocab, path)


def single_device_mesh():
    """Returns a (1, 1, 1) mesh on the first device (the suite's model fits one device)."""
    return make_mesh((1, 1, 1), jax.devices()[:1])


@functools.lru_cache(maxsize=16)
def _step_fn(cfg: ModelConfig, loss: LossConfig, lr: float, warmup: int, total: int,
             schedule: str):
    """Returns (optimizer, jitted train step), built once per setting so that runs sharing a
    setting share the compiled step (make_train_step returns a fresh jit each call)."""
    opt = make_optimizer(lr, warmup, total, schedule=schedule)
    return opt, make_train_step(cfg, loss, opt, 1)


def sft_rows(demos: Sequence[Task], tools: list[dict], tokenizer, rcfg: RolloutConfig
             ) -> list[dict]:
    """Returns SFT rows (advantage 1 on policy tokens) of rendered demonstrations."""
    return [demonstration_row(*gold_demonstration(t, tools, tokenizer, rcfg)[:2])
            for t in demos]


def warm_start(scfg: SanityConfig, pool: EnvPool) -> WarmStart:
    """Returns the SFT warm start: tokenizer trained on the demonstrations, the tiny preset
    (vocab = the tokenizer's), `sft_steps` SFT updates over shuffled demonstration batches."""
    t0 = time.time()
    rcfg = rollout_config(scfg.kind, scfg.engine)
    demos = demo_tasks(pool, scfg.kind, scfg.num_demos, scfg.seed, scfg.follow_fraction)
    (ep,) = pool.reset([demos[0].spec])
    tools = ep.tools
    pool.close([ep])
    with tempfile.TemporaryDirectory(prefix="tv_sanity_tok_") as tmp:
        tok = train_tokenizer(demos, tools, rcfg, scfg.tokenizer_vocab, f"{tmp}/tokenizer")
    cfg = get_preset("tiny").replace(vocab_size=tok.vocab_size)
    rows = sft_rows(demos, tools, tok, rcfg)
    mesh = single_device_mesh()
    opt, step = _step_fn(cfg, LossConfig(name="sft"), scfg.sft_lr, 10, scfg.sft_steps, "cosine")
    rng = np.random.default_rng([scfg.seed, 3])
    losses = []
    with sharding_context(mesh):
        params = shard_params(init_params(cfg, jax.random.key(scfg.seed)), cfg, mesh)
        state = init_train_state(params, opt)
        order: list[int] = []
        for _ in range(scfg.sft_steps):
            if len(order) < scfg.sft_batch:
                order += list(rng.permutation(len(rows)))
            idx, order = order[:scfg.sft_batch], order[scfg.sft_batch:]
            batch = global_batch([rows[i] for i in idx], tok.pad_id, mesh, 1)
            state, m = step(state, batch)
            losses.append(float(m["loss"]))
    return WarmStart(tok, cfg, state.params, losses, time.time() - t0)


def steps_to(successes: Sequence[float], threshold: float, window: int = 1) -> int | None:
    """Returns the first step s (= RL updates done) whose trailing mean sampled success over
    steps s-window+1..s is >= threshold, or None if no step reaches it."""
    v = np.asarray(successes, np.float64)
    for s in range(window - 1, len(v)):
        if v[s - window + 1:s + 1].mean() >= threshold:
            return s
    return None


@dataclasses.dataclass
class SanityResult:
    """An RL run's per-step curve; curve[s]["success"] is the sampled success (temperature
    `SanityConfig.temperature`) of the policy after s updates, over the step's whole batch."""

    config: dict
    curve: list
    initial_success: float
    steps_to: dict                        # {threshold: first step reaching it, or None}
    rl_seconds: float
    warm_seconds: float

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def sampling_params(scfg: SanityConfig, tokenizer) -> SamplingParams:
    """Returns the rollout sampling settings (temperature scfg.temperature, stop at <|im_end|>)."""
    stop = tuple(tokenizer.stop_ids_for(["<|im_end|>", "<|endoftext|>"]))
    return SamplingParams(max_new_tokens=scfg.max_new_tokens, temperature=scfg.temperature,
                          stop_token_ids=stop, pad_id=tokenizer.pad_id)


def rl_step(scfg: SanityConfig, warm: WarmStart, state, step_fn, tasks: list[Task],
            pool: EnvPool, step: int, mesh) -> tuple[Any, dict, list]:
    """Returns (state, metrics, trajectories) after one RL step on `tasks`: rollouts of the
    current policy, advantages of the configured estimator (negated when flip_sign), one
    `ppo_update` — the RL branch of rl.driver."""
    rcfg, tok, cfg = rollout_config(scfg.kind, scfg.engine), warm.tokenizer, warm.cfg
    t0 = time.time()
    policy = SamplerPolicy(state.params, cfg, sampling_params(scfg, tok))
    key = jax.random.fold_in(jax.random.key(scfg.seed), step)
    trajs = run_rollouts(policy, tasks, scfg.group_size, pool, tok, rcfg, key,
                         seed=scfg.seed * 1_000_003 + step)
    t_roll = time.time() - t0
    readiness = None
    if scfg.estimator == "trace":  # π_ref = the warm start, scored like loop.run_training does
        readiness = readiness_for_trajectories(
            warm.params, cfg, trajs, {t.id: t for t in tasks}, tok, rcfg.max_turns + 1,
            ANSWER_PREFIX, "single_pass", pad_to=64)
    turn_adv = compute_advantages(trajs, scfg.estimator, dict(scfg.adv_consts),
                                  rcfg.max_turns + 1, readiness)
    if scfg.flip_sign:
        turn_adv = -turn_adv
    rows = trajectory_rows(trajs, turn_adv)
    metrics = rollout_metrics(trajs, "rollout")
    metrics.update(advantage_metrics(advantage_stats(trajs, rows)))
    metrics["adv/nonzero_turns"] = float(np.sum(np.abs(turn_adv) > 1e-8))
    # The choice alone (turn 1 pressed the named button), apart from the answer's copy.
    metrics["rollout/right_press"] = float(np.mean(
        [bool(t.turns) and t.turns[0].gold_match > 0 for t in trajs]))
    if rows:
        state, m = ppo_update(state, rows, step_fn, cfg=cfg, mesh=mesh, num_micro=1,
                              pad_id=tok.pad_id, temperature=scfg.temperature,
                              epochs=scfg.ppo_epochs, num_minibatches=scfg.num_minibatches,
                              rng=np.random.default_rng([scfg.seed, step]))
        metrics.update(m)
    metrics["time/rollout_s"] = t_roll
    metrics["time/step_s"] = time.time() - t0
    return state, metrics, trajs


def rl_setup(scfg: SanityConfig, warm: WarmStart) -> tuple[Any, Any]:
    """Returns (train state on a copy of the warm-start params with a fresh RL optimizer, the
    jitted PPO-clip step), as rl.driver does when its RL phase starts."""
    loss = LossConfig(name="ppo_clip", clip_eps_low=scfg.clip_eps_low,
                      clip_eps_high=scfg.clip_eps_high, temperature=scfg.temperature)
    opt, step_fn = _step_fn(warm.cfg, loss, scfg.rl_lr, 1, max(scfg.rl_steps, 1), "constant")
    return init_train_state(jax.tree.map(jnp.copy, warm.params), opt), step_fn


def train_rl(scfg: SanityConfig, warm: WarmStart, pool: EnvPool) -> SanityResult:
    """Returns the curve of `rl_steps` RL steps from the warm start (its params are copied, so
    the warm start can seed other runs). Deterministic under scfg.seed."""
    t0 = time.time()
    tasks = gold_tasks(pool, scfg.kind, scfg.rl_steps * scfg.tasks_per_step, scfg.seed)
    mesh = single_device_mesh()
    curve = []
    with sharding_context(mesh):
        state, step_fn = rl_setup(scfg, warm)
        for step in range(scfg.rl_steps):
            batch = tasks[step * scfg.tasks_per_step:(step + 1) * scfg.tasks_per_step]
            state, m, _ = rl_step(scfg, warm, state, step_fn, batch, pool, step, mesh)
            keep = {k: float(v) for k, v in m.items() if isinstance(v, (int, float))}
            curve.append({"step": step, "success": m["rollout/success_rate"], **keep})
            reached = steps_to([c["success"] for c in curve], scfg.stop_at or 2.0, scfg.window)
            if reached is not None:
                break
    successes = [c["success"] for c in curve]
    return SanityResult(
        config=dataclasses.asdict(scfg), curve=curve, initial_success=successes[0],
        steps_to={str(t): steps_to(successes, t, scfg.window) for t in scfg.thresholds},
        rl_seconds=time.time() - t0, warm_seconds=warm.seconds)


def open_pool(scfg: SanityConfig) -> EnvPool:
    """Returns an env pool over the buttons server (close it, or use it as a context)."""
    return EnvPool(sanity_catalog(), num_workers=scfg.num_workers, call_timeout_s=10.0)


def run_sanity(scfg: SanityConfig, warm: WarmStart | None = None) -> SanityResult:
    """Returns one sanity run's result (warm start trained here unless given)."""
    with open_pool(scfg) as pool:
        warm = warm if warm is not None else warm_start(scfg, pool)
        return train_rl(scfg, warm, pool)


def run_suite(base: SanityConfig, estimators: Sequence[str], seeds: Sequence[int],
              flip: Sequence[str] = (), log=None,
              on_result: Callable[[list], None] | None = None) -> list[SanityResult]:
    """Returns one result per (seed, estimator), plus a flipped-sign run per (seed, name in
    `flip`); runs of one seed share its warm start (a paired comparison) and one env pool.
    `on_result(results_so_far)` is called after each run."""
    out = []
    with open_pool(base) as pool:
        for seed in seeds:
            warm = warm_start(dataclasses.replace(base, seed=seed), pool)
            if log:
                log(f"{base.kind} seed {seed}: warm start {warm.seconds:.0f}s, final SFT loss "
                    f"{warm.sft_losses[-1]:.3f}")
            runs = [(e, False) for e in estimators] + [(e, True) for e in flip]
            for est, flipped in runs:
                scfg = dataclasses.replace(base, seed=seed, estimator=est, flip_sign=flipped)
                res = train_rl(scfg, warm, pool)
                out.append(res)
                if on_result:
                    on_result(list(out))
                if log:
                    log(f"  {est}{' (flipped)' if flipped else ''}: initial "
                        f"{res.initial_success:.2f}, steps to {res.steps_to}, "
                        f"final {res.curve[-1]['success']:.2f}, {res.rl_seconds:.0f}s")
    return out
