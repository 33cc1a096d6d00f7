"""Templated natural-language instructions for DUSA chains.

The instruction states every value the user must supply (literals and seeded values used as
inputs) and the goal, never a value the agent has to discover (an upstream output): derived
arguments are described by where they come from ("the contact id from the search").
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

from toolverse_jax.tasks import schema as sch

_VERB_TEXT = {"list": "list", "search": "search", "get": "look up", "create": "create",
              "update": "update", "delete": "delete"}


def _words(name: str) -> str:
    return " ".join(sch.split_words(name))


def _fmt(v: Any) -> str:
    if isinstance(v, str):
        return f'"{v}"'
    return json.dumps(v)


def _ordinal(i: int) -> str:
    names = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
             "ninth", "tenth"]
    return names[i] if i < len(names) else f"#{i + 1}"


def tool_phrase(tool: str) -> str:
    """Returns a verb phrase for a tool name (`get_account_balance` -> `get account balance`)."""
    words = sch.split_words(tool)
    return " ".join(words) if words else tool


def step_phrase(step, stages) -> str:
    """Returns the phrase for one gold step: what to do, given values, and derived inputs."""
    parts = [tool_phrase(step.tool)]
    given, derived = [], []
    for p, v in step.arguments.items():
        src = step.sources.get(p, {"from": "literal"})
        if src.get("from") == "step":
            up = stages[src["stage"]][src["index"]]
            leaf = src["field"].rsplit(".", 1)[-1].replace("[]", "").replace("*", "") or "value"
            which = ""
            pick = src.get("pick")
            if pick and "field" in pick:
                which = f" of the one whose {_words(pick['field'])} is {_fmt(pick['value'])}"
            elif pick:
                which = f" of the {_ordinal(pick['position'])} item"
            derived.append(f"the {_words(leaf)}{which} from the {tool_phrase(up.tool)} result"
                           + ("" if sch.split_words(leaf) == sch.split_words(p) else
                              f" as {_words(p)}"))
        else:
            given.append(f"{_words(p)} {_fmt(v)}")
    if given:
        parts.append("with " + ", ".join(given))
    if derived:
        parts.append(("and " if given else "using ") + " and ".join(derived))
    return " ".join(parts)


def goal_phrase(verifier: dict, stages) -> str:
    """Returns the closing sentence that says what to report (empty for state goals)."""
    kind = verifier["kind"]
    if kind == "state":
        return ""
    src = verifier.get("source", {})
    step = stages[src["stage"]][src["index"]] if src else stages[-1][-1]
    field = src.get("field", "")
    leaf = field.rsplit(".", 1)[-1].replace("[]", "") or "result"
    ent = sch.tool_entity(step.tool)
    if kind == "set" and field.endswith("[]"):
        return f"Reply with all the {_words(leaf)} in the {tool_phrase(step.tool)} result."
    if kind == "set":
        return f"Reply with the {_words(leaf)} of every {_words(ent)} in that result."
    if leaf == "result":
        return f"Reply with the result of the {tool_phrase(step.tool)} step."
    if sch.singular(leaf) == ent or ent in sch.split_words(leaf):
        return f"Reply with the {_words(leaf)}."
    if sch.tool_kind(step.tool) in ("list", "search") or "[]" in field:
        return f"Reply with the {_words(leaf)} from the {tool_phrase(step.tool)} result."
    return f"Reply with the {_words(leaf)} of the {_words(ent)}."


def render_instruction(stages, verifier: dict, servers) -> str:
    """Returns the templated instruction for gold stages and their verifier."""
    sents = []
    for i, st in enumerate(stages):
        phrases = [step_phrase(s, stages) for s in st]
        body = " and ".join(phrases) if len(phrases) < 3 else \
            ", ".join(phrases[:-1]) + " and " + phrases[-1]
        lead = "" if len(stages) == 1 else ("First, " if i == 0 else "Then ")
        sents.append(lead + body + ".")
    text = " ".join(s[0].upper() + s[1:] for s in sents)
    goal = goal_phrase(verifier, stages)
    if len(stages) > 3:
        text = f"Using the {', '.join(servers)} tools: " + text
    return (text + (" " + goal if goal else "")).strip()


def apply_rewriter(text: str, rewriter: Callable[[str], str] | None) -> str:
    """Returns `rewriter(text)` (e.g. an LLM paraphrase), or `text` if off or it fails."""
    if rewriter is None:
        return text
    try:
        out = rewriter(text)
    except Exception as e:  # noqa: BLE001 - a flaky LLM must not drop the task
        logging.warning("instruction rewriter failed (%s); keeping the template", e)
        return text
    return out.strip() if isinstance(out, str) and out.strip() else text
