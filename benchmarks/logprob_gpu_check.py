"""Pallas log-prob kernel on GPU: correctness vs the reference and timing vs naive, one JSON line.

    python -m benchmarks.logprob_gpu_check [--vocab 151936 --dim 1024 --tokens 4096]
With a GPU: runs backend="pallas" (Triton) forward and forward+backward against the full-logits
reference (fp32 and bf16) and times both. Without one: only checks that the fwd/bwd kernels
lower to Triton for CUDA from this host (jit(...).trace(...).lower(lowering_platforms=("cuda",))).
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


def logprob_loss(fn, t):
    """Returns loss(h, w) = sum(lp) + 0.1 * sum(entropy) of log-prob backend `fn` on targets t."""
    def loss(h, w):
        lp, ent = fn(h, w, t)
        return jnp.sum(lp) + 0.1 * jnp.sum(ent)
    return loss


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def median_time(f, *args, repeats=5):
    """Returns the median seconds of `f(*args)` over `repeats` calls after one warm-up call."""
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def lowering_check(n: int, d: int, v: int) -> dict:
    """Returns whether fwd and fwd+bwd lower for CUDA (Triton) on this host, with any error."""
    shapes = (jax.ShapeDtypeStruct((n, d), jnp.bfloat16), jax.ShapeDtypeStruct((d, v), jnp.bfloat16),
              jax.ShapeDtypeStruct((n,), jnp.int32))
    fn = functools.partial(token_logprobs, backend="pallas")
    out = {}
    for name, f in (("fwd", fn),
                    ("fwd_bwd", lambda h, w, t: jax.grad(logprob_loss(fn, t), (0, 1))(h, w))):
        try:
            text = jax.jit(f).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
            out[name] = {"lowered": True, "triton_calls": text.count("triton")}
        except Exception as e:  # report, do not hide, what JAX refused
            out[name] = {"lowered": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out


def gpu_check(n: int, d: int, v: int) -> dict:
    """Returns errors vs the reference and naive/pallas times on the local GPU."""
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    res = {}
    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 1e-2)):
        h = jax.random.normal(k[0], (n, d)).astype(dtype)
        w = (jax.random.normal(k[1], (d, v)) / np.sqrt(d)).astype(dtype)
        t = jax.random.randint(k[2], (n,), 0, v)
        ours = jax.jit(functools.partial(token_logprobs, backend="pallas"))
        ref = jax.jit(token_logprobs_reference)
        g_ours = jax.jit(jax.grad(logprob_loss(functools.partial(token_logprobs, backend="pallas"),
                                               t), (0, 1)))
        g_ref = jax.jit(jax.grad(logprob_loss(token_logprobs_reference, t), (0, 1)))
        o, r = ours(h, w, t), ref(h, w, t)
        go, gr = g_ours(h, w), g_ref(h, w)
        errs = [_rel(o[0], r[0]), _rel(o[1], r[1]), _rel(go[0], gr[0]), _rel(go[1], gr[1])]
        res[jnp.dtype(dtype).name] = {
            "rel_err_lp_ent_dh_dw": errs, "ok": max(errs) <= tol,
            "time_fwd_s": {"naive": median_time(ref, h, w, t),
                           "pallas": median_time(ours, h, w, t)},
            "time_fwd_bwd_s": {"naive": median_time(g_ref, h, w),
                               "pallas": median_time(g_ours, h, w)}}
    return res


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=4096)
    a = p.parse_args(argv)
    report = {"benchmark": "logprob_gpu_check", "platform": jax.default_backend(),
              "lowering_cuda": lowering_check(a.tokens, a.dim, a.vocab)}
    if jax.default_backend() == "gpu":
        report["gpu"] = gpu_check(a.tokens, a.dim, a.vocab)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
