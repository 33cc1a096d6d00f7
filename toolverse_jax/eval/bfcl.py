"""BFCL-v3 multi-turn evaluation through the env pool, scored by BFCL's own checker.

Protocol (BFCL's `inference_multi_turn_prompting` and `_evaluate_single_multi_turn_entry`):
- user turns in order; within a turn the model takes steps until a step has no tool call (or
  its calls fail to parse), at most `max_steps` (20) steps, past which the entry is
  force-terminated and failed;
- miss_func entries hold out functions: they are absent from the first prompt, and at the turn
  `missed_function` names (an empty user turn in the data) a user message lists them, followed by
  BFCL's "I have updated some more functions you can choose from. What about now?";
- the calls run in our MCP-wrapped BFCL servers (envs/bfcl.py) through the env pool; the verdict is
  BFCL's `multi_turn_checker` on the decoded call strings per turn and step (it re-executes them on
  fresh BFCL instances and compares state and responses with the ground truth's).
`excluded_function` is ignored, as BFCL's harness ignores it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import json
import keyword
import re
from typing import Any, Protocol, Sequence

from toolverse_jax.envs import bfcl as bfcl_env
from toolverse_jax.envs.pool import EnvPool, EpisodeSpec
from toolverse_jax.models.toolcall import parse_tool_calls_lenient

MAX_STEPS = 20  # BFCL's MAXIMUM_STEP_LIMIT
HOLDOUT_PROMPT = "I have updated some more functions you can choose from. What about now?"
SYSTEM_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls to "
    "achieve the purpose. If none of the functions can be used, point it out. If the given "
    "question lacks the parameters required by the function, also point it out.\n\n"
    "At each turn, you should try your best to complete the tasks requested by the user within "
    "the current turn. Continue to output functions to call until you have fulfilled the user's "
    "request to the best of your ability. Once you have no more functions to call, the system "
    "will consider the current turn complete and proceed to the next turn or task.")
_IDENT = re.compile(r"^[A-Za-z_]\w*$")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One BFCL multi-turn entry with its ground truth."""

    id: str
    category: str
    turns: tuple           # per turn, the user messages [{"role", "content"}] (may be empty)
    ground_truth: tuple    # per turn, BFCL call strings
    involved_classes: tuple
    missed: dict           # {turn index: [function names held out until that turn]}
    raw: dict = dataclasses.field(repr=False, compare=False, hash=False, default=None)

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(bfcl_env.SERVERS[c] for c in self.involved_classes)

    @property
    def spec(self) -> EpisodeSpec:
        return EpisodeSpec(self.servers, bfcl_env.entry_seed(self.id))


def load_entries(categories: Sequence[str] = bfcl_env.CATEGORIES, limit: int = 0,
                 ids: Sequence[str] = ()) -> list[Entry]:
    """Returns the entries of `categories` (first `limit` per category if > 0; or just `ids`)."""
    wanted = set(ids)
    out = []
    for cat in categories:
        gt = bfcl_env.load_ground_truth(cat)
        rows = [e for e in bfcl_env.load_questions(cat) if not wanted or e["id"] in wanted]
        if limit > 0:
            rows = rows[:limit]
        for e in rows:
            if e["id"] not in gt:
                raise ValueError(f"BFCL entry {e['id']} has no ground truth in bfcl-eval's data")
            missed = {int(k): list(v) for k, v in e.get("missed_function", {}).items()}
            out.append(Entry(e["id"], cat, tuple(e["question"]), tuple(gt[e["id"]]),
                             tuple(e["involved_classes"]), missed, e))
    missing = wanted - {e.id for e in out}
    if missing:
        raise ValueError(f"BFCL entries not found in categories {tuple(categories)}: {sorted(missing)[:10]}")
    return out


# ----------------------------------------------------------------------------- call strings

def call_string(name: str, arguments: dict) -> str:
    """Returns the BFCL call string of a tool call (as BFCL's FC handlers decode one)."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def checkable(name: str, arguments: Any, tool_names: set[str]) -> bool:
    """Returns whether a call may go to BFCL's checker (it `eval`s the string): a listed tool
    name and identifier keys only, so model output can never inject code."""
    return (name in tool_names and bool(_IDENT.match(name)) and isinstance(arguments, dict)
            and all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k)
                    for k in arguments))


def parse_call(text: str, entry: Entry) -> tuple[str, dict]:
    """Returns (name, keyword arguments) of a ground-truth call string like "sort('a.pdf')"."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"{entry.id}: ground-truth call {text!r} does not parse: {e}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"{entry.id}: ground-truth {text!r} is not a plain function call")
    name = node.func.id
    args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    if node.args:  # positional: name them from the BFCL method's signature
        method = None
        for cls in entry.involved_classes:
            method = getattr(bfcl_env.api_class(cls), name, None) or method
        if method is None:
            raise ValueError(f"{entry.id}: {name!r} is not a method of {entry.involved_classes}")
        params = [p for p in inspect.signature(method).parameters if p != "self"]
        for p, v in zip(params, node.args):
            args[p] = ast.literal_eval(v)
    return name, args


# ----------------------------------------------------------------------------- dialogs

@dataclasses.dataclass
class Dialog:
    """One episode of one entry: the messages so far and what the checker needs.

    steps: per turn, per step, the BFCL call strings the model emitted (decoded calls).
    """

    entry: Entry
    sample: int
    tools: list[dict]                       # tool specs listed so far (prompt + revealed)
    messages: list[dict]
    turn: int = 0
    step: int = 0
    steps: list[list[list[str]]] = dataclasses.field(default_factory=list)
    statuses: list[str] = dataclasses.field(default_factory=list)
    done: bool = False
    end_reason: str = ""
    infra_failed: bool = False
    verdict: dict = dataclasses.field(default_factory=dict)
    scratch: dict = dataclasses.field(default_factory=dict, repr=False)  # the policy's own state


class AgentPolicy(Protocol):
    """Continues dialogs: returns one assistant text (with <tool_call> blocks) per dialog."""

    def act(self, dialogs: Sequence[Dialog]) -> list[str]: ...


def tool_call_text(name: str, arguments: dict) -> str:
    """Returns one `<tool_call>` block in our chat format."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


class OraclePolicy:
    """Replays the ground truth: all of a turn's calls in its first step, then a text reply
    (the harness's self-test: it must pass BFCL's checker)."""

    name = "oracle"

    def act(self, dialogs):
        out = []
        for d in dialogs:
            gold = d.entry.ground_truth[d.turn]
            if d.step == 0 and gold:
                out.append("\n".join(tool_call_text(*parse_call(c, d.entry)) for c in gold))
            else:
                out.append("Done." if gold else "I cannot do that with the functions I have.")
        return out


def holdout_message(tools: Sequence[dict]) -> str:
    """Returns the user message of a miss_func turn that reveals `tools`."""
    return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + "\n" + HOLDOUT_PROMPT


def _start(entry: Entry, sample: int, episode_tools: list[dict]) -> Dialog:
    held = {n for names in entry.missed.values() for n in names}
    tools = [t for t in episode_tools if t["name"] not in held]
    d = Dialog(entry, sample, tools, [{"role": "system", "content": SYSTEM_PROMPT}])
    d.steps.append([])
    _add_turn_message(d, episode_tools)
    return d


def _add_turn_message(d: Dialog, episode_tools: list[dict]) -> None:
    if d.turn in d.entry.missed:
        revealed = [t for t in episode_tools if t["name"] in set(d.entry.missed[d.turn])]
        d.tools = d.tools + revealed
        d.messages.append({"role": "user", "content": holdout_message(revealed),
                           "revealed_tools": [t["name"] for t in revealed]})
    else:
        for m in d.entry.turns[d.turn]:
            d.messages.append({"role": m["role"], "content": m["content"]})


def run_dialogs(policy: AgentPolicy, entries: Sequence[Entry], pool: EnvPool, samples: int = 1,
                max_steps: int = MAX_STEPS, verify_state: bool = False) -> list[Dialog]:
    """Returns one finished, checked Dialog per (entry, sample), run together in one batch."""
    pairs = [(e, s) for e in entries for s in range(samples)]
    episodes = pool.reset([e.spec for e, _ in pairs])
    dialogs = [_start(e, s, ep.tools) for (e, s), ep in zip(pairs, episodes)]
    try:
        for d, ep in zip(dialogs, episodes):
            if pool.is_failed(ep):
                d.done, d.infra_failed, d.end_reason = True, True, "reset_failed"
        while True:
            active = [i for i, d in enumerate(dialogs) if not d.done]
            if not active:
                break
            texts = policy.act([dialogs[i] for i in active])
            batch, owners = [], []
            pending: dict[int, list] = {}
            for i, text in zip(active, texts):
                d = dialogs[i]
                if d.done:  # the policy stopped it (e.g. its context is full)
                    continue
                parsed = parse_tool_calls_lenient(text)
                calls = [(c.name, c.arguments) for c in parsed.calls]
                d.messages.append({"role": "assistant", "content": text,
                                   "tool_calls": [{"name": n, "arguments": a} for n, a in calls]})
                if not calls:  # a text reply (or nothing parseable) ends the turn
                    _next_turn(d, episodes[i].tools)
                    continue
                names = {t["name"] for t in episodes[i].tools}
                d.steps[d.turn].append([call_string(n, a) for n, a in calls if checkable(n, a, names)])
                pending[i] = [f"invalid tool call: {e}" for e in parsed.errors]
                for n, a in calls:
                    batch.append((episodes[i], n, a))
                    owners.append(i)
            if batch:
                for i, obs in zip(owners, pool.step(batch)):
                    pending[i].append(obs.content)
                    dialogs[i].statuses.append(obs.status)
                    if obs.status == "server_crashed":
                        dialogs[i].infra_failed = True
            for i, outs in pending.items():
                d = dialogs[i]
                for content in outs:
                    d.messages.append({"role": "tool", "content": content})
                d.step += 1
                if d.infra_failed:
                    d.done, d.end_reason = True, "server_crashed"
                elif d.step > max_steps:  # BFCL force-quits the whole entry
                    d.done, d.end_reason = True, "max_steps"
        for d, ep in zip(dialogs, episodes):
            if pool.is_failed(ep):
                d.infra_failed = True
            if verify_state and not d.infra_failed:
                d.verdict["env_state_matches"] = env_state_matches(d, pool.read_state(ep))
    finally:
        pool.close(episodes)
    for d in dialogs:
        if not d.infra_failed:
            d.verdict.update(check(d.entry, d.steps))
    return dialogs


def _next_turn(d: Dialog, episode_tools: list[dict]) -> None:
    d.turn += 1
    d.step = 0
    if d.turn >= len(d.entry.turns):
        d.done, d.end_reason = True, "finished"
        return
    d.steps.append([])
    _add_turn_message(d, episode_tools)


def stop_dialog(d: Dialog, reason: str) -> None:
    """Ends a dialog early (e.g. its context is full); BFCL scores it force-terminated."""
    d.done, d.end_reason = True, reason


# ----------------------------------------------------------------------------- verdict

_check_ids = itertools.count()


def check(entry: Entry, steps: Sequence[Sequence[Sequence[str]]]) -> dict:
    """Returns BFCL's verdict {"valid", "error_type"?, "error_message"?} on decoded calls
    (per turn, per step, call strings), as BFCL's eval runner computes it."""
    bfcl_env.require()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    if len(steps) != len(entry.ground_truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"model ran {len(steps)} of {len(entry.ground_truth)} turns"}
    decoded = [[list(s) for s in turn if s] for turn in steps]
    # BFCL keeps its instances in multi_turn_utils' globals, keyed by model name and entry id:
    # a fresh name per check keeps samples independent, and the instances are dropped after.
    name = f"tvcheck{next(_check_ids)}"
    try:
        res = multi_turn_checker(decoded, [list(t) for t in entry.ground_truth], entry.raw,
                                 entry.id.rsplit("_", 1)[0], name)
    except Exception as e:  # noqa: BLE001 - a checker crash is this entry's failure, named
        res = {"valid": False, "error_type": "checker_exception", "error_message": f"{type(e).__name__}: {e}"}
    finally:
        g = vars(multi_turn_utils)
        for k in [k for k in g if k.startswith(name + "_")]:
            del g[k]
    out = {"valid": bool(res.get("valid"))}
    if not out["valid"]:
        out["error_type"] = res.get("error_type", "")
        out["error_message"] = str(res.get("error_message", ""))[:500]
    return out


def direct_states(entry: Entry, calls: Sequence[tuple[str, dict]]) -> dict:
    """Returns {server: state} after running `calls` on fresh in-process BFCL instances."""
    insts = {c: bfcl_env.new_instance(c, entry.raw) for c in entry.involved_classes}
    owner = {}
    for c, inst in insts.items():
        for n in dir(inst):
            if not n.startswith("_") and callable(getattr(inst, n)):
                owner.setdefault(n, inst)
    for name, args in calls:
        if name in owner:
            bfcl_env.execute(owner[name], name, args)
    return {bfcl_env.SERVERS[c]: json.loads(json.dumps(bfcl_env.instance_state(i))) for c, i in insts.items()}


def env_state_matches(d: Dialog, env_state: dict) -> bool:
    """Returns whether the MCP servers' final state equals running the same calls in-process."""
    calls = [(c["name"], c["arguments"]) for m in d.messages if m["role"] == "assistant"
             for c in m.get("tool_calls", [])]
    return json.loads(json.dumps(env_state)) == direct_states(d.entry, calls)
