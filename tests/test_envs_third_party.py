"""Real third-party MCP servers (unmodified, stdio) through the env pool; skipped if not installed."""

import os

import pytest

from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec

CAT = Catalog.default(kinds=("third_party",))
AVAILABLE = {e.name: e for e in CAT.servers if e.available}


def _need(name):
    if name not in AVAILABLE:
        e = CAT.entry(name) if name in CAT else None
        pytest.skip(f"{name} unavailable: {e.reason if e else 'not in catalog'} "
                    f"(python -m experiments.install_servers)")


@pytest.fixture(scope="module")
def env():
    if not AVAILABLE:
        pytest.skip("no third-party server installed (python -m experiments.install_servers)")
    with EnvPool(CAT, num_workers=0, call_timeout_s=20.0) as pool:
        (ep,) = pool.reset([EpisodeSpec(tuple(AVAILABLE), seed=4)])
        assert not pool.is_failed(ep)
        yield pool, ep


def _step(env, name, args, status="ok"):
    pool, ep = env
    o = pool.step([(ep, name, args)])[0]
    assert o.status == status, (name, o.status, o.content[:500])
    return o


def test_time(env):
    _need("time")
    now = _step(env, "get_current_time", {"timezone": "UTC"}).structured
    hhmm = now["datetime"][11:16]
    conv = _step(env, "convert_time", {"source_timezone": "UTC", "time": hhmm, "target_timezone": "Asia/Tokyo"})
    assert conv.structured["target"]["timezone"] == "Asia/Tokyo"
    _step(env, "get_current_time", {"timezone": "Mars/Base"}, "tool_error")


def test_git_on_fixture_repo(env):
    _need("git")
    st = _step(env, "git_status", {"repo_path": "."}).content
    assert "docs/todo.txt" in st  # the seeded uncommitted change
    _step(env, "git_add", {"repo_path": ".", "files": ["docs/todo.txt"]})
    _step(env, "git_commit", {"repo_path": ".", "message": "Record todo"})
    log = _step(env, "git_log", {"repo_path": ".", "max_count": 5}).content
    assert "Record todo" in log and "Add changelog" in log
    o = _step(env, "git_status", {"repo_path": "/"}, "invalid_call")
    assert "outside the episode sandbox" in o.content
    _step(env, "git_add", {"repo_path": ".", "files": ["../../../etc/passwd"]}, "invalid_call")


def test_sqlite_on_fixture_db(env):
    _need("sqlite")
    assert "orders" in _step(env, "list_tables", {}).content
    _step(env, "write_query", {"query": "INSERT INTO orders VALUES (99, 1, 'Desk Lamp', 34.25)"})
    assert "21" in _step(env, "read_query", {"query": "SELECT COUNT(*) AS n FROM orders"}).content
    pool, ep = env
    state = pool.read_state(ep)["sqlite"]
    assert len(state["fixture.db"]["orders"]) == 21


def test_filesystem_confined(env):
    _need("filesystem")
    _step(env, "write_file", {"path": "notes/new.txt", "content": "hello"}, "tool_error")  # parent missing
    _step(env, "create_directory", {"path": "notes"})
    _step(env, "write_file", {"path": "notes/new.txt", "content": "hello ✓"})
    assert "hello ✓" in _step(env, "read_text_file", {"path": "notes/new.txt"}).content
    assert "README.md" in _step(env, "list_directory", {"path": "."}).content
    for bad in ("../../../../etc/passwd", "/etc/passwd", "notes/../../x"):
        o = _step(env, "read_text_file", {"path": bad}, "invalid_call")
        assert "outside the episode sandbox" in o.content
    _step(env, "move_file", {"source": "notes/new.txt", "destination": "/tmp/escaped.txt"}, "invalid_call")
    pool, ep = env
    assert pool.read_state(ep)["filesystem"]["notes/new.txt"] == "hello ✓"


def test_memory_graph_in_sandbox(env):
    _need("memory")
    ents = [{"name": "Ada", "entityType": "person", "observations": ["likes tea"]},
            {"name": "Acme", "entityType": "company", "observations": []}]
    _step(env, "create_entities", {"entities": ents})
    _step(env, "create_relations", {"relations": [{"from": "Ada", "to": "Acme", "relationType": "works_at"}]})
    found = _step(env, "search_nodes", {"query": "tea"}).content
    assert "Ada" in found
    pool, ep = env
    assert "works_at" in pool.read_state(ep)["memory"]["memory.jsonl"]


def test_everything(env):
    _need("everything")
    assert "hi" in _step(env, "echo", {"message": "hi"}).content
    assert "5" in _step(env, "get-sum", {"a": 2, "b": 3}).content
    _step(env, "get-sum", {"a": "two", "b": 3}, "invalid_call")
