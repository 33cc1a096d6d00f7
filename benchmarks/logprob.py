"""Fused token log-prob vs naive full logits: peak temp memory and wall time, one JSON line.

    python -m benchmarks.logprob            # V=151936, D=1024, N in {1024, 4096, 8192}
    python -m benchmarks.logprob --quick    # small sizes, seconds
Memory comes from XLA's compiled memory analysis (no allocation needed); a variant whose
argument + output + temp bytes exceed --max-gib is compiled and reported but not run.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from kernels import token_logprobs, token_logprobs_reference
from kernels.dispatch import DEFAULT_CHUNK, resolve_backend


def _fwd(fn):
    return lambda h, w, t: fn(h, w, t)


def _fwd_bwd(fn):
    def loss(h, w, t):
        lp, ent = fn(h, w, t)
        return jnp.sum(lp) + 0.01 * jnp.sum(ent)
    return jax.grad(loss, (0, 1))


def _measure(f, args, repeats: int, max_bytes: float) -> dict:
    compiled = jax.jit(f).lower(*args).compile()
    ma = compiled.memory_analysis()
    out = {"temp_bytes": int(ma.temp_size_in_bytes), "arg_bytes": int(ma.argument_size_in_bytes),
           "out_bytes": int(ma.output_size_in_bytes)}
    total = out["temp_bytes"] + out["arg_bytes"] + out["out_bytes"]
    if total > max_bytes:
        out["time_s"] = None
        out["skipped"] = f"needs {total / 2**30:.1f} GiB > --max-gib"
        return out
    jax.block_until_ready(compiled(*args))  # warmup
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    out["time_s"] = float(np.median(times))
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 8192])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--chunk", type=int, default=None, help="vocab chunk (default per backend)")
    p.add_argument("--backend", default="auto")
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd_bwd"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-gib", type=float, default=18.0, help="skip running beyond this")
    p.add_argument("--quick", action="store_true", help="V=32000, D=256, N in {256, 1024}")
    a = p.parse_args(argv)
    if a.quick:
        a.vocab, a.dim, a.tokens = 32000, 256, [256, 1024]
    backend = resolve_backend(a.backend)
    chunk = a.chunk or DEFAULT_CHUNK.get(backend)
    dtype = jnp.dtype(a.dtype)
    ours = functools.partial(token_logprobs, chunk=chunk, backend=backend)
    naive = token_logprobs_reference
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    w = (jax.random.normal(k[1], (a.dim, a.vocab)) / np.sqrt(a.dim)).astype(dtype)
    results = []
    for n in a.tokens:
        h = jax.random.normal(k[0], (n, a.dim)).astype(dtype)
        t = jax.random.randint(k[2], (n,), 0, a.vocab)
        for mode in a.modes:
            wrap = _fwd if mode == "fwd" else _fwd_bwd
            row = {"N": n, "mode": mode}
            for name, fn in (("naive", naive), ("ours", ours)):
                row[name] = _measure(wrap(fn), (h, w, t), a.repeats, a.max_gib * 2**30)
            row["temp_ratio"] = row["ours"]["temp_bytes"] / max(row["naive"]["temp_bytes"], 1)
            if row["naive"]["time_s"] and row["ours"]["time_s"]:
                row["time_ratio"] = row["ours"]["time_s"] / row["naive"]["time_s"]
            results.append(row)
    report = {"benchmark": "logprob", "platform": jax.default_backend(), "backend": backend,
              "chunk": chunk, "vocab": a.vocab, "dim": a.dim, "dtype": a.dtype,
              "results": results}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
