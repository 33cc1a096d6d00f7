"""Servers' control plane stays out of an agent's reach, and server processes stay in their sandbox.

- A plain MCP client (the SDK's stdio client, as any MCP host would use it) sees no `_tv_*` tool on
  any server kind we serve, and calling one without the pool's token fails like an unknown tool.
- Escapes through the pool (isolate.py: Landlock, a network namespace, resource limits): SQL file
  writes on the third-party sqlite server, symlinks and traversal on the filesystem server, huge
  outputs, a synthesized server's arguments. Skipped where this machine cannot isolate.
"""

import asyncio
import glob
import json
import os
import subprocess
import sys

import pytest

from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec, isolate
from toolverse_jax.envs.connection import MAX_CONTENT_CHARS
from toolverse_jax.envs.episode import CONTROL_META_KEY, CONTROL_TOKEN_VAR, EPISODE_META_KEY, HIDDEN_PREFIX

CAT = Catalog.default(kinds=("builtin", "synthesized", "third_party", "bfcl"), include_hidden=True)
PROBE = isolate.probe()
needs_landlock = pytest.mark.skipif(not PROBE["landlock_fs"], reason=f"no Landlock here: {PROBE}")
needs_netns = pytest.mark.skipif(not PROBE["netns"], reason=f"no network namespace here: {PROBE}")


def _launch(name):
    e = CAT.entry(name)
    if not e.available:
        pytest.skip(f"{name} unavailable: {e.reason}")
    return e.format(e.launch["command"]), [e.format(a) for a in e.launch.get("args", [])]


async def _plain_client(cmd, args, token=None, calls=()):
    """Lists tools and makes `calls` [(name, args, meta)] with the SDK's own client over stdio."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(sys.path)}
    if token:
        env[CONTROL_TOKEN_VAR] = token
    params = StdioServerParameters(command=cmd, args=args, env=env)
    async with Client(stdio_client(params), mode="legacy") as c:
        names = [t.name for t in (await c.list_tools()).tools]
        results = []
        for name, a, meta in calls:
            r = await c.call_tool(name, a, meta=meta)
            results.append((r.is_error, "\n".join(getattr(x, "text", "") for x in r.content)))
        return names, results


@pytest.mark.parametrize("server", ["calendar", "memory_bank", "search", "acuity_scheduling", "bfcl_math"])
def test_plain_mcp_client_sees_no_control_tool(server):
    """Built-in, memory-bank, search, synthesized and BFCL servers: no `_tv_*` tool listed, and
    reset/state/close answer "Unknown tool" without the token, with a wrong one, and with a
    token set but none sent; the pool's token (sent in `_meta`) is obeyed."""
    cmd, args = _launch(server)
    ep = {EPISODE_META_KEY: "e1"}
    probes = [("_tv_state", {}, None), ("_tv_reset", {"seed": 3}, ep), ("_tv_close", {}, ep)]
    names, results = asyncio.run(_plain_client(cmd, args, calls=probes))
    assert names and not [n for n in names if n.startswith(HIDDEN_PREFIX)]
    for (is_error, text), (name, _, _) in zip(results, probes):
        assert is_error and text == f"Unknown tool: {name}"
    good = dict(ep, **{CONTROL_META_KEY: "s3cret"})
    bad = dict(ep, **{CONTROL_META_KEY: "guess"})
    names, results = asyncio.run(_plain_client(cmd, args, token="s3cret", calls=[
        ("_tv_state", {}, bad), ("_tv_reset", {"seed": 3}, ep), ("_tv_reset", {"seed": 3}, good),
        ("_tv_state", {}, good)]))
    assert not [n for n in names if n.startswith(HIDDEN_PREFIX)]
    assert [r[0] for r in results] == [True, True, False, False]
    assert "Unknown tool" in results[0][1] and "Unknown tool" in results[1][1]
    assert "state" in json.loads(results[3][1])


def test_standalone_server_serves_its_default_episode():
    """Without a token (python -m toolverse_jax.envs.builtin.run) the tools work on the default
    episode and nothing can reset or read it."""
    cmd, args = _launch("notes")
    names, results = asyncio.run(_plain_client(cmd, args, calls=[("list_notes", {}, None)]))
    assert "list_notes" in names
    assert results[0][0] is False and "nt_" in results[0][1]


def _run_isolated(tmp_path, code, **kw):
    sb = tmp_path / "sb"
    sb.mkdir(exist_ok=True)
    argv = isolate.launcher([str(sb)], **kw) + [sys.executable, "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=sb)


@needs_landlock
def test_launcher_confines_writes(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    code = f"""
import os, sqlite3
open('inside.txt', 'w').write('ok')
open('/dev/null', 'w').write('ok')
errs = []
for f in (lambda: open({str(outside / 'x.txt')!r}, 'w'), lambda: os.remove({str(outside / 'keep.txt')!r}),
          lambda: os.symlink('/etc', {str(outside / 'ln')!r}), lambda: os.mkdir({str(outside / 'd')!r}),
          lambda: open({str(outside / 'keep.txt')!r}, 'r+').truncate(0),
          lambda: sqlite3.connect(':memory:').execute("VACUUM INTO {str(outside / 'v.db')}")):
    try:
        f(); errs.append('wrote')
    except (OSError, sqlite3.Error) as e:
        errs.append(type(e).__name__)
print(errs)
"""
    r = _run_isolated(tmp_path, code)
    assert r.returncode == 0, r.stderr
    assert "wrote" not in r.stdout, r.stdout
    assert (tmp_path / "sb" / "inside.txt").read_text() == "ok"
    assert sorted(os.listdir(outside)) == ["keep.txt"] and (outside / "keep.txt").read_text() == "keep"


@needs_netns
def test_launcher_has_no_network(tmp_path):
    code = """
import socket
s = socket.socket()
s.settimeout(3)
try:
    s.connect(('1.1.1.1', 80)); print('connected')
except OSError as e:
    print('refused', e.errno)
"""
    r = _run_isolated(tmp_path, code)
    assert r.returncode == 0, r.stderr
    assert "refused" in r.stdout


def test_launcher_memory_limit(tmp_path):
    r = _run_isolated(tmp_path, "b = bytearray(600 << 20); print('allocated')", mem_mb=300)
    assert "allocated" not in r.stdout and "MemoryError" in r.stderr


def test_isolation_modes():
    assert isolate.Isolation("off").prefix(["/tmp"], shared=False) == []
    with pytest.raises(ValueError, match="isolation mode"):
        isolate.Isolation("strict")
    argv = isolate.Isolation(cpu_s=7).prefix(["/tmp/a"], shared=False)
    assert "--cpu-s" in argv and argv[argv.index("--cpu-s") + 1] == "7"
    assert "--cpu-s" not in isolate.Isolation(cpu_s=7).prefix(["/tmp/a"], shared=True)


@pytest.fixture(scope="module")
def escape_env(tmp_path_factory):
    servers = tuple(s for s in ("sqlite", "filesystem", "git", "everything", "notes", "acuity_scheduling")
                    if s in CAT and CAT.entry(s).available)
    base = tmp_path_factory.mktemp("escape")
    outside = base / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("canary")
    with EnvPool(CAT, num_workers=1, call_timeout_s=20.0, root=str(base / "pool")) as pool:
        (ep,) = pool.reset([EpisodeSpec(servers, seed=2)])
        assert not pool.is_failed(ep)
        yield pool, ep, outside, servers


def _untouched(outside):
    assert sorted(os.listdir(outside)) == ["canary.txt"]
    assert (outside / "canary.txt").read_text() == "canary"


@needs_landlock
def test_sqlite_cannot_write_files_outside(escape_env):
    pool, ep, outside, servers = escape_env
    if "sqlite" not in servers:
        pytest.skip("sqlite server not installed")
    queries = [f"ATTACH DATABASE '{outside}/a.db' AS x", f"VACUUM INTO '{outside}/copy.db'",
               f"ATTACH DATABASE 'file:{outside}/u.db?mode=rwc' AS y",
               f"ATTACH DATABASE '{outside}/canary.txt' AS z"]
    obs = pool.step([(ep, "write_query", {"query": q}) for q in queries])
    for o in obs:
        assert o.status in ("ok", "tool_error") and "error" in o.content.lower(), o.content
    _untouched(outside)
    assert pool.step([(ep, "read_query", {"query": "SELECT COUNT(*) FROM customers"})])[0].status == "ok"


def test_filesystem_symlink_and_traversal(escape_env):
    pool, ep, outside, servers = escape_env
    if "filesystem" not in servers:
        pytest.skip("filesystem server not installed")
    (sb,) = glob.glob(os.path.join(str(outside.parent), "pool", "w*", ep.id, "filesystem"))
    os.symlink(outside, os.path.join(sb, "link"))  # as if a fixture or a checkout had planted it
    calls = [("write_file", {"path": "link/pwn.txt", "content": "x"}), ("list_directory", {"path": "link"}),
             ("write_file", {"path": f"{outside}/x.txt", "content": "x"}),
             ("write_file", {"path": "../../outside/x.txt", "content": "x"}),
             ("move_file", {"source": "README.md", "destination": f"{outside}/moved.md"}),
             ("create_directory", {"path": "docs/../../../../outside/newdir"})]
    for name, args in calls:
        assert pool.step([(ep, name, args)])[0].status == "invalid_call"
    _untouched(outside)


def test_huge_outputs_are_truncated(escape_env):
    pool, ep, outside, servers = escape_env
    if "filesystem" not in servers:
        pytest.skip("filesystem server not installed")
    big = "A" * 60_000
    for i in range(3):
        assert pool.step([(ep, "write_file", {"path": f"big{i}.txt", "content": big})])[0].status == "ok"
    o = pool.step([(ep, "read_multiple_files", {"paths": [f"big{i}.txt" for i in range(3)]})])[0]
    assert o.status == "ok" and len(o.content) <= MAX_CONTENT_CHARS + 20 and o.content.endswith("[truncated]")


def test_synthesized_and_builtin_arguments_stay_inside(escape_env):
    pool, ep, outside, servers = escape_env
    hostile = [f"'); ATTACH DATABASE '{outside}/s.db' AS x; --", f"{outside}/x", "../" * 10 + "outside/p"]
    calls = []
    for t in ep.tools:
        server, _ = ep.names[t["name"]]
        if server not in ("notes", "acuity_scheduling"):
            continue
        props = t["inputSchema"].get("properties", {})
        strs = [k for k, v in props.items() if v.get("type") == "string"]
        if strs:
            calls += [(ep, t["name"], {k: h for k in strs}) for h in hostile]
    assert calls
    obs = pool.step(calls)
    assert all(o.status != "server_crashed" for o in obs)
    _untouched(outside)
