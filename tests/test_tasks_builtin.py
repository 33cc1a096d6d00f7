"""DUSA against the real built-in catalog through EnvPool (in-process workers)."""

import collections

import pytest

from toolverse_jax.tasks import (DusaConfig, PoolExecutor, build_tool_graph, dusa_generate,
                                 graph_stats, task_seed, verify_task)
from toolverse_jax.tasks.replay import answer_text

envs = pytest.importorskip("toolverse_jax.envs")


@pytest.fixture(scope="module")
def executor():
    try:
        ex = PoolExecutor(kinds=("builtin",), num_workers=0)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"built-in catalog unavailable: {e}")
    yield ex
    ex.shutdown()


@pytest.fixture(scope="module")
def graph(executor):
    return build_tool_graph(executor.tool_specs())


def _gen(executor, graph, n, base=0, **kw):
    return dusa_generate(executor, [task_seed(base, i) for i in range(n)], DusaConfig(**kw),
                         graph=graph)


def test_builtin_graph_links_servers(executor, graph):
    st = graph_stats(graph)
    assert st["num_servers"] >= 6 and st["num_tools"] >= 40
    assert st["cross_server_edges"] > 0
    edges = {(u, v, d["param"]) for u, v, d in graph.edges(data=True)}
    # a contact's email can address a mail
    assert any(u.startswith("contacts.") and v == "mail.send_email" and p == "to"
               for u, v, p in edges)


def test_builtin_tasks_replay_and_reject_wrong_answers(executor, graph):
    res = _gen(executor, graph, 12, horizon=2, max_per_stage=2)
    tasks = [t for t, *_ in res if t is not None]
    assert len(tasks) >= 8
    for t in tasks:
        assert t.stats["horizon"] == 2
        assert verify_task(t, executor)
        assert all(s.name for st in t.stages for s in st)
        if t.verifier["kind"] in ("exact", "set"):
            assert t.check(answer_text(t.answer))
            wrong = answer_text(t.answer[:-1]) if t.verifier["kind"] == "set" else \
                answer_text(t.answer) + "x9"
            assert not t.check(wrong)
        else:
            fresh = executor.reset([t.spec])[0]
            assert not t.check(None, executor.read_state(fresh))
            executor.close([fresh])


def test_verify_task_accepts_an_env_pool(executor, graph):
    (t, reason, _), = _gen(executor, graph, 1, base=7, horizon=2, max_per_stage=1)
    assert reason == "ok"
    assert verify_task(t, executor.pool)
    # a tampered gold chain does not replay to the same answer / state
    t.stages[-1][-1].arguments = {"__bogus__": 1}
    assert not verify_task(t, executor.pool)


@pytest.mark.parametrize("horizon,n", [(2, 6), (10, 4)])
def test_builtin_horizon_control(executor, graph, horizon, n):
    res = _gen(executor, graph, n, base=horizon, horizon=horizon, max_per_stage=2)
    tasks = [t for t, *_ in res if t is not None]
    assert len(tasks) >= n // 2
    assert all(t.stats["horizon"] == horizon for t in tasks)
    if horizon >= 10:
        assert max(t.stats["depth"] for t in tasks) >= 3


def test_builtin_horizon_30(executor, graph):
    res = _gen(executor, graph, 3, base=30, horizon=30, max_per_stage=2, num_servers=(3, 5))
    tasks = [t for t, *_ in res if t is not None]
    assert tasks and all(t.stats["horizon"] == 30 for t in tasks)
    assert all(t.stats["num_servers"] >= 3 for t in tasks)
    assert max(t.stats["depth"] for t in tasks) >= 5


def test_builtin_cross_server_and_determinism(executor, graph):
    a = _gen(executor, graph, 8, base=3, horizon=3, max_per_stage=2, num_servers=(2, 2))
    b = _gen(executor, graph, 8, base=3, horizon=3, max_per_stage=2, num_servers=(2, 2))
    assert [t.to_json() if t else r for t, r, _ in a] == [t.to_json() if t else r
                                                          for t, r, _ in b]
    flows = collections.Counter()
    for t, *_ in a:
        if t is None:
            continue
        for st in t.stages:
            for s in st:
                for src in s.sources.values():
                    if src["from"] == "step":
                        up = t.stages[src["stage"]][src["index"]]
                        flows[up.server != s.server] += 1
    assert flows[True] > 0, "expected values flowing between servers"


def test_quickstart_tasks(tmp_path, executor):
    from toolverse_jax.tasks.gust import load_or_generate_quickstart_tasks

    tasks = load_or_generate_quickstart_tasks(str(tmp_path), num_tasks=12, horizons=(1, 2),
                                              seed=5)
    assert len(tasks) == 12
    assert {t.stats["horizon"] for t in tasks} == {1, 2}
    assert all(t.stats["num_servers"] <= 2 for t in tasks)
    assert all(len(t.instruction) < 400 for t in tasks)
    again = load_or_generate_quickstart_tasks(str(tmp_path), num_tasks=12, horizons=(1, 2),
                                              seed=5)
    assert [t.id for t in again] == [t.id for t in tasks]


def test_state_verifiers_fail_on_the_untouched_initial_state(tmp_path, executor):
    """A create-then-delete chain changes the state before its last stage but not overall: a
    check "record X is gone" would pass for an agent that does nothing, so it is never chosen."""
    from toolverse_jax.tasks.gust import load_or_generate_quickstart_tasks

    tasks = load_or_generate_quickstart_tasks(str(tmp_path), num_tasks=60, horizons=(2,),
                                              seed=3, servers=("notes", "calendar"))
    state = [t for t in tasks if t.verifier["kind"] == "state"]
    assert len(state) >= 10
    fresh = executor.reset([t.spec for t in state])
    try:
        trivial = [t.instruction for t, ep in zip(state, fresh)
                   if t.check(None, executor.read_state(ep))]
    finally:
        executor.close(fresh)
    assert not trivial, trivial[:3]


def test_shipped_quickstart_file_replays(executor):
    from toolverse_jax.tasks.gust import QUICKSTART_FILE, load_or_generate_quickstart_tasks
    from toolverse_jax.tasks.replay import verify_tasks
    import os

    if not os.path.exists(QUICKSTART_FILE):
        pytest.skip("no shipped quickstart file")
    tasks = load_or_generate_quickstart_tasks()
    assert len(tasks) == 64 and {t.stats["horizon"] for t in tasks} == {1, 2, 3}
    bad = [(t.id, why) for t, (ok, why) in zip(tasks, verify_tasks(tasks, executor)) if not ok]
    assert not bad, f"shipped quickstart tasks no longer replay on the built-in servers: {bad[:3]}"


@pytest.mark.slow
def test_builtin_two_processes_same_set_as_one():
    from toolverse_jax.tasks.gust import generate_gust

    cfg = dict(num_tasks=16, horizons=(2, 5), chunk_size=4)
    one, _ = generate_gust({**cfg, "num_processes": 1}, progress=False)
    two, _ = generate_gust({**cfg, "num_processes": 2}, progress=False)
    assert [t.id for t in one] == [t.id for t in two] and len(one) == 16


@pytest.mark.slow
def test_shipped_quickstart_file_is_what_the_code_generates():
    from toolverse_jax.tasks.gust import (QUICKSTART_FILE, QUICKSTART_SETTINGS, generate_gust,
                                          read_tasks)

    cfg = {**QUICKSTART_SETTINGS, "num_processes": 0, "attempts_factor": 6.0}
    tasks, _ = generate_gust(cfg, progress=False)
    assert [t.to_json() for t in tasks] == [t.to_json() for t in read_tasks(QUICKSTART_FILE)], \
        "regenerate: rm toolverse_jax/tasks/data/gust_quickstart.*; " \
        "python -c 'from toolverse_jax.tasks import *; " \
        "load_or_generate_quickstart_tasks(\"toolverse_jax/tasks/data\")'"


def test_generator_processes_leave_no_sandboxes(tmp_path, monkeypatch):
    """Pool.terminate() kills generator workers mid-flight; their env-pool dirs must still go."""
    import os
    import tempfile

    from toolverse_jax.tasks.gust import generate_gust

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # spawned workers' temporary dirs land here too
    monkeypatch.setattr(tempfile, "tempdir", None)
    tasks, _ = generate_gust(dict(num_tasks=2, horizons=(2,), chunk_size=2, num_processes=1),
                             progress=False)
    assert len(tasks) == 2
    assert not os.listdir(tmp_path), os.listdir(tmp_path)


# The quickstart's set (goal level) and the recipe-level set its earlier results were measured on
# (`--config.tasks.instruction_level=recipe --config.tasks.num_tasks=2000`) are both shipped.
SHIPPED_VARIANTS = [{}, {"instruction_level": "recipe", "num_tasks": 2000}]


def _config_want(overrides=None):
    from configs.quickstart import get_config
    t = get_config().tasks
    for k, v in (overrides or {}).items():
        setattr(t, k, v)
    want = {"num_tasks": t.num_tasks, "horizons": list(t.horizons), "seed": t.gen_seed,
            "servers": list(t.servers)}
    whole = t.instruction_level != "recipe" if t.whole_chain is None else bool(t.whole_chain)
    if whole or t.instruction_level != "recipe":
        want.update(instruction_level=t.instruction_level, whole_chain=whole)
    return want


@pytest.mark.parametrize("overrides", SHIPPED_VARIANTS)
def test_quickstart_config_task_set_is_shipped(tmp_path, overrides):
    # configs/quickstart.py's task set loads from the package (generating it takes minutes),
    # and a run's task cache gets the same tasks.
    from toolverse_jax.tasks.gust import (load_or_generate_quickstart_tasks, read_task_file,
                                          shipped_quickstart_file)
    want = _config_want(overrides)
    path = shipped_quickstart_file(want)
    assert path is not None and path.endswith(".jsonl.gz"), "ship the quickstart config's tasks"
    shipped = read_task_file(path)
    assert len(shipped) == want["num_tasks"]
    got = load_or_generate_quickstart_tasks(
        str(tmp_path), want["num_tasks"], tuple(want["horizons"]), want["seed"],
        tuple(want["servers"]), instruction_level=want.get("instruction_level", "recipe"),
        whole_chain=want.get("whole_chain"))
    assert [t.id for t in got] == [t.id for t in shipped]
    assert shipped_quickstart_file({**want, "seed": want["seed"] + 1}) is None


@pytest.mark.slow
@pytest.mark.parametrize("overrides", SHIPPED_VARIANTS)
def test_shipped_quickstart_config_tasks_are_what_the_code_generates(overrides):
    from toolverse_jax.tasks.gust import (QUICKSTART_SETTINGS, generate_gust, read_task_file,
                                          shipped_quickstart_file)
    want = _config_want(overrides)
    # What load_or_generate_quickstart_tasks runs when nothing matching is shipped (minutes).
    fresh, _ = generate_gust({**QUICKSTART_SETTINGS, **want, "num_processes": 0,
                              "attempts_factor": 6.0}, progress=False)
    assert [t.to_json() for t in fresh] == [
        t.to_json() for t in read_task_file(shipped_quickstart_file(want))], \
        "regenerate: python -m experiments.train --config configs/quickstart.py --workdir W " \
        "--config.rl.steps=0 --config.sft.steps=0, then gzip W/tasks/gust_quickstart.jsonl to " \
        "toolverse_jax/tasks/data/gust_quickstart_<name>.jsonl.gz (and copy its .meta.json)"
