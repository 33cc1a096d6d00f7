"""Runs every benchmark in a subprocess and collects their JSON lines into one table.

    python -m benchmarks.all            # full sizes (slow: the others' defaults take minutes)
    python -m benchmarks.all --quick    # each at its small size
    python -m benchmarks.all --args logprob="--tokens 1024 4096"   # flags for one benchmark

Writes benchmarks/results.json (machine info + one object per benchmark) and
benchmarks/results.md (benchmark, headline figures, baseline, ratio); prints one JSON summary
line. A benchmark that fails or times out is recorded with its error; the others still run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = {"__init__", "all", "logprob_gpu_check", "gpu_check"}  # GPU checks need an accelerator
# Small-size flags for benchmarks without --quick (their argparse options, checked by hand).
QUICK_ARGS = {"envs": ["--episodes", "8", "--rounds", "5"],
              "dusa": ["--num_tasks", "8", "--horizon", "3"]}


def _log(msg: str) -> None:
    print(f"[all] {msg}", file=sys.stderr, flush=True)


def discover() -> list[str]:
    """Returns the benchmark module names in benchmarks/ (sorted), minus SKIP."""
    return sorted(f[:-3] for f in os.listdir(HERE) if f.endswith(".py") and f[:-3] not in SKIP)


def quick_args(name: str) -> list[str]:
    """Returns the command-line flags that make benchmark `name` small."""
    if name in QUICK_ARGS:
        return QUICK_ARGS[name]
    with open(os.path.join(HERE, f"{name}.py")) as f:
        return ["--quick"] if '"--quick"' in f.read() else []


def last_json_line(stdout: str) -> dict | None:
    """Returns the last stdout line that parses as a JSON object, or None."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def parse_extra(items: list[str], names: list[str]) -> dict[str, list[str]]:
    """Returns {benchmark: flags} from `NAME=FLAGS` strings (FLAGS split like a shell)."""
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, flags = item.partition("=")
        if not sep or name not in names:
            raise ValueError(f"--args {item!r}: expected NAME=FLAGS with NAME one of {names}")
        out.setdefault(name, []).extend(shlex.split(flags))
    return out


def run_one(name: str, quick: bool, timeout_s: float, extra: list[str] = ()) -> dict:
    """Returns {"name", "args", "wall_s", "ok", "result" | "error"} for one benchmark run."""
    args = (quick_args(name) if quick else []) + list(extra)
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *args]
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    t0 = time.perf_counter()
    rec = {"name": name, "args": args}
    try:
        p = subprocess.run(cmd, cwd=os.path.dirname(HERE), env=env, capture_output=True,
                           text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        rec.update(wall_s=round(time.perf_counter() - t0, 1), ok=False,
                   error=f"timed out after {timeout_s:.0f} s (raise --timeout)")
        return rec
    rec["wall_s"] = round(time.perf_counter() - t0, 1)
    result = last_json_line(p.stdout)
    if p.returncode != 0 or result is None:
        tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
        rec.update(ok=False, error=f"exit {p.returncode}"
                   + ("" if result is not None else ", no JSON line on stdout")
                   + (": " + " | ".join(tail) if tail else ""))
        return rec
    rec.update(ok=True, result=result)
    return rec


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.3e}"
    return str(x)


def headline(rec: dict) -> tuple[str, str, str]:
    """Returns (headline figures, baseline, ratio) Markdown cells for a benchmark record."""
    if not rec["ok"]:
        return f"FAILED: {rec['error'][:120]}", "", ""
    r, name = rec["result"], rec["name"]
    if name == "sampler":
        return (f"ours {_fmt(r['ours_tokens_per_s'])} tok/s (compile {_fmt(r['compile_s'])} s, "
                f"greedy match {_fmt(r['greedy_match'])})",
                f"HF generate {_fmt(r['hf_tokens_per_s'])} tok/s", _fmt(r["ratio"]))
    if name == "train_step":
        t, rl = r["train_step"], r.get("rl_step")
        cells = f"{_fmt(t['flops_per_s'])} FLOP/s, {_fmt(t['tokens_per_s'])} tok/s"
        if rl:
            cells += (f"; RL step {_fmt(rl['step_s'])} s = rollout {_fmt(rl['rollout_s'])} + "
                      f"adv {_fmt(rl['advantages_s'])} + score {_fmt(rl['scoring_s'])} + "
                      f"update {_fmt(rl['update_s'])}")
        return (cells, f"matmul peak {_fmt(r['matmul_peak']['flops_per_s'])} FLOP/s",
                f"{_fmt(t['utilization'])} (utilization)")
    if name == "dusa":
        ray = (f"; Ray actors {_fmt(r['ray_verified_tasks_per_s_2actors'])} tasks/s (2)"
               if "ray_verified_tasks_per_s_2actors" in r else "")
        return (f"{_fmt(r['verified_tasks_per_s_2proc'])} tasks/s (2 proc)" + ray,
                f"1 proc {_fmt(r['verified_tasks_per_s_1proc'])} tasks/s",
                _fmt(r["speedup_2_vs_1"]))
    if name == "envs":
        ray = (f"; Ray actors {_fmt(r['ray_calls_per_s_2_workers'])} calls/s (2 workers), overhead "
               f"{_fmt(r['ray_overhead_per_call_ms'])} ms/call" if "ray_calls_per_s_2_workers" in r else "")
        return (f"{_fmt(r['calls_per_s_2_workers'])} calls/s (2 workers), overhead "
                f"{_fmt(r['overhead_per_call_ms'])} ms/call" + ray,
                f"1 worker {_fmt(r['calls_per_s_1_worker'])} calls/s",
                _fmt(r["calls_per_s_2_workers"] / max(r["calls_per_s_1_worker"], 1e-9)))
    if name == "grpo_trl":
        o, t = r["ours"], r["trl"]
        cells = (f"ours {_fmt(o['step_no_scoring_s'])} s/step (rollout {_fmt(o['rollout_s'])} + "
                 f"update {_fmt(o['update_s'])}; + old-logprob scoring {_fmt(o['scoring_s'])})")
        if "step_s" not in t:
            return cells, f"TRL skipped: {t.get('skipped', '?')}", ""
        plain = r.get("ours_plain")
        if plain:
            cells += (f"; rl.share_prefix=False {_fmt(plain['step_no_scoring_s'])} s/step "
                      f"(update {_fmt(plain['update_s'])}, {_fmt(r['speedup_vs_trl_plain'])}x "
                      "TRL)")
        return cells, f"TRL GRPOTrainer {_fmt(t['step_s'])} s/step", _fmt(r["speedup_vs_trl"])
    if name == "logprob":
        rows = r["results"]
        big = max(rows, key=lambda x: (x["N"], x["mode"] == "fwd_bwd"))
        ours_t, naive_t = big["ours"].get("time_s"), big["naive"].get("time_s")
        return (f"N={big['N']} {big['mode']}: temp {big['ours']['temp_bytes'] / 2**20:.3g} MiB, "
                f"{_fmt(ours_t)} s", f"naive log-softmax: temp "
                f"{big['naive']['temp_bytes'] / 2**20:.3g} MiB, {_fmt(naive_t)} s",
                f"{_fmt(big['temp_ratio'])} (memory)")
    if name == "trace_scoring":
        res = r["results"]
        return ("; ".join(f"{k}: {_fmt(v['single_pass_states_per_s'])} states/s"
                          for k, v in res.items()),
                "per-state: " + "; ".join(f"{k}: {_fmt(v['per_state_states_per_s'])}"
                                          for k, v in res.items()),
                "; ".join(f"{_fmt(v['speedup'])}" for v in res.values()))
    if name == "eval_bfcl":
        return (f"{_fmt(r['pool_episodes_per_s'])} episodes/s through the MCP pool "
                f"({_fmt(r['pool_ms_per_call'])} ms/call)",
                f"in-process {_fmt(r['direct_episodes_per_s'])} episodes/s", _fmt(r["ratio"]))
    if name == "rollout":
        tps = r["tokens_per_s"]
        return (f"turn loop, KV kept: {_fmt(tps['kv'])} tok/s at horizon {r['horizon']} "
                f"({r['model']}), greedy equal {r['greedy_equal']}",
                f"re-prefill every turn: {_fmt(tps['reprefill'])} tok/s; continuous batching: "
                f"{_fmt(tps['continuous'])} tok/s ({_fmt(r.get('continuous_vs_kv'))}x the KV "
                f"loop)", _fmt(r["speedup_vs_sync"]))
    if name == "multihost":
        s, m = r["single_process"], r["two_processes"]
        return (f"2 processes (gloo): {_fmt(m['step_s'])} s/step, {_fmt(m['tokens_per_s'])} tok/s; "
                f"first loss |diff| {r['first_loss_abs_diff']:.1e}",
                f"1 process: {_fmt(s['step_s'])} s/step, {_fmt(s['tokens_per_s'])} tok/s",
                _fmt(r["ratio"]))
    # Unknown layout (new ones): show the top-level scalars.
    scalars = {k: v for k, v in r.items() if isinstance(v, (int, float)) and k != "quick"}
    return (", ".join(f"{k}={_fmt(v)}" for k, v in list(scalars.items())[:4]) or
            "see results.json", "", "")


def machine_info() -> dict:
    import jax
    return {"platform": platform.platform(), "processor": platform.processor(),
            "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "jax_version": jax.__version__, "loadavg": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def write_markdown(records: list[dict], machine: dict, path: str, quick: bool) -> None:
    lines = [f"# Benchmarks{' (--quick)' if quick else ''}", "",
             f"{machine['date']}, {machine['platform']}, {machine['cpu_count']} CPUs, "
             f"jax {machine['jax_version']}, load average {machine['loadavg']}", "",
             "| benchmark | headline | baseline | ratio | wall s |", "|---|---|---|---|---|"]
    for rec in records:
        cells = [c.replace("|", "\\|") for c in headline(rec)]
        flags = f" `{' '.join(rec['args'])}`" if rec.get("args") else ""
        lines.append(f"| {rec['name']}{flags} | {cells[0]} | {cells[1]} | {cells[2]} | "
                     f"{rec.get('wall_s', '')} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def run(args: argparse.Namespace) -> dict:
    """Runs the benchmarks, writes results.json / results.md; returns the summary record."""
    names = args.only or discover()
    extra = parse_extra(args.args, discover())
    records = []
    for name in names:
        flags = (quick_args(name) if args.quick else []) + extra.get(name, [])
        _log(f"running {name} {' '.join(flags)}")
        rec = run_one(name, args.quick, args.timeout, extra.get(name, []))
        _log(f"{name}: {'ok' if rec['ok'] else rec['error']} ({rec['wall_s']} s)")
        records.append(rec)
    machine = machine_info()
    out_dir = args.out_dir or HERE
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"machine": machine, "quick": bool(args.quick), "benchmarks": records}, f,
                  indent=2)
    write_markdown(records, machine, os.path.join(out_dir, "results.md"), args.quick)
    return {"benchmark": "all", "quick": bool(args.quick),
            "ok": [r["name"] for r in records if r["ok"]],
            "failed": {r["name"]: r["error"] for r in records if not r["ok"]},
            "wall_s": {r["name"]: r["wall_s"] for r in records},
            "loadavg": machine["loadavg"], "results": os.path.join(out_dir, "results.json")}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="pass each benchmark its small size")
    p.add_argument("--only", nargs="+", default=None, help="benchmark names (default: all)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    p.add_argument("--args", action="append", default=[], metavar="NAME=FLAGS",
                   help="extra flags for one benchmark, after --quick's (repeatable)")
    p.add_argument("--out-dir", default=None, help="where results.* go (default benchmarks/)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    out = run(parse_args(argv))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
