"""The three Memory-R2 roles on one params pytree: prompts, output formats, parsers, gold outputs.

    extractor: session text                         -> "slot: value" lines (or "none")
    manager:   facts + retrieved memories           -> ADD text / UPDATE id text / DELETE id / NOOP
    answerer:  retrieved memories + question        -> short answer

Formats are plain lines so a tiny byte-level model can learn them; the manager's operations are
executed as the memory bank server's `add` / `update` / `delete` MCP tools.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from toolverse_jax.memory.data import NONE, Question, Session

ROLES = ("extractor", "manager", "answerer")
SYSTEM = {"extractor": "Role: extract facts.", "manager": "Role: manage memory.",
          "answerer": "Role: answer from memory."}
OP_KINDS = ("ADD", "UPDATE", "DELETE", "NOOP")


def check_roles(roles: Sequence[str]) -> tuple[str, ...]:
    """Returns `roles` as a tuple after checking each is a known role."""
    bad = [r for r in roles if r not in ROLES]
    if bad:
        raise ValueError(f"unknown memory roles {bad}; train a subset of {ROLES}")
    return tuple(roles)


def messages(role: str, user: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM[role]}, {"role": "user", "content": user}]


def render_memory(entry: dict) -> str:
    """Returns one memory as the roles see it: 'm_0001 city: Rome; was: Oslo'."""
    text = entry["text"]
    key = text.split(":", 1)[0] + ":" if ":" in text else None
    old = []
    for rev in entry.get("history", []):
        t = rev["text"]
        old.append(t[len(key):].strip() if key and t.startswith(key) else t)
    tail = f"; was: {', '.join(reversed(old))}" if old else ""
    return f"{entry['memory_id']} {text}{tail}"


def render_memories(entries: Sequence[dict]) -> str:
    return "\n".join(render_memory(e) for e in entries) if entries else NONE


def extractor_user(session: Session) -> str:
    return session.text


def manager_user(facts: Sequence[str], memories: Sequence[dict]) -> str:
    return f"facts:\n{chr(10).join(facts) if facts else NONE}\nmem:\n{render_memories(memories)}"


def answerer_user(question: Question, memories: Sequence[dict]) -> str:
    return f"mem:\n{render_memories(memories)}\nq: {question.text}"


# ----------------------------------------------------------------------------- parsing

def parse_facts(text: str) -> list[str]:
    """Returns the 'slot: value' lines of an extractor output ('none' and blanks dropped)."""
    out = []
    for line in text.splitlines():
        line = " ".join(line.split())
        if line and line.lower() != NONE and line not in out:
            out.append(line)
    return out


@dataclasses.dataclass(frozen=True)
class Op:
    kind: str                 # ADD | UPDATE | DELETE | NOOP
    memory_id: str = ""
    text: str = ""

    def line(self) -> str:
        return " ".join(p for p in (self.kind, self.memory_id, self.text) if p)


def parse_ops(text: str) -> tuple[list[Op], list[str]]:
    """Returns (operations, errors) of a manager output, one operation per line."""
    ops, errors = [], []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        kind = parts[0].upper()
        if kind == "NOOP" and len(parts) == 1:
            ops.append(Op("NOOP"))
        elif kind == "ADD" and len(parts) >= 2:
            ops.append(Op("ADD", "", " ".join(parts[1:])))
        elif kind == "UPDATE" and len(parts) >= 3:
            ops.append(Op("UPDATE", parts[1], " ".join(parts[2:])))
        elif kind == "DELETE" and len(parts) == 2:
            ops.append(Op("DELETE", parts[1]))
        else:
            errors.append(f"cannot parse memory operation {line!r}; use 'ADD text', "
                          f"'UPDATE id text', 'DELETE id' or 'NOOP'")
    return ops, errors


def op_call(op: Op, time: int) -> Optional[tuple[str, dict]]:
    """Returns the memory bank (tool, arguments) of an operation, None for NOOP."""
    if op.kind == "ADD":
        return "add", {"text": op.text, "time": time}
    if op.kind == "UPDATE":
        return "update", {"memory_id": op.memory_id, "text": op.text, "time": time}
    if op.kind == "DELETE":
        return "delete", {"memory_id": op.memory_id}
    return None


# ----------------------------------------------------------------------------- gold outputs

def _key(text: str) -> str:
    return text.split(":", 1)[0].strip().lower()


def _value(text: str) -> str:
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def gold_extractor(session: Session) -> str:
    return "\n".join(session.facts) if session.facts else NONE


def gold_ops(facts: Sequence[str], memories: Sequence[dict]) -> list[Op]:
    """Returns the oracle manager's operations: UPDATE the memory of a fact's slot (keeps its
    history), DELETE it when the fact says 'none', ADD a new slot, NOOP when nothing changes."""
    ops = []
    for fact in facts:
        match = next((m for m in memories if _key(m["text"]) == _key(fact)), None)
        gone = _value(fact).lower() == NONE
        if match is None:
            if not gone:
                ops.append(Op("ADD", "", fact))
        elif gone:
            ops.append(Op("DELETE", match["memory_id"]))
        elif match["text"] != fact:
            ops.append(Op("UPDATE", match["memory_id"], fact))
    return ops or [Op("NOOP")]


def ops_text(ops: Sequence[Op]) -> str:
    return "\n".join(op.line() for op in ops)


def gold_answer(question: Question, memories: Sequence[dict]) -> str:
    """Returns the oracle answer read from retrieved memories (generated questions only)."""
    if question.slot is None:
        raise ValueError(f"question {question.text!r} has no slot (a loaded LoCoMo question); "
                         f"the oracle answerer only reads generated questions")
    m = next((m for m in memories if _key(m["text"]) == question.slot), None)
    if m is None:
        return NONE
    if question.kind == "latest":
        return _value(m["text"])
    values = [_value(r["text"]) for r in m.get("history", [])] + [_value(m["text"])]
    if question.kind == "history":
        return values[-2] if len(values) >= 2 else NONE
    return str(len(dict.fromkeys(values)))
