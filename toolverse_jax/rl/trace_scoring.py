"""TRACE scoring: answer readiness ℓ̄ of each rollout state under the frozen reference model.

The maths that turns readiness into credit lives in `rl.trace` (`trace_rewards`, `kstep_backup`,
`trace_advantages`); this module produces its `readiness [B, T+1]` input from rollouts.

Layout of one rollout with n tool turns (0-indexed) and an optional final-answer turn:

    S_0 = prompt | a_0 o_0 | S_1 | a_1 o_1 | S_2 ... | a_{n-1} o_{n-1} | S_n | final answer

ℓ̄_k = the best (over gold aliases) mean log-prob of the gold answer, introduced by an answer
prefix (e.g. "<answer>"), right after state S_k.

Scorers (registered in `SCORERS`, chosen by config.trace.scorer):
- `score_readiness` ("single_pass"): one forward per rollout; the trajectory once, then a copy of
  prefix ⊕ alias per (state, alias), each attending only to its own S_k and itself through a
  custom attention mask (IGPO's appended-answer trick; layout in `single_pass_layout`).
- `score_readiness_naive` ("naive"): one sequence per (rollout, state, alias); the reference.

Host side: `state_boundaries` / `readiness_inputs` / `pack_answers` pack trajectories
(`rl.rollout.Trajectory`) into padded arrays; `readiness_for_trajectories` is the entry point of
the training loop (gold aliases via `gold_aliases`, one jitted scorer per padded shape), and
`readiness_metrics` summarizes its result (trace/readiness_* metrics).
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from toolverse_jax.registry import Registry

Array = jax.Array

__all__ = [
    "SCORERS",
    "gold_aliases",
    "pack_answers",
    "readiness_for_trajectories",
    "readiness_inputs",
    "readiness_metrics",
    "score_readiness",
    "score_readiness_naive",
    "single_pass_layout",
    "state_boundaries",
]


# Inputs shared by both scorers:
#   sequences [B, L] int: the trajectory tokens (anything past the last boundary is ignored);
#   boundaries [B, T+1] int: len(S_k) in tokens, S_k = sequences[b, :boundaries[b, k]]; -1 marks
#       a state the rollout does not have (its readiness comes back 0);
#   answers [B, A, La] (or [B, La] for one alias) int: gold answer aliases, padded with -1;
#   answer_prefix_ids [P] int, P >= 1: the text that introduces an answer (e.g. "<answer>"); its
#       last token predicts the first answer token, so no answer token is scored from S_k itself.


def pack_answers(aliases: Sequence[Sequence[Sequence[int]]], pad: int = -1,
                 pad_to: int = 1) -> np.ndarray:
    """Returns int32 [B, A, La] from per-rollout lists of alias token lists, padded with -1.

    La is rounded up to a multiple of `pad_to` (the padding is never scored) to bound recompiles.
    """
    b = len(aliases)
    a = max(1, max(len(x) for x in aliases))
    la = max(1, max((len(t) for x in aliases for t in x), default=1))
    la = -(-la // pad_to) * pad_to
    out = np.full((b, a, la), pad, np.int32)
    for i, x in enumerate(aliases):
        for j, t in enumerate(x):
            out[i, j, :len(t)] = t
    return out


def _prep(boundaries, answers, answer_prefix_ids):
    answers = jnp.asarray(answers, jnp.int32)
    if answers.ndim == 2:
        answers = answers[:, None, :]
    prefix = jnp.asarray(answer_prefix_ids, jnp.int32).reshape(-1)
    p = prefix.shape[0]
    if p < 1:
        raise ValueError("answer_prefix_ids must hold at least one token (e.g. the ids of "
                         "'<answer>'): its last token predicts the first gold answer token")
    b, a, _ = answers.shape
    lens = jnp.sum(answers >= 0, axis=-1)  # [B, A]
    blk = jnp.concatenate([jnp.broadcast_to(prefix, (b, a, p)), jnp.maximum(answers, 0)], -1)
    bnd = jnp.asarray(boundaries, jnp.int32)
    return bnd, blk, lens, p


def _best_alias(lp_sum, lens, bnd):
    """Returns [B, T+1] best (max over aliases) mean log-prob; 0 for missing states."""
    mean = lp_sum / jnp.maximum(lens, 1)[:, None, :]
    mean = jnp.where(lens[:, None, :] > 0, mean, -jnp.inf)
    best = jnp.max(mean, axis=-1)
    ok = (bnd >= 0) & jnp.isfinite(best)
    return jnp.where(ok, best, 0.0)


def score_readiness_naive(params, cfg, sequences, boundaries, answers, answer_prefix_ids,
                          backend: str = "auto") -> Array:
    """Returns ℓ̄ [B, T+1] with one sequence per (rollout, state, alias) — the reference scorer.

    Row (b, k, a) = S_k ⊕ prefix ⊕ alias a, positions 0..; all rows go through `logprobs_of`
    as one batch of B·(T+1)·A sequences of length L + P + La.
    """
    from toolverse_jax.models import logprobs_of
    seq = jnp.asarray(sequences, jnp.int32)
    bnd, blk, lens, p = _prep(boundaries, answers, answer_prefix_ids)
    bsz, l = seq.shape
    t1 = bnd.shape[1]
    _, a, w = blk.shape
    n = l + w
    j = jnp.arange(n)
    bk = jnp.maximum(bnd, 0)[:, :, None, None]            # [B, T+1, 1, 1]
    o = j[None, None, None, :] - bk                       # offset inside the answer block
    in_traj = o < 0
    traj_tok = seq[:, jnp.minimum(j, l - 1)][:, None, None, :]
    blk_b = blk[:, None, :, :]                            # [B, 1, A, W]
    blk_tok = jnp.take_along_axis(jnp.broadcast_to(blk_b, (bsz, t1, a, w)),
                                  jnp.broadcast_to(jnp.clip(o, 0, w - 1), (bsz, t1, a, n)), -1)
    tok = jnp.where(in_traj, traj_tok, blk_tok)
    blen = (p + lens)[:, None, :, None]
    valid = (in_traj | (o < blen)) & (bnd >= 0)[:, :, None, None]
    tok = jnp.where(valid, tok, 0)
    tgt = jnp.concatenate([tok[..., 1:], jnp.zeros_like(tok[..., :1])], -1)
    score = (o >= p - 1) & (o < p - 1 + lens[:, None, :, None]) & valid
    shape = (bsz * t1 * a, n)
    pos = jnp.broadcast_to(j, (bsz, t1, a, n)).reshape(shape)
    lp, _ = logprobs_of(params, cfg, tok.reshape(shape), tgt.reshape(shape), pos,
                        valid.reshape(shape).astype(jnp.int32), score.reshape(shape),
                        backend=backend)
    lp_sum = jnp.sum(jnp.where(score.reshape(shape), lp, 0.0), -1).reshape(bsz, t1, a)
    return _best_alias(lp_sum, lens, bnd)


def single_pass_layout(sequences, boundaries, answers, answer_prefix_ids):
    """Returns (tokens, targets, positions, segment_ids, attn_mask, score_mask) for one pass.

    Per rollout: [trajectory (L) | block(k=0, a=0) | block(0, 1) | ... | block(T, A-1)], block =
    prefix ⊕ alias (W = P + La slots). A block attends to the trajectory before its own boundary
    and causally to itself; its positions continue from its boundary. Shapes [B, L + (T+1)·A·W]
    (attn_mask [B, S, S]).
    """
    seq = jnp.asarray(sequences, jnp.int32)
    bnd, blk, lens, p = _prep(boundaries, answers, answer_prefix_ids)
    bsz, l = seq.shape
    t1 = bnd.shape[1]
    _, a, w = blk.shape
    c = t1 * a
    s = l + c * w
    j = jnp.arange(s)
    region = jnp.where(j >= l, (j - l) // w, -1)          # -1 = trajectory, else block id
    o = jnp.where(j >= l, (j - l) % w, 0)
    k_of = jnp.maximum(region, 0) // a
    a_of = jnp.maximum(region, 0) % a
    in_blk = region >= 0
    bnd_q = jnp.where(in_blk[None, :], bnd[:, k_of], l)   # [B, S]: keys visible before this
    last = jnp.max(bnd, axis=1, keepdims=True)
    blk_tok = blk[:, a_of, o]                             # [B, S]
    traj_tok = seq[:, jnp.minimum(j, l - 1)]
    tok = jnp.where(in_blk[None, :], blk_tok, traj_tok)
    blen = p + lens[:, a_of]                              # [B, S]
    valid = jnp.where(in_blk[None, :], (o[None, :] < blen) & (bnd[:, k_of] >= 0),
                      j[None, :] < last)
    tok = jnp.where(valid, tok, 0)
    nxt = blk[:, a_of, jnp.minimum(o + 1, w - 1)]
    tgt = jnp.where(in_blk[None, :] & (o[None, :] + 1 < w), nxt, 0)
    pos = jnp.where(in_blk[None, :], jnp.maximum(bnd_q, 0) + o[None, :], j[None, :])
    score = in_blk[None, :] & valid & (o[None, :] >= p - 1) & (o[None, :] < p - 1 + lens[:, a_of])
    key_traj = (region == -1)[None, None, :] & (j[None, None, :] < bnd_q[:, :, None])
    same_blk = (region[None, :, None] == region[None, None, :]) & in_blk[None, :, None]
    attn = key_traj | same_blk
    return tok, tgt, pos.astype(jnp.int32), valid.astype(jnp.int32), attn, score


def score_readiness(params, cfg, sequences, boundaries, answers, answer_prefix_ids,
                    backend: str = "auto") -> Array:
    """Returns ℓ̄ [B, T+1]: best-alias mean log-prob of the gold answer after each state S_k.

    One forward per rollout (IGPO's appended-answer trick): the trajectory once, then a copy of
    (prefix ⊕ alias) per state and alias, each attending only to its own prefix S_k and itself
    (custom `attn_mask`), scored through the fused `logprobs_of`. Equal to
    `score_readiness_naive` up to float summation order. Use the frozen reference params.
    """
    from toolverse_jax.models import logprobs_of
    bnd, blk, lens, p = _prep(boundaries, answers, answer_prefix_ids)
    tok, tgt, pos, seg, attn, score = single_pass_layout(sequences, boundaries, answers,
                                                         answer_prefix_ids)
    bsz, l = jnp.asarray(sequences).shape
    t1 = bnd.shape[1]
    _, a, w = blk.shape
    lp, _ = logprobs_of(params, cfg, tok, tgt, pos, seg, score, backend=backend, attn_mask=attn)
    lp = jnp.where(score, lp, 0.0)[:, l:].reshape(bsz, t1, a, w)
    return _best_alias(jnp.sum(lp, -1), lens, bnd)


def state_boundaries(token_turn: Sequence[int], num_tool_turns: int, num_states: int) -> list:
    """Returns [num_states] boundaries len(S_k) of one rollout, -1 past its last state.

    token_turn: per-token turn index (-1 for prompt/observations), as in `rollout.Trajectory`.
    S_k (k <= num_tool_turns) ends where turn k's first policy token starts (prompt, or the k-th
    observation plus the next assistant header); a state with no turn after it (the rollout
    stopped after its last observation) ends at the end of the tokens.
    """
    tt = np.asarray(token_turn)
    out = [-1] * num_states
    for k in range(min(num_tool_turns, num_states - 1) + 1):
        idx = np.flatnonzero(tt == k)
        out[k] = int(idx[0]) if idx.size else len(tt)
    return out


def readiness_inputs(token_lists: Sequence[Sequence[int]], token_turns: Sequence[Sequence[int]],
                     num_tool_turns: Sequence[int],
                     answer_aliases: Sequence[Sequence[Sequence[int]]], num_turns: int,
                     pad_to: int = 8, answer_pad_to: int = 8):
    """Returns numpy (sequences [B, L], boundaries [B, num_turns+1], answers [B, A, La]).

    Host-side packing of rollouts for `score_readiness`; L is rounded up to a multiple of
    `pad_to` and La to one of `answer_pad_to` to bound recompiles. answer_aliases: per rollout, the
    token ids of each gold alias.
    """
    b = len(token_lists)
    longest = max(len(t) for t in token_lists)
    length = -(-longest // pad_to) * pad_to
    seq = np.zeros((b, length), np.int32)
    bnd = np.full((b, num_turns + 1), -1, np.int32)
    for i, (toks, tt, n) in enumerate(zip(token_lists, token_turns, num_tool_turns)):
        seq[i, :len(toks)] = toks
        bnd[i] = state_boundaries(tt, n, num_turns + 1)
    return seq, bnd, pack_answers(answer_aliases, pad_to=answer_pad_to)


def readiness_metrics(readiness, num_tool_turns: Sequence[int]) -> dict:
    """Returns mean ℓ̄ at S_0 and at each rollout's last state, and their difference (gain).

    readiness: [B, T+1] from `readiness_for_trajectories`; num_tool_turns [B]: the last state of
    row b is S_{min(n_b, T)}. A positive gain: the rollouts' tool calls made the reference more
    ready to give the gold answer.
    """
    r = np.asarray(readiness, np.float64)
    last_idx = np.minimum(np.asarray(num_tool_turns, np.int64), r.shape[1] - 1)
    first, last = r[:, 0], r[np.arange(r.shape[0]), last_idx]
    return {"trace/readiness_s0": float(first.mean()), "trace/readiness_last": float(last.mean()),
            "trace/readiness_gain": float((last - first).mean())}


def gold_aliases(task) -> list:
    """Returns the gold answer strings of a task: meta["aliases"], else [answer]."""
    aliases = list((getattr(task, "meta", None) or {}).get("aliases") or [])
    return aliases or [str(task.answer)]


def readiness_for_trajectories(ref_params, cfg, trajs, tasks_by_id, tokenizer, num_turns: int,
                               answer_prefix: str = "<answer>", scorer: str = "single_pass",
                               pad_to: int = 64, backend: str = "auto") -> np.ndarray:
    """Returns ℓ̄ [B, num_turns+1] (numpy) for rollouts under the frozen reference params.

    trajs: objects with `task_id`, `tokens`, `token_turn`, `num_call_turns` (rl.rollout.Trajectory);
    tasks_by_id: {task_id: Task}; answers are `gold_aliases(task)` encoded with `tokenizer`
    (best alias taken), scored after `answer_prefix`. Feed the result to
    `AdvantageInputs.readiness` with turn_mask/answer_mask over the same `num_turns`.
    """
    SCORERS.get(scorer)  # an unknown name fails here, naming the known ones, before any work
    prefix = tokenizer.encode(answer_prefix, allow_special=False)
    aliases = [[tokenizer.encode(a, allow_special=False) for a in
                gold_aliases(tasks_by_id[t.task_id])] for t in trajs]
    seq, bnd, ans = readiness_inputs([t.tokens for t in trajs], [t.token_turn for t in trajs],
                                     [t.num_call_turns for t in trajs], aliases, num_turns,
                                     pad_to=pad_to)
    out = _score_jit(ref_params, seq, bnd, ans, np.asarray(prefix, np.int32), cfg=cfg,
                     scorer=scorer, backend=backend)
    return np.asarray(out)


SCORERS: Registry[Callable] = Registry("TRACE scorer", hint="(config.trace.scorer)")
SCORERS.register("single_pass", score_readiness)
SCORERS.register("naive", score_readiness_naive)


# One jit for every RL step: params are an argument (not baked-in constants), so a step whose
# padded shapes were seen before reuses the compiled scorer.
@functools.partial(jax.jit, static_argnames=("cfg", "scorer", "backend"))
def _score_jit(params, seq, bnd, ans, prefix, *, cfg, scorer, backend):
    return SCORERS.get(scorer)(params, cfg, seq, bnd, ans, prefix, backend=backend)
