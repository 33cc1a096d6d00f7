"""What a task's verifier depends on: record-level effects of gold calls, one state check per
effect, the dependency closure of the verifier, trimming a chain to it, and the shortcut test.

A gold call is on the *closure* of the verifier when the verifier needs it: it wrote a field a
state check names, it produced the asked value, or it feeds (through `sources`, or through the
state: `GoldStep.after`) a call that is. The effective horizon is the number of stages that
hold a closure call. Whole-chain DUSA (issue 24) trims every chain to its closure; the shortcut
test replays a chain with one stage (and every call that needs its outputs) left out and
expects the verifier to fail.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

from toolverse_jax.tasks import graph as tg
from toolverse_jax.tasks import schema as sch
from toolverse_jax.tasks.executor import Close, Reset, State, Step
from toolverse_jax.tasks.task import GoldStep, Task, check_state

Call = tuple[int, int]          # (stage, index) of a gold call
Ident = tuple[str, str, str]    # (server, collection path, record id)


# ------------------------------------------------------------------------------- records


def record_id_key(rec: dict) -> str | None:
    """Returns the key of a record's own id (`id`, else its first non-empty `*_id`), or None."""
    for k, v in rec.items():
        if (k == "id" or k.endswith("_id") and "id" not in rec) and \
                isinstance(v, (str, int)) and not isinstance(v, bool) and v != "":
            return k
    return None


def state_records(state: dict | None, servers: Iterable[str]) -> dict[Ident, dict]:
    """Returns {(server, collection, id): record} for the top-level records of each server's
    state (records nested in another record, such as an order's items, belong to it)."""
    out: dict[Ident, dict] = {}
    for server in sorted(servers):
        owners: set[str] = set()
        for path, rec in sch.iter_records((state or {}).get(server)):
            k = record_id_key(rec) if path else None
            if k is None or any(path[:i] in owners for i, ch in enumerate(path) if ch in ".["):
                continue
            owners.add(path)
            rid = str(rec[k])
            coll = path[:-len(rid) - 1] if path.endswith("." + rid) else path
            out[(server, coll, rid)] = rec
    return out


def _flat(v: Any) -> list:
    if isinstance(v, list):
        return [y for x in v for y in _flat(x)]
    if isinstance(v, dict):
        return [y for x in v.values() for y in _flat(x)]
    return [v]


def mentions(step: GoldStep) -> set[str]:
    """Returns every scalar of a call's arguments and result, as strings."""
    return {str(x) for x in _flat(step.arguments) + _flat(step.observation)
            if x is not None and not isinstance(x, bool)}


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (
        isinstance(a, (int, float)) and isinstance(b, (int, float)) and
        not isinstance(a, bool) and not isinstance(b, bool) and abs(a - b) < 1e-9)


@dataclasses.dataclass
class Effect:
    """One call's change of one record: `old`/`new` (None: absent) and the fields it claims
    (`{"*"}` for a create or a removal). A call claims the changed fields its arguments set
    ("title" of update_note(title=...)); side effects (an `updated` date) only when it sets
    nothing else, so a check never rests on a field several calls would write."""
    call: Call
    ident: Ident
    old: dict | None
    new: dict | None
    claims: frozenset
    direct: frozenset = frozenset()    # fields set to an argument's value (not appended to)


def _claims(step: GoldStep, old: dict | None, new: dict | None) -> tuple[frozenset, frozenset]:
    """Returns (claimed fields, directly set fields) of one record change."""
    if old is None or new is None:
        return frozenset({"*"}), frozenset({"*"})
    changed = {k for k in set(old) | set(new) if old.get(k) != new.get(k)}
    args = [a for a in _flat(step.arguments) if a is not None]
    direct = set()
    for k in changed:
        nv, ov = new.get(k), old.get(k)
        if isinstance(nv, list):
            added = [x for x in nv if x not in (ov if isinstance(ov, list) else [])]
            if any(_same(y, a) for x in added for y in _flat(x) for a in args):
                direct.add(k)
        elif any(_same(nv, a) for a in args):
            direct.add(k)
    return frozenset(direct or changed), frozenset(direct)


def stage_effects(stage: Sequence[GoldStep], k: int, before: dict[Ident, dict],
                  after: dict[Ident, dict]) -> list[list[Effect]]:
    """Returns, per call of stage k, the record changes it made (records of `before` vs
    `after`, by `state_records`). A change goes to the state-changing calls that mention the
    record's id (to reads that do when none does), else to every state-changing call of that
    server in the stage."""
    out: list[list[Effect]] = [[] for _ in stage]
    ment = [mentions(s) for s in stage]
    for ident in sorted(set(before) | set(after)):
        old, new = before.get(ident), after.get(ident)
        if old == new:
            continue
        who = [j for j, s in enumerate(stage) if s.server == ident[0] and ident[2] in ment[j]]
        writers = [j for j in who if sch.tool_kind(stage[j].tool) not in sch.READ_ONLY_KINDS]
        # a read in the same stage shows the change; only reads that are alone made it
        # (read_email marks a mail read)
        who = writers or who
        if not who:
            who = [j for j, s in enumerate(stage) if s.server == ident[0] and
                   sch.tool_kind(s.tool) not in sch.READ_ONLY_KINDS]
        fx = [Effect((k, j), ident, old, new, *_claims(stage[j], old, new)) for j in who]
        if len(fx) > 1 and old is not None and new is not None:
            # several calls changed one record: each claims what it set; what none set goes
            # to those that set nothing (append_to_note next to tag_note)
            changed = {f for f in set(old) | set(new) if old.get(f) != new.get(f)}
            rest = changed - set().union(*(e.direct for e in fx))
            for e in fx:
                e.claims = e.direct if e.direct else frozenset(rest)
        for e in fx:
            out[e.call[1]].append(e)
    return out


# -------------------------------------------------------------------------------- checks


def _writers(hist: list[Effect], field: str) -> list[Effect] | None:
    """Returns the calls a field's final value needs: its last writer, and the writers before
    when that one built on the value (`_builds_on`: append_to_note); None when one of them
    wrote it as a side effect (a check resting on it would not need that call)."""
    by_stage: dict[int, list[Effect]] = {}
    for e in hist:
        if e.old is None or e.new is None or e.old.get(field) != e.new.get(field):
            by_stage.setdefault(e.call[0], []).append(e)
    if by_stage:
        last = max(by_stage)
        if all("*" not in e.direct and field not in e.direct for e in by_stage[last]) and \
                any(e.call[0] > last for e in hist):
            # a side effect (an `updated` date) that a later call on the record may have
            # written again unseen: nothing can be credited with it
            return None
    out = []
    for k in sorted(by_stage, reverse=True):
        mine = [e for e in by_stage[k] if "*" in e.claims or field in e.claims]
        if not mine:
            return None
        out += mine
        if not any(_builds_on(e, field) for e in mine):
            break
    return out or None


def _builds_on(e: Effect, field: str) -> bool:
    """Returns whether a change computed the field from its previous value (an appended body,
    a debited balance), so the writers before it count too; a value set outright (to an
    argument, or a constant like read_email's `read`) does not."""
    if e.old is None or e.new is None or "*" in e.direct or field in e.direct:
        return False
    old, new = e.old.get(field), e.new.get(field)
    if isinstance(new, (int, float)) and not isinstance(new, bool):
        return isinstance(old, (int, float)) and not isinstance(old, bool)
    return isinstance(new, str) and isinstance(old, str) and bool(old) and old in new


def _adder(hist: list[Effect], field: str, item: Any) -> Effect | None:
    """Returns the call that added `item` to a list field and claims it, or None."""
    first = None
    for e in hist:
        was = (e.old or {}).get(field)
        if e.new is not None and item in (e.new.get(field) or []) and \
                item not in (was if isinstance(was, list) else []):
            if first is not None and e.call[0] != first:
                break
            first = e.call[0]
            if "*" in e.claims or field in e.claims:
                return e
    return None


def _item(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: v for k, v in x.items() if v is not None and not isinstance(v, (dict, list))}
    return x


def effect_checks(initial: dict[Ident, dict], final: dict[Ident, dict],
                  effects: Iterable[Effect], initial_state: dict,
                  fields: list | None = None) -> tuple[list[dict], set[Call]]:
    """Returns (state checks, the calls they need): one check per record the chain created,
    changed or removed (its final state), each field credited to the last call that wrote it.

    A created record is matched by every scalar field but ids and must hold its list items; a
    changed one by its id and the fields the last call that wrote them claims; a removed one by
    its id. A check that already holds in `initial_state` is left out (doing nothing passes).
    A field back at its value from creation needs only the creator. `fields` (if given) gets
    (record, field, checked value) for every scalar field checked (see `repair_closure`).
    """
    hist: dict[Ident, list[Effect]] = {}
    for e in effects:
        hist.setdefault(e.ident, []).append(e)
    checks, needs = [], set()
    for ident in sorted(set(initial) | set(final)):
        old, new = initial.get(ident), final.get(ident)
        h = hist.get(ident)
        if old == new or not h:
            continue
        server = ident[0]
        if new is None:
            gone = next((e for e in reversed(h) if e.new is None), None)
            k = record_id_key(old)
            if gone is None or k is None:
                continue
            check, need = {"server": server, "match": {k: old[k]}, "exists": False}, {gone.call}
        else:
            created = next((e for e in h if e.old is None), None) if old is None else None
            if old is None and created is None:
                continue
            base = created.new if created else old
            match: dict = {}
            contains: dict = {}
            need = {created.call} if created else set()
            if not created:
                k = record_id_key(new)
                match[k] = new[k]
            for f in sorted(new):
                v = new[f]
                if v is None or isinstance(v, dict) or f == "id" or f.endswith("_id") or \
                        isinstance(v, str) and len(v) > 200:
                    continue
                writers = _writers(h, f)
                if isinstance(v, list):
                    was = base.get(f) if isinstance(base.get(f), list) else []
                    keep = [x for x in v if x in was] if created else []
                    for x in v:
                        if x in was:
                            continue
                        # each added item is credited to the call that added it
                        adder = _adder(h, f, x)
                        if adder is not None and adder is not created:
                            keep.append(x)
                            need.add(adder.call)
                    keep = [_item(x) for x in keep if not isinstance(x, list)]
                    if keep:
                        contains[f] = keep
                    continue
                if created and base.get(f) == v:
                    match[f] = v  # set at creation (what changed it and back is not needed)
                elif writers and base.get(f) != v:
                    match[f] = v
                    need |= {e.call for e in writers}
            if not created and len(match) <= 1 and not contains:
                continue
            check = {"server": server, "match": match, "exists": True}
            if contains:
                check["contains"] = contains
        if not check["match"] or check_state(check, initial_state):
            continue
        checks.append(check)
        needs |= need
        if fields is not None and check["exists"]:
            fields += [(ident, f, v) for f, v in check["match"].items()
                       if f != record_id_key(new)]
    return checks, needs


def repair_closure(stages: Sequence[Sequence[GoldStep]], needs: set[Call], effects: list,
                   initial: dict[Ident, dict], fields: list) -> set[Call]:
    """Returns the closure of `needs` grown until every checked field still gets its value
    when only closure calls run: a call kept for one field may also change another (close a
    ticket for its resolution, which sets its status), and the call that set that field back
    (reopening it) is then needed too."""
    by_field: dict[tuple, list[Effect]] = {}
    for e in effects:
        for f in set(e.old or {}) | set(e.new or {}):
            if e.old is None or e.new is None or e.old.get(f) != e.new.get(f):
                by_field.setdefault((e.ident, f), []).append(e)
    needs = set(needs)
    for _ in range(len(effects) + 1):
        keep = closure(stages, needs)
        grow = set()
        for ident, f, v in fields:
            ws = by_field.get((ident, f), [])
            val = (initial.get(ident) or {}).get(f)
            for e in ws:
                if e.call in keep and e.new is not None:
                    val = e.new.get(f)
            if not _same(val, v) and val != v and ws:
                grow.add(ws[-1].call)
        if not grow - needs:
            return keep
        needs |= grow
    return closure(stages, needs)


# ------------------------------------------------------------------------------- closure


def closure(stages: Sequence[Sequence[GoldStep]], needs: Iterable[Call]) -> set[Call]:
    """Returns the gold calls `needs` depend on, themselves included (through `sources` and
    `after`)."""
    todo, seen = list(needs), set()
    while todo:
        c = tuple(todo.pop())
        if c in seen or c[0] >= len(stages) or c[1] >= len(stages[c[0]]):
            continue
        seen.add(c)
        s = stages[c[0]][c[1]]
        todo.extend((src["stage"], src["index"]) for src in s.sources.values()
                    if isinstance(src, dict) and src.get("from") == "step")
        todo.extend(tuple(a) for a in s.after)
    return seen


def verifier_needs(task: Task) -> set[Call]:
    """Returns the gold calls a task's verifier reads directly: `verifier["needs"]` (whole-chain
    tasks), else the answer's source and, for each state check, the latest state-changing call
    that mentions one of its values (an estimate for tasks made before issue 24)."""
    v = task.verifier
    if "needs" in v:
        return {tuple(c) for c in v["needs"]}
    out = set()
    if "source" in v:
        out.add((v["source"]["stage"], v["source"]["index"]))
    for c in v.get("checks", ()):
        vals = {str(x) for x in c["match"].values()}
        hit = None
        for i, st in enumerate(task.stages):
            for j, s in enumerate(st):
                if sch.tool_kind(s.tool) not in sch.READ_ONLY_KINDS and vals & mentions(s):
                    hit = (i, j)
        if hit is not None:
            out.add(hit)
    return out


def effective_horizon(task: Task) -> int:
    """Returns the number of stages that hold a call on the verifier's dependency closure."""
    return len({c[0] for c in closure(task.stages, verifier_needs(task))})


def trim(stages: Sequence[Sequence[GoldStep]], keep: set[Call],
         ) -> tuple[list[list[GoldStep]], dict[Call, Call]]:
    """Returns (stages holding only the `keep` calls, old -> new call positions); sources and
    `after` are renumbered, emptied stages dropped."""
    remap: dict[Call, Call] = {}
    nk = 0
    for k, st in enumerate(stages):
        js = [j for j in range(len(st)) if (k, j) in keep]
        for n, j in enumerate(js):
            remap[(k, j)] = (nk, n)
        nk += bool(js)
    return _renumber(stages, remap)


def _renumber(stages: Sequence[Sequence[GoldStep]], remap: dict[Call, Call],
              ) -> tuple[list[list[GoldStep]], dict[Call, Call]]:
    """Returns (the calls of `remap` at their new positions, remap) with sources and `after`
    pointing at the new positions."""
    out: list[list[GoldStep]] = [[] for _ in range(len({c[0] for c in remap.values()}))]
    for (k, j), (a, _) in sorted(remap.items(), key=lambda kv: kv[1]):
        s = stages[k][j]
        src = {}
        for p, d in s.sources.items():
            d = dict(d)
            if d.get("from") == "step":
                d["stage"], d["index"] = remap[(d["stage"], d["index"])]
            src[p] = d
        after = sorted(list(remap[tuple(x)]) for x in s.after if tuple(x) in remap)
        out[a].append(dataclasses.replace(s, sources=src, after=after))
    return out, remap


def merge_stages(stages: Sequence[Sequence[GoldStep]], target: int, max_per_stage: int,
                 ) -> tuple[list[list[GoldStep]], dict[Call, Call]]:
    """Returns (stages, old -> new call positions) with adjacent stages merged until at most
    `target` remain: two stages merge
    when together they hold at most `max_per_stage` calls and no call of the second needs an
    output of the first. Calls keep their order, so a replay executes exactly the same calls."""
    groups = [[k] for k in range(len(stages))]
    while len(groups) > target:
        best = None
        for g in range(len(groups) - 1, 0, -1):
            a, b = groups[g - 1], groups[g]
            if sum(len(stages[k]) for k in a + b) > max_per_stage:
                continue
            if any(src.get("from") == "step" and src["stage"] in a
                   for k in b for s in stages[k] for src in s.sources.values()) or \
                    any(x[0] in a for k in b for s in stages[k] for x in s.after):
                continue
            best = g
            break
        if best is None:
            break
        groups[best - 1:best + 1] = [groups[best - 1] + groups[best]]
    remap: dict[Call, Call] = {}
    for n, grp in enumerate(groups):
        off = 0
        for k in grp:
            for j in range(len(stages[k])):
                remap[(k, j)] = (n, off + j)
            off += len(stages[k])
    return _renumber(stages, remap)


# ----------------------------------------------------------------- replay programs


def refresh_program(task: Task, executor: Any):
    """Program that replays a (trimmed) chain in a fresh episode and, when it still holds,
    stores what the replay returned as the observations; returns (ok, reason).

    It holds when every call succeeds, every argument taken from an output is still found
    there (the picked element too), and the verifier passes on the replay. Fills each step's
    agent-facing `name`."""
    from toolverse_jax.tasks.replay import answer_text, execute_chain, replayed_answer  # noqa: PLC0415

    produced, final = yield from execute_chain(task, executor)
    if produced is None:
        return False, final
    for st in task.stages:
        for s in st:
            for p, src in s.sources.items():
                if src.get("from") != "step":
                    continue
                obs = produced[src["stage"]][src["index"]]
                want = s.arguments[p]
                want = want[0] if isinstance(want, list) and len(want) == 1 else want
                if want not in tg.field_values(obs, src["field"]):
                    return False, f"{s.tool}.{p} no longer in the output it came from"
                pick = src.get("pick")
                if pick and "field" in pick and not _pick_holds(obs, src["field"], pick, want):
                    return False, f"{s.tool}.{p}: the picked element changed"
    v = task.verifier
    if v["kind"] in ("exact", "set"):
        got = replayed_answer(task, produced)
        if not task.check(answer_text(got), final):
            return False, f"replayed answer {got!r} does not pass the verifier"
    elif not task.check(None, final):
        return False, "final-state check failed on replay"
    for st, obs in zip(task.stages, produced):
        for s, o in zip(st, obs):
            s.observation = o
    return True, "ok"


def _pick_holds(obs: Any, field: str, pick: dict, val: Any) -> bool:
    prefix, _, leaf = field.rpartition("[].")
    items = obs
    for part in [x for x in prefix.split(".") if x]:
        items = items.get(part) if isinstance(items, dict) else None
    if not isinstance(items, list):
        return False
    hits = [it for it in items if isinstance(it, dict) and it.get(pick["field"]) == pick["value"]]
    return len(hits) == 1 and hits[0].get(leaf) == val


def left_out(task: Task, stage: int) -> set[Call]:
    """Returns the calls an agent that skips `stage` cannot make: that stage's calls and every
    call that needs one of their outputs (through `sources`, transitively)."""
    out = {(stage, j) for j in range(len(task.stages[stage]))}
    for i, st in enumerate(task.stages):
        for j, s in enumerate(st):
            if any(src.get("from") == "step" and (src["stage"], src["index"]) in out
                   for src in s.sources.values()) or any(tuple(a) in out for a in s.after):
                out.add((i, j))
    return out


def shortcut_program(task: Task, executor: Any, stage: int):
    """Program that replays the chain without `stage` (and what needs its outputs); returns
    whether the verifier still passes (a shortcut) — it should not."""
    skip = left_out(task, stage)
    handle = yield Reset(task.spec)
    produced: dict[Call, Any] = {}
    for i, st in enumerate(task.stages):
        calls = [(j, s) for j, s in enumerate(st) if (i, j) not in skip]
        if not calls:
            continue
        res = yield Step([(handle, s.server, s.tool, s.arguments) for _, s in calls])
        for (j, _), r in zip(calls, res):
            if r.status == "ok":
                produced[(i, j)] = r.value
    final = yield State(handle)
    yield Close(handle)
    v = task.verifier
    from toolverse_jax.tasks.replay import answer_text  # noqa: PLC0415

    if v["kind"] in ("exact", "set"):
        key = (v["source"]["stage"], v["source"]["index"])
        if key not in produced:
            return False
        obs = produced[key]
        vals = tg.field_values(obs, v["source"]["field"]) if v["source"]["field"] else [obs]
        got = vals[0] if v["kind"] == "exact" and vals else vals
        return task.check(answer_text(got), final)
    return task.check(None, final)


def shortcut_stages(tasks: Sequence[Task], executor: Any, max_concurrent: int = 16,
                    ) -> list[list[int]]:
    """Returns, per task, the stages whose omission still passes its verifier (empty: the
    whole chain is needed)."""
    from toolverse_jax.tasks.executor import run_programs  # noqa: PLC0415
    from toolverse_jax.tasks.replay import as_executor  # noqa: PLC0415

    ex = as_executor(executor)
    jobs = [(n, i) for n, t in enumerate(tasks) for i in range(len(t.stages))]
    res = run_programs(ex, (shortcut_program(tasks[n], ex, i) for n, i in jobs),
                       max_concurrent=max_concurrent)
    out: list[list[int]] = [[] for _ in tasks]
    for (n, i), r in zip(jobs, res):
        if r is True:
            out[n].append(i)
    return out
