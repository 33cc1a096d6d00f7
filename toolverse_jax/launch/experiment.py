"""XManager-style experiments: a config plus a sweep, run as work units by an executor.

The concepts follow `xmanager` (an Experiment owns WorkUnits; an Executor decides where a job
runs) without its Cloud dependencies, which do not install next to our pins:

    with Experiment("runs/qs", "configs/quickstart.py", LocalExecutor(max_parallel=2)) as exp:
        for overrides in load_sweep("sweeps/quickstart_smoke.py"):
            exp.add(overrides)
    print(exp.summary_table())

Each work unit is its own `python -m experiments.train` process with its own workdir and log
(ROOT/wu_N/ and ROOT/wu_N/log.txt). ROOT/experiment.json records every unit's overrides, status,
exit code, wall time and final metrics, rewritten at each change; relaunching the same ROOT
skips the units that already succeeded (the trainer itself resumes the rest from checkpoints).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Sequence

from toolverse_jax.launch.sweep import check_overrides, load_config, short_name, to_flags

PENDING, RUNNING, SUCCEEDED, FAILED = "pending", "running", "succeeded", "failed"
DEFAULT_COLUMNS = ("step", "loss", "rollout/success_rate", "eval/success_rate")


@dataclasses.dataclass
class WorkUnit:
    """One point of the sweep: its overrides, where it writes, and what happened to it."""

    id: int
    overrides: dict[str, Any]
    workdir: str
    status: str = PENDING
    returncode: int | None = None
    wall_s: float | None = None
    started: float | None = None
    error: str | None = None
    final: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def log_path(self) -> str:
        return os.path.join(self.workdir, "log.txt")

    @property
    def name(self) -> str:
        return f"wu_{self.id}"


def final_metrics(workdir: str) -> dict[str, Any]:
    """Returns the last value of every key in WORKDIR/metrics.jsonl (the unit's final state)."""
    path = os.path.join(workdir, "metrics.jsonl")
    out: dict[str, Any] = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            try:
                out.update(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a kill
    return out


def _log_tail(path: str, n: int = 3) -> str:
    if not os.path.exists(path):
        return "no log written"
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return " | ".join(lines[-n:])[-300:]


class LocalExecutor:
    """Runs work units as local subprocesses, at most `max_parallel` at once.

    `module` is the entry point (`python -m MODULE --config C --workdir W FLAGS...`);
    `timeout_s` bounds each unit (0 = none). Children get their own process group so a
    stopped launcher ends every process a unit started (its env-pool workers included).
    """

    def __init__(self, max_parallel: int = 1, module: str = "experiments.train",
                 timeout_s: float = 0.0, env: dict[str, str] | None = None,
                 poll_s: float = 0.2):
        if max_parallel < 1:
            raise ValueError(f"max_parallel={max_parallel}; use 1 or more")
        self.max_parallel, self.module, self.timeout_s = max_parallel, module, timeout_s
        self.env, self.poll_s = env or {}, poll_s

    def command(self, config_path: str, wu: WorkUnit, extra_flags: Sequence[str]) -> list[str]:
        """Returns the argv of one work unit: base flags first, so the unit's overrides win."""
        return [sys.executable, "-m", self.module, "--config", config_path,
                "--workdir", wu.workdir, *extra_flags, *to_flags(wu.overrides)]

    def run(self, units: Sequence[WorkUnit], config_path: str, extra_flags: Sequence[str],
            on_change, cwd: str | None = None) -> None:
        """Runs `units` to completion, calling `on_change(unit)` at each status change."""
        queue = [u for u in units if u.status not in (SUCCEEDED, FAILED)]
        running: dict[int, tuple[WorkUnit, subprocess.Popen, Any]] = {}
        env = {**os.environ, **self.env}
        try:
            while queue or running:
                while queue and len(running) < self.max_parallel:
                    wu = queue.pop(0)
                    os.makedirs(wu.workdir, exist_ok=True)
                    log = open(wu.log_path, "a")
                    cmd = self.command(config_path, wu, extra_flags)
                    log.write("$ " + " ".join(cmd) + "\n")
                    log.flush()
                    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            cwd=cwd, start_new_session=True)
                    wu.status, wu.started, wu.returncode, wu.error = RUNNING, time.time(), None, None
                    running[proc.pid] = (wu, proc, log)
                    on_change(wu)
                time.sleep(self.poll_s)
                for pid, (wu, proc, log) in list(running.items()):
                    rc = proc.poll()
                    timed_out = (rc is None and self.timeout_s > 0 and
                                 time.time() - wu.started > self.timeout_s)
                    if timed_out:
                        _stop_group(proc)
                        rc = proc.wait()
                    if rc is None:
                        continue
                    log.close()
                    del running[pid]
                    wu.returncode, wu.wall_s = rc, round(time.time() - wu.started, 1)
                    wu.final = final_metrics(wu.workdir)
                    if rc == 0:
                        wu.status = SUCCEEDED
                    else:
                        wu.status = FAILED
                        wu.error = (f"timed out after {self.timeout_s:.0f} s (raise --timeout_s)"
                                    if timed_out else f"exit {rc}: {_log_tail(wu.log_path)}")
                    on_change(wu)
        finally:
            for wu, proc, log in running.values():  # interrupted: end what this launcher started
                _stop_group(proc)
                proc.wait()
                log.close()
                wu.status, wu.error = FAILED, "launcher stopped before the unit finished"
                on_change(wu)


def _stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Experiment:
    """A config file, a list of work units (one per override dict) and where they write.

    Used as a context manager like `xm_local.create_experiment`: units are `add`ed inside the
    block and run by the executor when it exits (or by an explicit `run()`).
    """

    def __init__(self, root: str, config_path: str, executor: LocalExecutor | None = None,
                 title: str = "", extra_flags: Sequence[str] = (), cwd: str | None = None):
        self.root, self.config_path = os.path.abspath(root), config_path
        self.executor = executor or LocalExecutor()
        self.title = title or os.path.basename(self.root)
        self.extra_flags, self.cwd = list(extra_flags), cwd
        self.config = load_config(config_path)
        self.units: list[WorkUnit] = []
        self._previous = self._load_record()

    @property
    def record_path(self) -> str:
        return os.path.join(self.root, "experiment.json")

    def _load_record(self) -> list[WorkUnit]:
        if not os.path.exists(self.record_path):
            return []
        with open(self.record_path) as f:
            rec = json.load(f)
        return [WorkUnit(**u) for u in rec["work_units"]]

    def add(self, overrides: dict[str, Any], rerun_failed: bool = True) -> WorkUnit:
        """Returns the new work unit for `overrides` (the one already recorded under this root
        if an earlier launch had the same overrides). rerun_failed=False keeps a unit whose
        earlier launch failed as it is (failed, not run again), e.g. an arm stopped by hand."""
        check_overrides(self.config, overrides)
        overrides = dict(overrides)
        if any(u.overrides == overrides for u in self.units):
            raise ValueError(f"work unit overrides {overrides} appear twice in the sweep")
        wu = next((u for u in self._previous if u.overrides == overrides), None)
        if wu is not None and wu.status == FAILED and not rerun_failed:
            self.units.append(wu)
            return wu
        if wu is None or wu.status != SUCCEEDED:
            used = {u.id for u in self.units} | {u.id for u in self._previous}
            wid = wu.id if wu is not None else next(i for i in range(1, len(used) + 2)
                                                    if i not in used)
            wu = WorkUnit(wid, overrides, os.path.join(self.root, f"wu_{wid}"))
        self.units.append(wu)
        return wu

    def work_units(self) -> list[WorkUnit]:
        return list(self.units)

    def save(self) -> None:
        """Writes ROOT/experiment.json atomically."""
        os.makedirs(self.root, exist_ok=True)
        rec = {"title": self.title, "config": self.config_path, "extra_flags": self.extra_flags,
               "executor": {"kind": "local", "max_parallel": self.executor.max_parallel,
                            "module": self.executor.module},
               "work_units": [dataclasses.asdict(u) for u in self.units]}
        tmp = self.record_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rec, f, indent=2, default=str)
        os.replace(tmp, self.record_path)

    def run(self) -> list[WorkUnit]:
        """Runs every unit not yet succeeded; returns the units with their final status."""
        if not self.units:
            raise ValueError(f"experiment {self.title!r} has no work units; add() at least one")
        self.save()

        def on_change(wu: WorkUnit) -> None:
            self.save()
            extra = f" ({wu.wall_s} s)" if wu.wall_s is not None else ""
            print(f"[launch] {wu.name} {short_name(wu.overrides)}: {wu.status}{extra}",
                  file=sys.stderr, flush=True)

        self.executor.run(self.units, self.config_path, self.extra_flags, on_change, self.cwd)
        self.save()
        return self.units

    def __enter__(self) -> "Experiment":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.run()

    def summary_rows(self, columns: Sequence[str] = DEFAULT_COLUMNS) -> list[list[str]]:
        """Returns one row of cells per unit: id, overrides, status, rc, wall s, columns."""
        rows = []
        for u in self.units:
            cells = [u.name, short_name(u.overrides), u.status,
                     "" if u.returncode is None else str(u.returncode),
                     "" if u.wall_s is None else f"{u.wall_s:.1f}"]
            for c in columns:
                v = u.final.get(c)
                cells.append(f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v)))
            rows.append(cells)
        return rows

    def summary_table(self, columns: Sequence[str] = DEFAULT_COLUMNS) -> str:
        """Returns the Markdown table of all units (failed units' errors listed below it)."""
        head = ["unit", "overrides", "status", "rc", "wall s", *columns]
        rows = self.summary_rows(columns)
        widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
        fmt = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
        lines = [fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        lines += [fmt(r) for r in rows]
        for u in self.units:
            if u.status == FAILED:
                lines.append(f"{u.name} failed: {u.error} (log: {u.log_path})")
        return "\n".join(lines)
