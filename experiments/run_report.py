"""One Markdown row per tool-use training run: the RL phase's held-out curve and lift, the
train-rollout success, truncation and invalid-call rates of its first and last 10 RL steps, and
its timings (what the README's RL tables report).

    python -m experiments.run_report runs/qs runs/sweep/wu_1 ...      # Markdown table
    python -m experiments.run_report --json runs/qs                     # one JSON line per run

Reads WORKDIR/metrics.jsonl only (a run still in progress reports what it has logged).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import numpy as np

COLUMNS = ("run", "RL steps", "held-out: warm start → evals", "Δ held-out",
           "train success first 10 → last 10", "truncated first 10 → last 10",
           "invalid calls first 10 → last 10", "held-out truncated: warm start → end",
           "s per RL step (rollout + update)",
           "wall min")


def run_record(workdir: str, window: int = 10) -> dict:
    """Returns the RL-phase summary of the run in `workdir` (see the module docstring)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: not a training run's workdir (no metrics.jsonl)")
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    rl = [r for r in records if r.get("phase") == "rl"]
    if not rl:
        raise ValueError(f"{workdir}: no RL step logged yet")
    first_rl = rl[0]["step"]
    evals = [(r["step"], r["eval/success_rate"]) for r in records if "eval/success_rate" in r]
    trunc = {r["step"]: r.get("eval/truncated_frac") for r in records
             if "eval/success_rate" in r}
    warm = next((v for s, v in evals if s == first_rl - 1), None)
    curve = [(s - first_rl + 1, v) for s, v in evals if s >= first_rl]

    def mean(key: str, part: list) -> float | None:
        vals = [r[key] for r in part if key in r]
        return float(np.mean(vals)) if vals else None

    head, tail = rl[:window], rl[-window:]
    out = {"run": workdir, "rl_steps": len(rl), "warm_start": warm, "evals": curve,
           "final": curve[-1][1] if curve else None,
           "lift": (curve[-1][1] - warm) if curve and warm is not None else None,
           "eval_truncated": (trunc.get(first_rl - 1), trunc[evals[-1][0]] if curve else None)}
    for key, name in (("rollout/success_rate", "train_success"),
                      ("rollout/truncated_frac", "truncated"),
                      ("rollout/rate_invalid_call", "invalid_calls")):
        out[name] = (mean(key, head), mean(key, tail))
    for key in ("time/step_s", "time/rollout_s", "time/update_s"):
        out[key.split("/")[1]] = float(np.median([r[key] for r in rl if key in r]))
    out["wall_min"] = _wall_minutes(workdir, records)
    return out


def _wall_minutes(workdir: str, records: list[dict]) -> float | None:
    """Minutes from the run's last invocation (config_history.jsonl) to its last logged
    record; None for a resumed run (its wall would hide the earlier part) or older logs."""
    path = os.path.join(workdir, "config_history.jsonl")
    stamps = [r["unix_time"] for r in records if "unix_time" in r]
    if not stamps or not os.path.exists(path):
        return None
    with open(path) as f:
        starts = [json.loads(line) for line in f if line.strip()]
    if len(starts) != 1:
        return None
    start = datetime.datetime.strptime(starts[0]["time"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    return (stamps[-1] - start) / 60


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def markdown_row(rec: dict) -> str:
    """Returns the Markdown table row of `run_record`'s dict."""
    pair = lambda p: f"{_pct(p[0])} → {_pct(p[1])}"
    curve = " / ".join(_pct(v) for _, v in rec["evals"])
    lift = "—" if rec["lift"] is None else f"{100 * rec['lift']:+.1f}"
    wall = "—" if rec["wall_min"] is None else f"{rec['wall_min']:.1f}"
    cells = [rec["run"], str(rec["rl_steps"]), f"{_pct(rec['warm_start'])} → {curve}", lift,
             pair(rec["train_success"]), pair(rec["truncated"]), pair(rec["invalid_calls"]),
             pair(rec["eval_truncated"]),
             f"{rec['step_s']:.1f} ({rec['rollout_s']:.1f} + {rec['update_s']:.1f})", wall]
    return "| " + " | ".join(cells) + " |"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workdirs", nargs="+")
    p.add_argument("--json", action="store_true", help="one JSON line per run")
    p.add_argument("--window", type=int, default=10, help="RL steps averaged at each end")
    a = p.parse_args(argv)
    if not a.json:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
    rc = 0
    for wd in a.workdirs:
        try:
            rec = run_record(wd, a.window)
        except (OSError, ValueError) as e:
            print(f"run_report: {e}", file=sys.stderr)
            rc = 1
            continue
        print(json.dumps(rec) if a.json else markdown_row(rec))
    return rc


if __name__ == "__main__":
    sys.exit(main())
