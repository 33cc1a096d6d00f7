"""Demonstration augmentation: fresh literals per SFT demonstration (`tasks.sft_fresh_literals`).

A tiny model trained on few gold chains memorizes their literals ("Team client 26", "nt_0001")
instead of learning to copy the instruction's, and then calls tools with the memorized values on
unseen tasks (docs/results/rl_scarce_sweep.md). `swap_literals` gives each rendering of a
demonstration new literals: every string argument of the gold chain that the instruction states
verbatim is replaced, everywhere in the task (instruction, arguments, observations, answer,
verifier), by a fresh value of the same shape, so a demonstration teaches "copy what the
instruction says" and no literal repeats across renderings. Text-level only: the result is a
demonstration to render, not a task to execute (its ids need not exist in any env state).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from toolverse_jax.tasks.task import Task

# Replacement words (lower case; the original's case pattern is kept).
_WORDS = ("quarterly", "update", "project", "budget", "meeting", "travel", "invoice", "review",
          "launch", "summary", "planning", "team", "client", "report", "design", "audit",
          "roadmap", "hiring", "offsite", "payroll", "vendor", "backlog", "release", "sprint",
          "partner", "contract", "feedback", "training", "support", "research", "pricing",
          "security", "migration", "onboarding", "forecast", "retro", "demo", "kickoff",
          "alpha", "beta", "river", "harbor", "maple", "cedar", "orbit", "signal", "ember",
          "copper", "delta", "summit", "lantern", "meadow", "falcon", "granite", "willow")
_TOKEN = re.compile(r"[A-Za-z]+|[0-9]")
MIN_CHARS = 4               # shorter literals ("10", "Q2") also occur inside other values


def copied_literals(task: Task) -> list[str]:
    """Returns the gold chain's string argument values (at least MIN_CHARS long) that the
    instruction states verbatim: the values an agent copies. Longest first."""
    vals = {v for stage in task.stages for step in stage for v in step.arguments.values()
            if isinstance(v, str) and len(v) >= MIN_CHARS and v in task.instruction}
    return sorted(vals, key=lambda v: (-len(v), v))


def fresh_like(value: str, rng: np.random.Generator) -> str:
    """Returns a value of `value`'s shape: each digit redrawn, each word of 3+ letters replaced
    by a random word in the same case pattern, except id prefixes (letters next to "_") and an
    email's domain; every other character kept."""
    out, pos = [], 0
    for m in _TOKEN.finditer(value):
        out.append(value[pos:m.start()])
        tok, pos = m.group(), m.end()
        after = value[m.end()] if m.end() < len(value) else ""
        id_prefix = after == "_" or (m.start() and value[m.start() - 1] == "_")
        domain = "@" in value[:m.start()]
        if tok.isdigit():
            out.append(str(int(rng.integers(10))))
        elif len(tok) >= 3 and not id_prefix and not domain:
            word = _WORDS[int(rng.integers(len(_WORDS)))]
            out.append(word.upper() if tok.isupper() else
                       word.capitalize() if tok[0].isupper() else word)
        else:
            out.append(tok)
    out.append(value[pos:])
    return "".join(out)


def _replace(x: Any, pairs: list[tuple[str, str]]) -> Any:
    if isinstance(x, str):
        for old, new in pairs:
            x = x.replace(old, new)
        return x
    if isinstance(x, list):
        return [_replace(v, pairs) for v in x]
    if isinstance(x, dict):
        return {_replace(k, pairs): _replace(v, pairs) for k, v in x.items()}
    return x


def swap_literals(task: Task, rng: np.random.Generator, tries: int = 8) -> Task:
    """Returns `task` with each copied literal replaced by a fresh value of its shape,
    consistently in every string of the task (see the module docstring). A literal whose
    fresh draws all collide with text already in the task is kept."""
    # What the policy reads or writes: never ids, servers, tool names or provenance.
    d = {"instruction": task.instruction, "answer": task.answer, "verifier": task.verifier,
         "stages": [[{"arguments": s.arguments, "observation": s.observation} for s in st]
                    for st in task.stages]}
    text = str(d)
    pairs = []
    for lit in copied_literals(task):
        for _ in range(tries):
            new = fresh_like(lit, rng)
            if new != lit and new not in text and all(new != n for _, n in pairs):
                pairs.append((lit, new))
                break
    # Placeholders first: a fresh value may contain a shorter literal of the same task.
    marks = [(old, f"\x00{i}\x00") for i, (old, _) in enumerate(pairs)]
    d = _replace(_replace(d, marks), [(m, new) for (_, m), (_, new) in zip(marks, pairs)])
    stages = [[dataclasses.replace(s, arguments=n["arguments"], observation=n["observation"])
               for s, n in zip(st, nst)] for st, nst in zip(task.stages, d["stages"])]
    return dataclasses.replace(task, instruction=d["instruction"], answer=d["answer"],
                               verifier=d["verifier"], stages=stages)
