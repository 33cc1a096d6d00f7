"""Checkpoint saves per training step: RunCheckpointer's async save against a blocking save.

    python -m benchmarks.checkpoint_save           # 4 layers, d=256, vocab 8192, save every step
    python -m benchmarks.checkpoint_save --quick   # 2 layers, d=128, vocab 1024

Both modes run the same loop as rl/driver.py: a jitted PPO-clip train step that donates its state,
then `RunCheckpointer.save(step, state, reference, meta)` every step. "blocking" (the baseline:
what RunCheckpointer did before, a save then `wait_until_finished()`) writes each step before the
next one starts; "async" (ours) returns once the arrays are on the host and writes while the next
step runs, waiting at the next save and at close. Per mode: medians over steps of the seconds
spent inside save and of the whole step (train + save), and the wall time of all steps including
the final close. Modes alternate over rounds, so both see the same machine load. The async run's
last step is read back and compared with the state it saved (`restored_equal`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

MODES = ("blocking", "async")


def _log(msg: str) -> None:
    print(f"[checkpoint_save] {msg}", file=sys.stderr, flush=True)


def _dir_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs) / 2**20


def run_mode(mode: str, setup: dict, steps: int, workdir: str) -> dict:
    """Returns {save_s, step_s (lists), close_s, wall_s, ckpt_mb, restored_equal} of `steps`
    train steps, each followed by a save, in `mode` ("blocking" or "async")."""
    import jax

    from toolverse_jax.rl.checkpoint import RunCheckpointer
    from toolverse_jax.rl.trainer import init_train_state

    state = init_train_state(jax.tree.map(lambda x: x.copy(), setup["params"]), setup["opt"])
    ref, step_fn, batch = setup["ref"], setup["step_fn"], setup["batch"]
    ckpt = RunCheckpointer(workdir, keep=2)
    save_s, step_s, last = [], [], None
    t_all = time.perf_counter()
    for i in range(1, steps + 1):
        t0 = time.perf_counter()
        state, m = step_fn(state, batch)
        jax.block_until_ready(m)
        t1 = time.perf_counter()
        ckpt.save(i, state, ref, {"global_step": i, "has_ref": True})
        if mode == "blocking":
            ckpt.wait_until_finished()
        t2 = time.perf_counter()
        save_s.append(t2 - t1)
        step_s.append(t2 - t0)
        if i == steps and mode == "async":
            last = jax.tree.map(np.array, state.params)  # before the next step could donate it
    t0 = time.perf_counter()
    ckpt.close()
    close_s = time.perf_counter() - t0
    wall_s = time.perf_counter() - t_all
    out = {"save_s": save_s, "step_s": step_s, "close_s": close_s, "wall_s": wall_s,
           "ckpt_mb": _dir_mb(os.path.join(ckpt.directory, str(steps)))}
    if last is not None:
        reader = RunCheckpointer(workdir)
        got = reader.restore_params(steps)
        reader.close()
        out["restored_equal"] = all(np.array_equal(a, np.asarray(b)) for a, b in
                                    zip(jax.tree.leaves(last), jax.tree.leaves(got)))
    return out


def run(a: argparse.Namespace) -> dict:
    """Returns the benchmark's JSON record for parsed `args` (see `parse_args`)."""
    import jax

    from benchmarks.train_step import random_rows
    from toolverse_jax.models import ModelConfig, init_params
    from toolverse_jax.rl.batching import pack_rows
    from toolverse_jax.rl.trainer import (LossConfig, init_train_state, make_optimizer,
                                          make_train_step, score_jit)
    cfg = ModelConfig(vocab_size=a.vocab, d_model=a.d_model, num_layers=a.layers,
                      num_heads=a.heads, num_kv_heads=a.kv_heads, head_dim=a.head_dim,
                      mlp_dim=a.mlp_dim, tie_embeddings=True, max_seq_len=max(512, a.length))
    opt = make_optimizer(1e-4, 1, 1000)
    params = init_params(cfg, jax.random.key(0))
    step_fn = make_train_step(cfg, LossConfig(name="ppo_clip"), opt, num_micro=1)
    batch = pack_rows(random_rows(np.random.default_rng(0), a.batch, a.length, a.vocab), 0, 1)
    old_lp, _ = score_jit(params, batch, cfg=cfg)
    batch = batch._replace(old_logprobs=old_lp, ref_logprobs=old_lp)
    setup = {"params": params, "ref": jax.tree.map(lambda x: x.copy(), params), "opt": opt,
             "step_fn": step_fn, "batch": batch}
    state = init_train_state(jax.tree.map(lambda x: x.copy(), params), opt)
    jax.block_until_ready(step_fn(state, batch))  # compile outside the timed runs
    per = {m: {"save_s": [], "step_s": [], "close_s": [], "wall_s": []} for m in MODES}
    extra: dict = {}
    root = tempfile.mkdtemp(prefix="bench_ckpt_")
    try:
        for r in range(a.rounds):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                wd = os.path.join(root, f"{mode}{r}")
                res = run_mode(mode, setup, a.steps, wd)
                shutil.rmtree(wd, ignore_errors=True)
                for k in per[mode]:
                    per[mode][k] += res[k] if isinstance(res[k], list) else [res[k]]
                extra["ckpt_mb_per_step"] = round(res["ckpt_mb"], 2)
                if "restored_equal" in res:
                    extra["restored_equal"] = extra.get("restored_equal", True) and \
                        res["restored_equal"]
                _log(f"round {r} {mode}: save median {np.median(res['save_s']):.3f} s, step "
                     f"median {np.median(res['step_s']):.3f} s, wall {res['wall_s']:.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = {m: {"save_s_median": round(float(np.median(v["save_s"])), 4),
                   "step_s_median": round(float(np.median(v["step_s"])), 4),
                   "close_s_median": round(float(np.median(v["close_s"])), 4),
                   "wall_s_median": round(float(np.median(v["wall_s"])), 4)}
               for m, v in per.items()}
    b, s = summary["blocking"], summary["async"]
    return {
        "benchmark": "checkpoint_save",
        "config": {"layers": a.layers, "d_model": a.d_model, "vocab": a.vocab,
                   "batch": a.batch, "length": a.length, "steps": a.steps, "rounds": a.rounds,
                   "num_params": int(sum(x.size for x in jax.tree.leaves(params))),
                   "saved": "train state (params + AdamW moments) + reference + meta"},
        **extra, "blocking": b, "async": s,
        "save_speedup_vs_blocking": round(b["save_s_median"] / max(s["save_s_median"], 1e-9), 2),
        "step_speedup_vs_blocking": round(b["step_s_median"] / max(s["step_s_median"], 1e-9), 3),
        "wall_speedup_vs_blocking": round(b["wall_s_median"] / max(s["wall_s_median"], 1e-9), 3),
        "jax_version": jax.__version__, "cpu_count": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()], "quick": bool(a.quick),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--mlp-dim", type=int, default=768)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=128, help="a length bucket (power of two >= 64)")
    p.add_argument("--steps", type=int, default=6, help="train steps (and saves) per run")
    p.add_argument("--rounds", type=int, default=2, help="runs per mode, alternating the order")
    p.add_argument("--quick", action="store_true",
                   help="2 layers, d=128, vocab 1024, B=2 x 64, 4 steps, 2 rounds")
    a = p.parse_args(argv)
    if a.quick:
        a.layers, a.d_model, a.heads, a.kv_heads, a.head_dim, a.mlp_dim = 2, 128, 4, 2, 32, 256
        a.vocab, a.batch, a.length, a.steps, a.rounds = 1024, 2, 64, 4, 2
    return a


def main(argv=None) -> dict:
    out = run(parse_args(argv))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
