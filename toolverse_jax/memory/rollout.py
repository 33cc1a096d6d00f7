"""Multi-session memory rollouts over the memory bank MCP server, token in / token out.

One trajectory = one conversation processed by the three roles against its own memory bank
episode: for each session, extractor -> bank `search` per fact -> manager -> bank operations;
after the last session the answerer answers the questions from `search` results. Every role
call is kept as its own row (rendered prompt ids + the exact sampled ids), so nothing sampled is
ever re-tokenized for training.

Local re-rollouts (LoGo-GRPO): the bank state of one rollout before session k is snapshotted,
restored into K fresh episodes (the restore's content hash is checked against the snapshot's),
session k is re-rolled K times from that identical state and each member is scored by the QA
reward of the probe questions asked right after k.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, NamedTuple, Optional, Protocol, Sequence

import jax
import numpy as np

from toolverse_jax.envs import EnvPool, Episode
from toolverse_jax.envs.pool import EpisodeSpec
from toolverse_jax.memory import roles as R
from toolverse_jax.memory.data import Conversation, Question, Session, exact_match, qa_score
from toolverse_jax.models.chat import render_assistant, render_prompt

SERVER = "memory_bank"
END = "<|im_end|>"


@dataclasses.dataclass(frozen=True)
class MemoryRolloutConfig:
    max_facts: int = 4          # extractor lines used per session (bounds bank calls)
    manager_k: int = 2          # memories retrieved per fact for the manager
    answer_k: int = 3           # memories retrieved per question for the answerer
    max_ops: int = 4            # manager operations executed per session
    qa_metric: str = "f1"       # reward of one answer: "f1" | "em"
    comp_coef: float = 0.2      # λ_comp: reward -= comp_coef * memory words / (θ * session words)
    comp_theta: float = 0.7
    chat_template: Any = None   # models.template.ChatTemplate; None = chat.py's Qwen3 format


class Completion(NamedTuple):
    tokens: list[int]
    logprobs: list[float]
    stopped: bool


class Actor(Protocol):
    """Produces one completion per prompt for a role (the model, or the gold oracle)."""

    def complete(self, role: str, prompts: Sequence[Sequence[int]], contexts: Sequence[Any],
                 rng: jax.Array) -> list[Completion]: ...


@dataclasses.dataclass
class ModelActor:
    """Samples every role from one params pytree; `policies` maps role -> Policy (each role may
    have its own max_new_tokens, hence a Policy per role)."""

    policies: dict

    def complete(self, role, prompts, contexts, rng):
        out = self.policies[role](list(prompts), rng)
        res = []
        for i in range(len(prompts)):
            n = int(out.lengths[i])
            res.append(Completion([int(t) for t in out.tokens[i, :n]],
                                  [float(x) for x in out.logprobs[i, :n]], bool(out.stopped[i])))
        return res


@dataclasses.dataclass
class GoldActor:
    """The oracle: gold extractor facts, gold manager operations on the retrieved memories, gold
    answers read from the retrieved memories (SFT demonstrations and data-consistency tests)."""

    tokenizer: Any
    template: Any = None        # the chat template the prompts were rendered with

    def complete(self, role, prompts, contexts, rng):
        res = []
        for ctx in contexts:
            if role == "extractor":
                text = R.gold_extractor(ctx)
            elif role == "manager":
                text = R.ops_text(R.gold_ops(*ctx))
            else:
                text = R.gold_answer(*ctx)
            toks = render_assistant({"role": "assistant", "content": text}, self.tokenizer,
                                    template=self.template)
            res.append(Completion(toks, [0.0] * len(toks), True))
        return res


@dataclasses.dataclass
class RoleCall:
    """One role call: prompt ids + completion ids (policy_mask marks the completion)."""

    role: str
    session: int                 # 1-based session, 0 for answers
    tokens: list[int]
    policy_mask: list[bool]
    sample_logprobs: list[float]
    text: str
    stopped: bool


@dataclasses.dataclass
class MemoryTrajectory:
    conv_id: str
    group_id: int
    calls: list[RoleCall] = dataclasses.field(default_factory=list)
    answers: list[str] = dataclasses.field(default_factory=list)
    scores: list[float] = dataclasses.field(default_factory=list)
    em: list[float] = dataclasses.field(default_factory=list)
    kinds: list[str] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    compression: float = 0.0
    op_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    infra_failed: bool = False
    start_hash: str = ""
    session: int = 0             # local members: the re-rolled session

    @property
    def qa_f1(self) -> float:
        return float(np.mean(self.scores)) if self.scores else 0.0

    @property
    def qa_em(self) -> float:
        return float(np.mean(self.em)) if self.em else 0.0


def completion_text(tokenizer, tokens: Sequence[int]) -> str:
    """Returns the decoded completion without its end-of-turn marker."""
    return tokenizer.decode(list(tokens)).split(END)[0].strip()


def _role_calls(actor: Actor, role: str, users: list[str], contexts: list, sessions: list[int],
                tokenizer, rng, template=None) -> list[RoleCall]:
    if not users:
        return []
    prompts = [render_prompt(R.messages(role, u), tokenizer, template=template) for u in users]
    comps = actor.complete(role, prompts, contexts, rng)
    return [RoleCall(role, s, list(p) + c.tokens, [False] * len(p) + [True] * len(c.tokens),
                     [0.0] * len(p) + c.logprobs, completion_text(tokenizer, c.tokens), c.stopped)
            for p, c, s in zip(prompts, comps, sessions)]


def _entries(obs) -> list[dict]:
    if obs.status != "ok" or not obs.structured:
        return []
    return list(obs.structured.get("entries", []))


def _dedupe(entries: list[dict]) -> list[dict]:
    seen, out = set(), []
    for e in entries:
        if e["memory_id"] not in seen:
            seen.add(e["memory_id"])
            out.append(e)
    return out


def _mark_crashed(trajs, owners, results) -> None:
    for j, obs in zip(owners, results):
        if obs.status == "server_crashed":
            trajs[j].infra_failed = True


def run_session(actor: Actor, items: Sequence[tuple[MemoryTrajectory, Episode, Session]],
                pool: EnvPool, tokenizer, cfg: MemoryRolloutConfig, rng: jax.Array) -> None:
    """Runs extractor -> search -> manager -> bank operations for one session of each item
    (batched across items); appends the role calls to each trajectory."""
    items = [it for it in items if not it[0].infra_failed]
    if not items:
        return
    k1, k2 = jax.random.split(rng)
    trajs = [t for t, _, _ in items]
    ext = _role_calls(actor, "extractor", [R.extractor_user(s) for _, _, s in items],
                      [s for _, _, s in items], [s.index for _, _, s in items], tokenizer, k1,
                      cfg.chat_template)
    facts = [R.parse_facts(c.text)[:cfg.max_facts] for c in ext]
    calls, owners = [], []
    for j, (_, ep, _) in enumerate(items):
        for f in facts[j]:
            calls.append((ep, "search", {"query": f, "k": cfg.manager_k}))
            owners.append(j)
    results = pool.step(calls) if calls else []
    _mark_crashed(trajs, owners, results)
    mems: list[list[dict]] = [[] for _ in items]
    for j, obs in zip(owners, results):
        mems[j] += _entries(obs)
    mems = [_dedupe(m) for m in mems]
    man = _role_calls(actor, "manager", [R.manager_user(f, m) for f, m in zip(facts, mems)],
                      list(zip(facts, mems)), [s.index for _, _, s in items], tokenizer, k2,
                      cfg.chat_template)
    calls, owners = [], []
    for j, ((tr, ep, sess), call) in enumerate(zip(items, man)):
        tr.calls += [ext[j], call]
        ops, errors = R.parse_ops(call.text)
        tr.op_counts["invalid"] += len(errors) + (0 if call.stopped else 1)
        for op in ops[:cfg.max_ops]:
            tr.op_counts[op.kind] += 1
            c = R.op_call(op, sess.index)
            if c is not None:
                calls.append((ep, c[0], c[1]))
                owners.append(j)
    results = pool.step(calls) if calls else []
    _mark_crashed(trajs, owners, results)
    for j, obs in zip(owners, results):
        if obs.status != "ok":
            trajs[j].op_counts["failed"] += 1


def answer_questions(actor: Actor, items: Sequence[tuple[MemoryTrajectory, Episode,
                                                         Sequence[Question]]],
                     pool: EnvPool, tokenizer, cfg: MemoryRolloutConfig, rng: jax.Array,
                     keep_calls: bool = True, judge=None) -> None:
    """Answers each item's questions from `search` results; records answers and QA scores."""
    flat = [(j, q) for j, (tr, _, qs) in enumerate(items) if not tr.infra_failed for q in qs]
    if not flat:
        return
    trajs = [t for t, _, _ in items]
    results = pool.step([(items[j][1], "search", {"query": q.text, "k": cfg.answer_k})
                         for j, q in flat])
    _mark_crashed(trajs, [j for j, _ in flat], results)
    mems = [_entries(o) for o in results]
    calls = _role_calls(actor, "answerer", [R.answerer_user(q, m) for (_, q), m in zip(flat, mems)],
                        [(q, m) for (_, q), m in zip(flat, mems)], [0] * len(flat), tokenizer, rng,
                        cfg.chat_template)
    for (j, q), call in zip(flat, calls):
        tr = trajs[j]
        if keep_calls:
            tr.calls.append(call)
        tr.answers.append(call.text)
        tr.scores.append(qa_score(q, call.text, cfg.qa_metric, judge))
        tr.em.append(exact_match(call.text, q.answer))
        tr.kinds.append(q.kind)


def _snapshot(pool: EnvPool, eps: Sequence[Episode]) -> list[Optional[dict]]:
    res = pool.step([(ep, "snapshot", {}) for ep in eps])
    return [o.structured if o.status == "ok" else None for o in res]


def _compression(pool: EnvPool, items, cfg: MemoryRolloutConfig) -> None:
    """Sets each trajectory's compression ratio (memory words / (θ · session words so far))."""
    live = [it for it in items if not it[0].infra_failed]
    if not live:
        return
    res = pool.step([(ep, "list", {}) for _, ep, _ in live])
    for (tr, _, words), obs in zip(live, res):
        mem = sum(len(e["text"].split()) for e in _entries(obs))
        tr.compression = mem / max(cfg.comp_theta * words, 1.0)


def _finish(tr: MemoryTrajectory, cfg: MemoryRolloutConfig) -> None:
    tr.reward = tr.qa_f1 - cfg.comp_coef * tr.compression


def rollout_conversations(actor: Actor, convs: Sequence[Conversation], group_size: int,
                          pool: EnvPool, tokenizer, cfg: MemoryRolloutConfig, rng: jax.Array,
                          seed: int = 0, group_offset: int = 0,
                          snapshot_at: Sequence[tuple[int, int]] = (), judge=None
                          ) -> tuple[list[MemoryTrajectory], dict]:
    """Returns (trajectories, snapshots). Trajectory r = c * group_size + g is rollout g of
    conversation c (group id group_offset + c); all start from an empty bank. `snapshot_at`
    lists (trajectory, session) pairs whose bank state right before that 1-based session is
    returned in `snapshots[(trajectory, session)]` = {"state", "hash", "count"}."""
    owners = [c for c in range(len(convs)) for _ in range(group_size)]
    eps = pool.reset([EpisodeSpec((SERVER,), seed)] * len(owners))
    trajs = [MemoryTrajectory(convs[c].id, group_offset + c) for c in owners]
    snapshots: dict = {}
    want = collections.defaultdict(list)
    for r, s in snapshot_at:
        want[s].append(r)
    try:
        for r, ep in enumerate(eps):
            trajs[r].infra_failed = pool.is_failed(ep)
        for s in range(1, max(c.num_sessions for c in convs) + 1):
            if want.get(s):
                for r, snap in zip(want[s], _snapshot(pool, [eps[r] for r in want[s]])):
                    if snap is None:
                        trajs[r].infra_failed = True
                    snapshots[(r, s)] = snap
            rng, key = jax.random.split(rng)
            run_session(actor, [(trajs[r], eps[r], convs[owners[r]].sessions[s - 1])
                                for r in range(len(trajs)) if s <= convs[owners[r]].num_sessions],
                        pool, tokenizer, cfg, key)
        rng, key = jax.random.split(rng)
        answer_questions(actor, [(trajs[r], eps[r], convs[owners[r]].questions)
                                 for r in range(len(trajs))], pool, tokenizer, cfg, key,
                         judge=judge)
        _compression(pool, [(trajs[r], eps[r], sum(len(s.text.split())
                                                    for s in convs[owners[r]].sessions))
                            for r in range(len(trajs))], cfg)
        for r, ep in enumerate(eps):
            trajs[r].infra_failed |= pool.is_failed(ep)
            _finish(trajs[r], cfg)
    finally:
        pool.close(eps)
    return trajs, snapshots


def plan_locals(convs: Sequence[Conversation], group_size: int, fraction: float,
                rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """Returns (conversation, rollout, session) triples: each session of each conversation is
    picked with probability `fraction`, with one of its group's rollouts as the source."""
    out = []
    for c, conv in enumerate(convs):
        for s in range(1, conv.num_sessions + 1):
            if conv.probes.get(s) and rng.random() < fraction:
                out.append((c, c * group_size + int(rng.integers(group_size)), s))
    return out


def rollout_local(actor: Actor, scorer: Actor, convs: Sequence[Conversation],
                  plan: Sequence[tuple[int, int, int]], snapshots: dict, inner_n: int,
                  pool: EnvPool, tokenizer, cfg: MemoryRolloutConfig, rng: jax.Array,
                  seed: int = 0, group_offset: int = 0, judge=None) -> list[MemoryTrajectory]:
    """Returns len(plan) * inner_n local members: member m of plan item p re-rolls session s of
    conversation c from snapshots[(rollout, s)] (group id group_offset + p) and is scored by
    the probe questions asked right after s, answered by `scorer` (no answer rows kept)."""
    items = [(p, c, r, s) for p, (c, r, s) in enumerate(plan) if snapshots.get((r, s))]
    if not items:
        return []
    eps = pool.reset([EpisodeSpec((SERVER,), seed)] * (len(items) * inner_n))
    members = []
    try:
        restore_calls = []
        for i, (p, c, r, s) in enumerate(items):
            snap = snapshots[(r, s)]
            for m in range(inner_n):
                tr = MemoryTrajectory(convs[c].id, group_offset + p, session=s,
                                      start_hash=snap["hash"])
                members.append((tr, eps[i * inner_n + m], convs[c], s))
                restore_calls.append((eps[i * inner_n + m], "restore", {"state": snap["state"]}))
        for (tr, ep, _, _), obs in zip(members, pool.step(restore_calls)):
            if obs.status != "ok":
                tr.infra_failed = True
                continue
            got = obs.structured["hash"]
            if got != tr.start_hash:
                raise RuntimeError(f"memory bank restore is not exact: episode {ep.id} has hash "
                                   f"{got[:12]} after restoring snapshot {tr.start_hash[:12]}; "
                                   f"check memory_bank.restore / content_hash")
        k1, k2 = jax.random.split(rng)
        run_session(actor, [(tr, ep, conv.sessions[s - 1]) for tr, ep, conv, s in members],
                    pool, tokenizer, cfg, k1)
        answer_questions(scorer, [(tr, ep, conv.probes[s]) for tr, ep, conv, s in members],
                         pool, tokenizer, cfg, k2, keep_calls=False, judge=judge)
        _compression(pool, [(tr, ep, sum(len(x.text.split()) for x in conv.sessions[:s]))
                            for tr, ep, conv, s in members], cfg)
        for tr, ep, _, _ in members:
            tr.infra_failed |= pool.is_failed(ep)
            _finish(tr, cfg)
    finally:
        pool.close(eps)
    return [m[0] for m in members]


def bank_hashes(pool: EnvPool, eps: Sequence[Episode]) -> list[Optional[str]]:
    """Returns the content hash of each episode's bank (None where the snapshot failed)."""
    return [s["hash"] if s else None for s in _snapshot(pool, eps)]
