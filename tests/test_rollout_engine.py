"""Continuous-batching rollout engine (sampling/engine.py, rl/engine.py) against the turn loop:
real built-in MCP servers through EnvPool, a tiny model warmed up on gold chains, no mocks."""

import dataclasses

import jax
import numpy as np
import pytest

from benchmarks.rollout import episode_plan, run_episodes
from toolverse_jax.envs import Catalog, EnvPool
from toolverse_jax.models import ByteTokenizer, get_preset, init_params
from toolverse_jax.rl.batching import demonstration_row, pack_rows
from toolverse_jax.rl.rollout import (RolloutConfig, SamplerPolicy, gold_demonstration,
                                      prompt_tool_specs, run_rollouts)
from toolverse_jax.rl.trainer import LossConfig, init_train_state, make_optimizer, make_train_step
from toolverse_jax.sampling import KVSession, SamplingParams
from toolverse_jax.sampling.engine import ContinuousEngine, EngineConfig
from toolverse_jax.tasks import load_or_generate_quickstart_tasks
from tests.scoring import context_logprobs

TOK = ByteTokenizer()
END = "<|im_end|>"
RCFG = RolloutConfig(max_turns=12, max_context=8192, tool_format="minimal", prompt_tools="gold",
                     num_distractors=0, max_observation_chars=60)


@pytest.fixture(scope="module")
def pool():
    with EnvPool(Catalog.default(kinds=("builtin",)), num_workers=0) as p:
        yield p


@pytest.fixture(scope="module")
def tasks():
    quick = load_or_generate_quickstart_tasks(None, num_tasks=64, horizons=(1, 2, 3), seed=0)
    long = load_or_generate_quickstart_tasks(None, num_tasks=4, horizons=(10,), seed=0)
    return {"quickstart": quick[:4], "horizon10": long[:2]}


@pytest.fixture(scope="module")
def warm(tasks, pool):
    """A tiny model after a few SFT steps on the tasks' gold turns (each with the 400 tokens
    before it): it emits tool calls, valid ones (executed by the servers) and invalid ones, so
    rollouts run many turns and reach the end reasons. (With 40 tokens of context the
    horizon-10 rollouts stopped at their first turn, truncated.)"""
    cfg = get_preset("tiny").replace(vocab_size=TOK.vocab_size, max_seq_len=8192)
    rows = []
    for t in tasks["quickstart"] + tasks["horizon10"]:
        (ep,) = pool.reset([t.spec])
        tools = prompt_tool_specs(t, ep.tools, RCFG, np.random.default_rng(0))
        pool.close([ep])
        toks, mask, _ = gold_demonstration(t, tools, TOK, RCFG)
        for a, b in _spans(mask)[:2]:
            lo = max(a - 400, 0)
            rows.append(demonstration_row(toks[lo:b], [False] * (a - lo) + [True] * (b - a)))
    opt = make_optimizer(1e-2, 5, 60)
    step = make_train_step(cfg, LossConfig(name="sft"), opt)
    state = init_train_state(init_params(cfg, jax.random.key(0)), opt)
    batch = pack_rows(rows, TOK.pad_id)
    for _ in range(60):
        state, _ = step(state, batch)
    return cfg, state.params


def _spans(mask):
    """Returns the [start, end) runs of True in mask."""
    out, start = [], None
    for j, m in enumerate(list(mask) + [False]):
        if m and start is None:
            start = j
        elif not m and start is not None:
            out.append((start, j))
            start = None
    return out


def _sp(temperature=0.0, max_new=96):
    return SamplingParams(max_new_tokens=max_new, temperature=temperature,
                          stop_token_ids=tuple(TOK.stop_ids_for([END])), pad_id=TOK.pad_id)


class PlanAgent:
    """An engine Agent over a benchmark plan (random prompts and env responses): the
    turn-by-turn reference is `run_episodes` with a KVSession."""

    def __init__(self, plan):
        self.plan = plan
        self.ctx = [list(p) for p in plan["prompts"]]
        self.outs = [[] for _ in self.ctx]
        self.logprobs = [[] for _ in self.ctx]

    def prompt(self, i):
        return self.ctx[i]

    def end_turn(self, i, out):
        gen = [int(t) for t in out.tokens]
        self.outs[i].append(gen)
        self.logprobs[i].append((len(self.ctx[i]), out.logprobs.tolist()))
        self.ctx[i] += gen
        turn = len(self.outs[i]) - 1
        if turn + 1 >= self.plan["ends"][i]:
            return None
        return lambda: self.plan["env"][i][turn]

    def resume(self, i, env):
        self.ctx[i] += env
        return self.ctx[i]


@pytest.fixture(scope="module")
def tiny():
    cfg = get_preset("tiny")
    return cfg, init_params(cfg, jax.random.key(0))


def test_greedy_turns_equal_kv_session_with_refill_and_compaction(tiny):
    """Episodes of different horizons and turn lengths, more episodes than slots (refill), a
    cache that overflows its first bucket (compaction): every turn equals the synchronous loop's."""
    cfg, params = tiny
    sp = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(5, 17, 33))
    plan = episode_plan(np.random.default_rng(0), 6, 6, 24, cfg.vocab_size)
    session = KVSession(params, cfg, sp)
    ref, _ = run_episodes(lambda p, t: session.generate(p, jax.random.key(t)), plan, 6)
    for slots in (0, 2):
        agent = PlanAgent(plan)
        eng = ContinuousEngine(params, cfg, sp, EngineConfig(slots=slots, chunk=8, resume_lag=3))
        stats = eng.run(agent, [jax.random.key(i) for i in range(6)])
        assert agent.outs == ref, slots
        assert stats["episodes"] == 6 and stats["compactions"] >= 1
        # Only appended tokens were prefilled after each episode's first turn.
        assert stats["reused_tokens"] > stats["prefill_tokens"] - sum(map(len, plan["prompts"]))
    # With 2 slots the 6 episodes ran 2 at a time: more decode calls, each over 2 rows.
    assert stats["slot_steps"] == 2 * stats["decode_steps"]


@pytest.mark.slow  # the engine is off by default (rollout.engine='sync'): minutes of compiles
def test_sampled_logprobs_match_trainer_and_runs_are_deterministic(tiny):
    """Temperature 1: each token's log-prob equals the trainer's scoring of the whole context
    (<= 1e-5); the same keys give the same tokens whatever the slot count and resume lag."""
    cfg, params = tiny
    sp = SamplingParams(max_new_tokens=10, temperature=1.0, stop_token_ids=(7,))
    plan = episode_plan(np.random.default_rng(1), 4, 4, 20, cfg.vocab_size)
    keys = [jax.random.fold_in(jax.random.key(3), i) for i in range(4)]
    runs = []
    for slots, lag in ((0, 4), (0, 4), (2, 0)):
        agent = PlanAgent(plan)
        ContinuousEngine(params, cfg, sp, EngineConfig(slots=slots, chunk=8,
                                                       resume_lag=lag)).run(agent, keys)
        runs.append(agent)
    assert runs[0].outs == runs[1].outs
    assert [[len(t) for t in o] for o in runs[0].outs] == [[len(t) for t in o]
                                                           for o in runs[2].outs]
    assert runs[0].outs == runs[2].outs
    agent = runs[0]
    for i, ctx in enumerate(agent.ctx):
        lp = context_logprobs(params, cfg, ctx)
        for start, got in agent.logprobs[i]:
            np.testing.assert_allclose(lp[start - 1:start - 1 + len(got)], got, atol=1e-5)


def test_engine_config_rejects_bad_values_and_spec_reads_rollout_engine():
    from configs.quickstart import get_config
    from toolverse_jax.rl.engine import engine_config
    from toolverse_jax.rl.spec import RunSpec
    with pytest.raises(ValueError, match="chunk >= 1"):
        EngineConfig(chunk=0)
    with pytest.raises(ValueError, match="use one of"):
        RolloutConfig(engine="async")
    c = get_config()
    c.rollout.engine, c.rollout.engine_slots, c.rollout.engine_resume_lag = "continuous", 4, 2
    ro = RunSpec.from_config(c).tool_use.rollout
    assert (ro.engine, ro.engine_slots, ro.engine_resume_lag) == ("continuous", 4, 2)
    assert engine_config(ro) == EngineConfig(slots=4, chunk=16, resume_lag=2)


def _record(tr):
    """Returns everything a trajectory records except its log-probs (compared to 1e-5)."""
    d = tr.to_json()
    d.pop("sample_logprobs")
    return d


def _equal_to_turn_loop(warm, tasks, pool, rcfg, max_new=96, group_size=2):
    cfg, params = warm
    out = {}
    for engine in ("sync", "continuous"):
        policy = SamplerPolicy(params, cfg, _sp(max_new=max_new))
        out[engine] = run_rollouts(policy, tasks, group_size, pool, TOK,
                                   dataclasses.replace(rcfg, engine=engine), jax.random.key(0))
    assert [_record(t) for t in out["continuous"]] == [_record(t) for t in out["sync"]]
    for a, b in zip(out["continuous"], out["sync"]):
        np.testing.assert_allclose(a.sample_logprobs, b.sample_logprobs, atol=1e-5)
    # The sampled log-probs are the trainer's scoring of the whole trajectory.
    for tr in out["continuous"]:
        lp = context_logprobs(params, cfg, tr.tokens)
        mask = np.asarray(tr.policy_mask[1:])
        np.testing.assert_allclose(lp[mask],
                                   np.asarray(tr.sample_logprobs[1:])[mask], atol=1e-5)
    return out["continuous"]


@pytest.mark.slow  # the engine is off by default (rollout.engine='sync'): minutes of compiles
def test_rollouts_equal_turn_loop_fast(warm, tasks, pool):
    """Greedy: the continuous engine's trajectories equal the turn loop's (tokens, masks, turn
    records, end reasons, rewards; log-probs to 1e-5, and to the trainer's scoring)."""
    trajs = _equal_to_turn_loop(warm, tasks["quickstart"][:2], pool,
                                dataclasses.replace(RCFG, max_turns=3, max_invalid_streak=2))
    assert max(len(t.turns) for t in trajs) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("which", ["quickstart", "horizon10"])
def test_rollouts_equal_turn_loop(warm, tasks, pool, which):
    trajs = _equal_to_turn_loop(warm, tasks[which], pool, RCFG)
    assert max(len(t.turns) for t in trajs) >= 3
    trajs = _equal_to_turn_loop(warm, tasks[which], pool,
                                dataclasses.replace(RCFG, max_invalid_streak=2))
    assert any(t.end_reason == "invalid_calls" for t in trajs) or which == "horizon10"


@pytest.mark.slow  # the engine is off by default (rollout.engine='sync'): minutes of compiles
def test_benchmark_case_runs_real_env_calls_on_every_engine(tiny, pool):
    """benchmarks.rollout on real GUST horizon-3 tasks: the env responses come from the
    built-in servers (the engine's env thread for "continuous") and every engine's greedy turns
    are equal."""
    from benchmarks.rollout import Envs, bench_case
    cfg, params = tiny
    tasks = load_or_generate_quickstart_tasks(None, num_tasks=64, horizons=(1, 2, 3), seed=0)
    tasks = [t for t in tasks if len(t.stages) == 3][:2]
    sp = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(5, 17, 33))
    envs = Envs(pool, tasks, 4, 60, 0.0)
    plan = episode_plan(np.random.default_rng(0), 4, 3, 16, cfg.vocab_size)
    case = bench_case(params, cfg, sp, plan, envs, 3, 1)
    assert case["greedy_equal"], case
    assert 0 <= case["continuous"]["env_idle_frac"] <= 1 and case["kv"]["env_idle_frac"] > 0
    assert case["continuous_vs_kv"] > 0 and case["continuous"]["decode_calls"] > 0
    assert case["speedup_vs_sync"] == pytest.approx(
        case["reprefill"]["rollout_s"] / case["kv"]["rollout_s"], rel=1e-2)


def test_env_thread_merges_queued_env_calls_and_splits_results():
    """Work queued while the env thread is busy runs together: consecutive EnvCalls with the
    same `run` become one call whose results go back to each work in order; a plain callable
    runs alone; a failing call fails every work merged into it; shutdown cancels the rest."""
    import threading
    from toolverse_jax.sampling.engine import EnvCalls, _EnvThread

    calls = []

    def run(items):
        calls.append(list(items))
        return [x * 10 for x in items]

    def short(items):  # drops a result: an error, not a shifted answer
        return items[:-1]

    gate, started = threading.Event(), threading.Event()

    def blocker():  # holds the env thread until the gate opens
        started.set()
        return gate.wait(5) and "first"

    env = _EnvThread()
    first = env.submit(blocker)
    assert started.wait(5)  # everything below queues while the thread is busy
    futs = [env.submit(EnvCalls(run, [1, 2])), env.submit(EnvCalls(run, [3])),
            env.submit(lambda: "alone"), env.submit(EnvCalls(run, [4])),
            env.submit(EnvCalls(short, [5])), env.submit(EnvCalls(short, [6, 7]))]
    gate.set()
    assert first.result(5) == "first"
    assert [f.result(5) for f in futs[:4]] == [[10, 20], [30], "alone", [40]]
    assert calls == [[1, 2, 3], [4]]
    for f in futs[4:]:
        with pytest.raises(RuntimeError, match="2 results for 3 items"):
            f.result(5)
    assert env.calls == 5  # first, [1, 2, 3], alone, [4], the failed pair
    gate.clear()
    started.clear()
    env.submit(blocker)
    assert started.wait(5)
    late = env.submit(EnvCalls(run, [8]))
    threading.Timer(0.2, gate.set).start()
    env.shutdown()
    assert late.cancelled() and calls == [[1, 2, 3], [4]]
