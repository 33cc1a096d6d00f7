"""The records one RL step passes along: rollout -> advantages -> rows -> batch -> train step.

`Trajectory` (one rollout, with its per-turn record `Turn`) is what `rl/rollout.py` produces;
`rl/batching.py` joins trajectories with an estimator's per-turn advantages into `Row`s (one
token sequence each) and packs rows into a padded `TrainBatch`, which `rl/trainer.py`'s jitted
step and `rl/losses.py` read. SFT demonstrations and Memory-R2's role calls are `Row`s too.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import numpy as np


class Row(NamedTuple):
    """One training sequence, all fields aligned with `tokens` (length L + 1).

    policy_mask: True where the token was produced by the policy (the loss's tokens);
    advantages: per-token advantage (1 on every token of an SFT demonstration);
    sample_logprobs: the sampler's log-prob of each policy token (0 where it has none)."""

    tokens: Sequence[int]
    policy_mask: Sequence[bool]
    advantages: np.ndarray
    sample_logprobs: np.ndarray

    @classmethod
    def blank(cls, pad_id: int) -> "Row":
        """Returns a loss-free row (two pads, nothing masked in): batch padding."""
        return cls([pad_id, pad_id], [False, False], np.zeros(2, np.float32),
                   np.zeros(2, np.float32))

    @property
    def has_signal(self) -> bool:
        """Whether any policy token carries a non-zero advantage (else the row adds no gradient)."""
        adv = np.asarray(self.advantages)[np.asarray(self.policy_mask, bool)]
        return bool(np.any(np.abs(adv) > 1e-8))


class TrainBatch(NamedTuple):
    """Padded, right-aligned training rows. All [B, L]; targets[t] = tokens[t + 1].

    With shared prefixes (`pack_rows(share_prefix=True)`), row b's first inputs are held once
    in prefix row prefix_index[b] and its fields start after them: prefix_tokens and
    prefix_segment_ids are [P, Lp] (segment 1, 0 = padding; RoPE positions 0..), prefix_index
    is [B] int32 into them, and each row's positions continue its prefix. None otherwise."""

    tokens: jax.Array          # int32 input ids
    targets: jax.Array         # int32 next-token ids
    segment_ids: jax.Array     # int32, 1 = real token, 0 = padding
    positions: jax.Array       # int32 RoPE positions
    loss_mask: jax.Array       # float32, 1 where the target is a policy-produced token
    advantages: jax.Array      # float32 per-token advantage
    sample_logprobs: jax.Array  # float32 log-prob of the target under the sampler
    old_logprobs: jax.Array    # float32 log-prob under the trainer's params before the update
    ref_logprobs: jax.Array    # float32 log-prob under the frozen reference
    prefix_tokens: jax.Array | None = None       # int32 [P, Lp] shared leading inputs
    prefix_segment_ids: jax.Array | None = None  # int32 [P, Lp], 1 = real, 0 = padding
    prefix_index: jax.Array | None = None        # int32 [B], each row's prefix row


TURN_KINDS = ("calls", "answer", "truncated")


@dataclasses.dataclass
class Turn:
    """One assistant turn of a rollout: what the policy emitted and what came back.

    kind: "calls" (tool calls, possibly unparseable ones: `statuses` then holds
    "invalid_call"), "answer" (the final answer, no calls) or "truncated" (cut at
    max_new_tokens; ends the rollout). Every kind is a turn of the loss: its tokens carry the
    rollout's outcome advantage plus the estimator's turn-level terms.
    gold_match: TARA's r_{i,t}, 1.0 when the calls cover turn t's gold stage (for the answer
    turn the batching layer uses the rollout's outcome reward instead).
    arg_match: the fraction of the gold stage's (call, argument) values the calls reproduce
    (`arg_overlap`), the partial credit behind RolloutConfig.arg_match_bonus.
    state_key: 31-bit hash of the environment state the turn acted from (the set of calls
    executed before this turn with their observations; DESIGN §5's GiGPO anchor state).
    Rollouts of one group start from the same seeded state, so equal keys mean equal states.
    """

    kind: str
    calls: list[dict] = dataclasses.field(default_factory=list)
    statuses: list[str] = dataclasses.field(default_factory=list)
    gold_match: float = 0.0
    state_key: int = 0
    arg_match: float = 0.0
    policy_version: int = 0         # RL updates done when the sampling params were current

    def __post_init__(self):
        if self.kind not in TURN_KINDS:
            raise ValueError(f"Turn.kind={self.kind!r}; use one of {TURN_KINDS}")


@dataclasses.dataclass
class Trajectory:
    """One rollout. tokens/policy_mask/sample_logprobs/token_turn are aligned, length = len(tokens).
    token_turn: index into `turns` of each policy token, -1 elsewhere. `turns` is the one
    per-turn record (calls, statuses, gold match, state key); the views below derive from it."""

    task_id: str
    group_id: int
    tokens: list[int]
    policy_mask: list[bool]
    sample_logprobs: list[float]
    token_turn: list[int]
    prompt_len: int
    turns: list[Turn] = dataclasses.field(default_factory=list)
    final_answer: str | None = None
    finished: bool = False           # ended by an answer (not by turn/length limits)
    success: bool = False
    reward: float = 0.0
    infra_failed: bool = False       # a server crashed: excluded from group statistics
    end_reason: str = ""

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def tool_turns(self) -> list[Turn]:
        """Turns that are not the final answer (calls and a truncated last turn)."""
        return [t for t in self.turns if t.kind != "answer"]

    @property
    def num_call_turns(self) -> int:
        """Returns the number of turns whose calls reached the environment (TRACE's n)."""
        return sum(t.kind == "calls" for t in self.turns)

    @property
    def turn_calls(self) -> list[list[dict]]:
        return [t.calls for t in self.tool_turns]

    @property
    def turn_statuses(self) -> list[list[str]]:
        return [t.statuses for t in self.tool_turns]

    @property
    def final_turn_is_answer(self) -> bool:
        return bool(self.turns) and self.turns[-1].kind == "answer"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
