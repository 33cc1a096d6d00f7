"""One registry of evaluations: `experiments.evaluate` looks the benchmark up here by name.

Each evaluation is `fn(config, workdir, progress) -> results dict`, writing results.json
(`{"benchmark", "categories": {NAME: {"accuracy", "n", ...}}, ...}`), results.md and
episodes.jsonl under workdir. Search-QA and memory-QA register here when their harnesses land.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from ml_collections import ConfigDict

from toolverse_jax.eval import report
from toolverse_jax.registry import Registry

log = logging.getLogger(__name__)

EVALUATIONS: Registry[Callable[[ConfigDict, str, bool], dict]] = Registry(
    "benchmark", plural="evaluations", hint="(config.benchmark)")
# Published BFCL-v3 multi-turn overall accuracy (%), for scale next to ours (ToolVerse paper).
BFCL_PUBLISHED = {"Qwen3-8B (ToolVerse paper, base)": 28.88, "Qwen3-8B + ToolVerse RL (paper)": 37.50}


def register(name: str):
    """Returns a decorator registering an evaluation function under `name`."""
    return EVALUATIONS.register(name)


def get(name: str) -> Callable[[ConfigDict, str, bool], dict]:
    """Returns the evaluation registered as `name` or raises listing the known ones."""
    return EVALUATIONS.get(name)


def _sampler(config: ConfigDict, tokenizer=None):
    """Returns (cfg, params, tokenizer, description) of the configured checkpoint."""
    from toolverse_jax.eval.policies import describe, load_model, resolve_tokenizer

    m = config.model
    tokenizer = tokenizer or resolve_tokenizer(m.tokenizer, config.checkpoint)
    cfg, params, what = load_model(config.checkpoint, m.preset, m.dtype, config.seed)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is "
                         f"{cfg.vocab_size}: set config.model.tokenizer to the checkpoint's tokenizer")
    return cfg, params, tokenizer, f"{what} ({describe(params)['num_params']:,} params)"


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, dynamic_ncols=True, disable=not enabled)


# ----------------------------------------------------------------------------- BFCL

@register("bfcl")
def run_bfcl(config: ConfigDict, workdir: str, progress: bool = True) -> dict:
    """Runs BFCL-v3 multi-turn (eval/bfcl.py) and writes the reports; returns results."""
    from toolverse_jax.envs import Catalog, EnvPool
    from toolverse_jax.envs import bfcl as bfcl_env
    from toolverse_jax.eval import bfcl
    from toolverse_jax.eval.policies import SamplerAgent, sampling_params

    bfcl_env.require()
    b = config.bfcl
    entries = bfcl.load_entries(tuple(b.categories), limit=int(b.limit), ids=tuple(b.ids))
    k = int(b.k)
    if k < 1:
        raise ValueError(f"config.bfcl.k={k}: average@k needs k >= 1 samples")
    if config.policy == "oracle":
        policy, what = bfcl.OraclePolicy(), "oracle (ground-truth replay)"
        if k != 1:
            raise ValueError("config.policy=oracle is deterministic: use config.bfcl.k=1")
    elif config.policy == "sampler":
        cfg, params, tok, what = _sampler(config)
        s = config.sampling
        if k > 1 and s.temperature == 0.0:
            raise ValueError("average@k with k > 1 needs config.sampling.temperature > 0 (greedy "
                             "samples are identical)")
        policy = SamplerAgent(params, cfg, tok, sampling_params(tok, s.max_new_tokens, s.temperature,
                                                                 s.top_p, s.top_k),
                              tool_format=b.tool_format, max_context=s.max_context, seed=config.seed)
    else:
        raise ValueError(f"config.policy={config.policy!r}; use 'sampler' or 'oracle'")
    t0 = time.time()
    dialogs = []
    bar = _progress(len(entries) * k, "bfcl", progress)
    catalog = Catalog.default(kinds=("bfcl",))
    with EnvPool(catalog, num_workers=config.env.num_workers,
                 call_timeout_s=config.env.call_timeout_s) as pool:
        step = max(1, int(config.batch_size) // k)
        for i in range(0, len(entries), step):
            chunk = bfcl.run_dialogs(policy, entries[i:i + step], pool, samples=k,
                                     max_steps=int(b.max_steps), verify_state=bool(b.verify_state))
            dialogs += chunk
            bar.update(len(chunk))
            done = [d for d in dialogs if not d.infra_failed]
            bar.set_postfix(acc=round(sum(d.verdict["valid"] for d in done) / max(len(done), 1), 3))
    bar.close()
    rows = [{"category": d.entry.category, "id": d.entry.id, "sample": d.sample,
             "valid": bool(d.verdict.get("valid")), "infra_failed": d.infra_failed,
             "end_reason": d.end_reason, "verdict": d.verdict, "statuses": d.statuses,
             "decoded": d.steps, "messages": d.messages} for d in dialogs]
    cats = report.accuracy_table(rows)
    results = {"benchmark": "bfcl_v3_multi_turn", "bfcl_eval": bfcl_env.BFCL_VERSION,
               "policy": config.policy, "model": what, "k": k, "metric": f"average@{k}",
               "categories": cats, "wall_s": round(time.time() - t0, 1),
               "published_overall": BFCL_PUBLISHED}
    if b.verify_state:
        checked = [r for r in rows if "env_state_matches" in r["verdict"]]
        results["env_state_matches"] = sum(r["verdict"]["env_state_matches"] for r in checked)
        results["env_state_checked"] = len(checked)
    gold = {e.id: list(e.ground_truth) for e in entries}
    failed = [dict(r, expected=gold[r["id"]]) for r in rows if not r["valid"] and not r["infra_failed"]]
    md = [f"## BFCL-v3 multi-turn: {what}\n",
          f"policy `{config.policy}`, {results['metric']}, bfcl-eval {bfcl_env.BFCL_VERSION}, "
          f"{len(rows)} episodes in {results['wall_s']} s\n",
          report.markdown_table(cats, "Accuracy by category"),
          "Published overall multi-turn accuracy, for scale: " +
          ", ".join(f"{n} {v:.2f}%" for n, v in BFCL_PUBLISHED.items()) + "\n",
          report.failures_markdown(failed, int(config.report.num_failures))]
    report.write_results(workdir, results, "\n".join(md), rows)
    return results


# ----------------------------------------------------------------------------- GUST held-out

@register("gust")
def run_gust(config: ConfigDict, workdir: str, progress: bool = True) -> dict:
    """Runs the policy greedily on GUST tasks held out by tool set; success rate per horizon."""
    import jax

    from toolverse_jax.envs import Catalog, EnvPool
    from toolverse_jax.rl.rollout import RolloutConfig, SamplerPolicy, run_rollouts
    from toolverse_jax.eval.policies import sampling_params
    from toolverse_jax.tasks import load_or_generate_quickstart_tasks, read_tasks, split_tasks

    g = config.gust
    if config.policy != "sampler":
        raise ValueError(f"config.policy={config.policy!r}: the GUST evaluation runs the sampler "
                         f"(its gold chains are checked at generation time by tasks.replay)")
    if g.path:
        tasks = read_tasks(g.path)
    else:
        tasks = load_or_generate_quickstart_tasks(
            os.path.join(workdir, "tasks"), num_tasks=int(g.num_tasks), horizons=tuple(g.horizons),
            seed=int(g.gen_seed), servers=tuple(g.servers) or None)
    split = split_tasks(tasks, by=g.split_by, fractions=tuple(g.fractions), seed=int(g.gen_seed))
    held = split["test"][: int(g.limit) or None]
    if not held:
        raise ValueError(f"the {g.split_by!r} split left no test tasks out of {len(tasks)}; raise "
                         f"config.gust.fractions[2] or use more tasks")
    cfg, params, tok, what = _sampler(config)
    s = config.sampling
    rcfg = RolloutConfig(max_turns=int(g.max_turns), max_context=int(s.max_context),
                         tool_format=g.tool_format, prompt_tools=g.prompt_tools,
                         max_observation_chars=int(g.max_observation_chars))
    policy = SamplerPolicy(params, cfg, sampling_params(tok, s.max_new_tokens, 0.0))
    kinds = tuple(sorted({Catalog.default(include_hidden=True).entry(sv).kind
                          for t in held for sv in t.servers}))
    t0 = time.time()
    trajs = []
    bar = _progress(len(held), "gust", progress)
    with EnvPool(Catalog.default(kinds=kinds, include_hidden=True), num_workers=config.env.num_workers,
                 call_timeout_s=config.env.call_timeout_s) as pool:
        for i in range(0, len(held), int(config.batch_size)):
            chunk = held[i:i + int(config.batch_size)]
            trajs += run_rollouts(policy, chunk, 1, pool, tok, rcfg, jax.random.key(config.seed + i),
                                  seed=config.seed)
            bar.update(len(chunk))
    bar.close()
    rows = [{"category": f"horizon_{len(t.stages)}", "id": t.id, "valid": tr.success,
             "infra_failed": tr.infra_failed, "end_reason": tr.end_reason,
             "final_answer": tr.final_answer, "turn_calls": tr.turn_calls,
             "turn_statuses": tr.turn_statuses, "instruction": t.instruction,
             "expected": [[st.to_json() for st in stage] for stage in t.stages]}
            for t, tr in zip(held, trajs)]
    cats = report.accuracy_table(rows)
    results = {"benchmark": "gust_heldout", "split_by": g.split_by, "policy": config.policy,
               "model": what, "categories": cats, "wall_s": round(time.time() - t0, 1),
               "num_tasks": len(tasks), "num_heldout": len(held)}
    failed = [dict(r, messages=[{"role": "user", "content": r["instruction"]}] +
                   [{"role": "assistant", "content": f"calls {c} -> {st}"}
                    for c, st in zip(r["turn_calls"], r["turn_statuses"])] +
                   [{"role": "assistant", "content": f"answer: {r['final_answer']}"}],
                   verdict={"error_type": r["end_reason"]})
              for r in rows if not r["valid"] and not r["infra_failed"]]
    md = [f"## GUST held-out ({g.split_by} split): {what}\n",
          report.markdown_table(cats, "Success rate by horizon"),
          report.failures_markdown(failed, int(config.report.num_failures))]
    report.write_results(workdir, results, "\n".join(md), rows)
    return results


__all__ = ["EVALUATIONS", "BFCL_PUBLISHED", "get", "register", "run_bfcl", "run_gust"]
