"""Goal-level instructions and whole-chain verifiers (issue 24): effects and checks, the
closure, trimming, instruction levels and their mechanical check, the writer hook, and
whole-chain DUSA on the fake and the built-in servers (shortcut test on a sample)."""

import collections
import http.server
import json
import threading

import pytest

from tasks_fake import FakeExecutor
from toolverse_jax.tasks import (DusaConfig, GoldStep, Task, dusa_generate, task_seed,
                                 verify_task)
from toolverse_jax.tasks import closure as cl
from toolverse_jax.tasks import instructions as ins
from toolverse_jax.tasks import schema as sch
from toolverse_jax.tasks.dusa import _Live, _bad_value, _noop_reason, _state_unique, ToolIndex
from toolverse_jax.tasks.graph import build_tool_graph
from toolverse_jax.tasks.task import check_state, episode_spec

USER = "alex.morgan@example.com"


def _notes(*rows):
    return {"notes": {"notes": {r["note_id"]: r for r in rows}, "_counters": {"nt": len(rows)}}}


def _note(i, title, body="", tags=(), updated="2026-02-01"):
    return {"note_id": f"nt_{i}", "title": title, "body": body, "tags": list(tags),
            "shared_with": [], "updated": updated}


def _step(tool, args, obs=None, sources=None, server="notes"):
    return GoldStep(server, tool, tool, args, obs, sources or {})


def _src(stage, index, field, pick=None):
    d = {"from": "step", "stage": stage, "index": index, "field": field}
    if pick:
        d["pick"] = pick
    return d


# ------------------------------------------------------------------------------ records


def test_state_records_keep_top_level_records_by_id():
    state = {"shop": {"orders": {"o1": {"order_id": "o1", "items": [{"product_id": "p1"}]}},
                      "cart": [{"product_id": "p2", "quantity": 1}], "_counters": {"ord": 1}}}
    recs = cl.state_records(state, ["shop"])
    assert set(recs) == {("shop", "orders", "o1"), ("shop", "cart[]", "p2")}
    assert cl.record_id_key({"product_id": "p", "id": "x"}) == "id"
    assert cl.record_id_key({"order_id": "", "name": "n"}) is None


def _effects(stages, snaps):
    out = []
    for k, st in enumerate(stages):
        fx = cl.stage_effects(st, k, cl.state_records(snaps[k], ["notes"]),
                              cl.state_records(snaps[k + 1], ["notes"]))
        out += [e for f in fx for e in f]
    return out


def test_effect_checks_credit_the_last_writer_and_skip_side_effects():
    s0 = _notes(_note(1, "A"), _note(2, "B"))
    # stage 0 renames note 1, stage 1 renames it again: only the second rename is needed
    s1 = _notes(_note(1, "X", updated="2026-03-02"), _note(2, "B"))
    s2 = _notes(_note(1, "Y", updated="2026-03-02"), _note(2, "B"))
    stages = [[_step("update_note", {"note_id": "nt_1", "title": "X"})],
              [_step("update_note", {"note_id": "nt_1", "title": "Y"})]]
    checks, needs = cl.effect_checks(cl.state_records(s0, ["notes"]),
                                     cl.state_records(s2, ["notes"]),
                                     _effects(stages, [s0, s1, s2]), s0)
    # `updated` changed only as a side effect of the first rename: not checked
    assert checks == [{"server": "notes", "match": {"note_id": "nt_1", "title": "Y"},
                       "exists": True}]
    assert needs == {(1, 0)}


def test_effect_checks_appends_need_every_writer_and_list_items_their_adder():
    s0 = _notes(_note(1, "A", body="b"))
    s1 = _notes(_note(1, "A", body="b\nx", tags=["t1"]))
    s2 = _notes(_note(1, "A", body="b\nx\ny", tags=["t1", "t2"]))
    stages = [[_step("append_to_note", {"note_id": "nt_1", "text": "x"}),
               _step("tag_note", {"note_id": "nt_1", "tag": "t1"})],
              [_step("append_to_note", {"note_id": "nt_1", "text": "y"}),
               _step("tag_note", {"note_id": "nt_1", "tag": "t2"})]]
    checks, needs = cl.effect_checks(cl.state_records(s0, ["notes"]),
                                     cl.state_records(s2, ["notes"]),
                                     _effects(stages, [s0, s1, s2]), s0)
    (c,) = checks
    assert c["match"] == {"note_id": "nt_1", "body": "b\nx\ny"}
    assert c["contains"] == {"tags": ["t1", "t2"]}
    assert needs == {(0, 0), (0, 1), (1, 0), (1, 1)}  # the body needs both appends
    assert check_state(c, s2) and not check_state(c, s1)


def test_effect_checks_walk_back_only_through_values_built_on_the_last():
    def mail(read):
        return {"mail": {"emails": {"em_1": {"email_id": "em_1", "subject": "S", "read": read}}}}

    def acct(bal):
        return {"bank": {"accounts": {"a1": {"account_id": "a1", "balance": bal}}}}

    def fx(stages, snaps, server):
        out = []
        for k, st in enumerate(stages):
            f = cl.stage_effects(st, k, cl.state_records(snaps[k], [server]),
                                 cl.state_records(snaps[k + 1], [server]))
            out += [e for x in f for e in x]
        return cl.effect_checks(cl.state_records(snaps[0], [server]),
                                cl.state_records(snaps[-1], [server]), out, snaps[0])

    # read_email sets `read` outright: marking the mail unread before it is not needed
    stages = [[_step("mark_email", {"email_id": "em_1", "read": False}, server="mail")],
              [_step("read_email", {"email_id": "em_1"}, server="mail")]]
    snaps = [mail(True), mail(False), mail(True)]
    assert fx(stages, snaps, "mail") == ([], set())  # back where it was: nothing to check
    snaps = [mail(False), mail(False), mail(True)]
    stages[0][0].arguments["read"] = True
    assert fx(stages, snaps, "mail")[1] == {(1, 0)}
    # a balance debited twice needs both debits
    stages = [[_step("transfer", {"from_account_id": "a1", "amount": 5.0}, server="bank")],
              [_step("transfer", {"from_account_id": "a1", "amount": 7.0}, server="bank")]]
    checks, needs = fx(stages, [acct(100.0), acct(95.0), acct(88.0)], "bank")
    assert checks[0]["match"] == {"account_id": "a1", "balance": 88.0}
    assert needs == {(0, 0), (1, 0)}


def test_effect_checks_create_remove_and_undiscriminative():
    s0 = _notes(_note(1, "A"), _note(2, "B"))
    s1 = _notes(_note(1, "A"), _note(3, "New", updated="2026-03-02"))
    stages = [[_step("delete_note", {"note_id": "nt_2"}, {"note_id": "nt_2", "deleted": True}),
               _step("create_note", {"title": "New"}, _note(3, "New"))]]
    checks, needs = cl.effect_checks(cl.state_records(s0, ["notes"]),
                                     cl.state_records(s1, ["notes"]),
                                     _effects(stages, [s0, s1]), s0)
    assert {"server": "notes", "match": {"note_id": "nt_2"}, "exists": False} in checks
    created = next(c for c in checks if c["exists"])
    assert created["match"] == {"title": "New", "body": "", "updated": "2026-03-02"}
    assert needs == {(0, 0), (0, 1)}
    # a check that already holds initially is left out
    same = cl.effect_checks(cl.state_records(s0, ["notes"]), cl.state_records(s0, ["notes"]),
                            [], s0)
    assert same == ([], set())


def test_closure_trim_and_merge_renumber():
    stages = [[_step("list_notes", {}, {"notes": []}), _step("list_tags", {}, {"tags": []})],
              [_step("get_note", {"note_id": "n"}, {}, {"note_id": _src(0, 0, "notes[].note_id")})],
              [_step("delete_note", {"note_id": "n"}, {},
                     {"note_id": _src(1, 0, "note_id")})]]
    keep = cl.closure(stages, {(2, 0)})
    assert keep == {(0, 0), (1, 0), (2, 0)}  # list_tags feeds nothing
    out, remap = cl.trim(stages, keep)
    assert [[s.tool for s in st] for st in out] == [["list_notes"], ["get_note"],
                                                     ["delete_note"]]
    assert out[2][0].sources["note_id"]["stage"] == 1 and remap[(2, 0)] == (2, 0)
    # independent neighbours merge (in order); dependent ones never do
    indep = [[_step("create_note", {"title": "a"})], [_step("create_note", {"title": "b"})]]
    merged, m = cl.merge_stages(indep, 1, 2)
    assert [[s.arguments["title"] for s in st] for st in merged] == [["a", "b"]]
    assert m == {(0, 0): (0, 0), (1, 0): (0, 1)}
    assert len(cl.merge_stages(out, 1, 2)[0]) == 3


def test_effective_horizon_of_a_task_with_a_side_branch():
    stages = [[_step("list_notes", {}, {"notes": []})], [_step("list_tags", {}, {"tags": []})],
              [_step("get_note", {"note_id": "n"}, {"title": "T"},
                     {"note_id": _src(0, 0, "notes[].note_id")})]]
    t = Task("t", "x", episode_spec(("notes",), 0), stages, "T",
             {"kind": "exact", "value": "T", "source": {"stage": 2, "index": 0,
                                                       "field": "title"}})
    assert cl.effective_horizon(t) == 2  # list_tags is off the closure
    t.verifier["needs"] = [[1, 0], [2, 0]]
    assert cl.effective_horizon(t) == 3


# --------------------------------------------------------------------------- flow rules


def _live(state):
    recs = cl.state_records(state, list(state))
    return _Live(state, recs, recs, {USER}, collections.Counter(), collections.Counter())


@pytest.fixture(scope="module")
def builtin_ix():
    envs = pytest.importorskip("toolverse_jax.envs")
    del envs
    from toolverse_jax.tasks import PoolExecutor
    try:
        ex = PoolExecutor(kinds=("builtin",), num_workers=0)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"built-in catalog unavailable: {e}")
    ix = ToolIndex.build(build_tool_graph(ex.tool_specs(["mail", "notes"])))
    ex.shutdown()
    return ix


def test_flow_rules_reject_collisions_noops_and_self(builtin_ix):
    mail = {"email_id": "em_1", "sender": "bo@x.com", "to": [USER], "subject": "Hi",
            "folder": "inbox", "read": False}
    mine = {"email_id": "em_2", "sender": USER, "to": ["bo@x.com"], "subject": "Re: Hi",
            "folder": "sent", "read": True}
    state = {"mail": {"emails": {"em_1": mail, "em_2": mine}}, **_notes(_note(1, "A"))}
    live = _live(state)
    ix = builtin_ix
    # moving a mail to the folder it is in, marking a read mail read: no-ops
    assert _noop_reason(ix, "mail.move_email", {"email_id": "em_1", "folder": "inbox"},
                        "mail", live) == "noop_call"
    assert _noop_reason(ix, "mail.move_email", {"email_id": "em_1", "folder": "archive"},
                        "mail", live) is None
    assert _noop_reason(ix, "mail.mark_email", {"email_id": "em_2", "read": True},
                        "mail", live) == "noop_call"
    # forwarding a mail to its own sender; replying to one's own mail
    assert _noop_reason(ix, "mail.forward_email", {"email_id": "em_1", "to": ["bo@x.com"]},
                        "mail", live) == "role_collision"
    assert _noop_reason(ix, "mail.reply_email", {"email_id": "em_2", "body": "x"},
                        "mail", live) == "self_reference"
    # deleting what the chain created
    live.recs = {**live.recs, ("notes", "notes", "nt_9"): _note(9, "Mine")}
    assert _noop_reason(ix, "notes.delete_note", {"note_id": "nt_9"}, "notes",
                        live) == "delete_created"
    p = {"name": "email"}
    assert _bad_value(USER, p, {}, live) == "self_reference"
    assert _bad_value("MAD", p, {"origin": "MAD"}, live) == "role_collision"
    assert _bad_value("BER", p, {"origin": "MAD"}, live) is None


def test_descriptors_must_be_unique_now_and_as_the_user_knew_them():
    s0 = _notes(_note(1, "A"), _note(2, "B"), _note(3, "B"))
    live = _live(s0)
    unique = _state_unique(live, "notes")
    assert unique(_note(1, "A"), "title")
    assert not unique(_note(2, "B"), "title")        # two notes titled B
    assert not unique(_note(1, ""), "body")           # empty says nothing
    live.recs = cl.state_records(_notes(_note(1, "Z"), _note(2, "B"), _note(3, "C")), ["notes"])
    assert not unique(_note(1, "Z"), "title")         # renamed: the user knows it as "A"


# -------------------------------------------------------------------------- instructions


def _chain():
    """list_notes -> delete the note titled "Q2 goals"; create a note; share it; ask a tag."""
    notes = {"notes": [_note("0001", "Meeting notes"), _note("0005", "Q2 goals", tags=["work"])],
             "count": 2}
    stages = [
        [_step("list_notes", {}, notes), _step("create_note", {"title": "Budget 7"},
                                               _note("0007", "Budget 7"),
                                               {"title": {"from": "literal"}})],
        [_step("delete_note", {"note_id": "nt_0005"}, {"note_id": "nt_0005", "deleted": True},
               {"note_id": _src(0, 0, "notes[].note_id", {"field": "title",
                                                           "value": "Q2 goals"})}),
         _step("share_note", {"note_id": "nt_0007", "email": "ada@x.com"},
               _note("0007", "Budget 7"), {"note_id": _src(0, 1, "note_id"),
                                           "email": {"from": "state"}})],
        [_step("get_note", {"note_id": "nt_0001"}, _note("0001", "Meeting notes", tags=["home"]),
               {"note_id": _src(0, 0, "notes[].note_id", {"field": "title",
                                                           "value": "Meeting notes"})})],
    ]
    verifier = {"kind": "exact", "value": "home", "source": {"stage": 2, "index": 0,
                                                            "field": "tags[]"},
                "checks": [{"server": "notes", "match": {"note_id": "nt_0005"},
                            "exists": False}],
                "needs": [[1, 0], [1, 1], [2, 0]]}
    return stages, verifier


def test_levels_render_the_same_chain():
    stages, v = _chain()
    goal = ins.render_instruction(stages, v, ("notes",), "goal")
    stage = ins.render_instruction(stages, v, ("notes",), "stage")
    recipe = ins.render_instruction(stages, v, ("notes",), "recipe")
    assert goal == ('Create a note titled "Budget 7". Delete the note titled "Q2 goals". '
                    'Share the new note titled "Budget 7" with "ada@x.com". Then reply with '
                    'the tags of the note titled "Meeting notes".')
    assert stage.startswith('First, look up the note titled "Q2 goals" and the note titled '
                            '"Meeting notes" and create a note titled "Budget 7". Then ')
    assert recipe.startswith("First, list notes and create note with title")
    for tool in ("list_notes", "get_note"):
        assert ins.names_tool(recipe, tool)
        assert not ins.names_tool(goal, tool) and not ins.names_tool(stage, tool)
    keep, secret = ins.instruction_facts(stages, v, "home")
    assert keep == ["Budget 7", "Meeting notes", "Q2 goals", "ada@x.com"]
    assert {"nt_0005", "nt_0007", "home"} <= set(secret)
    for text in (goal, stage, recipe):
        assert ins.check_instruction(text, keep, secret) == []
    with pytest.raises(ValueError, match="goal"):
        ins.render_instruction(stages, v, ("notes",), "goals")


def test_check_instruction_and_names_tool():
    assert ins.check_instruction('Delete "A" (nt_0005).', ["A"], ["nt_0005"]) == \
        ["leaks 'nt_0005'"]
    assert ins.check_instruction("Delete it.", ["A"], []) == ["missing 'A'"]
    # a stated value that contains a secret one is fine; short numbers are not checked
    assert ins.check_instruction('Book "Harbor New York" for 2.', ["Harbor New York"],
                                 ["New York", "2"]) == []
    assert ins.names_tool("then get the transaction", "get_transaction")
    assert ins.names_tool("List all notes", "list_notes")
    assert not ins.names_tool("the transactions you listed", "get_transaction")


def _task_from_chain():
    stages, v = _chain()
    return Task("t", "", episode_spec(("notes",), 0), stages, "home", v,
                {"nominal_horizon": 3, "instruction_level": "goal"})


def test_writer_keeps_a_good_rewrite_and_falls_back_on_a_bad_one():
    t = _task_from_chain()
    template = ins.render_instruction(t.stages, t.verifier, t.servers, "goal")
    good = ins.instruction_for(t, "goal", lambda s: "Hi! " + s)
    assert good == ("Hi! " + template, 0)
    leaky = ins.instruction_for(t, "goal", lambda s: s + " (id nt_0005)")
    assert leaky == (template, 1)
    dropped = ins.instruction_for(t, "goal", lambda s: s.replace('"Budget 7"', "a budget"))
    assert dropped == (template, 1)

    def down(_):
        raise RuntimeError("llm down")
    assert ins.instruction_for(t, "goal", down) == (template, 0)
    assert ins.make_writer("") is None
    with pytest.raises(ValueError, match="writer kind"):
        ins.make_writer("nope")


def test_openai_writer_talks_to_a_compatible_endpoint(monkeypatch):
    seen = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen["path"] = self.path
            seen["auth"] = self.headers.get("Authorization")
            seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            out = json.dumps({"choices": [{"message": {"content": "REWRITTEN"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("TEST_KEY", "k1")
        w = ins.make_writer("openai", model="m", api_key_env="TEST_KEY",
                            base_url=f"http://127.0.0.1:{srv.server_port}/v1")
        assert w("Delete the note.") == "REWRITTEN"
    finally:
        srv.shutdown()
    assert seen["path"] == "/v1/chat/completions" and seen["auth"] == "Bearer k1"
    assert seen["body"]["model"] == "m"
    assert "Delete the note." in seen["body"]["messages"][0]["content"]


def test_with_instruction_level_rerenders_whole_chain_tasks_only():
    t = _task_from_chain()
    (r,) = ins.with_instruction_level([t], "recipe")
    assert r.stages is t.stages and r.meta["instruction_level"] == "recipe"
    assert r.instruction.startswith("First, list notes")
    legacy = Task("x", "i", t.spec, t.stages, t.answer, t.verifier, {"seed": 1})
    with pytest.raises(ValueError, match="whole-chain"):
        ins.with_instruction_level([legacy], "goal")


# ------------------------------------------------------------------ whole-chain DUSA (fake)


def _gen(ex, h, n, base=0, **kw):
    cfg = DusaConfig(horizon=h, max_per_stage=2, num_servers=(1, 3), whole_chain=True,
                     instruction_level="goal", **kw)
    return dusa_generate(ex, [task_seed(base, i) for i in range(n)], cfg)


def _assert_whole_chain(tasks, ex, h):
    for t in tasks:
        assert len(t.stages) == h == t.meta["nominal_horizon"] == t.stats["horizon"]
        assert cl.effective_horizon(t) == h  # every stage on the verifier's closure
        assert cl.closure(t.stages, cl.verifier_needs(t)) == \
            {(i, j) for i, st in enumerate(t.stages) for j in range(len(st))}
        keep, secret = ins.instruction_facts(t.stages, t.verifier, t.answer)
        assert ins.check_instruction(t.instruction, keep, secret) == [], t.instruction
        for i, j in ins.discovery_calls(t.stages, t.verifier):
            assert not ins.names_tool(t.instruction, t.stages[i][j].tool), t.instruction
        for st in t.stages:
            for s in st:
                for p, src in s.sources.items():
                    if sch.semantic_key(p).startswith("id:"):
                        assert src["from"] == "step"  # ids are discovered, never stated
    assert all(verify_task(t, ex) for t in tasks)
    assert cl.shortcut_stages(tasks, ex) == [[] for _ in tasks]


def test_whole_chain_tasks_on_fake():
    ex = FakeExecutor()
    for h in (2, 3):
        res = _gen(ex, h, 16)
        tasks = [t for t, *_ in res if t is not None]
        assert len(tasks) >= 8
        assert {r for _, r, _ in res} <= {"ok", "short", "short_closure", "long_closure",
                                          "instruction_check"}
        _assert_whole_chain(tasks, ex, h)
    again = _gen(FakeExecutor(), 3, 16)
    assert [t.to_json() for t, *_ in again if t] == [t.to_json() for t, *_ in _gen(ex, 3, 16)
                                                      if t]


def test_levels_share_the_chain():
    ex = FakeExecutor()
    by = {}
    for lvl in ins.LEVELS:
        cfg = DusaConfig(horizon=3, max_per_stage=2, num_servers=(1, 3), whole_chain=True,
                         instruction_level=lvl)
        by[lvl] = [t for t, *_ in dusa_generate(ex, [task_seed(0, i) for i in range(8)], cfg)
                   if t]
    ids = [[t.id for t in by[lvl]] for lvl in ins.LEVELS]
    assert ids[0] == ids[1] == ids[2] and ids[0]
    assert [t.instruction for t in by["recipe"]] == [
        t.instruction for t in ins.with_instruction_level(by["goal"], "recipe")]


# -------------------------------------------------------------- whole-chain DUSA (built-in)


@pytest.fixture(scope="module")
def executor():
    pytest.importorskip("toolverse_jax.envs")
    from toolverse_jax.tasks import PoolExecutor
    try:
        ex = PoolExecutor(kinds=("builtin",), num_workers=0)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"built-in catalog unavailable: {e}")
    yield ex
    ex.shutdown()


@pytest.mark.parametrize("h,n", [(3, 8), (10, 5)])
def test_builtin_whole_chain_sample_needs_every_stage(executor, h, n):
    res = dusa_generate(executor, [task_seed(h, i) for i in range(n)],
                        DusaConfig(horizon=h, max_per_stage=2, whole_chain=True,
                                   instruction_level="goal"))
    tasks = [t for t, *_ in res if t is not None]
    assert len(tasks) >= n // 2
    _assert_whole_chain(tasks, executor, h)
    # no call addresses the user or repeats a value in two roles
    for t in tasks:
        for st in t.stages:
            for s in st:
                vals = [x for v in s.arguments.values() for x in (v if isinstance(v, list)
                                                                   else [v])
                        if isinstance(x, str)]
                assert USER not in vals and len(vals) == len(set(vals)), s


def test_quickstart_default_is_the_shipped_recipe_set(tmp_path):
    from toolverse_jax.tasks.gust import (QUICKSTART_FILE, load_or_generate_quickstart_tasks,
                                          read_tasks)
    import os
    if not os.path.exists(QUICKSTART_FILE):
        pytest.skip("no shipped quickstart file")
    got = load_or_generate_quickstart_tasks(str(tmp_path))
    assert [t.to_json() for t in got] == [t.to_json() for t in read_tasks(QUICKSTART_FILE)]
    with pytest.raises(ValueError, match="instruction_level"):
        load_or_generate_quickstart_tasks(str(tmp_path), instruction_level="goals")


def test_goal_level_quickstart_generates_whole_chain_tasks(tmp_path):
    from toolverse_jax.tasks.gust import load_or_generate_quickstart_tasks
    goal = load_or_generate_quickstart_tasks(str(tmp_path), num_tasks=6, horizons=(2,),
                                             executor_factory="tasks_fake:make_fake_executor",
                                             instruction_level="goal")
    assert len(goal) == 6 and all(t.meta["instruction_level"] == "goal" for t in goal)
    recipe = load_or_generate_quickstart_tasks(str(tmp_path), num_tasks=6, horizons=(2,),
                                               executor_factory="tasks_fake:make_fake_executor",
                                               instruction_level="recipe", whole_chain=True)
    assert [t.id for t in recipe] == [t.id for t in goal]  # same chains, recipe text
    assert all(t.instruction.startswith("First, ") for t in recipe)


def polite_writer():
    """A scripted instruction writer (make_writer("test_tasks_goal:polite_writer"))."""
    return lambda text: "Hi! " + text


def lossy_writer():
    """A writer that loses the values the user states (always rejected)."""
    import re
    return lambda text: re.sub(r'"[^"]*"', "it", text)


def test_writer_from_the_generation_config():
    from toolverse_jax.tasks.gust import generate_gust
    cfg = dict(num_tasks=4, horizons=(2,), num_servers=(1, 3), num_processes=0,
               executor_factory="tasks_fake:make_fake_executor")
    plain, _ = generate_gust(cfg, progress=False)
    polite, _ = generate_gust({**cfg, "writer": "test_tasks_goal:polite_writer"},
                              progress=False)
    assert [t.instruction for t in polite] == ["Hi! " + t.instruction for t in plain]
    lossy, man = generate_gust({**cfg, "writer": "test_tasks_goal:lossy_writer"},
                               progress=False)
    assert [t.instruction for t in lossy] == [t.instruction for t in plain]
    assert man["quality"]["rejections"]["rewrite_rejected"] >= 1
