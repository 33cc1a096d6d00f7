"""Templated natural-language instructions for DUSA chains, at three levels (issue 24).

- "recipe": every gold call in order, named by its tool ("First, list notes. Then delete note
  using the note id of the one whose title is "Q2 goals" from the list notes result."); a
  curriculum start, and what the shipped quickstart sets use (`render_recipe`).
- "stage": the goal of each stage in order, without tool names ("First, look up the note
  titled "Q2 goals". Then delete the note titled "Q2 goals".").
- "goal": what the user wants: the entities by attributes a user knows (a title, a subject, a
  name), the values the user supplies, and the final ask; which list/search/get calls find
  the ids, and in what order, is left to the agent.

Every level states each value the user supplies verbatim and never a value the agent has to
discover (an id, an upstream output, the answer): `instruction_facts` + `check_instruction` test
that mechanically, for the templates (tests) and for the optional chat-model writer
(`instruction_for`, `make_writer`), whose rewrite falls back to the template when it fails.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any, Callable, Sequence

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


def render_recipe(stages, verifier: dict, servers) -> str:
    """Returns the recipe-level instruction as generated before issue 24 (every call named in
    order; the shipped quickstart task sets hold exactly this text)."""
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


# ------------------------------------------------------------------ levels (issue 24)

LEVELS = ("recipe", "stage", "goal")

# How a user names common result fields (a schema's own description wins).
_FIELD_WORDS = {
    "updated": "last-updated date", "eta": "estimated delivery date", "kind": "type",
    "count": "number of {plural}", "total_count": "number of {plural}",
    "num_results": "number of {plural}", "seats_left": "number of seats left",
    "open_tickets": "number of open tickets", "stock": "number in stock",
    "customer_email": "customer's email address", "email": "email address",
    "sender": "sender's address", "traveler_email": "traveler's email address",
    "agent_email": "agent's email address", "to": "recipients", "cc": "cc recipients",
    "price_per_night": "price per night", "total_price": "total price", "rate": "exchange rate",
    "tracking_number": "tracking number", "account_number": "account number",
    "start_time": "start time", "end_time": "end time", "departure_time": "departure time",
    "arrival_time": "arrival time", "shared_with": "people it is shared with",
    "counterparty": "counterparty", "body": "text", "assignee": "assignee",
    "shipping_address": "shipping address", "date": "date", "phone": "phone number",
}
_DISCOVERY = ("get", "list", "search")


def _plural(noun: str) -> str:
    if noun.endswith("y") and not noun.endswith(("ay", "ey", "oy")):
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def field_phrase(field: str, entity: str = "", description: str | None = None) -> str:
    """Returns how a user names a result field: its schema description when there is one, a
    phrase for common names (`updated` -> "last-updated date"), else its words."""
    if description:
        d = description.strip().rstrip(".")
        return d[:1].lower() + d[1:]
    leaf = field.rsplit(".", 1)[-1].replace("[]", "").replace("*", "")
    w = _FIELD_WORDS.get(leaf)
    if w:
        return w.format(plural=_plural(entity or "item"))
    return _words(leaf) or "value"


def entity_phrase(tool: str) -> str:
    """Returns the thing a tool works on, in words (`update_ticket_status` -> "ticket status",
    `find_contact_by_email` -> "contact", `add_to_cart` -> "cart")."""
    words = sch.split_words(tool)
    verbs = set().union(*sch._VERBS.values()) | {"append", "pay", "request", "share", "reply",
                                                  "forward", "send", "transfer", "book"}
    rest = words[1:] if len(words) > 1 and words[0] in verbs else words
    while rest and rest[0] in sch._STOP:
        rest = rest[1:]
    out = []
    for w in rest:
        if w in sch._STOP:
            break
        out.append(w)
    out = out or rest or words
    return " ".join(out[:-1] + [sch.singular(out[-1])])


def _is_id(param: str) -> bool:
    return param == "id" or param.endswith("_id")


def _id_entity(param: str) -> str:
    key = sch.semantic_key(param)
    return key.split(":", 1)[1] if key.startswith("id:") else ""


def _own_id(obs: dict, step) -> str | None:
    """Returns the key of the id of the record a result is (shards sort keys, so not simply
    the first: a ticket's `ticket_id` over its `order_id`): the one the call was given, else
    the one naming the tool's entity, else `id`, else the first."""
    keys = sorted(k for k in obs if _is_id(k) and isinstance(obs[k], (str, int)))
    given = [k for k in keys if any(a == obs[k] or a == [obs[k]]
                                    for a in step.arguments.values())]
    words = set(sch.split_words(step.tool)) | {sch.singular(w) for w in
                                               sch.split_words(step.tool)}
    named = [k for k in keys if _id_entity(k) in words]
    return (given or named or [k for k in keys if k == "id"] or keys or [None])[0]


def _named(entity: str, k: str, v: Any) -> str:
    if k == "title":
        return f"the {entity} titled {_fmt(v)}"
    if k == "name":
        return f"the {entity} named {_fmt(v)}"
    if k == "subject":
        return f"the {entity} with the subject {_fmt(v)}"
    if k == "sender":
        return f"the {entity} from {_fmt(v)}"
    return f"the {entity} whose {field_phrase(k)} is {_fmt(v)}"


def _join(parts: Sequence[str]) -> str:
    parts = [p for p in parts if p]
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


class _Describer:
    """Noun phrases for the records and values of a gold chain, as a user would name them."""

    def __init__(self, stages):
        self.stages = stages

    def step(self, c) -> Any:
        return self.stages[c[0]][c[1]]

    def literal(self, v: Any) -> str:
        if isinstance(v, list):
            return _join([_fmt(x) for x in v])
        return _fmt(v)

    def arg(self, c, p: str) -> str:
        """Returns the phrase for argument p of call c: the value itself when the user supplies
        it, else a description of where it comes from."""
        s = self.step(c)
        src = s.sources.get(p, {"from": "literal"})
        v = s.arguments[p]
        if src.get("from") != "step":
            return self.literal(v)
        return self.value(src, v[0] if isinstance(v, list) and len(v) == 1 else v)

    def main_id(self, c) -> str | None:
        """Returns the id parameter naming the record call c acts on (the tool's own entity
        first), or None."""
        s = self.step(c)
        ids = [p for p in s.arguments if _is_id(p)]
        if not ids:
            return None
        words = set(sch.split_words(s.tool))
        own = [p for p in ids if _id_entity(p) in words]
        return (own or ids)[0]

    def qualifiers(self, c, skip: str | None = None, all_inputs: bool = False) -> str:
        """Returns what narrows a lookup: the records it belongs to ("of the account named
        ...") and the values the user states ("with city "Paris""); other inputs taken from
        outputs only with `all_inputs` (a list's element is named by its own descriptor)."""
        s = self.step(c)
        of, withs = [], []
        for p in s.arguments:
            if p == skip:
                continue
            src = s.sources.get(p, {"from": "literal"})
            if _is_id(p) and src.get("from") == "step":
                of.append(self.arg(c, p))
            elif src.get("from") != "step" or all_inputs:
                withs.append(f"{_words(p)} {self.arg(c, p)}")
        return (" of " + _join(of) if of else "") + (" with " + _join(withs) if withs else "")

    def record(self, c, single: bool = False) -> str:
        """Returns the record (or, for list/search, the records) call c is about."""
        s = self.step(c)
        kind = sch.tool_kind(s.tool)
        ent = entity_phrase(s.tool)
        obs = s.observation if isinstance(s.observation, dict) else {}
        k = _own_id(obs, s)
        if kind == "create" and k and _id_entity(k) and \
                not any(a == obs[k] for a in s.arguments.values()):
            ent = _id_entity(k)  # book_hotel makes a booking
        if kind == "create":
            for k in ("title", "name", "subject"):
                v = s.arguments.get(k)
                if isinstance(v, str) and s.sources.get(k, {}).get("from") != "step":
                    return _named(f"new {ent}", k, v).replace("the new", "the new", 1)
            return f"the new {ent}"
        p = self.main_id(c)
        if p is not None:
            desc = self.arg(c, p)
            if kind in _DISCOVERY and _id_entity(p) and _id_entity(p) not in ent.split():
                noun = _plural(ent) if kind in ("list", "search") and not single else ent
                return f"the {noun} of {desc}" + self.qualifiers(c, skip=p)
            return desc
        many = isinstance(s.observation, list) or not k  # find_contact_by_email: one
        noun = _plural(ent) if kind in ("list", "search") and many and not single else ent
        return f"the {noun}" + self.qualifiers(c, all_inputs=True)

    def value(self, src: dict, v: Any) -> str:
        """Returns a description of value v taken from the output of call (stage, index) at
        `field` (with its `pick`), never the value itself."""
        c = (src["stage"], src["index"])
        u = self.step(c)
        field = src.get("field", "")
        leaf = field.rsplit(".", 1)[-1].replace("[]", "").replace("*", "")
        # a value the call was given and returns (get_note(id).note_id): describe the input
        for p, a in u.arguments.items():
            if not isinstance(v, (list, dict, bool)) and (a == v or a == [v]):
                return self.arg(c, p)
        ent = entity_phrase(u.tool)
        pick = src.get("pick")
        if re.search(r"\[\][^\[]*\.", field):  # an element of a list of records
            prefix = field.rsplit("[]", 1)[0].rsplit(".", 1)[-1].replace("[]", "")
            item_ent = sch.singular(prefix) if prefix and prefix != "result" else ent
            if pick and "field" in pick:
                item = _named(item_ent, pick["field"], pick["value"])
                among = self.qualifiers(c, all_inputs=True)
                if sch.tool_kind(u.tool) not in ("list", "search"):
                    item += f" in {self.result(c)}"
                elif among:
                    item += f" among the {_plural(ent)}{among}"
            elif sch.tool_kind(u.tool) in ("list", "search"):
                item = "the " + self.record(c, single=True)[4:]
            else:
                item = f"the {item_ent} in {self.result(c)}"
            return self._field_of(leaf, item_ent, item)
        rec = self.result(c)
        if leaf in ("count", "total_count", "num_results"):
            return f"the number of {self.record(c)[4:]}"
        if isinstance(u.observation, dict) and leaf == _own_id(u.observation, u):
            return rec  # the result's own id: the record itself
        return self._field_of(leaf, ent, rec)

    def _field_of(self, leaf: str, ent: str, rec: str) -> str:
        if not leaf or leaf == "result" or leaf == "id" or \
                _is_id(leaf) and _id_entity(leaf) in ent.split():
            return rec
        if _is_id(leaf):
            return f"the {_id_entity(leaf) or _words(leaf)} of {rec}"
        return f"the {field_phrase(leaf, ent)} of {rec}"

    def result(self, c) -> str:
        """Returns the record a call returned: the one it acted on (tag_note returns the note),
        the one it created, or what an action produced ("the transaction returned when you pay
        the payee named ...")."""
        s = self.step(c)
        kind = sch.tool_kind(s.tool)
        obs = s.observation if isinstance(s.observation, dict) else {}
        k = _own_id(obs, s)
        for p, a in s.arguments.items():
            if k is not None and (a == obs[k] or a == [obs[k]]):
                return self.arg(c, p)  # add_attendee returns the event it was given
        if kind in _DISCOVERY or kind == "create" or k is None:
            return self.record(c, single=True)
        what = _id_entity(k) or entity_phrase(s.tool)
        verb = sch.split_words(s.tool)[0]
        for p, a in s.arguments.items():
            # the user's own words name what the call made best ("created when you reply
            # with body "...""), rather than a chain of "returned when you ..."
            if isinstance(a, str) and not _is_id(p) and \
                    s.sources.get(p, {}).get("from") == "literal":
                return f"the {what} created when you {verb} with {_words(p)} {_fmt(a)}"
        return f"the {what} returned when you {self.effect(c, short=True)}"

    def ask(self, verifier: dict) -> str:
        """Returns the closing request for an exact/set verifier ("" for state verifiers)."""
        kind = verifier["kind"]
        if kind == "state":
            return ""
        src = verifier["source"]
        desc = src.get("description")
        if kind == "set":
            c = (src["stage"], src["index"])
            field = src.get("field", "")
            leaf = field.rsplit(".", 1)[-1].replace("[]", "")
            u = self.step(c)
            if field.endswith("[]"):
                of = f" of {self.result(c)}" if u.arguments else ""
                return f"Reply with all the {field_phrase(leaf, description=desc)}{of}."
            prefix = field.rsplit("[]", 1)[0].rsplit(".", 1)[-1]
            ent = sch.singular(prefix) if prefix and prefix != "result" else \
                entity_phrase(u.tool)
            what = _plural(field_phrase(leaf, ent, desc))
            where = self.record(c)[4:] if sch.tool_kind(u.tool) in ("list", "search") else \
                f"{_plural(ent)} in {self.record(c)}"
            return f"Reply with the {what} of all {where}."
        return f"Reply with {self.value(src, object())}." if not desc else \
            f"Reply with the {field_phrase('', description=desc)} of " \
            f"{self.record((src['stage'], src['index']), single=True)}."

    def effect(self, c, short: bool = False) -> str:
        """Returns what the user wants a state-changing call to do, without naming ids (short:
        the verb and its object only)."""
        s = self.step(c)
        kind = sch.tool_kind(s.tool)
        words = sch.split_words(s.tool)
        verb, rest = words[0], words[1:]
        obj_p = self.main_id(c)
        obj = self.arg(c, obj_p) if obj_p else None
        name_p = next((p for p in ("title", "name", "subject") if p in s.arguments
                       and kind == "create"), None)
        named, sets, withs, preps = [], [], [], []
        setter = obj is not None and verb in ("update", "set", "change", "edit", "modify")
        for p in s.arguments:
            if p == obj_p:
                continue
            val = self.arg(c, p)
            v = s.arguments[p]
            if p == name_p:
                named.append({"title": "titled", "name": "named",
                              "subject": "with the subject"}[p] + f" {val}")
            elif isinstance(v, bool):
                preps.append("as unread" if p == "read" and not v else
                             f"as {'' if v else 'not '}{_words(p)}")
            elif setter:
                sets.append(f"its {_words(p)} to {val}")
            elif p in ("to", "cc"):
                preps.append(f"{'to' if p == 'to' else 'with a copy to'} {val}")
            elif p == "folder":
                preps.append(f"to the {val} folder" if s.sources.get(p, {}).get("from") !=
                             "step" else f"to {val}")
            elif verb == "share" and sch.semantic_key(p) == "email":
                preps.append(f"with {val}")
            elif verb == "assign" and sch.semantic_key(p) == "email":
                preps.append(f"to {val}")
            elif _is_id(p):
                preps.append(f"using {val}")
            else:
                withs.append((p, val))
        nouns = [w for w in rest if w not in sch._STOP]
        if obj is None:
            noun = " ".join(rest)
            art = "an" if noun[:1] in "aeiou" else "a"
            head = f"{verb} {art} {noun}" if noun and (kind == "create" or verb == "send") \
                else f"{verb} {noun}".strip()
        elif setter:
            head = f"update {obj}"
        elif verb == "reply":
            head = f"reply to {obj}"
        elif not nouns or [sch.singular(w) for w in nouns] == _id_entity(obj_p).split():
            if rest and rest[0] in ("to", "on", "into") and withs:
                head = f"{verb} {_join([val for _, val in withs])} {rest[0]} {obj}"
                withs = []
            else:
                head = f"{verb} {obj}"
        elif rest[0] == "to":
            noun = " ".join(rest[1:])
            target = [val for p, val in withs if p == noun]
            withs = [(p, val) for p, val in withs if p != noun]
            head = f"{verb} {obj} to the {noun}" + (f" {target[0]}" if target else "")
        elif sch.singular(nouns[0]) == _id_entity(obj_p):
            head = f"{verb} the {' '.join(nouns[1:])} of {obj}"
        elif kind == "create":
            noun = " ".join(nouns)
            art = "an" if noun[:1] in "aeiou" else "a"
            head = f"{verb} {art} {noun} to {obj}"
        else:
            head = f"{verb} the {' '.join(nouns)} of {obj}"
        if short:
            return head
        tail = named + ([": set " + _join(sets)] if sets else []) + \
            (["with " + _join([f"{_words(p)} {val}" for p, val in withs])] if withs else []) + \
            preps
        return head + "".join((" " if not t.startswith(":") else "") + t for t in tail)

    def discovery(self, c) -> str:
        """Returns the stage-level goal of a list/search/get call: what it looks up."""
        s = self.step(c)
        kind = sch.tool_kind(s.tool)
        picks = []
        for st in self.stages:
            for t in st:
                for src in t.sources.values():
                    if src.get("from") == "step" and (src["stage"], src["index"]) == c and \
                            (src.get("pick") or {}).get("field"):
                        ent = entity_phrase(s.tool)
                        prefix = src["field"].rsplit("[]", 1)[0].rsplit(".", 1)[-1]
                        item = sch.singular(prefix) if prefix and prefix != "result" else ent
                        p = _named(item, src["pick"]["field"], src["pick"]["value"])
                        if p not in picks:
                            picks.append(p)
        if picks and kind in ("list", "search"):
            where = f" among {self.record(c)}" if s.arguments else ""
            return "look up " + _join(picks) + where
        return "look up " + self.record(c)


def render_instruction(stages, verifier: dict, servers, level: str = "recipe") -> str:
    """Returns the instruction for gold stages and their verifier at `level` (see LEVELS).

    "recipe" is `render_recipe`'s call-by-call text with the ask phrased from the answer field
    ("Reply with the number of notes."); "stage" says what each stage is for, without tools;
    "goal" says only what the user wants done and asks (the chain's state-changing calls and
    the asked value), leaving discovery calls and their order to the agent.
    """
    if level not in LEVELS:
        raise ValueError(f"instruction level {level!r}; expected one of {LEVELS}")
    d = _Describer(stages)
    ask = d.ask(verifier)
    lookups = set(discovery_calls(stages, verifier))

    def is_effect(i, j, s):
        return (i, j) not in lookups

    sents = []
    if level == "goal":
        for i, st in enumerate(stages):
            for j, s in enumerate(st):
                if is_effect(i, j, s):
                    sents.append(d.effect((i, j)) + ".")
    else:
        for i, st in enumerate(stages):
            if level == "recipe":
                phrases = [step_phrase(s, stages) for s in st]
            else:
                phrases = [d.effect((i, j)) if is_effect(i, j, s) else d.discovery((i, j))
                           for j, s in enumerate(st)]
            lead = "" if len(stages) == 1 else ("First, " if i == 0 else "Then ")
            sents.append(lead + _join(phrases) + ".")
    if level == "goal" and sents and ask:
        ask = "Then r" + ask[1:]
    text = " ".join(x[0].upper() + x[1:] for x in sents)
    if len(stages) > 3:
        text = f"Using the {', '.join(servers)} tools: " + text
    return (text + (" " + ask if ask else "")).strip()


def discovery_calls(stages, verifier: dict) -> list[tuple[int, int]]:
    """Returns the gold calls that only find things out: list/search/get calls, except a
    read whose state change the verifier checks (read_email marks the mail read), which the
    user asks for like any other effect."""
    src = verifier.get("source") or {}
    checked = {tuple(c) for c in verifier.get("needs", ())} - {(src.get("stage"),
                                                                 src.get("index"))}
    return [(i, j) for i, st in enumerate(stages) for j, s in enumerate(st)
            if sch.tool_kind(s.tool) in _DISCOVERY and (i, j) not in checked]


def names_tool(text: str, tool: str) -> bool:
    """Returns whether an instruction names a tool: its words in order, articles allowed
    between them ("get the transaction" names get_transaction)."""
    words = [sch.singular(w) for w in sch.split_words(tool) if w not in sch._STOP]
    if not words:
        return False
    gap = r"\W+(?:(?:the|a|an|all|my|your|its|of|to|for|by|with|from|in)\W+)*"
    pat = r"\b" + gap.join(re.escape(w) + r"(?:e?s)?" for w in words) + r"\b"
    return re.search(pat, text, flags=re.IGNORECASE) is not None


def instruction_facts(stages, verifier: dict, answer: Any) -> tuple[list[str], list[str]]:
    """Returns (values an instruction must state verbatim, values it must not contain).

    Stated: every argument the user supplies (`sources` literal/state; not booleans, which
    read as words) and every descriptor a list pick names. Secret: what the agent must
    discover: arguments taken from outputs, ids in outputs, and the answer.
    """
    keep: list[str] = []
    secret: list[str] = []
    for st in stages:
        for s in st:
            for p, v in s.arguments.items():
                src = s.sources.get(p, {"from": "literal"})
                vals = v if isinstance(v, list) else [v]
                if src.get("from") == "step":
                    secret += [str(x) for x in vals if not isinstance(x, (bool, dict, list))]
                    pick = src.get("pick") or {}
                    if "value" in pick:
                        keep.append(str(pick["value"]))
                else:
                    keep += [json.dumps(x) if isinstance(x, float) else str(x) for x in vals
                             if not isinstance(x, (bool, dict, list))]
            for k, v in _id_fields(s.observation):
                secret.append(str(v))
    vals = answer if isinstance(answer, list) else [answer]
    if verifier["kind"] in ("exact", "set"):
        secret += [str(x) for x in vals if not isinstance(x, (bool, dict, list))]
    kept = {k.casefold() for k in keep}
    secret = sorted({x for x in secret if x.casefold() not in kept})
    return sorted(set(keep)), secret


def _id_fields(value: Any):
    for _, r in sch.iter_records(value):
        for k, v in r.items():
            if _is_id(k) and isinstance(v, (str, int)) and not isinstance(v, bool):
                yield k, v


def check_instruction(text: str, keep: Sequence[str], secret: Sequence[str]) -> list[str]:
    """Returns what is wrong with an instruction (empty: fine): a user-supplied value it does
    not state verbatim, or a value the agent must discover that it gives away (strings of 3+
    characters, numbers of 4+, matched as whole words, ignoring case)."""
    problems = [f"missing {k!r}" for k in keep if k not in text]
    low = text.casefold()
    for k in sorted(keep, key=len, reverse=True):
        if len(k) >= 3:  # a stated value may contain a secret one ("Harbor New York")
            low = low.replace(k.casefold(), " ")
    for x in secret:
        short = len(x) < 3 or (re.fullmatch(r"-?[\d.]+", x) is not None and len(x) < 4)
        if not short and re.search(r"(?<!\w)" + re.escape(x.casefold()) + r"(?!\w)", low):
            problems.append(f"leaks {x!r}")
    return problems


def instruction_for(task, level: str, writer: Callable[[str], str] | None = None,
                    ) -> tuple[str, int]:
    """Returns (instruction, 1 if a writer's rewrite was rejected else 0) for a task.

    The template at `level`; with a writer (a chat model, `make_writer`), its rewrite when it
    passes `check_instruction` (every stated value kept verbatim, nothing to discover given
    away), else the template."""
    text = render_instruction(task.stages, task.verifier, task.servers, level)
    if writer is None:
        return text, 0
    new = apply_rewriter(text, writer)
    if new == text:
        return text, 0
    keep, secret = instruction_facts(task.stages, task.verifier, task.answer)
    if check_instruction(new, keep, secret):
        return text, 1
    return new, 0


def with_instruction_level(tasks, level: str):
    """Returns copies of whole-chain tasks whose instruction is rendered at `level` (the chain,
    verifier and id unchanged): one task set serves every curriculum level."""
    import dataclasses  # noqa: PLC0415

    out = []
    for t in tasks:
        if "nominal_horizon" not in t.meta:
            raise ValueError(f"task {t.id} was not generated whole-chain (tasks.whole_chain); "
                             "only those have instructions at every level")
        out.append(dataclasses.replace(t, instruction=render_instruction(
            t.stages, t.verifier, t.servers, level), meta={**t.meta, "instruction_level": level}))
    return out


# --------------------------------------------------------------------------- writers

WRITER_PROMPT = (
    "Rewrite this request to an assistant as the user would write it: natural, brief, in the "
    "first person. Keep every quoted value exactly as written, inside double quotes. Do not add "
    "ids, values or steps that are not in the request. Reply with the rewritten request only."
    "\n\nRequest: {text}")


def make_writer(kind: str, model: str = "", base_url: str = "",
                api_key_env: str = "OPENAI_API_KEY", checkpoint: str = "", tokenizer: str = "",
                max_new_tokens: int = 256, temperature: float = 0.0, timeout_s: float = 60.0,
                ) -> Callable[[str], str] | None:
    """Returns an instruction writer (text -> rewritten text), or None for kind "" (off).

    kind "openai": an OpenAI-compatible chat endpoint (`base_url`, e.g.
    http://localhost:8000/v1, `model`, key from env `api_key_env`); "sampler": a local
    checkpoint (HF dir or training workdir) through our sampler; "module:function": a factory
    returning the writer (tests script one). Its rewrites are checked by `instruction_for`.
    """
    if not kind:
        return None
    if kind == "openai":
        return _openai_writer(model, base_url, api_key_env, max_new_tokens, temperature,
                              timeout_s)
    if kind == "sampler":
        return _sampler_writer(checkpoint, tokenizer, max_new_tokens, temperature)
    if ":" in kind:
        import importlib  # noqa: PLC0415

        mod, fn = kind.split(":")
        return getattr(importlib.import_module(mod), fn)()
    raise ValueError(f"writer kind {kind!r}: use '' (off), 'openai', 'sampler' or "
                     "'module:function'")


def _openai_writer(model: str, base_url: str, api_key_env: str, max_tokens: int,
                   temperature: float, timeout_s: float) -> Callable[[str], str]:
    import urllib.request  # noqa: PLC0415

    if not base_url or not model:
        raise ValueError("writer 'openai' needs base_url (e.g. http://localhost:8000/v1) and model")
    url = base_url.rstrip("/") + "/chat/completions"
    key = os.environ.get(api_key_env, "") if api_key_env else ""

    def write(text: str) -> str:
        body = json.dumps({"model": model, "temperature": temperature, "max_tokens": max_tokens,
                           "messages": [{"role": "user",
                                         "content": WRITER_PROMPT.format(text=text)}]})
        req = urllib.request.Request(url, data=body.encode(), method="POST", headers={
            "Content-Type": "application/json", **({"Authorization": f"Bearer {key}"}
                                                   if key else {})})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read())["choices"][0]["message"]["content"]
    return write


def _sampler_writer(checkpoint: str, tokenizer: str, max_new_tokens: int,
                    temperature: float) -> Callable[[str], str]:
    # Models are imported only here: task generation never needs them otherwise.
    import jax  # noqa: PLC0415

    from toolverse_jax.eval.policies import (load_model, resolve_tokenizer,  # noqa: PLC0415
                                             sampling_params)
    from toolverse_jax.models.chat import render_chat  # noqa: PLC0415
    from toolverse_jax.sampling import generate  # noqa: PLC0415

    if not checkpoint:
        raise ValueError("writer 'sampler' needs checkpoint (an HF dir or a training workdir)")
    cfg, params, _ = load_model(checkpoint)
    tok = resolve_tokenizer(tokenizer, checkpoint)
    sp = sampling_params(tok, max_new_tokens, temperature)
    rng = [jax.random.key(0)]

    def write(text: str) -> str:
        msgs = [{"role": "user", "content": WRITER_PROMPT.format(text=text)}]
        ids = render_chat(msgs, tok, add_generation_prompt=True).tokens
        rng[0], k = jax.random.split(rng[0])
        out = generate(params, cfg, [ids], sp, k)
        n = int(out.lengths[0])
        return tok.decode([int(x) for x in out.tokens[0][:n]
                           if int(x) not in sp.stop_token_ids]).strip()
    return write
