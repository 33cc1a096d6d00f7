"""Multi-turn rollouts with real env calls: the continuous-batching engine
(`sampling.engine.ContinuousEngine`, rollout.engine="continuous") vs the synchronous turn loop
with the KV kept across turns (`sampling.KVSession`, the "sync" engine) vs re-prefilling every
context from token 0 each turn (`sampling.generate`). One JSON line.

    python -m benchmarks.rollout            # tiny and d512 models, horizons 5 / 10 / 20
    python -m benchmarks.rollout --quick    # tiny at 5 / 10 / 20, a 2-layer d512 at 10, B=8
                                            # (re-prefill up to horizon 10)

Each episode is a GUST task's prompt-length context of random ids, then per turn: the policy's
sampled turn (up to --new-tokens, ending early at a stop id) and the real tool responses of the
task's gold stage for that turn, executed on the built-in MCP servers through an `EnvPool`
(--env-workers worker processes) and appended as tokens, as `rl/rollout.py:run_rollouts` builds
contexts. Episodes drop out as the horizon nears (a quarter of them end at each of the last
turns). All engines decode greedily from the same random weights; `greedy_equal` says whether
every turn of every episode came out token-for-token equal across the three. Timed runs follow
a full warm-up run (compiles) and alternate engines; medians are reported.

env_idle_frac: the fraction of the rollout's wall time the decoder waited on env calls (the
turn loops wait for every call of a turn; the continuous engine only when a slot is due to
resume before its calls are back). rl_step_s: rollout wall + one PPO-clip update on the episodes'
rows (the same update for every engine). --env-latency-ms adds a sleep to every env call batch
(remote tools); 0 = the built-in servers' own latency.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def _log(msg: str) -> None:
    print(f"[rollout] {msg}", file=sys.stderr, flush=True)


def episode_plan(rng: np.random.Generator, batch: int, horizon: int, prompt_len: int,
                 vocab: int) -> dict:
    """Returns the fixed inputs of one benchmark case: prompts, per-turn env responses and the
    turn at which each episode ends."""
    prompts = [rng.integers(3, vocab, prompt_len + int(rng.integers(0, 32))).tolist()
               for _ in range(batch)]
    env = [[rng.integers(3, vocab, int(rng.integers(20, 81))).tolist() for _ in range(horizon)]
           for _ in range(batch)]
    ends = np.full(batch, horizon)
    tail = max(1, horizon // 4)
    for i in range(batch):
        if i % 4:
            ends[i] = horizon - int(rng.integers(0, tail + 1))
    return {"prompts": prompts, "env": env, "ends": ends.tolist()}


def run_episodes(call, plan: dict, horizon: int) -> tuple[list[list[list[int]]], int]:
    """Returns (per episode, per turn: the generated ids; generated-token count) of running the
    plan with `call(prompts, turn) -> SampleOutput`."""
    ctx = [list(p) for p in plan["prompts"]]
    outs = [[] for _ in ctx]
    n_tok = 0
    for turn in range(horizon):
        live = [i for i in range(len(ctx)) if turn < plan["ends"][i]]
        if not live:
            break
        out = call([ctx[i] for i in live], turn)
        for row, i in enumerate(live):
            gen = [int(t) for t in out.tokens[row, :int(out.lengths[row])]]
            outs[i].append(gen)
            n_tok += len(gen)
            ctx[i] += gen + plan["env"][i][turn]
    return outs, n_tok


class Envs:
    """The real env side of a benchmark case: one episode per rollout on a built-in GUST task
    (horizon-h), whose turn t executes the task's gold stage t; responses rendered as tokens."""

    def __init__(self, pool, tasks, batch: int, obs_chars: int, latency_s: float):
        from toolverse_jax.models import ByteTokenizer
        self.pool, self.tasks, self.batch = pool, tasks, batch
        self.obs_chars, self.latency_s = obs_chars, latency_s
        self.tok = ByteTokenizer()
        self.episodes: list = []
        self.wait_s = 0.0  # seconds the caller spent inside env calls

    def open(self) -> None:
        self.episodes = self.pool.reset([self.tasks[i % len(self.tasks)].spec
                                         for i in range(self.batch)])
        self.wait_s = 0.0

    def close(self) -> None:
        self.pool.close(self.episodes)

    def step(self, eps: list[int], turn: list[int]) -> list[list[int]]:
        """Returns the response ids of episodes eps at turns turn (one pool call)."""
        from toolverse_jax.models.chat import render_tool_responses
        calls, owner = [], []
        for j, (i, t) in enumerate(zip(eps, turn)):
            for st in self.tasks[i % len(self.tasks)].stages[t]:
                calls.append((self.episodes[i], st.name, st.arguments))
                owner.append(j)
        t0 = time.perf_counter()
        obs = self.pool.step(calls)
        if self.latency_s:
            time.sleep(self.latency_s)
        self.wait_s += time.perf_counter() - t0
        texts: list[list[str]] = [[] for _ in eps]
        for j, o in zip(owner, obs):
            texts[j].append(str(o.content)[:self.obs_chars])
        return [render_tool_responses(t or ["(no output)"], self.tok) for t in texts]


def run_sync(call, plan: dict, envs: Envs, horizon: int) -> list[list[list[int]]]:
    """Returns per episode, per turn, the generated ids of the turn loop: each turn every live
    episode decodes (`call(prompts, turn)`), then every env call of the turn runs."""
    ctx = [list(p) for p in plan["prompts"]]
    outs: list[list[list[int]]] = [[] for _ in ctx]
    for turn in range(horizon):
        live = [i for i in range(len(ctx)) if turn < plan["ends"][i]]
        if not live:
            break
        out = call([ctx[i] for i in live], turn)
        for row, i in enumerate(live):
            gen = [int(t) for t in out.tokens[row, :int(out.lengths[row])]]
            outs[i].append(gen)
            ctx[i] += gen
        go = [i for i in live if turn + 1 < plan["ends"][i]]
        if go:
            for i, env in zip(go, envs.step(go, [turn] * len(go))):
                ctx[i] += env
    return outs


class PlanAgent:
    """The continuous engine's `Agent` for a benchmark plan: each turn's env calls run on the
    engine's env thread, merged with those of the other turns queued at the same time
    (`EnvCalls`)."""

    def __init__(self, plan: dict, envs: Envs):
        self.plan, self.envs = plan, envs
        self.ctx = [list(p) for p in plan["prompts"]]
        self.outs: list[list[list[int]]] = [[] for _ in self.ctx]

    def prompt(self, i):
        return self.ctx[i]

    def end_turn(self, i, out):
        gen = [int(t) for t in out.tokens]
        self.outs[i].append(gen)
        self.ctx[i] += gen
        turn = len(self.outs[i]) - 1
        if turn + 1 >= self.plan["ends"][i]:
            return None
        from toolverse_jax.sampling.engine import EnvCalls
        # As rl/engine.py's agent: turns that end together share one pool call (and one
        # --env-latency-ms sleep, like a turn of the synchronous loop).
        return EnvCalls(self._step, [(i, turn)])

    def _step(self, items: list) -> list:
        return self.envs.step([i for i, _ in items], [t for _, t in items])

    def resume(self, i, env):
        (ids,) = env  # the results of this turn's one EnvCalls item
        self.ctx[i] += ids
        return self.ctx[i]


def update_seconds(params, cfg, plan: dict, outs, repeats: int) -> float:
    """Returns the median seconds of one PPO-clip update (one micro-batch) on the episodes' rows
    (prompt, then per turn the generated ids as policy tokens and random env-length ids)."""
    import jax

    from toolverse_jax.rl.batching import pack_rows
    from toolverse_jax.rl.trainer import (LossConfig, init_train_state, make_optimizer,
                                          make_train_step)
    from toolverse_jax.rl.types import Row
    rows = []
    rng = np.random.default_rng(0)
    for i, turns in enumerate(outs):
        toks, mask = list(plan["prompts"][i]), [False] * len(plan["prompts"][i])
        for gen in turns:
            env = rng.integers(3, cfg.vocab_size, 50).tolist()
            toks += gen + env
            mask += [True] * len(gen) + [False] * len(env)
        n = len(toks)
        rows.append(Row(toks, mask, rng.normal(size=n).astype(np.float32),
                        -np.abs(rng.normal(size=n)).astype(np.float32)))
    opt = make_optimizer(1e-4, 1, 10)
    step = make_train_step(cfg, LossConfig(name="ppo_clip"), opt)
    batch = pack_rows(rows, 0)
    state = init_train_state(jax.tree.map(lambda x: x.copy(), params), opt)
    times = []
    for r in range(repeats + 1):  # the first compiles
        t0 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


ENGINES = ("continuous", "kv", "reprefill")


def bench_case(params, cfg, sp, plan: dict, envs: Envs, horizon: int, repeats: int,
               engines: tuple[str, ...] = ENGINES, resume_lag: int = 8) -> dict:
    """Returns timings of the engines on one (model, horizon) case."""
    import jax

    from toolverse_jax.sampling import KVSession, generate
    from toolverse_jax.sampling.engine import ContinuousEngine, EngineConfig

    def one(name):
        envs.open()
        stats = {}
        t0 = time.perf_counter()
        try:
            if name == "continuous":
                agent = PlanAgent(plan, envs)
                eng = ContinuousEngine(params, cfg, sp, EngineConfig(resume_lag=resume_lag))
                stats = eng.run(agent, [jax.random.key(i) for i in range(len(plan["prompts"]))])
                outs, idle = agent.outs, stats.get("env_wait_s", 0.0)
            elif name == "kv":
                session = KVSession(params, cfg, sp)
                outs = run_sync(lambda p, t: session.generate(p, jax.random.key(t)), plan, envs,
                                horizon)
                idle, stats = envs.wait_s, session.stats
            else:
                outs = run_sync(lambda p, t: generate(params, cfg, p, sp, jax.random.key(t)),
                                plan, envs, horizon)
                idle = envs.wait_s
        finally:
            wall = time.perf_counter() - t0
            envs.close()
        return outs, wall, idle, stats

    first = {name: one(name) for name in engines}  # warm-up: compiles every bucket
    runs = {name: [] for name in engines}
    for _ in range(repeats):
        for name in engines:
            runs[name].append(one(name))
    ref = first[engines[-1]][0]
    n_tok = sum(len(g) for turns in ref for g in turns)
    upd = update_seconds(params, cfg, plan, ref, max(repeats, 2))
    case = {"horizon": horizon, "generated_tokens": n_tok, "update_s": round(upd, 4),
            "greedy_equal": all(first[n][0] == ref for n in engines)
            and all(r[0] == ref for n in engines for r in runs[n])}
    for name in engines:
        wall = float(np.median([r[1] for r in runs[name]]))
        idle = float(np.median([r[2] / r[1] for r in runs[name]]))
        case[name] = {"rollout_s": round(wall, 4), "tokens_per_s": round(n_tok / wall, 1),
                      "env_idle_frac": round(idle, 3), "rl_step_s": round(wall + upd, 4)}
        st = runs[name][-1][3]
        if name == "continuous":
            case[name].update({k: st.get(k, 0) for k in
                               ("decode_calls", "decode_steps", "prefill_calls", "compactions",
                                "env_waits")})
        if name == "kv":
            case[name]["compactions"] = st["compactions"]
    # The figure: the default engine (turn loop, KV kept across turns) against the
    # synchronous loop it replaced, which re-prefilled every context from token 0 each turn.
    if "kv" in engines and "reprefill" in engines:
        case["speedup_vs_sync"] = round(case["reprefill"]["rollout_s"]
                                        / case["kv"]["rollout_s"], 3)
        case["rl_step_speedup_vs_sync"] = round(case["reprefill"]["rl_step_s"]
                                                / case["kv"]["rl_step_s"], 3)
    if "continuous" in engines:
        base = case["continuous"]["rollout_s"]
        if "kv" in engines:
            case["continuous_vs_kv"] = round(case["kv"]["rollout_s"] / base, 3)
        if "reprefill" in engines:
            case["continuous_vs_reprefill"] = round(case["reprefill"]["rollout_s"] / base, 3)
    return case


MODELS = {
    "tiny": {"preset": "tiny"},
    "d512": {"d_model": 512, "num_layers": 4, "num_heads": 8, "num_kv_heads": 4, "head_dim": 64,
             "mlp_dim": 1536, "vocab_size": 1024},
}


def run(a: argparse.Namespace) -> dict:
    import jax

    from toolverse_jax.envs import Catalog, EnvPool
    from toolverse_jax.models import get_preset, init_params
    from toolverse_jax.models.config import ModelConfig
    from toolverse_jax.sampling import SamplingParams
    from toolverse_jax.tasks import load_or_generate_quickstart_tasks

    cases = []
    pool = EnvPool(Catalog.default(kinds=("builtin",)), num_workers=a.env_workers)
    try:
        for name in a.models:
            spec = dict(MODELS[name])
            if a.quick and name == "d512":
                spec["num_layers"] = 2
            cfg = (get_preset("tiny") if spec.get("preset") == "tiny" else
                   ModelConfig(max_seq_len=8192, **spec))
            cfg = cfg.replace(max_seq_len=max(cfg.max_seq_len, 8192))
            params = init_params(cfg, jax.random.key(0))
            # ~1 in 40 sampled ids stops a turn: turns of varying length, as real ones are.
            stops = tuple(range(3, 3 + max(cfg.vocab_size // 40, 1)))
            sp = SamplingParams(max_new_tokens=a.new_tokens, temperature=0.0,
                                stop_token_ids=stops)
            horizons = a.horizons if not (a.quick and name == "d512") else [10]
            for h in horizons:
                tasks = load_or_generate_quickstart_tasks(None, num_tasks=8, horizons=(h,),
                                                          seed=0)
                envs = Envs(pool, tasks, a.batch, a.obs_chars, a.env_latency_ms / 1000)
                plan = episode_plan(np.random.default_rng(h), a.batch, h, a.prompt_len,
                                    cfg.vocab_size)
                t0 = time.perf_counter()
                # --quick: re-prefilling (O(T^2) prefill) only up to horizon 10.
                engines = ENGINES if not (a.quick and h > 10) else ENGINES[:2]
                c = bench_case(params, cfg, sp, plan, envs, h, a.repeats, engines,
                               resume_lag=a.resume_lag)
                c["model"] = name
                c["wall_s"] = round(time.perf_counter() - t0, 1)
                _log(json.dumps(c))
                cases.append(c)
    finally:
        pool.shutdown()
    at10 = [c for c in cases if c["horizon"] == 10]
    head = at10[0] if at10 else cases[-1]
    return {
        "benchmark": "rollout", "horizon": head["horizon"], "model": head["model"],
        # The default engine (turn loop, KV kept across turns) against the synchronous loop
        # the issue started from (every context re-prefilled from token 0 each turn).
        "speedup_vs_sync": head.get("speedup_vs_sync"),
        "continuous_vs_kv": head.get("continuous_vs_kv"),
        "continuous_vs_reprefill": head.get("continuous_vs_reprefill"),
        "greedy_equal": all(c["greedy_equal"] for c in cases),
        "tokens_per_s": {e: head[e]["tokens_per_s"] for e in ENGINES},
        "env_idle_frac": {e: head[e]["env_idle_frac"] for e in ENGINES},
        "rl_step_s": {e: head[e]["rl_step_s"] for e in ENGINES},
        "rollout_s_by_horizon": {e: {f"{c['model']}@{c['horizon']}": c[e]["rollout_s"]
                                     for c in cases if e in c} for e in ENGINES},
        "cases": cases,
        "config": {"batch": a.batch, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
                   "env": f"built-in MCP servers, {a.env_workers} worker process(es), gold "
                          f"stage calls of GUST horizon-h tasks, responses cut at "
                          f"{a.obs_chars} chars", "env_latency_ms": a.env_latency_ms,
                   "resume_lag": a.resume_lag, "repeats": a.repeats,
                   "note": "greedy; episodes end over the last quarter of the horizon; "
                           "speedup_vs_sync = re-prefill loop (the synchronous loop before "
                           "KV reuse) / KV-session turn loop (the default engine); "
                           "continuous_vs_kv = KV-session turn loop / continuous; "
                           "continuous_vs_reprefill = re-prefill loop / continuous"},
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "quick": bool(a.quick),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["tiny", "d512"], choices=sorted(MODELS))
    p.add_argument("--horizons", nargs="+", type=int, default=[5, 10, 20])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=192)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--env-workers", type=int, default=1)
    p.add_argument("--env-latency-ms", type=float, default=0.0)
    p.add_argument("--obs-chars", type=int, default=60)
    p.add_argument("--resume-lag", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="tiny at the horizons, a 2-layer d512 "
                   "at 10 only, re-prefill up to horizon 10, batch 8, 32 new tokens, "
                   "128-token prompts, 1 repeat")
    a = p.parse_args(argv)
    if a.quick:
        a.repeats = 1
        a.batch, a.new_tokens, a.prompt_len = min(a.batch, 8), min(a.new_tokens, 32), 128
    if a.batch < 1 or any(h < 1 for h in a.horizons):
        p.error("--batch and --horizons must be >= 1")
    return a


def main(argv=None) -> dict:
    out = run(parse_args(argv))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
