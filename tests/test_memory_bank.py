"""Memory bank MCP server: tools, snapshot/restore exactness, hash, errors (through the env pool)."""

import hashlib
import json

import jsonschema
import pytest

from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec
from toolverse_jax.envs.builtin.memory_bank import content_hash


@pytest.fixture(scope="module")
def pool():
    with EnvPool(Catalog.default(kinds=("builtin",), include_hidden=True), num_workers=0) as p:
        yield p


def _call(pool, ep, tool, **args):
    (obs,) = pool.step([(ep, tool, args)])
    return obs


def _ok(pool, ep, tool, **args):
    obs = _call(pool, ep, tool, **args)
    assert obs.status == "ok", obs.content
    return obs.structured


def test_tools_and_revision_history(pool):
    (ep,) = pool.reset([EpisodeSpec(("memory_bank",), 0)])
    a = _ok(pool, ep, "add", text="city: Oslo", time=1)
    b = _ok(pool, ep, "add", text="job:  nurse", time=2)
    assert (a["memory_id"], b["memory_id"], b["text"]) == ("m_0001", "m_0002", "job: nurse")
    u = _ok(pool, ep, "update", memory_id="m_0001", text="city: Rome", time=3)
    assert u["history"] == [{"text": "city: Oslo", "time": 1}] and u["updated"] == 3
    hits = _ok(pool, ep, "search", query="Which city do I live in?", k=5)["entries"]
    assert [h["memory_id"] for h in hits] == ["m_0001"]
    assert _ok(pool, ep, "delete", memory_id="m_0002") == {"memory_id": "m_0002", "deleted": True}
    assert [e["text"] for e in _ok(pool, ep, "list")["entries"]] == ["city: Rome"]
    err = _call(pool, ep, "delete", memory_id="m_0002")
    assert err.status == "tool_error" and "m_0002" in err.content
    assert _call(pool, ep, "add", text="   ").status == "tool_error"
    assert _call(pool, ep, "search", query="x", k=0).status == "tool_error"
    pool.close([ep])


def test_snapshot_restore_is_exact(pool):
    src, dst = pool.reset([EpisodeSpec(("memory_bank",), 0)] * 2)
    _ok(pool, src, "add", text="city: Oslo", time=1)
    _ok(pool, src, "add", text="dog: Rex", time=2)
    _ok(pool, src, "update", memory_id="m_0001", text="city: Lima", time=3)
    snap = _ok(pool, src, "snapshot")
    # The hash is the sha256 of the canonical JSON of the state (computed here another way).
    canon = json.dumps({"entries": snap["state"]["entries"],
                        "_counters": snap["state"]["_counters"]}, sort_keys=True,
                       separators=(",", ":"))
    assert snap["hash"] == hashlib.sha256(canon.encode()).hexdigest() == content_hash(snap["state"])
    # Mutate the source after the snapshot, and give the destination different content.
    _ok(pool, src, "delete", memory_id="m_0002")
    _ok(pool, dst, "add", text="trip: Paris", time=1)
    for ep in (src, dst):
        assert _ok(pool, ep, "restore", state=snap["state"])["hash"] == snap["hash"]
        again = _ok(pool, ep, "snapshot")
        assert again["state"] == snap["state"] and again["hash"] == snap["hash"]
    # The id counter is restored too: both banks continue with the same next id.
    ids = [_ok(pool, ep, "add", text="job: chef", time=4)["memory_id"] for ep in (src, dst)]
    assert ids == ["m_0003", "m_0003"]
    assert _ok(pool, src, "snapshot")["hash"] == _ok(pool, dst, "snapshot")["hash"] != snap["hash"]
    pool.close([src, dst])


def test_restore_rejects_malformed_state(pool):
    (ep,) = pool.reset([EpisodeSpec(("memory_bank",), 0)])
    bad = _call(pool, ep, "restore", state={"entries": []})
    assert bad.status == "tool_error" and "snapshot" in bad.content
    bad = _call(pool, ep, "restore", state={"entries": {"m_0001": {"text": "x"}}, "_counters": {}})
    assert bad.status == "tool_error" and "m_0001" in bad.content
    pool.close([ep])


def test_outputs_match_manifest_schemas(pool):
    cat = Catalog.default(kinds=("builtin",), include_hidden=True)
    specs = {t["name"]: t for t in cat.list_tools("memory_bank")}
    assert set(specs) == {"add", "update", "delete", "search", "list", "snapshot", "restore"}
    (ep,) = pool.reset([EpisodeSpec(("memory_bank",), 0)])
    outs = {"add": _ok(pool, ep, "add", text="city: Oslo"),
            "update": _ok(pool, ep, "update", memory_id="m_0001", text="city: Rome"),
            "search": _ok(pool, ep, "search", query="city"), "list": _ok(pool, ep, "list"),
            "snapshot": _ok(pool, ep, "snapshot")}
    outs["restore"] = _ok(pool, ep, "restore", state=outs["snapshot"]["state"])
    outs["delete"] = _ok(pool, ep, "delete", memory_id="m_0001")
    for name, out in outs.items():
        jsonschema.validate(out, specs[name]["outputSchema"])
    pool.close([ep])
