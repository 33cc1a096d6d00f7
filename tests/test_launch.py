"""Launcher: sweep grids and flags, a local executor on a scripted entry point (concurrency,
failure, resume), and a real 3-unit quickstart sweep through `python -m experiments.launch`."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from configs.quickstart import get_config
from toolverse_jax.launch import (Experiment, LocalExecutor, chain, check_overrides, load_sweep,
                                  product, to_flags)
from toolverse_jax.launch.sweep import format_value

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_product_chain_and_flags():
    grid = product(**{"rl.lr": [1e-3, 3e-4], "seed": [0, 1, 2]})
    assert len(grid) == 6
    assert grid[0] == {"rl.lr": 1e-3, "seed": 0} and grid[-1] == {"rl.lr": 3e-4, "seed": 2}
    both = chain([{"seed": 9}], grid)
    assert len(both) == 7 and both[0] == {"seed": 9}
    assert to_flags({"rl.advantage": "grpo", "train.progress": False, "tasks.horizons": (1, 2)}) \
        == ["--config.rl.advantage=grpo", "--config.train.progress=False",
            "--config.tasks.horizons=(1, 2)"]
    assert format_value((1,)) == "(1,)" and format_value(("a", "b")) == "('a', 'b')"


def test_check_overrides_names_the_bad_key():
    c = get_config()
    check_overrides(c, {"rl.adv.lam": 0.0, "seed": 3})
    with pytest.raises(KeyError, match=r"'rl.stepz' is not a config key; did you mean \['rl.steps'"):
        check_overrides(c, {"rl.stepz": 1})
    with pytest.raises(KeyError, match="names a config section"):
        check_overrides(c, {"rl.adv": 1})


def test_load_sweep_errors(tmp_path):
    assert len(load_sweep(os.path.join(REPO, "sweeps", "quickstart_smoke.py"))) == 3
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_sweep(str(tmp_path / "none.py"))
    bad = tmp_path / "bad.py"
    bad.write_text("def get_sweep():\n    return [1]\n")
    with pytest.raises(TypeError, match="entry 0 is int"):
        load_sweep(str(bad))


# A stand-in for experiments.train: logs its start/end, writes a metrics line, fails on demand.
_FAKE_TRAIN = """
import json, os, sys, time
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
workdir = sys.argv[sys.argv.index("--workdir") + 1]
events = os.environ["FAKE_EVENTS"]
with open(events, "a") as f:
    f.write(f"start {time.time()}\\n")
time.sleep(float(args.get("--config.sleep", "0.5")))
x = float(args.get("--config.x", "0"))
with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"step": 1, "loss": x * 2}) + "\\n")
with open(events, "a") as f:
    f.write(f"end {time.time()}\\n")
print("hello from", x)
sys.exit(3 if args.get("--config.fail") == "True" else 0)
"""

_FAKE_CONFIG = """
from ml_collections import ConfigDict
def get_config():
    return ConfigDict({"x": 0.0, "fail": False, "sleep": 0.5})
"""


def _max_concurrency(events_path: str) -> int:
    evs = []
    for line in open(events_path):
        kind, t = line.split()
        evs.append((float(t), 1 if kind == "start" else -1))
    live = peak = 0
    for _, d in sorted(evs, key=lambda e: (e[0], e[1])):
        live += d
        peak = max(peak, live)
    return peak


def test_local_executor_concurrency_failure_and_resume(tmp_path):
    (tmp_path / "fake_train.py").write_text(_FAKE_TRAIN)
    (tmp_path / "fake_config.py").write_text(_FAKE_CONFIG)
    events = tmp_path / "events.txt"
    env = {"PYTHONPATH": str(tmp_path), "FAKE_EVENTS": str(events)}
    root = tmp_path / "exp"

    def launch(rerun_failed=True):
        ex = LocalExecutor(max_parallel=2, module="fake_train", env=env, poll_s=0.05)
        with Experiment(str(root), str(tmp_path / "fake_config.py"), ex) as exp:
            for o in [{"x": 1.0}, {"x": 2.0}, {"x": 3.0, "fail": True}, {"x": 4.0}]:
                exp.add(o, rerun_failed=rerun_failed)
        return exp

    exp = launch()
    status = {u.id: u.status for u in exp.work_units()}
    assert status == {1: "succeeded", 2: "succeeded", 3: "failed", 4: "succeeded"}
    assert _max_concurrency(str(events)) == 2  # four units, never more than two at once
    u3 = exp.work_units()[2]
    assert u3.returncode == 3 and "exit 3" in u3.error and "hello from 3.0" in u3.error
    assert [u.final.get("loss") for u in exp.work_units()] == [2.0, 4.0, 6.0, 8.0]
    for u in exp.work_units():
        assert os.path.exists(os.path.join(u.workdir, "log.txt"))
        assert u.workdir == str(root / f"wu_{u.id}")
    rec = json.load(open(root / "experiment.json"))
    assert [u["status"] for u in rec["work_units"]] == ["succeeded", "succeeded", "failed",
                                                        "succeeded"]
    table = exp.summary_table(("loss",))
    assert "| wu_3 | x=3.0,fail=True | failed" in table and "wu_3 failed: exit 3" in table

    # Relaunch: only the failed unit runs again (same id, same workdir).
    events.write_text("")
    exp2 = launch()
    assert open(events).read().count("start") == 1
    assert [u.id for u in exp2.work_units()] == [1, 2, 3, 4]
    assert exp2.work_units()[2].status == "failed" and exp2.work_units()[0].status == "succeeded"
    # --keep_failed: the failed unit is kept as it was and nothing runs.
    events.write_text("")
    exp3 = launch(rerun_failed=False)
    assert open(events).read().count("start") == 0
    assert [u.status for u in exp3.work_units()] == ["succeeded", "succeeded", "failed",
                                                     "succeeded"]


def test_quickstart_three_unit_sweep(tmp_path):
    """The real thing: three quickstart units (GRPO, Turn-Aware with lam 0 and 0.5) for one
    SFT and one RL step each, two at a time; ~1 min on 2 cores."""
    root = tmp_path / "qs"
    smoke = ["--config.tasks.num_tasks=12", "--config.sft.steps=1", "--config.sft.batch_size=4",
             "--config.rl.steps=1", "--config.rl.tasks_per_step=2", "--config.rl.group_size=2",
             "--config.train.eval_every=0", "--config.rollout.max_new_tokens=16",
             "--config.rollout.max_turns=2", "--config.train.progress=False"]
    cmd = [sys.executable, "-m", "experiments.launch", "--config", "configs/quickstart.py",
           "--sweep", "sweeps/quickstart_smoke.py", "--root", str(root), "--max_parallel", "2",
           *smoke]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    rec = json.load(open(root / "experiment.json"))
    units = rec["work_units"]
    assert [u["overrides"] for u in units] == [
        {"rl.advantage": "grpo"}, {"rl.advantage": "turn_aware", "rl.adv.lam": 0.0},
        {"rl.advantage": "turn_aware", "rl.adv.lam": 0.5}]
    for u in units:
        assert u["status"] == "succeeded" and u["returncode"] == 0
        rows = [json.loads(l) for l in open(os.path.join(u["workdir"], "metrics.jsonl"))]
        assert [r["step"] for r in rows] == [1, 2]
        assert rows[0]["phase"] == "sft" and rows[1]["phase"] == "rl"
        assert u["final"]["step"] == 2
        log = open(os.path.join(u["workdir"], "log.txt")).read()
        assert f"--config.rl.advantage={u['overrides']['rl.advantage']}" in log
    lines = p.stdout.splitlines()
    assert lines[0].startswith("| unit | overrides") and len([l for l in lines
                                                              if "| succeeded |" in l]) == 3
