"""GUST generation (processes, dedup, manifest), shards, grain source, splits (fake env)."""

import json
import os
import tempfile
import subprocess
import sys

import pytest

from toolverse_jax.tasks.gust import (GustFormatError, GustSource, generate_gust, make_dataset,
                                      read_tasks, split_tasks, write_shards)

FAKE = "tasks_fake:make_fake_executor"
HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)


def _cfg(**kw):
    base = dict(num_tasks=24, horizons=(2, 3, 4), num_servers=(1, 3), executor_factory=FAKE,
                chunk_size=6, num_processes=0)
    base.update(kw)
    return base


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("gust"))
    tasks, manifest = generate_gust(_cfg(shard_size=10), out_dir=out, progress=False)
    return out, tasks, manifest


def test_manifest_counts_and_histogram(generated):
    out, tasks, man = generated
    assert man["num_tasks"] == len(tasks) == 24
    assert man["attempts"] == len(tasks) + man["num_dropped"]
    assert sum(man["horizon_histogram"].values()) == 24
    assert set(man["horizon_histogram"]) <= {"2", "3", "4"}
    assert len({t.chain_hash() for t in tasks}) == 24  # deduplicated
    with open(os.path.join(out, "manifest.json")) as f:
        on_disk = json.load(f)
    assert on_disk["num_tasks"] == 24 and on_disk["shards"] == ["gust-00000.jsonl",
                                                                  "gust-00001.jsonl",
                                                                  "gust-00002.jsonl"]


def test_shards_round_trip(generated):
    out, tasks, _ = generated
    back = read_tasks(out)
    assert [t.to_json() for t in back] == [t.to_json() for t in tasks]


def test_grain_source_and_pipeline(generated):
    out, tasks, _ = generated
    src = GustSource(out)
    assert len(src) == 24
    assert [src[i]["id"] for i in range(len(src))] == [t.id for t in tasks]
    ds = make_dataset(out, seed=3, horizons=(2, 3), batch_size=5)
    batches = list(ds)
    got = [d["id"] for b in batches for d in b]
    want = {t.id for t in tasks if t.stats["horizon"] in (2, 3)}
    assert set(got) == want and len(got) == len(want)
    assert all(len(b) == 5 for b in batches[:-1])
    assert got == [d["id"] for b in make_dataset(out, seed=3, horizons=(2, 3), batch_size=5)
                   for d in b]  # deterministic shuffle
    assert got != [t.id for t in tasks if t.stats["horizon"] in (2, 3)]
    parsed = make_dataset(out, seed=None, as_tasks=True)
    assert parsed[0].id == tasks[0].id and parsed[0].check is not None


def test_split_by_server_holds_out_tools(generated):
    _, tasks, _ = generated
    sp = split_tasks(tasks, by="server", held_out={"test": ["bank"]})
    assert sum(len(v) for v in sp.values()) == len(tasks)
    train_tools = {tool for t in sp["train"] for tool in t.tools}
    assert sp["test"] and all("bank" in t.servers for t in sp["test"])
    assert not any(tool.startswith("bank.") for tool in train_tools)
    auto = split_tasks(tasks, by="server", seed=1)
    assert sum(len(v) for v in auto.values()) == len(tasks)


def test_split_by_toolset_never_shares_a_tool_set(generated):
    _, tasks, _ = generated
    sp = split_tasks(tasks, by="toolset", fractions=(0.5, 0.25, 0.25))
    sets = {k: {t.tools for t in v} for k, v in sp.items()}
    assert not sets["train"] & sets["test"] and not sets["train"] & sets["validation"]
    assert sum(len(v) for v in sp.values()) == len(tasks)
    with pytest.raises(ValueError, match="server"):
        split_tasks(tasks, by="nope")


def test_two_processes_give_the_same_set_as_one(generated, tmp_path, monkeypatch):
    _, tasks0, _ = generated
    # every temporary directory of this run (ours and the spawned workers') lands in tmp_path
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    one, _ = generate_gust(_cfg(shard_size=10, num_processes=1), progress=False)
    two, m2 = generate_gust(_cfg(shard_size=10, num_processes=2), progress=False)
    ids = [t.id for t in tasks0]
    assert [t.id for t in one] == ids and [t.id for t in two] == ids
    assert m2["startup_s"] > 0
    # terminated workers leave no env-pool sandboxes behind
    assert not [p for p in os.listdir(tmp_path) if p.startswith("toolverse_")], os.listdir(tmp_path)


def test_unknown_setting_is_named():
    with pytest.raises(KeyError, match="num_taskz"):
        generate_gust({"num_taskz": 3}, progress=False)


def test_write_shards_sizes(generated, tmp_path):
    _, tasks, _ = generated
    names = write_shards(tasks[:7], str(tmp_path), shard_size=3)
    assert names == ["gust-00000.jsonl", "gust-00001.jsonl", "gust-00002.jsonl"]
    assert len(GustSource(str(tmp_path))) == 7


def test_malformed_line_names_file_and_line(generated, tmp_path):
    _, tasks, _ = generated
    write_shards(tasks[:4], str(tmp_path), shard_size=10)
    shard = tmp_path / "gust-00000.jsonl"
    lines = shard.read_text().splitlines(keepends=True)
    # line 4 (after a blank line 2) is cut short: not JSON
    shard.write_text(lines[0] + "\n" + lines[1] + lines[2][:40] + "\n" + lines[3])
    with pytest.raises(GustFormatError, match=r"gust-00000\.jsonl:4: malformed GUST line"):
        read_tasks(str(tmp_path))
    with pytest.raises(GustFormatError, match=r"gust-00000\.jsonl:4: malformed GUST line"):
        GustSource(str(tmp_path))[2]
    # valid JSON that is not a task: the missing field is named too
    shard.write_text(lines[0] + json.dumps({"id": "x"}) + "\n")
    with pytest.raises(GustFormatError,
                       match=r"gust-00000\.jsonl:2: malformed GUST task.*'instruction'"):
        read_tasks(str(shard))
    assert issubclass(GustFormatError, ValueError)


def test_generate_tasks_cli(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    out = subprocess.run(
        [sys.executable, "-m", "experiments.generate_tasks", "--config", "configs/gust.py",
         "--out", str(tmp_path), "--config.num_tasks=6", "--config.num_processes=0",
         f"--config.executor_factory={FAKE}", "--config.horizons=(2,3)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["num_tasks"] == 6
    with open(tmp_path / "manifest.json") as f:
        man = json.load(f)
    # configs/gust.py: goal-level, whole-chain tasks; a chain whose verifier closure falls
    # short of its horizon is dropped, so the horizons need not alternate
    assert set(man["horizon_histogram"]) <= {"2", "3"}
    assert sum(man["horizon_histogram"].values()) == 6
    q = man["quality"]
    assert q["instruction_levels"] == {"goal": 6}
    for h, row in q["by_horizon"].items():
        if row["tasks"]:
            assert row["effective_horizon_histogram"] == {h: row["tasks"]}
            assert row["effective_ratio_mean"] == 1.0
    assert summary["quality"].keys() == q["by_horizon"].keys()


def test_refine_warmup_runs_and_keeps_determinism():
    a, ma = generate_gust(_cfg(num_tasks=8, refine_warmup=6), progress=False)
    b, _ = generate_gust(_cfg(num_tasks=8, refine_warmup=6), progress=False)
    assert [t.id for t in a] == [t.id for t in b] and len(a) == 8
    assert "graph_dropped" in ma["generation_info"]


def test_workers_that_cannot_start_fail_instead_of_hanging():
    with pytest.raises(RuntimeError, match="did not start"):
        generate_gust(_cfg(num_processes=1, executor_factory="no_such_module_xyz:make",
                           worker_start_timeout_s=4.0), progress=False)


def test_manifest_quality_recipe_vs_goal():
    # recipe (the pre-issue-24 generator) names every gold call; goal level names no discovery
    # call, and every stage of a whole-chain task is on its verifier's closure
    _, rec = generate_gust(_cfg(num_tasks=8, horizons=(3,), instruction_level="recipe",
                                whole_chain=False), progress=False)
    _, goal = generate_gust(_cfg(num_tasks=8, horizons=(3,)), progress=False)
    r, g = rec["quality"]["by_horizon"]["3"], goal["quality"]["by_horizon"]["3"]
    assert r["named_calls_fraction"] == 1.0 and r["named_discovery_fraction"] == 1.0
    assert g["named_discovery_fraction"] == 0.0 and g["effective_ratio_mean"] == 1.0
    assert rec["quality"]["instruction_levels"] == {"recipe": 8}
    assert r["tasks"] == g["tasks"] == 8
    assert set(g["dropped"]) <= {"short", "short_closure", "long_closure", "duplicate",
                                 "instruction_check"}
    with pytest.raises(ValueError, match="instruction_level"):
        generate_gust(_cfg(num_tasks=1, instruction_level="goals"), progress=False)
