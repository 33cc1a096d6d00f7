"""What a run logs and draws: metrics.jsonl + tensorboard, rollout / advantage summaries computed
over the global batch (processes all-gather per-trajectory numbers), and the learning curve."""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np

from toolverse_jax.envs.episode import STATUSES
from toolverse_jax.rl.types import Row
from toolverse_jax.sharding.distributed import gather_rows


class MetricsLog:
    """metrics.jsonl + tensorboard scalars; on resume, drops lines past the restored step."""

    def __init__(self, workdir: str, resume_step: int | None):
        self.path = os.path.join(workdir, "metrics.jsonl")
        if os.path.exists(self.path):
            keep = []
            with open(self.path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut by a kill
                    if resume_step is not None and rec.get("step", 0) <= resume_step:
                        keep.append(line if line.endswith("\n") else line + "\n")
            with open(self.path, "w") as f:
                f.writelines(keep)
        from tensorboardX import SummaryWriter
        self.tb = SummaryWriter(os.path.join(workdir, "tb"))

    def write(self, step: int, metrics: dict) -> None:
        rec = {"step": int(step), "unix_time": round(time.time(), 3)}  # not a TB scalar
        for k, v in metrics.items():
            v = float(v) if isinstance(v, (np.floating, np.integer, jax.Array, float, int)) else v
            rec[k] = v
            if isinstance(v, float) and np.isfinite(v):
                self.tb.add_scalar(k, v, step)
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.tb.flush()

    def records(self) -> list[dict]:
        with open(self.path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def close(self) -> None:
        self.tb.close()


# Call statuses the env reports, plus the turns the sampler cut at max_new_tokens.
CALL_STATUSES = STATUSES + ("truncated",)
_STAT_COLS = 8  # present, success, reward, turns, answered, infra_failed, policy tokens, truncated


def trajectory_stats(trajs) -> np.ndarray:
    """Returns per-trajectory summary numbers [n, 8 + len(CALL_STATUSES)] (present, success,
    reward, turns, answered, infra_failed, policy tokens, ended by max_new_tokens, call-status
    counts): the form that processes all-gather so metrics are computed over the global batch."""
    out = np.zeros((len(trajs), _STAT_COLS + len(CALL_STATUSES)), np.float64)
    for i, t in enumerate(trajs):
        statuses = [s for turn in t.turn_statuses for s in turn]
        out[i, :_STAT_COLS] = (1.0, t.success, t.reward, t.num_turns, t.finished,
                               t.infra_failed, sum(t.policy_mask),
                               bool(t.turns) and t.turns[-1].kind == "truncated")
        out[i, _STAT_COLS:] = [statuses.count(s) for s in CALL_STATUSES]
    return out


def metrics_from_stats(stats: np.ndarray, prefix: str) -> dict[str, float]:
    """Returns summary scalars from `trajectory_stats` rows (rows with present == 0 are
    padding from an uneven split over processes)."""
    stats = stats[stats[:, 0] > 0]
    valid = stats[stats[:, 5] == 0]
    mean = lambda col, rows: float(np.mean(rows[:, col])) if len(rows) else 0.0
    out = {
        f"{prefix}/success_rate": mean(1, valid),
        f"{prefix}/reward": mean(2, valid),
        f"{prefix}/turns": mean(3, stats),
        f"{prefix}/answered": mean(4, stats),
        f"{prefix}/infra_failed": float(np.sum(stats[:, 5])),
        f"{prefix}/policy_tokens": mean(6, stats),
        f"{prefix}/truncated_frac": mean(7, stats),
    }
    counts = stats[:, _STAT_COLS:].sum(0)
    n_calls = max(float(counts.sum()), 1.0)
    for j, status in enumerate(CALL_STATUSES):
        out[f"{prefix}/rate_{status}"] = float(counts[j]) / n_calls
    return out


def advantage_stats(trajs, rows: list[Row]) -> np.ndarray:
    """Returns per-trajectory advantage numbers [n, 5] (present, group id, sum and sum of
    squares of its policy tokens' advantages, policy tokens) for `advantage_metrics`; `rows`
    are `trajectory_rows(trajs, ...)` (infrastructure failures have no row and count 0)."""
    out = np.zeros((len(trajs), 5), np.float64)
    it = iter(rows)
    for i, t in enumerate(trajs):
        # Group ids restart at 0 on every process: tell the processes' groups apart.
        out[i, :2] = (1.0, t.group_id + 1_000_000 * jax.process_index())
        if t.infra_failed:
            continue
        r = next(it)
        a = np.asarray(r.advantages, np.float64)[np.asarray(r.policy_mask, bool)]
        out[i, 2:] = (a.sum(), (a * a).sum(), a.size)
    return out


def advantage_metrics(stats: np.ndarray) -> dict[str, float]:
    """Returns adv/mean, adv/std over policy tokens and adv/zero_group_frac (the fraction of
    groups whose every policy token has advantage 0: groups that teach nothing this step)."""
    stats = stats[stats[:, 0] > 0]
    n = max(float(stats[:, 4].sum()), 1.0)
    mean = float(stats[:, 2].sum()) / n
    var = max(float(stats[:, 3].sum()) / n - mean * mean, 0.0)
    groups = np.unique(stats[:, 1])
    zero = [np.all(stats[stats[:, 1] == g, 3] <= 1e-12) for g in groups]
    return {"adv/mean": mean, "adv/std": float(np.sqrt(var)),
            "adv/zero_group_frac": float(np.mean(zero)) if len(zero) else 1.0}


def rollout_metrics(trajs, prefix: str) -> dict[str, float]:
    """Returns summary scalars of a batch of trajectories (all processes' when multi-host)."""
    return metrics_from_stats(gather_rows(trajectory_stats(trajs)), prefix)


SMOOTH_WINDOW = 10


def smooth(values, window: int = SMOOTH_WINDOW) -> np.ndarray:
    """Returns the trailing mean over up to `window` values at each position."""
    v = np.asarray(values, np.float64)
    c = np.concatenate([[0.0], np.cumsum(v)])
    idx = np.arange(1, len(v) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def plot_curve(records: list[dict], path: str) -> None:
    """Writes a PNG of eval success rate and train reward against the step.

    Draws on a bare `Figure` with the Agg canvas: no pyplot state, and the caller's matplotlib
    backend (a notebook's inline one) is left as it was."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ev = [(r["step"], r["eval/success_rate"]) for r in records if "eval/success_rate" in r]
    tr = [(r["step"], r["rollout/success_rate"]) for r in records if "rollout/success_rate" in r]
    pr = [(r["step"], r["probe/success_rate"]) for r in records if "probe/success_rate" in r]
    if ev:
        ax.plot(*zip(*ev), "o-", label="held-out success (greedy)")
    if pr:
        ax.plot(*zip(*pr), "s-", color="tab:green", label="probe RL tasks (sampled, fixed set)")
    if tr:
        steps, vals = zip(*tr)
        ax.plot(steps, vals, ".", alpha=0.3, color="tab:orange",
                label="train rollout success (sampled)")
        ax.plot(steps, smooth(vals), "-", color="tab:orange",
                label=f"train rollout success ({SMOOTH_WINDOW}-step mean)")
    sft_end = [r["step"] for r in records if r.get("phase") == "sft"]
    if sft_end:
        ax.axvline(max(sft_end) + 0.5, color="gray", ls="--", lw=1, label="SFT -> RL")
    ax.set_xlabel("update step")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
