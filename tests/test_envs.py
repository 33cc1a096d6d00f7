"""Tests of toolverse_jax.envs: catalog, built-in and synthesized servers, validation, the pool."""

import json
import os
import random
import signal
import time

import jsonschema
import pytest

from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec
from toolverse_jax.envs.pool import STATUSES
from toolverse_jax.envs.synth import SynthState, Simulator, infer_ops, load_manifest
from toolverse_jax.envs.validate import InvalidCall, check_arguments, confine_path

BUILTIN = ("mail", "calendar", "contacts", "bank", "shop", "travel", "notes", "tickets")


@pytest.fixture(scope="module")
def catalog():
    return Catalog.default(include_hidden=True)


@pytest.fixture(scope="module")
def local_pool(catalog):
    with EnvPool(catalog, num_workers=0, call_timeout_s=5.0) as pool:
        yield pool


def _ok(obs):
    assert obs.status == "ok", (obs.status, obs.content)
    return obs.structured


# ----------------------------------------------------------------------------- catalog

def test_catalog_scale_and_specs(catalog):
    cat = Catalog.default()
    kinds = {e.kind for e in cat.servers}
    assert kinds == {"builtin", "synthesized", "third_party"}
    assert len(cat.servers) >= 100
    total = sum(cat.num_tools(e.name) for e in cat.servers if e.available)
    assert total >= 1000
    assert "faulty" not in cat and "faulty" in catalog
    for name in BUILTIN:
        tools = cat.list_tools(name)
        assert len(tools) >= 8, name
        for t in tools:
            assert set(t) <= {"name", "description", "inputSchema", "outputSchema"}
            assert t["inputSchema"]["type"] == "object" and "outputSchema" in t, (name, t["name"])
            assert not t["name"].startswith("_tv_")
    assert {e.name for e in Catalog.default(kinds=("builtin",)).servers} >= set(BUILTIN)
    for e in cat.servers:
        assert e.available or e.reason, e.name
    with pytest.raises(KeyError, match="not in the catalog"):
        cat.entry("no_such_server")


def test_episode_tool_names_collide_with_prefix(catalog):
    from toolverse_jax.envs import episode_tools

    tools, names = episode_tools(catalog, ("mail", "notes", "contacts"))
    assert names["send_email"] == ("mail", "send_email")
    # mail/contacts/notes share no names; jira + linear both have create_issue
    tools, names = episode_tools(catalog, ("jira", "linear"))
    assert names["jira.create_issue"] == ("jira", "create_issue")
    assert names["linear.create_issue"] == ("linear", "create_issue")
    assert "create_issue" not in names


# ----------------------------------------------------------------------------- validation

def test_check_arguments_messages():
    schema = {"type": "object", "properties": {"to": {"type": "array", "items": {"type": "string"}},
                                               "n": {"type": "integer"}}, "required": ["to"]}
    assert check_arguments("send", schema, {"to": ["a@b.c"]}) == {"to": ["a@b.c"]}
    with pytest.raises(InvalidCall, match=r"needs argument 'to' \(array\)"):
        check_arguments("send", schema, {"n": 1})
    with pytest.raises(InvalidCall, match=r"argument 'n' is invalid: 'x' is not of type 'integer'"):
        check_arguments("send", schema, {"to": [], "n": "x"})
    with pytest.raises(InvalidCall, match=r"unknown argument 'id'"):
        check_arguments("send", schema, {"to": [], "id": 3})
    with pytest.raises(InvalidCall, match="must be a JSON object"):
        check_arguments("send", schema, ["to"])
    with pytest.raises(InvalidCall, match="limit is 65536 bytes"):
        check_arguments("send", schema, {"to": ["x" * 70000]})


def test_confine_path(tmp_path):
    root = str(tmp_path)
    assert confine_path("a/b.txt", root, "path") == os.path.join(os.path.realpath(root), "a", "b.txt")
    assert confine_path(root, root, "path") == os.path.realpath(root)
    os.symlink("/etc", os.path.join(root, "link"))
    for bad in ("../x", "/etc/passwd", "a/../../x", "link/passwd", root + "_sibling/x", "a\x00b"):
        with pytest.raises(InvalidCall, match="path"):
            confine_path(bad, root, "path")


# ----------------------------------------------------------------------------- built-in servers

def test_builtin_seeded_and_reset(local_pool):
    a, b, c = local_pool.reset([EpisodeSpec(BUILTIN, seed=7), EpisodeSpec(BUILTIN, seed=7),
                                EpisodeSpec(BUILTIN, seed=8)])
    sa, sb, sc = (local_pool.read_state(e) for e in (a, b, c))
    assert sa == sb and sa != sc
    assert set(sa) == set(BUILTIN)
    _ok(local_pool.step([(a, "create_note", {"title": "x"})])[0])
    assert len(local_pool.read_state(a)["notes"]["notes"]) == len(sb["notes"]["notes"]) + 1
    assert local_pool.read_state(b) == sb  # episodes do not share state
    local_pool.close([a, b, c])


def test_state_past_the_agent_visible_cap_reads_whole(local_pool):
    """A state read is a control-plane reply parsed as JSON: it is never cut at the 64 KiB cap
    on what the agent sees (it used to be, and the JSON parse failed)."""
    (ep,) = local_pool.reset([EpisodeSpec(("notes",), seed=2)])
    bodies = [c * 40_000 for c in "xy"]
    for i, body in enumerate(bodies):
        _ok(local_pool.step([(ep, "create_note", {"title": f"big {i}", "body": body})])[0])
    notes = local_pool.read_state(ep)["notes"]["notes"].values()
    assert sorted(n["body"] for n in notes if n["title"].startswith("big ")) == bodies
    local_pool.close([ep])


def test_in_process_pool_works_under_a_running_event_loop(catalog):
    """Jupyter runs an asyncio loop on the caller's thread; num_workers=0 must still work there."""
    import asyncio

    async def main():
        with EnvPool(catalog, num_workers=0, call_timeout_s=5.0) as pool:
            (ep,) = pool.reset([EpisodeSpec(("notes",), seed=1)])
            note = _ok(pool.step([(ep, "create_note", {"title": "inside a loop"})])[0])
            titles = [n["title"] for n in pool.read_state(ep)["notes"]["notes"].values()]
            return note, titles

    note, titles = asyncio.run(main())
    assert "inside a loop" in titles and note


def test_cross_server_chain(local_pool):
    """contact email → mail; order amount → bank transfer; flight date → calendar event."""
    (ep,) = local_pool.reset([EpisodeSpec(("contacts", "mail", "shop", "bank", "travel", "calendar"), seed=3)])
    person = _ok(local_pool.step([(ep, "search_contacts", {"query": "a"})])[0])["contacts"][0]
    mail = _ok(local_pool.step([(ep, "send_email", {"to": [person["email"]], "subject": "Hi", "body": "b"})])[0])
    orders = _ok(local_pool.step([(ep, "list_orders", {})])[0])["orders"]
    accounts = _ok(local_pool.step([(ep, "list_accounts", {})])[0])["accounts"]
    payee = _ok(local_pool.step([(ep, "list_payees", {})])[0])["payees"][0]
    before = accounts[0]["balance"]
    tx = _ok(local_pool.step([(ep, "transfer", {"from_account_id": accounts[0]["account_id"],
                                                "to_account_number": payee["account_number"],
                                                "amount": orders[0]["total"], "memo": orders[0]["order_id"]})])[0])
    airports = [a["code"] for a in _ok(local_pool.step([(ep, "list_airports", {})])[0])["airports"]]
    flight = None
    for o in airports:
        for d in airports:
            if o != d and flight is None:
                fl = _ok(local_pool.step([(ep, "search_flights", {"origin": o, "destination": d})])[0])["flights"]
                flight = fl[0] if fl else None
    booking = _ok(local_pool.step([(ep, "book_flight", {"flight_id": flight["flight_id"], "traveler_name": "Alex",
                                                        "traveler_email": "alex.morgan@example.com"})])[0]) \
        if flight["seats_left"] else {"date": flight["date"]}
    ev = _ok(local_pool.step([(ep, "create_event", {"title": "Flight", "date": booking["date"], "start_time": "08:00",
                                                    "end_time": "09:00"})])[0])
    state = local_pool.read_state(ep)
    assert state["mail"]["emails"][mail["email_id"]]["to"] == [person["email"]]
    acc = state["bank"]["accounts"][accounts[0]["account_id"]]
    assert acc["balance"] == pytest.approx(round(before - orders[0]["total"], 2))
    assert tx["amount"] == -orders[0]["total"]
    assert state["calendar"]["events"][ev["event_id"]]["date"] == flight["date"]
    local_pool.close([ep])


def test_statuses_in_process(local_pool):
    (ep,) = local_pool.reset([EpisodeSpec(("mail", "shop"), seed=1)])
    obs = local_pool.step([
        (ep, "read_email", {"email_id": "em_0001"}),
        (ep, "read_email", {"email_id": "nope"}),
        (ep, "read_email", {}),
        (ep, "read_email", {"email_id": 5}),
        (ep, "no_such_tool", {}),
        (ep, "send_email", "not a dict"),
        (ep, "checkout", {"shipping_address": "x"}),
    ])
    assert [o.status for o in obs] == ["ok", "tool_error", "invalid_call", "invalid_call", "invalid_call",
                                       "invalid_call", "tool_error"]
    assert "email 'nope' not found" in obs[1].content
    assert "'email_id'" in obs[2].content and "'email_id'" in obs[3].content
    assert "no tool 'no_such_tool'" in obs[4].content
    assert obs[0].reward_info["valid"] and obs[0].reward_info["executed"] and obs[0].reward_info["latency_s"] >= 0
    assert not obs[2].reward_info["valid"]
    assert not local_pool.is_failed(ep)
    local_pool.close([ep])


def test_observations_name_no_episode_id(catalog):
    """What the agent reads back is the same in two pools (episode ids are random): an id in an
    observation made seeded rollouts differ from run to run."""
    contents = []
    for _ in range(2):
        with EnvPool(catalog, num_workers=0, call_timeout_s=5.0) as pool:
            (ep,) = pool.reset([EpisodeSpec(("notes", "calendar"), seed=3)])
            obs = pool.step([(ep, "create_event_x", {}), (ep, "list_notes", {"bad": 1})])
            pool.close([ep])
            closed = pool.step([(ep, "list_notes", {})])
            assert all(ep.id not in o.content for o in obs + closed)
            contents.append([(o.status, o.content) for o in obs + closed])
    assert contents[0] == contents[1]
    assert contents[0][0][0] == "invalid_call" and "no tool 'create_event_x'" in contents[0][0][1]
    assert contents[0][2][0] == "invalid_call"


# ----------------------------------------------------------------------------- synthesizer

def test_infer_ops():
    tools = [{"name": n, "inputSchema": {"type": "object", "properties": p, "required": list(p)}}
             for n, p in [("github_create_issue", {"title": {"type": "string"}}),
                          ("github_get_issue", {"issue_id": {"type": "string"}}),
                          ("github_list_issues", {}), ("github_close_issue", {"issue_id": {"type": "string"}}),
                          ("github_searchPullRequests", {"q": {"type": "string"}}),
                          ("github_track_shipment", {"issue_id": {"type": "string"}})]]
    ops = infer_ops(tools)
    got = {n: (o.kind, o.entity, o.id_param) for n, o in ops.items()}
    assert got == {"github_create_issue": ("create", "issue", None),
                   "github_get_issue": ("get", "issue", "issue_id"),
                   "github_list_issues": ("list", "issue", None),
                   "github_close_issue": ("action", "issue", "issue_id"),
                   "github_searchPullRequests": ("search", "pull_request", None),
                   "github_track_shipment": ("action", "issue", "issue_id")}


def _chain_servers(catalog, k=8):
    names = sorted(e.name for e in catalog.servers if e.kind == "synthesized")
    rng = random.Random(0)
    picked = []
    for n in rng.sample(names, len(names)):
        tools = {t["name"] for t in catalog.list_tools(n)}
        ent = next((t[7:] for t in sorted(tools) if t.startswith("create_") and f"get_{t[7:]}" in tools
                    and f"update_{t[7:]}" in tools), None)
        plain = ent and any(s.get("type") == "string" and "enum" not in s and "format" not in s for s in
                            next(t for t in catalog.list_tools(n) if t["name"] == f"create_{ent}")
                            ["inputSchema"]["properties"].values())
        if plain and any(t.startswith("list_") and ent in t for t in tools):
            picked.append((n, ent))
        if len(picked) == k:
            break
    return picked


def test_synth_create_get_update_list(catalog, local_pool):
    from toolverse_jax.envs.synth import fake

    for server, ent in _chain_servers(catalog):
        specs = {t["name"]: t for t in catalog.list_tools(server)}
        (ep,) = local_pool.reset([EpisodeSpec((server,), seed=5)])
        create = specs[f"create_{ent}"]
        rng = random.Random(1)
        args = {p: fake(p, s, rng) for p, s in create["inputSchema"]["properties"].items()}
        made = _ok(local_pool.step([(ep, create["name"], args)])[0])
        jsonschema.validate(made, create["outputSchema"])
        rid = made[f"{ent}_id"]
        got = _ok(local_pool.step([(ep, f"get_{ent}", {f"{ent}_id": rid})])[0])
        assert got == made
        field, fs = next((p, s) for p, s in create["inputSchema"]["properties"].items() if s.get("type") == "string"
                         and "enum" not in s and "format" not in s)
        upd = _ok(local_pool.step([(ep, f"update_{ent}", {f"{ent}_id": rid, field: "changed ✓"})])[0])
        assert upd[field] == "changed ✓"
        lst_name = next(n for n in specs if n.startswith("list_") and specs[n]["outputSchema"]["properties"].get("count")
                        and ent in n)
        lst = _ok(local_pool.step([(ep, lst_name, {})])[0])
        jsonschema.validate(lst, specs[lst_name]["outputSchema"])
        rows = next(v for v in lst.values() if isinstance(v, list))
        assert any(r[f"{ent}_id"] == rid and r[field] == "changed ✓" for r in rows), server
        bad = local_pool.step([(ep, f"get_{ent}", {f"{ent}_id": "missing_1"})])[0]
        assert bad.status == "tool_error" and "not found" in bad.content
        st = local_pool.read_state(ep)[server]
        assert st[ent][rid][field] == "changed ✓"
        local_pool.close([ep])


def test_synth_all_manifests_outputs_match_schema(catalog):
    """Every tool of every synthesized server answers a schema-valid call with a schema-valid result."""
    from toolverse_jax.envs.synth import fake

    n = 0
    for e in catalog.servers:
        if e.kind != "synthesized":
            continue
        name, tools = load_manifest(e.manifest_path)
        sim = Simulator(name, tools)
        st = SynthState(":memory:", 0, sim.ops, name)
        for t in tools:
            rng = random.Random(n)
            sch = sim.ops[t["name"]].input_schema
            args = {k: fake(k, v, rng) for k, v in (sch.get("properties") or {}).items() if k in (sch.get("required") or [])}
            op = sim.ops[t["name"]]
            if op.id_param and st.all(op.entity):
                args[op.id_param] = st.all(op.entity)[0]["id"]
            out = sim.call(st, t["name"], args)
            if t.get("outputSchema"):
                jsonschema.validate(out, t["outputSchema"])
            n += 1
        st.close()
    assert n >= 1000


# ----------------------------------------------------------------------------- worker processes

def _server_pids(pool_root: str):
    """Returns pids of live server processes started by the pool rooted at `pool_root`."""
    out = []
    needle = f"TOOLVERSE_POOL_ROOT={pool_root}".encode()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if any(x.startswith(needle) for x in f.read().split(b"\0")):
                        out.append(int(pid))
            except OSError:
                pass
    return out


def _wait_no_servers(root: str, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while _server_pids(root) and time.time() < deadline:
        time.sleep(0.1)
    assert _server_pids(root) == [], f"orphan servers of {root}"


def test_pool_one_worker_faults(catalog):
    """1 worker process: a hang past the timeout, a crash and a killed server, each recorded; no orphans."""
    with EnvPool(catalog, num_workers=1, call_timeout_s=2.5) as pool:
        a, f = pool.reset([EpisodeSpec(("notes", "jira"), seed=1), EpisodeSpec(("faulty",), seed=0)])
        note = _ok(pool.step([(a, "create_note", {"title": "t", "body": "b"})])[0])
        issue = _ok(pool.step([(a, "create_issue", {"summary": note["title"], "description": note["note_id"]})])[0])
        got = _ok(pool.step([(a, "get_issue", {"issue_id": issue["issue_id"]})])[0])
        assert got["description"] == note["note_id"]
        assert pool.read_state(a)["jira"]["issue"][issue["issue_id"]]["summary"] == "t"
        o = pool.step([(f, "block", {"seconds": 60}), (a, "get_note", {"note_id": note["note_id"]})])
        assert [x.status for x in o] == ["timeout", "ok"] and pool.is_failed(f) and not pool.is_failed(a)
        (f2,) = pool.reset([EpisodeSpec(("faulty",), seed=0)])
        o = pool.step([(f2, "crash", {}), (a, "list_tags", {}), (f2, "echo", {"text": "x"})])
        assert [x.status for x in o] == ["server_crashed", "ok", "server_crashed"] and pool.is_failed(f2)
        os.kill(pool.server_pid(a, "notes"), signal.SIGKILL)
        time.sleep(0.2)
        assert pool.step([(a, "list_tags", {})])[0].status == "server_crashed" and pool.is_failed(a)
        (a2,) = pool.reset([EpisodeSpec(("notes",), seed=1)])
        assert _ok(pool.step([(a2, "list_tags", {})])[0])["tags"]
        assert len(_server_pids(pool._root)) >= 2
    _wait_no_servers(pool._root)


@pytest.mark.slow
def test_pool_workers_builtin_and_synth_and_faults(catalog):
    """2 worker processes, stdio servers: multi-step episodes, a crash, a hang, a kill; no orphans."""
    pool = EnvPool(catalog, num_workers=2, call_timeout_s=3.0)
    try:
        specs = [EpisodeSpec(("contacts", "mail"), seed=1), EpisodeSpec(("shop", "bank"), seed=1),
                 EpisodeSpec(("faulty",), seed=0), EpisodeSpec(("faulty", "hubspot"), seed=0)]
        a, b, f1, f2 = pool.reset(specs)
        assert len({a.worker, b.worker}) == 2 or len({f1.worker, f2.worker}) == 2
        assert not any(pool.is_failed(e) for e in (a, b, f1, f2))
        person = _ok(pool.step([(a, "list_contacts", {"limit": 1})])[0])["contacts"][0]
        sent, orders = pool.step([(a, "send_email", {"to": [person["email"]], "subject": "s", "body": "b"}),
                                  (b, "list_orders", {})])
        _ok(sent), _ok(orders)
        contact = _ok(pool.step([(f2, "create_contact", {"email": person["email"], "firstname": "Ada"})])[0])
        assert contact["email"] == person["email"]
        # a slow tool in a live server: timeout, the episode stays usable
        t0 = time.time()
        o = pool.step([(f1, "hang", {"seconds": 30}), (a, "list_folders", {})])
        assert [x.status for x in o] == ["timeout", "ok"] and time.time() - t0 < 20
        assert not pool.is_failed(f1)
        assert _ok(pool.step([(f1, "echo", {"text": "still here"})])[0])["text"] == "still here"
        # a server that blocks entirely: timeout, killed, its episodes failed, restarted on next reset
        o = pool.step([(f1, "block", {"seconds": 60})])[0]
        assert o.status == "timeout" and pool.is_failed(f1)
        # f2 shares the faulty process only if it is on the same worker
        assert pool.is_failed(f2) == (f1.worker == f2.worker)
        assert pool.step([(f1, "echo", {"text": "x"})])[0].status == "server_crashed"
        # a crashing server
        (f3,) = pool.reset([EpisodeSpec(("faulty",), seed=0)])
        assert not pool.is_failed(f3)
        o = pool.step([(f3, "crash", {}), (a, "list_folders", {})])
        assert [x.status for x in o] == ["server_crashed", "ok"] and pool.is_failed(f3)
        # kill a built-in server process mid-episode
        pid = pool.server_pid(b, "bank")
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
        o = pool.step([(b, "list_accounts", {}), (a, "list_folders", {})])
        assert [x.status for x in o] == ["server_crashed", "ok"] and pool.is_failed(b)
        (b2,) = pool.reset([EpisodeSpec(("bank",), seed=1)])
        assert _ok(pool.step([(b2, "list_accounts", {})])[0])["accounts"]
        assert pool.server_pid(b2, "bank") != pid
        state = pool.read_state(a)
        assert any(e["to"] == [person["email"]] for e in state["mail"]["emails"].values())
        pool.close([a, b, b2, f1, f2, f3])
    finally:
        pool.close()
    _wait_no_servers(pool._root)


def test_pool_garbage_collected_cleans_up(catalog):
    import gc

    pool = EnvPool(catalog, num_workers=1)
    (ep,) = pool.reset([EpisodeSpec(("notes",), seed=0)])
    assert _ok(pool.step([(ep, "list_tags", {})])[0])
    procs, root = list(pool._procs), pool._root
    assert _server_pids(root)
    del pool, ep
    gc.collect()
    _wait_no_servers(root)
    assert not any(p.is_alive() for p in procs)


_CHILD = r"""
import signal, sys, time
from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec
if __name__ == "__main__":
    # A trainer's Ctrl-C: where pytest itself runs in a background job, SIGINT is inherited as
    # ignored, and the SIGINT case would then wait for a child that never stops.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with EnvPool(Catalog.default(kinds=("builtin",)), num_workers=1) as pool:
        (ep,) = pool.reset([EpisodeSpec(("notes",), seed=0)])
        print(pool.server_pid(ep, "notes"), pool._procs[0].pid, flush=True)
        time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_no_orphans_when_trainer_interrupted_or_killed(tmp_path, sig):
    import subprocess
    import sys

    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        server_pid, worker_pid = map(int, p.stdout.readline().split())
        os.kill(server_pid, 0) or os.kill(worker_pid, 0)  # both alive
        p.send_signal(sig)
        p.wait(timeout=30)
        deadline = time.time() + 10
        alive = [server_pid, worker_pid]
        while alive and time.time() < deadline:
            alive = [q for q in alive if os.path.exists(f"/proc/{q}") and
                     open(f"/proc/{q}/stat").read().split(") ", 1)[1][0] not in "ZX"]
            time.sleep(0.1)
        assert not alive, f"orphans after {sig!r}: {alive}"
    finally:
        if p.poll() is None:
            p.kill()


def test_builtin_outputs_match_output_schema(catalog, local_pool):
    """Every built-in tool, called with ids from its seeded state, returns schema-valid structured output."""
    from toolverse_jax.envs.synth import fake

    checked = 0
    for server in BUILTIN:
        (ep,) = local_pool.reset([EpisodeSpec((server,), seed=2)])
        state = local_pool.read_state(ep)[server]
        ids = {}
        for table in state.values():
            if isinstance(table, dict):
                for row in table.values():
                    if isinstance(row, dict):
                        for k, v in row.items():
                            if k.endswith("_id") or k == "email":
                                ids.setdefault(k, v)
        ids.update(account_id="acc_0001", from_account_id="acc_0001", folder="inbox", status="open",
                   priority="high", origin="SFO", destination="JFK", date="2026-03-05", check_in="2026-03-05",
                   start_time="10:00", end_time="11:00", amount=1.5, quantity=1, nights=2, limit=5,
                   from_currency="USD", to_currency="EUR", agent_email="sam@support.example.com",
                   to_account_number="1234567890", account_number="1234567890", city="Paris")
        for spec in catalog.list_tools(server):
            if spec["name"] in ("delete_email", "delete_event", "delete_contact", "delete_note"):
                continue
            props = spec["inputSchema"].get("properties", {})
            rng = random.Random(0)
            args = {p: ids[p] if p in ids else fake(p, s, rng) for p, s in props.items()
                    if p in spec["inputSchema"].get("required", []) or p in ids}
            o = local_pool.step([(ep, spec["name"], args)])[0]
            if o.status == "ok":
                jsonschema.validate(o.structured, spec["outputSchema"])
                assert json.loads(o.content) == o.structured
                checked += 1
        local_pool.close([ep])
    assert checked >= 60, checked  # of 75 tools; the rest need ids a blind call cannot know


def test_missing_third_party_marked_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLVERSE_MCP_SERVERS", str(tmp_path))  # an empty install folder
    cat = Catalog.default(kinds=("third_party",))
    fs = cat.entry("filesystem")
    assert not fs.available and "not installed" in fs.reason and "install_servers" in fs.reason
    assert cat.list_tools("filesystem")  # the harvested manifest is still listed
    with EnvPool(cat, num_workers=0) as pool:
        with pytest.raises(ValueError, match="filesystem.*unavailable"):
            pool.reset([EpisodeSpec(("filesystem",))])
