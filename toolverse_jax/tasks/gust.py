"""GUST datasets: generation at scale (worker processes), JSONL shards, a grain data source,
and train/validation/test splits by server or tool set."""

from __future__ import annotations

import collections
import glob
import hashlib
import importlib
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from typing import Any, Iterable, Sequence

from toolverse_jax.tasks import closure
from toolverse_jax.tasks.dusa import DusaConfig, dusa_generate, task_seed
from toolverse_jax.tasks.instructions import LEVELS, discovery_calls, names_tool
from toolverse_jax.tasks.task import Task

SHARD_PATTERN = "gust-{:05d}.jsonl"
QUICKSTART_FILE = os.path.join(os.path.dirname(__file__), "data", "gust_quickstart.jsonl")


# ------------------------------------------------------------------------------ configuration

BACKENDS = ("process", "ray")


def default_config() -> dict:
    """Returns the default generation settings (what `configs/gust.py` exposes)."""
    return {
        "num_tasks": 200,
        "seed": 0,
        "horizons": (2, 3, 5, 10),
        "min_horizon": None,        # None: exactly the drawn horizon
        "max_per_stage": 2,
        "num_servers": (1, 2),
        "servers": None,            # None: every available server of the catalog
        "kinds": ("builtin",),
        "num_processes": 1,         # 0: in this process
        "backend": "process",       # "process" (spawned here) | "ray" (actors in a Ray cluster)
        "ray_options": None,        # backend="ray": dict for the actors' .options(), e.g.
                                    # {"num_cpus": 1, "resources": {"gen_node": 1}}
        "chunk_size": 16,
        "max_concurrent": 16,
        "num_env_workers": 0,       # EnvPool workers inside each generator process
        "shard_size": 1000,
        "attempts_factor": 4.0,     # give up after num_tasks * factor task seeds
        "verify": True,
        "refine_warmup": 0,         # tasks run (unverified) per worker to refine the graph
        "executor_factory": None,   # "module:function" returning an Executor (tests, fakes)
        "worker_start_timeout_s": 300.0,
        # issue 24: instructions state goals; every gold call is on the verifier's closure
        "instruction_level": "goal",  # recipe | stage | goal (instructions.LEVELS)
        "whole_chain": True,        # False: the generator of the shipped quickstart sets
        "answer_with_checks": True,  # an asked value also checks the chain's effects
        "writer": "",               # instruction writer: "" (off) | openai | sampler | mod:fn
        "writer_model": "",         # openai: model name
        "writer_base_url": "",      # openai: http://host:port/v1
        "writer_api_key_env": "OPENAI_API_KEY",
        "writer_checkpoint": "",    # sampler: HF dir or training workdir
        "writer_tokenizer": "",     # sampler: "" = the checkpoint's own
    }


def _settings(cfg: Any) -> dict:
    d = default_config()
    src = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    unknown = set(src) - set(d) - {"out"}
    if unknown:
        raise KeyError(f"unknown GUST settings {sorted(unknown)}; known: {sorted(d)}")
    d.update({k: v for k, v in src.items() if k in d})
    if d["ray_options"] is not None:
        d["ray_options"] = dict(d["ray_options"])
    for k in ("horizons", "num_servers", "servers", "kinds"):
        if d[k] is not None:
            d[k] = tuple(d[k])
    return d


def _make_executor(s: dict):
    if s["executor_factory"]:
        mod, fn = s["executor_factory"].split(":")
        return getattr(importlib.import_module(mod), fn)()
    from toolverse_jax.tasks.executor import PoolExecutor  # noqa: PLC0415

    # Under generate_gust's process pool, sandboxes go below a directory the parent owns and
    # removes: Pool.terminate() kills the workers before they can clean up after themselves.
    root = os.path.join(s["pool_root"], f"gen{os.getpid()}") if s.get("pool_root") else None
    return PoolExecutor(kinds=s["kinds"], num_workers=s["num_env_workers"], root=root)


def _dusa_cfg(s: dict, horizon: int) -> DusaConfig:
    return DusaConfig(horizon=horizon, min_horizon=s["min_horizon"],
                      max_per_stage=s["max_per_stage"], servers=s["servers"],
                      num_servers=tuple(s["num_servers"]), whole_chain=bool(s["whole_chain"]),
                      instruction_level=s["instruction_level"],
                      answer_with_checks=bool(s["answer_with_checks"]),
                      rewriter=_WORKER.get("writer"))


def _make_writer(s: dict):
    from toolverse_jax.tasks.instructions import make_writer  # noqa: PLC0415

    return make_writer(s["writer"], model=s["writer_model"], base_url=s["writer_base_url"],
                       api_key_env=s["writer_api_key_env"],
                       checkpoint=s["writer_checkpoint"], tokenizer=s["writer_tokenizer"])


# ------------------------------------------------------------------------ worker processes

_WORKER: dict = {}


def _init_worker(s: dict) -> None:
    from toolverse_jax.tasks.dusa import observations_of  # noqa: PLC0415
    from toolverse_jax.tasks.graph import build_tool_graph, refine_with_observations  # noqa

    if s["instruction_level"] not in LEVELS:
        raise ValueError(f"instruction_level={s['instruction_level']!r}; use one of {LEVELS}")
    _WORKER["writer"] = _make_writer(s)
    ex = _make_executor(s)
    if hasattr(ex, "__enter__"):
        ex.__enter__()
    allowed = list(s["servers"]) if s["servers"] else ex.server_names()
    g = build_tool_graph(ex.tool_specs(allowed))
    refined = {}
    if s["refine_warmup"]:
        # the same warm-up seeds in every worker, so every worker refines to the same graph
        cfg = _dusa_cfg(s, min(s["horizons"]))
        cfg.servers = tuple(allowed)
        warm = dusa_generate(ex, [task_seed(s["seed"] + 7_777_777, i)
                                  for i in range(s["refine_warmup"])], cfg, graph=g,
                             verify=False)
        refined = refine_with_observations(g, observations_of(t for t, *_ in warm if t))
    _WORKER.update(settings=s, executor=ex, allowed=allowed, graph=g, refined=refined)


def _horizon_of(s: dict, index: int) -> int:
    hs = s["horizons"]
    return hs[index % len(hs)]


def _run_chunk(indices: Sequence[int]) -> list[tuple[int, dict | None, str, dict]]:
    """Generates the tasks of `indices` in this worker; returns (index, task JSON, reason, info)."""
    s, ex, g = _WORKER["settings"], _WORKER["executor"], _WORKER["graph"]
    env0 = (getattr(ex, "env_s", 0.0), getattr(ex, "env_ops", 0))
    t0 = time.perf_counter()
    by_h: dict[int, list[int]] = collections.defaultdict(list)
    for i in indices:
        by_h[_horizon_of(s, i)].append(i)
    out = []
    for h, idx in sorted(by_h.items()):
        cfg = _dusa_cfg(s, h)
        cfg.servers = tuple(_WORKER["allowed"])
        res = dusa_generate(ex, [task_seed(s["seed"], i) for i in idx], cfg, graph=g,
                            verify=s["verify"], max_concurrent=s["max_concurrent"])
        for i, (task, reason, info) in zip(idx, res):
            out.append((i, task.to_json() if task is not None else None, reason,
                        {k: v for k, v in info.items() if isinstance(v, int)}))
    out.sort(key=lambda r: r[0])
    if out:  # where the time went, charged to the chunk's first row
        out[0][3].update(
            worker_ms=int(1000 * (time.perf_counter() - t0)),
            env_ms=int(1000 * (getattr(ex, "env_s", 0.0) - env0[0])),
            env_ops=getattr(ex, "env_ops", 0) - env0[1])
    return out


def _ping(_: int) -> int:
    time.sleep(0.05)
    return os.getpid()


def _shutdown_worker() -> None:
    ex = _WORKER.get("executor")
    if ex is not None and hasattr(ex, "__exit__"):
        ex.__exit__(None, None, None)
    _WORKER.clear()


def _chunks(s: dict) -> Iterable[list[int]]:
    n = int(s["num_tasks"] * s["attempts_factor"]) + s["chunk_size"]
    for a in range(0, n, s["chunk_size"]):
        yield list(range(a, min(a + s["chunk_size"], n)))


def _generate_in_pool(ctx, nproc: int, s: dict, t0: float, consume) -> float:
    """Feeds index chunks to `nproc` spawned generator processes until `consume` says done;
    returns the startup time (until every worker had built its executor and graph)."""
    with ctx.Pool(nproc, initializer=_init_worker, initargs=(s,)) as pool:
        # wait until every worker has started (imports, env pool, graph) so that
        # tasks_per_s measures generation, and startup_s is reported apart
        pids: set = set()
        for _ in range(20):
            try:
                got = pool.map_async(_ping, range(nproc), chunksize=1).get(
                    s["worker_start_timeout_s"])
            except mp.TimeoutError:
                raise RuntimeError(
                    f"GUST generator workers did not start within "
                    f"{s['worker_start_timeout_s']} s (a worker that dies at import or "
                    "in its initializer is restarted forever by multiprocessing; run with "
                    "num_processes=0 to see the error, and run scripts from a file, not "
                    "stdin, since spawn re-imports __main__)") from None
            pids |= set(got)
            if len(pids) >= nproc:
                break
        startup = time.time() - t0
        feed_chunks(s, 2 * nproc, lambda ch: pool.apply_async(_run_chunk, (ch,)),
                    lambda handle: handle.get(), consume)
        pool.terminate()
        pool.join()
    return startup


def feed_chunks(s: dict, depth: int, submit, result, consume) -> None:
    """Keeps `depth` index chunks in flight (`submit(chunk) -> handle`) and hands their rows to
    `consume` in index order (`result(handle) -> rows`) until it says done or seeds run out:
    the kept set is the same whatever runs the chunks (processes, Ray actors)."""
    chunks = _chunks(s)
    inflight: collections.deque = collections.deque()
    for ch in chunks:
        inflight.append(submit(ch))
        if len(inflight) >= depth:
            break
    while inflight:
        if consume(result(inflight.popleft())):
            return
        nxt = next(chunks, None)
        if nxt is not None:
            inflight.append(submit(nxt))


def generate_gust(cfg: Any, out_dir: str | None = None, progress: bool = True,
                  ) -> tuple[list[Task], dict]:
    """Returns (tasks, manifest): DUSA tasks generated in worker processes, deduplicated.

    Task `i` uses seed `task_seed(cfg.seed, i)` and horizon `horizons[i % len(horizons)]`;
    results are consumed in index order and the first `num_tasks` distinct verified tasks
    are kept, so the set does not depend on `num_processes`. With `out_dir`, writes shards
    and `manifest.json` there.
    """
    s = _settings(cfg)
    t0 = time.time()
    kept: list[Task] = []
    hashes: set[str] = set()
    dropped: collections.Counter = collections.Counter()
    dropped_h: dict = collections.defaultdict(collections.Counter)
    info_tot: collections.Counter = collections.Counter()
    attempts = 0
    bar = None
    if progress:
        from tqdm import tqdm  # noqa: PLC0415

        bar = tqdm(total=s["num_tasks"], desc="GUST tasks", unit="task")

    def consume(rows) -> bool:
        nonlocal attempts
        for i, tj, reason, info in rows:
            if len(kept) >= s["num_tasks"]:
                return True
            attempts += 1
            info_tot.update(info)
            if tj is None:
                dropped[reason] += 1
                dropped_h[_horizon_of(s, i)][reason] += 1
                continue
            task = Task.from_json(tj)
            h = task.chain_hash()
            if h in hashes:
                dropped["duplicate"] += 1
                dropped_h[_horizon_of(s, i)]["duplicate"] += 1
                continue
            hashes.add(h)
            kept.append(task)
            if bar is not None:
                bar.update(1)
        return len(kept) >= s["num_tasks"]

    nproc = int(s["num_processes"])
    startup = 0.0
    if s["backend"] not in BACKENDS:
        raise ValueError(f"backend={s['backend']!r}; use one of {BACKENDS}")
    if s["backend"] == "ray":
        from toolverse_jax.tasks.ray_gen import generate_on_ray  # noqa: PLC0415 - optional extra

        startup = generate_on_ray(max(nproc, 1), s, t0, consume)
    elif nproc <= 0:
        _init_worker(s)
        startup = time.time() - t0
        info_tot.update({f"graph_{k}": v for k, v in _WORKER.get("refined", {}).items()})
        try:
            for ch in _chunks(s):
                if consume(_run_chunk(ch)):
                    break
        finally:
            _shutdown_worker()
    else:
        ctx = mp.get_context("spawn")
        pool_root = tempfile.mkdtemp(prefix="toolverse_gust_")
        try:
            startup = _generate_in_pool(ctx, nproc, {**s, "pool_root": pool_root}, t0, consume)
        finally:
            shutil.rmtree(pool_root, ignore_errors=True)
    if bar is not None:
        bar.close()
    elapsed = time.time() - t0
    manifest = make_manifest(kept, dropped, attempts, elapsed - startup, s, dropped_h, info_tot)
    manifest["startup_s"] = round(startup, 3)
    manifest["total_s"] = round(elapsed, 3)
    manifest["generation_info"] = dict(info_tot)
    if out_dir is not None:
        manifest["shards"] = write_shards(kept, out_dir, s["shard_size"])
        with open(os.path.join(out_dir, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
    return kept, manifest


def make_manifest(tasks: Sequence[Task], dropped: dict, attempts: int, elapsed: float,
                  settings: dict, dropped_by_horizon: dict | None = None,
                  info: dict | None = None) -> dict:
    """Returns manifest counts: tasks, attempts, drops by reason, histograms, and the
    instruction/verifier `quality` figures (`quality_report`)."""
    hist = collections.Counter(t.stats["horizon"] for t in tasks)
    depth = collections.Counter(t.stats["depth"] for t in tasks)
    servers = collections.Counter(s for t in tasks for s in t.servers)
    kinds = collections.Counter(t.verifier["kind"] for t in tasks)
    return {
        "num_tasks": len(tasks),
        "attempts": attempts,
        "dropped": dict(sorted(dropped.items())),
        "num_dropped": int(sum(dropped.values())),
        "horizon_histogram": {str(k): hist[k] for k in sorted(hist)},
        "depth_histogram": {str(k): depth[k] for k in sorted(depth)},
        "servers": dict(sorted(servers.items())),
        "verifier_kinds": dict(sorted(kinds.items())),
        "cross_server_tasks": sum(1 for t in tasks if t.stats["num_servers"] > 1),
        "elapsed_s": round(elapsed, 3),     # generation time, without worker startup
        "tasks_per_s": round(len(tasks) / elapsed, 3) if elapsed > 0 else None,
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.items()},
        "quality": quality_report(tasks, dropped_by_horizon or {}, info or {}),
    }


# Why drafted calls, argument values or rewrites were left out (generation_info keys): calls
# that could not be grounded, failed, repeated one, changed nothing, re-found the record
# their input came from, deleted what the task
# created, or were off the verifier's closure (trimmed); candidate values that were the user's
# own address, another argument's value, a reference without a unique descriptor, or copied
# from other records into a new one; writer rewrites that failed the check.
REJECTIONS = ("ungroundable", "undiscoverable_id", "failed_call", "duplicate_call", "noop_call",
              "redundant_lookup", "delete_created", "trimmed_calls", "self_reference",
              "role_collision", "ambiguous_reference", "copied_record", "mixed_record",
              "rewrite_rejected")


def quality_report(tasks: Sequence[Task], dropped_by_horizon: dict, info: dict) -> dict:
    """Returns instruction and verifier quality per nominal horizon (issue 24).

    For each horizon: the histogram of effective horizons (stages on the verifier's dependency
    closure, `closure.effective_horizon`) and its mean ratio to the nominal one; the fraction of
    gold calls, and of discovery calls (list/search/get, `instructions.discovery_calls`), whose
    tool the instruction names (`instructions.names_tool`); instruction length; tasks dropped
    by reason. `rejections` counts drafted calls and argument values left out, by reason
    (`REJECTIONS`).
    """
    by_h: dict = collections.defaultdict(list)
    for t in tasks:
        by_h[int(t.meta.get("nominal_horizon", t.stats["horizon"]))].append(t)
    out: dict = {}
    for h in sorted(set(by_h) | {int(k) for k in dropped_by_horizon}):
        ts = by_h.get(h, [])
        eff = [closure.effective_horizon(t) for t in ts]
        calls = [(s, names_tool(t.instruction, s.tool)) for t in ts for st in t.stages for s in st]
        disc = [names_tool(t.instruction, t.stages[i][j].tool) for t in ts
                for i, j in discovery_calls(t.stages, t.verifier)]
        hist = collections.Counter(eff)
        out[str(h)] = {
            "tasks": len(ts),
            "effective_horizon_histogram": {str(k): hist[k] for k in sorted(hist)},
            "effective_ratio_mean": round(sum(e / h for e in eff) / len(eff), 3) if eff else None,
            "effective_ratio_min": round(min(eff) / h, 3) if eff else None,
            "calls": len(calls),
            "named_calls_fraction": round(sum(n for _, n in calls) / len(calls), 3)
            if calls else None,
            "discovery_calls": len(disc),
            "named_discovery_fraction": round(sum(disc) / len(disc), 3) if disc else None,
            "instruction_chars_mean": round(sum(len(t.instruction) for t in ts) / len(ts), 1)
            if ts else None,
            "dropped": dict(sorted(dropped_by_horizon.get(h, {}).items())),
        }
    levels = collections.Counter(t.meta.get("instruction_level", "recipe") for t in tasks)
    return {"by_horizon": out, "instruction_levels": dict(sorted(levels.items())),
            "rejections": {k: int(info[k]) for k in REJECTIONS if info.get(k)}}


# ----------------------------------------------------------------------------- shards & grain


def write_shards(tasks: Sequence[Task], out_dir: str, shard_size: int = 1000) -> list[str]:
    """Writes tasks as JSONL shards `gust-00000.jsonl`...; returns the shard file names."""
    os.makedirs(out_dir, exist_ok=True)
    names = []
    for k in range(0, max(len(tasks), 1), shard_size):
        name = SHARD_PATTERN.format(k // shard_size)
        with open(os.path.join(out_dir, name), "w") as f:
            for t in tasks[k:k + shard_size]:
                f.write(json.dumps(t.to_json(), sort_keys=True) + "\n")
        names.append(name)
    return names


def shard_paths(path: str) -> list[str]:
    """Returns the JSONL files of a GUST directory (or the file itself)."""
    if os.path.isdir(path):
        return sorted(glob.glob(os.path.join(path, "*.jsonl")))
    return [path]


class GustFormatError(ValueError):
    """A GUST shard line that is not a task record; the message names the file and line."""


def parse_task_line(line: str | bytes, path: str, lineno: int) -> dict:
    """Returns the task JSON dict of one shard line; raises `GustFormatError` naming
    `path:lineno` when the line is not a JSON object."""
    try:
        d = json.loads(line)
    except json.JSONDecodeError as e:
        raise GustFormatError(
            f"{path}:{lineno}: malformed GUST line (not JSON: {e.msg} at column {e.colno}); "
            "fix or delete the line, or regenerate the shard") from e
    if not isinstance(d, dict):
        raise GustFormatError(f"{path}:{lineno}: malformed GUST line (a JSON "
                              f"{type(d).__name__}, not a task object)")
    return d


def task_from_line(line: str | bytes, path: str, lineno: int) -> Task:
    """Returns the `Task` of one shard line; raises `GustFormatError` naming `path:lineno` when
    the line is not JSON or lacks a task field."""
    d = parse_task_line(line, path, lineno)
    try:
        return Task.from_json(d)
    except (KeyError, TypeError, ValueError) as e:
        raise GustFormatError(f"{path}:{lineno}: malformed GUST task "
                              f"({type(e).__name__}: {e}); fields present: {sorted(d)}") from e


def read_tasks(path: str) -> list[Task]:
    """Returns every task of a GUST directory or JSONL file; a malformed line raises
    `GustFormatError` naming its file and line number."""
    out = []
    for p in shard_paths(path):
        with open(p) as f:
            out.extend(task_from_line(line, p, n) for n, line in enumerate(f, 1) if line.strip())
    return out


class GustSource:
    """grain random-access source over GUST JSONL shards; items are task JSON dicts.

    Implements grain's `RandomAccessDataSource` protocol (`__len__`, `__getitem__`); grain
    itself (which imports jax) is imported only by `make_dataset`.
    """

    def __init__(self, path: str | Sequence[str]):
        paths = shard_paths(path) if isinstance(path, str) else list(path)
        self._paths = paths
        self._index: list[tuple[int, int, int, int]] = []   # (file, offset, length, line no.)
        for fi, p in enumerate(paths):
            off = 0
            with open(p, "rb") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        self._index.append((fi, off, len(line), n))
                    off += len(line)

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> dict:
        fi, off, n, lineno = self._index[i]
        with open(self._paths[fi], "rb") as f:
            f.seek(off)
            return parse_task_line(f.read(n), self._paths[fi], lineno)

    def __repr__(self) -> str:
        return f"GustSource({len(self._paths)} shards, {len(self)} tasks)"


def make_dataset(path: str | Sequence[str], seed: int | None = 0,
                 horizons: tuple[int, int] | None = None, batch_size: int | None = None,
                 as_tasks: bool = False, drop_remainder: bool = False):
    """Returns a grain dataset over GUST shards: shuffled (seed; None = file order), filtered by
    horizon range [lo, hi], optionally parsed to `Task`, optionally batched (lists)."""
    import grain  # noqa: PLC0415 - heavy (imports jax); generation workers never need it

    ds = grain.MapDataset.source(GustSource(path))
    if seed is not None:
        ds = ds.shuffle(seed=seed)
    if horizons is not None:
        lo, hi = horizons
        ds = ds.filter(lambda d: lo <= len(d["stages"]) <= hi)
    if as_tasks:
        ds = ds.map(Task.from_json)
    if batch_size is None:
        return ds
    return ds.to_iter_dataset().batch(batch_size, drop_remainder=drop_remainder, batch_fn=list)


# ------------------------------------------------------------------------------------ splits


def _bucket(key: str, seed: int) -> float:
    h = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(h[:8], "little") / 2**64


def split_tasks(tasks: Sequence[Task], by: str = "server",
                fractions: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 0,
                held_out: dict[str, Sequence[str]] | None = None) -> dict[str, list[Task]]:
    """Returns {"train", "validation", "test"} splits that test generalization.

    by="server": each server is assigned to one split (by `fractions`, or `held_out`
      {"validation": [...], "test": [...]}); a task goes to the most held-out split among its
      servers, so train never contains a tool of a validation/test server.
    by="toolset": tasks are grouped by their exact set of tools; whole groups go to one split,
      so a test task's tool combination never appears in train.
    """
    rank = {"train": 0, "validation": 1, "test": 2}
    names = ("train", "validation", "test")
    out: dict[str, list[Task]] = {n: [] for n in names}
    if by == "server":
        servers = sorted({s for t in tasks for s in t.servers})
        assign: dict[str, str] = {}
        if held_out:
            for split, ss in held_out.items():
                for s in ss:
                    assign[s] = split
        else:
            order = sorted(servers, key=lambda s: _bucket(s, seed))
            n = len(order)
            n_test = max(1, round(fractions[2] * n)) if fractions[2] > 0 and n > 2 else 0
            n_val = max(1, round(fractions[1] * n)) if fractions[1] > 0 and n > 2 else 0
            for i, s in enumerate(order):
                assign[s] = "test" if i < n_test else ("validation" if i < n_test + n_val
                                                       else "train")
        for t in tasks:
            split = max((assign.get(s, "train") for s in t.servers), key=rank.get)
            out[split].append(t)
        return out
    if by == "toolset":
        for t in tasks:
            b = _bucket("|".join(t.tools), seed)
            split = "train" if b < fractions[0] else (
                "validation" if b < fractions[0] + fractions[1] else "test")
            out[split].append(t)
        return out
    raise ValueError(f"split_tasks(by={by!r}): expected 'server' or 'toolset'")


# -------------------------------------------------------------------------------- quickstart


# The shipped quickstart sets (and their tests) were generated at the recipe level by the
# generator before issue 24: these settings keep reproducing them byte for byte.
QUICKSTART_SETTINGS = {"num_tasks": 64, "horizons": (1, 2, 3), "seed": 0, "max_per_stage": 1,
                       "num_servers": (1, 2), "servers": None, "instruction_level": "recipe",
                       "whole_chain": False}


def load_or_generate_quickstart_tasks(out_dir: str | None = None, num_tasks: int = 64,
                                      horizons: Sequence[int] = (1, 2, 3), seed: int = 0,
                                      servers: Sequence[str] | None = None,
                                      executor_factory: str | None = None,
                                      instruction_level: str = "recipe",
                                      whole_chain: bool | None = None,
                                      ) -> list[Task]:
    """Returns short GUST tasks over the built-in catalog for the RL quickstart.

    Uses, in order: `out_dir/gust_quickstart.jsonl` if it was made with the same settings; the
    file shipped in the package if the settings are the defaults; else generates in-process
    (seconds) and writes it to `out_dir`.

    instruction_level: "recipe" (default) keeps the shipped sets; "stage" or "goal" generate
    whole-chain tasks (issue 24) at that level. whole_chain (None: level != "recipe") with
    "recipe" gives the same chains as "goal" with recipe instructions (a curriculum start).
    """
    if instruction_level not in LEVELS:
        raise ValueError(f"instruction_level={instruction_level!r}; use one of {LEVELS}")
    whole_chain = instruction_level != "recipe" if whole_chain is None else bool(whole_chain)
    want = {"num_tasks": num_tasks, "horizons": list(horizons), "seed": seed,
            "servers": list(servers) if servers else None}
    if whole_chain or instruction_level != "recipe":
        want.update(instruction_level=instruction_level, whole_chain=whole_chain)
    if out_dir is not None:
        path = os.path.join(out_dir, "gust_quickstart.jsonl")
        meta = os.path.join(out_dir, "gust_quickstart.meta.json")
        if os.path.exists(path) and os.path.exists(meta):
            with open(meta) as f:
                if json.load(f) == want:
                    return read_tasks(path)
    shipped = shipped_quickstart_file(want) if executor_factory is None else None
    if shipped is not None:
        tasks = read_task_file(shipped)
        if out_dir is not None:
            _write_quickstart(tasks, want, out_dir)
        return tasks
    cfg = {**QUICKSTART_SETTINGS, "num_tasks": num_tasks, "horizons": tuple(horizons),
           "seed": seed, "servers": tuple(servers) if servers else None,
           "num_processes": 0, "executor_factory": executor_factory, "attempts_factor": 6.0,
           "instruction_level": instruction_level, "whole_chain": whole_chain}
    tasks, _ = generate_gust(cfg, out_dir=None, progress=False)
    if out_dir is not None:
        _write_quickstart(tasks, want, out_dir)
    return tasks


def shipped_quickstart_file(want: dict) -> str | None:
    """Returns the task file shipped in the package that was generated with settings `want`
    ({"num_tasks", "horizons", "seed", "servers"}), or None. Shipped sets: the 64 default tasks
    (`QUICKSTART_FILE`) and the set `configs/quickstart.py` trains on (generating it takes
    minutes on 2 cores)."""
    data = os.path.dirname(QUICKSTART_FILE)
    for meta in sorted(glob.glob(os.path.join(data, "gust_quickstart*.meta.json"))):
        with open(meta) as f:
            if json.load(f) != want:
                continue
        base = meta[:-len(".meta.json")]
        for ext in (".jsonl", ".jsonl.gz"):
            if os.path.exists(base + ext):
                return base + ext
    return None


def read_task_file(path: str) -> list[Task]:
    """Returns the tasks of one JSONL file, gzip-compressed (`.gz`) or not."""
    if not path.endswith(".gz"):
        return read_tasks(path)
    import gzip
    with gzip.open(path, "rt") as f:
        return [task_from_line(line, path, n) for n, line in enumerate(f, 1) if line.strip()]


def _write_quickstart(tasks: Sequence[Task], meta: dict, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gust_quickstart.jsonl"), "w") as f:
        for t in tasks:
            f.write(json.dumps(t.to_json(), sort_keys=True) + "\n")
    with open(os.path.join(out_dir, "gust_quickstart.meta.json"), "w") as f:
        json.dump(meta, f, sort_keys=True)
