"""Built-in memory bank server (Memory-R2): entries with ids, text, timestamps and revisions.

Tools: `add`, `update`, `delete`, `search(query, k)`, `list`, plus `snapshot` / `restore` of the
full state. Snapshot returns the state as JSON with its content hash; restore replaces the
episode's state with a snapshot and returns the hash it now has, so a caller can check that K
local re-rollouts really start from one identical memory state. A state is a few kB (tens of
short entries), so a snapshot is one round trip and a restore is a dict copy.

`update` keeps the previous text in the entry's `history` (with the time it was replaced): the
bank remembers what changed, so questions about the past ("where did I live before?") are
answerable when the manager updates an entry instead of deleting and re-adding it.
"""

from __future__ import annotations

import hashlib
import json

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin.base import Domain, clone, db, fail, get_row, next_id
from toolverse_jax.envs.builtin.search import tokenize

MAX_K = 20
MAX_TEXT_CHARS = 500
STATE_KEYS = ("entries", "_counters")


class Revision(TypedDict):
    text: str
    time: int


class Entry(TypedDict):
    memory_id: str
    text: str
    created: int
    updated: int
    history: list[Revision]


class EntryList(TypedDict):
    entries: list[Entry]
    count: int


class Deleted(TypedDict):
    memory_id: str
    deleted: bool


class Snapshot(TypedDict):
    state: dict
    hash: str
    count: int


class Restored(TypedDict):
    hash: str
    count: int


def _init(rng, seed, sandbox):
    return {"entries": {}, "_counters": {"m": 0}}


DOMAIN = Domain("memory_bank", "Long-term memory: add, update, delete, search and list "
                               "remembered facts.", _init)


def content_hash(state: dict) -> str:
    """Returns the sha256 of a bank state's canonical JSON (entries and id counter)."""
    canon = {k: state.get(k) for k in STATE_KEYS}
    return hashlib.sha256(json.dumps(canon, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def _text(text: str) -> str:
    text = " ".join(text.split())
    if not text:
        fail("'text' must not be empty")
    if len(text) > MAX_TEXT_CHARS:
        fail(f"'text' has {len(text)} chars; a memory holds at most {MAX_TEXT_CHARS}")
    return text


def _ordered(entries: dict) -> list[dict]:
    # Ids are 'm_0001', 'm_0002'...: string order is creation order.
    return [entries[k] for k in sorted(entries)]


def rank(entries: dict, query: str, k: int) -> list[dict]:
    """Returns up to k entries by word overlap with `query` (then most recently updated)."""
    q = set(tokenize(query))
    scored = []
    for e in _ordered(entries):
        words = set(tokenize(e["text"]))
        score = len(q & words)
        if score > 0:
            scored.append((-score, -e["updated"], e["memory_id"], e))
    scored.sort(key=lambda t: t[:3])
    return [t[3] for t in scored[:k]]


@DOMAIN.tool
def add(text: str, time: int = 0) -> Entry:
    """Remember a new fact (time: the session it comes from)."""
    mid = next_id("m")
    row = {"memory_id": mid, "text": _text(text), "created": int(time), "updated": int(time),
           "history": []}
    db()["entries"][mid] = row
    return clone(row)


@DOMAIN.tool
def update(memory_id: str, text: str, time: int = 0) -> Entry:
    """Replace a memory's text; the old text is kept in its history."""
    row = get_row("entries", memory_id, "memory")
    new = _text(text)
    if new != row["text"]:
        row["history"].append({"text": row["text"], "time": row["updated"]})
        row["text"] = new
    row["updated"] = int(time)
    return clone(row)


@DOMAIN.tool
def delete(memory_id: str) -> Deleted:
    """Forget a memory."""
    get_row("entries", memory_id, "memory")
    del db()["entries"][memory_id]
    return {"memory_id": memory_id, "deleted": True}


@DOMAIN.tool
def search(query: str, k: int = 5) -> EntryList:
    """Return up to k memories sharing the most words with the query."""
    if not 1 <= k <= MAX_K:
        fail(f"'k' must be in 1..{MAX_K}; got {k}")
    rows = rank(db()["entries"], query, k)
    return {"entries": clone(rows), "count": len(rows)}


def list_memories() -> EntryList:
    """Return every memory, oldest first."""
    rows = _ordered(db()["entries"])
    return {"entries": clone(rows), "count": len(rows)}


# The tool's public name is `list`; the function is not called that, so the builtin `list` in
# this module's (lazily evaluated) annotations keeps its meaning.
list_memories.__name__ = "list"
DOMAIN.tool(list_memories)


@DOMAIN.tool
def snapshot() -> Snapshot:
    """Return the full bank state and its content hash (for exact restore)."""
    st = db()
    state = {k: clone(st.get(k, {})) for k in STATE_KEYS}
    return {"state": state, "hash": content_hash(state), "count": len(state["entries"])}


@DOMAIN.tool
def restore(state: dict) -> Restored:
    """Replace the bank with a snapshot's state; returns the hash it now has."""
    entries = state.get("entries")
    counters = state.get("_counters")
    if not isinstance(entries, dict) or not isinstance(counters, dict):
        fail("'state' must be a snapshot's state: {'entries': {...}, '_counters': {...}}; got "
             f"keys {sorted(state)}")
    for mid, e in entries.items():
        need = set(Entry.__annotations__)
        if not isinstance(e, dict) or set(e) != need or e["memory_id"] != mid:
            fail(f"snapshot entry {mid!r} must have exactly the keys {sorted(need)} and "
                 f"memory_id == its key")
    st = db()
    st["entries"] = clone(entries)
    st["_counters"] = clone(counters)
    return {"hash": content_hash(st), "count": len(entries)}
