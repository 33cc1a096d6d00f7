"""Multi-session memory data: a generator of histories whose facts change, a LoCoMo loader, QA rewards.

A generated conversation is a list of short sessions, each stating at most one event about one
slot of the user's life (city, job, dog, trip): set, move / new job, correction, cancelled plan,
or small talk. The generator keeps the fact timeline and derives every answer from it, so a
question can be asked "as of" any session: `Conversation.questions` are asked after the last
session, `Conversation.probes[k]` right after session k (for LoGo's local rewards).

Question kinds: "latest" (current value, "none" once a trip is cancelled), "history" (the value
before the current one) and "aggregate" (how many different values so far).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import os
import random
import re
import string
from typing import Callable, Optional, Sequence

NONE = "none"

VALUES = {
    "city": ("Oslo", "Rome", "Lima", "Pune", "Kyiv", "Cairo", "Quito", "Bern"),
    "job": ("nurse", "chef", "pilot", "baker", "judge", "tutor", "medic", "clerk"),
    "dog": ("Rex", "Max", "Bo", "Ace", "Fig", "Taz", "Kit", "Zed"),
    "trip": ("Paris", "Tokyo", "Dubai", "Milan", "Seoul", "Delhi", "Accra", "Perth"),
}
SET_TEXT = {"city": "I live in {v}.", "job": "I work as a {v}.", "dog": "My dog is {v}.",
            "trip": "I plan a trip to {v}."}
CHANGE_TEXT = {"city": "I moved to {v}.", "job": "My new job: {v}.",
               "dog": "Correction: my dog is {v}, not {old}."}
CANCEL_TEXT = "I cancelled the trip to {old}."
FILLER = ("I had soup today.", "It rained all day.", "I read a book.", "I slept late.",
          "We watched a film.", "I went for a run.")
QUESTION_TEXT = {
    ("city", "latest"): "Which city do I live in now?",
    ("job", "latest"): "What is my job now?",
    ("dog", "latest"): "What is my dog called?",
    ("trip", "latest"): "Where does my trip go?",
    ("city", "history"): "Which city did I live in before?",
    ("job", "history"): "What was my job before?",
    ("city", "aggregate"): "How many city homes have I had?",
    ("job", "aggregate"): "How many job roles have I had?",
}
# Slots whose changes are real changes (moves, new jobs); a dog's change is a corrected mistake
# and a trip is a plan, so only these get history / aggregate questions.
HISTORY_SLOTS = ("city", "job")


@dataclasses.dataclass(frozen=True)
class Event:
    """One change of the fact timeline: `slot` takes `value` (NONE = no longer true)."""

    session: int
    slot: str
    value: str
    kind: str  # "set" | "change" | "correct" | "cancel"


@dataclasses.dataclass(frozen=True)
class Session:
    index: int              # 1-based
    text: str
    facts: tuple[str, ...]  # gold extractor output: "slot: value" lines


@dataclasses.dataclass(frozen=True)
class Question:
    text: str
    answer: str
    as_of: int                       # asked right after this session (1-based)
    depends_on: tuple[int, ...]      # sessions whose facts determine the answer
    slot: Optional[str] = None       # None for loaded (LoCoMo) questions
    kind: str = "latest"


@dataclasses.dataclass(frozen=True)
class Conversation:
    id: str
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]
    probes: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)
    timeline: tuple[Event, ...] = ()

    @property
    def num_sessions(self) -> int:
        return len(self.sessions)


def fact_text(slot: str, value: str) -> str:
    return f"{slot}: {value}"


def slot_values(timeline: Sequence[Event], slot: str, as_of: int) -> list[Event]:
    """Returns the slot's events up to session `as_of`, oldest first."""
    return [e for e in timeline if e.slot == slot and e.session <= as_of]


def answer_from_timeline(timeline: Sequence[Event], slot: str, kind: str, as_of: int) -> str:
    """Returns the answer to a (slot, kind) question after session `as_of`."""
    evs = slot_values(timeline, slot, as_of)
    if not evs:
        return NONE
    if kind == "latest":
        return evs[-1].value
    # history / aggregate count real changes only; corrections replace the mistaken value
    values: list[str] = []
    for e in evs:
        if e.kind == "correct" and values:
            values[-1] = e.value
        else:
            values.append(e.value)
    if kind == "history":
        return values[-2] if len(values) >= 2 else NONE
    if kind == "aggregate":
        return str(len(dict.fromkeys(values)))
    raise ValueError(f"question kind {kind!r}; use 'latest', 'history' or 'aggregate'")


def _questions_for(timeline, slot: str, as_of: int) -> list[Question]:
    evs = slot_values(timeline, slot, as_of)
    if not evs:
        return []
    deps = tuple(e.session for e in evs)
    kinds = ["latest"]
    if slot in HISTORY_SLOTS and len(evs) >= 2:
        kinds += ["history", "aggregate"]
    return [Question(QUESTION_TEXT[(slot, k)], answer_from_timeline(timeline, slot, k, as_of),
                     as_of, deps, slot, k) for k in kinds]


def generate_conversation(num_sessions: int, seed: int, max_questions: int = 6,
                          filler_prob: float = 0.2) -> Conversation:
    """Returns a deterministic conversation of `num_sessions` sessions for `seed`."""
    rng = random.Random(f"memory-r2:{num_sessions}:{seed}")
    current: dict[str, str] = {}
    used: dict[str, set] = collections.defaultdict(set)
    timeline: list[Event] = []
    sessions = []
    for s in range(1, num_sessions + 1):
        options = []
        for slot in VALUES:
            fresh = [v for v in VALUES[slot] if v not in used[slot]]
            if slot not in current or current[slot] == NONE:
                if fresh:
                    options.append(("set", slot))
            elif slot == "trip":
                options.append(("cancel", slot))
            elif fresh:
                options.append(("correct" if slot == "dog" else "change", slot))
        if not options or (s > 1 and rng.random() < filler_prob):
            sessions.append(Session(s, rng.choice(FILLER), ()))
            continue
        kind, slot = rng.choice(options)
        old = current.get(slot, NONE)
        if kind == "cancel":
            value, text = NONE, CANCEL_TEXT.format(old=old)
        else:
            value = rng.choice([v for v in VALUES[slot] if v not in used[slot]])
            tmpl = SET_TEXT[slot] if kind == "set" else CHANGE_TEXT[slot]
            text = tmpl.format(v=value, old=old)
            used[slot].add(value)
        current[slot] = value
        timeline.append(Event(s, slot, value, kind))
        sessions.append(Session(s, text, (fact_text(slot, value),)))
    probes = {}
    for sess in sessions:
        touched = [e.slot for e in timeline if e.session == sess.index]
        slots = touched or sorted({e.slot for e in timeline if e.session <= sess.index})
        probes[sess.index] = tuple(q for slot in slots
                                   for q in _questions_for(timeline, slot, sess.index))
    final = [q for slot in VALUES for q in _questions_for(timeline, slot, num_sessions)]
    rng.shuffle(final)
    return Conversation(f"gen{num_sessions}-{seed}", tuple(sessions), tuple(final[:max_questions]),
                        probes, tuple(timeline))


def generate_conversations(n: int, num_sessions: int, seed: int, max_questions: int = 6
                           ) -> list[Conversation]:
    """Returns n conversations with seeds seed*1_000_003 + i (disjoint seed ranges per split)."""
    return [generate_conversation(num_sessions, seed * 1_000_003 + i, max_questions)
            for i in range(n)]


# ----------------------------------------------------------------------------- LoCoMo files

def _session_keys(conv: dict) -> list[tuple[int, str]]:
    out = []
    for k in conv:
        m = re.fullmatch(r"session_(\d+)", k)
        if m and isinstance(conv[k], list):
            out.append((int(m.group(1)), k))
    return sorted(out)


def load_locomo(path: str, limit: Optional[int] = None) -> list[Conversation]:
    """Returns conversations from LoCoMo-format JSON (a file, or a directory of *.json).

    Each sample: {"sample_id", "conversation": {"session_1": [{"speaker", "dia_id", "text"}...],
    ...}, "qa": [{"question", "answer", "evidence": ["D1:3", ...]}]}. Questions are asked after
    the last session and depend on the sessions their evidence ids name. Questions without an
    answer (LoCoMo's adversarial category) are skipped.
    """
    files = sorted(glob.glob(os.path.join(path, "*.json"))) if os.path.isdir(path) else [path]
    if not files or not all(os.path.exists(f) for f in files):
        raise FileNotFoundError(f"no LoCoMo JSON at {path!r}; pass a file like locomo10.json or "
                                f"a directory of them")
    out = []
    for f in files:
        with open(f) as fh:
            raw = json.load(fh)
        for i, sample in enumerate(raw if isinstance(raw, list) else [raw]):
            conv = sample.get("conversation")
            if not isinstance(conv, dict) or "qa" not in sample:
                raise ValueError(f"{f} sample {i}: a LoCoMo sample needs 'conversation' (dict) "
                                 f"and 'qa' (list); got keys {sorted(sample)}")
            keys = _session_keys(conv)
            sessions = tuple(
                Session(j + 1, "\n".join(f"{t.get('speaker', '?')}: {t.get('text', '')}"
                                         for t in conv[k]), ())
                for j, (_, k) in enumerate(keys))
            renum = {num: j + 1 for j, (num, _) in enumerate(keys)}
            qs = []
            for qa in sample["qa"]:
                if "answer" not in qa:
                    continue
                deps = sorted({renum[int(m.group(1))] for ev in qa.get("evidence", [])
                               for m in [re.match(r"D(\d+):", str(ev))]
                               if m and int(m.group(1)) in renum})
                qs.append(Question(str(qa["question"]), str(qa["answer"]), len(sessions),
                                   tuple(deps), None, str(qa.get("category", "latest"))))
            out.append(Conversation(str(sample.get("sample_id", f"{os.path.basename(f)}:{i}")),
                                    sessions, tuple(qs)))
            if limit is not None and len(out) >= limit:
                return out
    return out


# ----------------------------------------------------------------------------- rewards

def normalize_answer(s: str) -> str:
    """Returns SQuAD-style normalized text: lower case, no punctuation/articles, single spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(pred: str, gold: str) -> float:
    return float(normalize_answer(pred) == normalize_answer(gold))


def token_f1(pred: str, gold: str) -> float:
    """Returns the token-level F1 of normalized prediction vs gold (1.0 when both are empty)."""
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    prec, rec = same / len(p), same / len(g)
    return 2 * prec * rec / (prec + rec)


Judge = Callable[[str, str, str], float]  # (question, gold, prediction) -> score in [0, 1]


def qa_score(question: Question, pred: Optional[str], metric: str = "f1",
             judge: Optional[Judge] = None) -> float:
    """Returns the reward of one answer: token F1 (default), exact match, or an LLM judge."""
    pred = pred or ""
    if judge is not None:
        return float(judge(question.text, question.answer, pred))
    if metric == "f1":
        return token_f1(pred, question.answer)
    if metric == "em":
        return exact_match(pred, question.answer)
    raise ValueError(f"QA metric {metric!r}; use 'f1' or 'em' (or pass a judge)")
