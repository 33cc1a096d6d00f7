"""Tests of experiments/harvest_servers.py and the harvest helpers of toolverse_jax/envs/harvest.py.

The default tests harvest tiny MCP servers packaged here as wheels (stdlib only, so they install
with no network): three that list tools, one that wants an API key, one that lists none, and one
the index lacks. The networked test (`-m slow`) harvests real registry packages.
"""

import base64
import hashlib
import json
import os
import sys
import zipfile

import pytest

from experiments import harvest_servers
from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec
from toolverse_jax.envs import harvest as hv

# A stdio MCP server in the standard library alone: newline-delimited JSON-RPC (initialize,
# tools/list); MODE and TOOLS are filled in per package.
SERVER = '''import json, sys
MODE, NAME, TOOLS = {mode!r}, {name!r}, json.loads({tools!r})


def main():
    if MODE == "transport" and sys.argv[1:] != ["stdio"]:
        sys.stderr.write("usage: srv [-h] {{stdio,sse}}\\nsrv: error: the following arguments are required: transport\\n")
        sys.exit(2)
    if MODE == "key":
        sys.stderr.write("Error: FAKE_API_KEY environment variable is required\\n")
        sys.exit(1)
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        if msg["method"] == "initialize":
            res = {{"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {{"tools": {{}}}},
                   "serverInfo": {{"name": NAME, "version": "0.1.0"}}}}
        elif msg["method"] == "tools/list":
            res = {{"tools": TOOLS if MODE != "empty" else []}}
        else:
            out = {{"jsonrpc": "2.0", "id": msg["id"], "error": {{"code": -32601, "message": "no method"}}}}
            sys.stdout.write(json.dumps(out) + "\\n")
            sys.stdout.flush()
            continue
        sys.stdout.write(json.dumps({{"jsonrpc": "2.0", "id": msg["id"], "result": res}}) + "\\n")
        sys.stdout.flush()
'''


def _obj(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}, "required": required}


PACKAGES = {  # name -> (mode, tools)
    "fake-notes-mcp": ("ok", [
        {"name": "create_note", "description": "Create a note.", "inputSchema": _obj({"title": "string"}, ["title"])},
        {"name": "get_note", "description": "Get a note.", "inputSchema": _obj({"note_id": "string"}, ["note_id"])},
        {"name": "list_notes", "description": "List notes.", "inputSchema": _obj({}, [])}]),
    "fake-books-mcp": ("transport", [  # starts only with `stdio` as its argument
        {"name": "search_books", "description": "Search books.", "inputSchema": _obj({"query": "string"}, ["query"])},
        {"name": "get_book", "description": "Get a book.", "inputSchema": _obj({"book_id": "string"}, ["book_id"])}]),
    "mcp-server-fake-weather": ("ok", [
        {"name": "get_forecast", "description": "Forecast for a city.",
         "inputSchema": _obj({"city": "string", "days": "integer"}, ["city"])}]),
    "fake-keyed-mcp": ("key", []),
    "fake-empty-mcp": ("empty", []),
}


def _wheel(folder: str, name: str, mode: str, tools: list[dict]) -> None:
    mod = name.replace("-", "_")
    dist = f"{mod}-0.1.0.dist-info"
    files = {
        f"{mod}/__init__.py": "",
        f"{mod}/server.py": SERVER.format(mode=mode, name=name, tools=json.dumps(tools)),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/entry_points.txt": f"[console_scripts]\n{name} = {mod}.server:main\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(os.path.join(folder, f"{mod}-0.1.0-py3-none-any.whl"), "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


@pytest.fixture(scope="module")
def harvested(tmp_path_factory):
    """Harvests the fake packages (plus one the index lacks); returns (out dir, summary, rows)."""
    root = tmp_path_factory.mktemp("harvest")
    wheels = root / "wheels"
    wheels.mkdir()
    for name, (mode, tools) in PACKAGES.items():
        _wheel(str(wheels), name, mode, tools)
    lst = root / "packages.txt"
    lst.write_text("# fake servers\n" + "".join(f"pypi:{n}==0.1.0\n" for n in PACKAGES)
                   + "pypi:fake-absent-mcp==0.1.0\npypi:fake-notes-mcp==0.1.0  # a duplicate, harvested once\n")
    out = root / "out"
    summary = harvest_servers.main(["--packages", str(lst), "--out", str(out), "--jobs", "2", "--python", sys.executable,
                                    "--find-links", str(wheels), "--start-timeout", "30"])
    with open(out / "report.json") as f:
        rows = {r["server"]: r for r in json.load(f)["packages"]}
    return out, summary, rows


def test_parse_packages():
    pk = hv.parse_packages("pypi:mcp-server-time==2026.10.19\n# c\n\nnpm:@scope/server-bar@0.4.1\nnpm:plain-mcp\n")
    assert [(p.registry, p.name, p.version) for p in pk] == [
        ("pypi", "mcp-server-time", "2026.10.19"), ("npm", "@scope/server-bar", "0.4.1"), ("npm", "plain-mcp", None)]
    assert [p.spec for p in pk] == ["mcp-server-time==2026.10.19", "@scope/server-bar@0.4.1", "plain-mcp"]
    assert [p.server for p in pk] == ["pypi-mcp-server-time", "npm-scope-server-bar", "npm-plain-mcp"]
    with pytest.raises(ValueError, match="line 1"):
        hv.parse_packages("cargo:foo==1\n")


def test_start_reasons():
    assert hv.start_reason("McpError: Connection closed", "Error: BRAVE_API_KEY is required") == "needs_credentials"
    assert hv.start_reason("McpError: Connection closed", "getaddrinfo ENOTFOUND api.x.com") == "needs_network"
    assert hv.start_reason("McpError: Connection closed", "usage: srv [-h] --db DB") == "needs_arguments"
    assert hv.start_reason("TimeoutError: ", "INFO: Uvicorn running on http://127.0.0.1:8000") == "not_stdio"
    assert hv.start_reason("TimeoutError: ", "") == "start_timeout"
    assert hv.start_reason("McpError: Connection closed", "ModuleNotFoundError: No module named 'x'") == "broken_package"
    assert hv.start_reason("McpError: Connection closed", "Error: required option '--url <u>' not specified") \
        == "needs_arguments"
    assert hv.start_reason("McpError: Connection closed", "Please place gcp-oauth.keys.json in ~/.x") == "needs_credentials"
    assert hv.start_reason("McpError: Connection closed", "FastMCP was renamed; pin 'mcp<2' to keep v1 code") \
        == "needs_mcp_v1"


def test_stdio_args():
    assert hv.stdio_args("usage: s [-h] {stdio,sse}\ns: error: the following arguments are required: transport") == ["stdio"]
    assert hv.stdio_args("usage: s [--transport {stdio,http}]\nerror: --transport is required") == ["--transport", "stdio"]
    assert hv.stdio_args("usage: s --db-path PATH") is None


def test_task_readable_drops_what_dusa_cannot_read():
    good = {"name": "get_x", "inputSchema": _obj({"id": "string"}, ["id"])}
    odd = {"name": "odd", "inputSchema": {"type": "object", "properties": {"x": {"anyOf": {}}}}}
    keep, dropped = harvest_servers.task_readable([good, odd])
    assert keep == [good] and len(dropped) == 1 and dropped[0].startswith("odd: TypeError")


def test_shipped_package_list():
    with open(harvest_servers.DEFAULT_PACKAGES) as f:
        pk = hv.parse_packages(f.read())
    assert len(pk) >= 300 and all(p.version for p in pk)
    assert {p.registry for p in pk} == {"pypi", "npm"}
    assert len({p.server for p in pk}) == len(pk)


def test_harvest_report(harvested):
    out, summary, rows = harvested
    assert {s: (r["status"], r["reason"], r["tools"]) for s, r in rows.items()} == {
        "pypi-fake-notes-mcp": ("ok", None, 3), "pypi-fake-books-mcp": ("ok", None, 2),
        "pypi-mcp-server-fake-weather": ("ok", None, 1),
        "pypi-fake-keyed-mcp": ("skipped", "needs_credentials", 0),
        "pypi-fake-empty-mcp": ("skipped", "no_tools", 0),
        "pypi-fake-absent-mcp": ("skipped", "not_on_registry", 0)}
    assert (summary["tried"], summary["installed"], summary["started"], summary["ok"], summary["tools"]) == (6, 5, 4, 3, 6)
    assert summary["reasons"] == {"needs_credentials": 1, "no_tools": 1, "not_on_registry": 1}
    assert "FAKE_API_KEY" in rows["pypi-fake-keyed-mcp"]["detail"]
    assert rows["pypi-fake-books-mcp"]["command"] == "bin/fake-books-mcp stdio"
    assert sorted(os.listdir(out / "manifests")) == sorted(os.listdir(out / "catalog")) == [
        "pypi-fake-books-mcp.json", "pypi-fake-notes-mcp.json", "pypi-mcp-server-fake-weather.json"]
    assert not os.path.exists(out / "prefixes")  # only the manifests are kept
    with open(out / "manifests" / "pypi-fake-notes-mcp.json") as f:
        m = json.load(f)
    assert m["server"] == "pypi-fake-notes-mcp" and m["source"].startswith("pypi:fake-notes-mcp==0.1.0")
    assert m["tools"] == PACKAGES["fake-notes-mcp"][1]  # as listed, in order


def test_harvested_catalog_and_episode(harvested, monkeypatch):
    out, _, _ = harvested
    monkeypatch.setenv("TOOLVERSE_HARVEST_DIR", str(out))
    assert not any(e.kind == "harvested" for e in Catalog.default().servers)  # only when named
    cat = Catalog.default(kinds=("harvested",))
    assert sorted(e.name for e in cat.servers) == [
        "pypi-fake-books-mcp", "pypi-fake-notes-mcp", "pypi-mcp-server-fake-weather"]
    assert all(e.available and e.stateful for e in cat.servers)
    assert [t["name"] for t in cat.list_tools("pypi-fake-books-mcp")] == ["search_books", "get_book"]
    with EnvPool(cat, num_workers=1, call_timeout_s=20.0, start_timeout_s=60.0) as pool:
        (ep,) = pool.reset([EpisodeSpec(("pypi-fake-notes-mcp", "pypi-mcp-server-fake-weather"), seed=3)])
        made, bad, weather = pool.step([(ep, "create_note", {"title": "harvested"}),
                                        (ep, "get_note", {"note_id": "nope"}),
                                        (ep, "get_forecast", {"city": "Oslo"})])
        assert made.status == "ok", made.content
        note = json.loads(made.content)  # no outputSchema listed: the record as JSON text
        assert note["title"] == "harvested"
        assert bad.status == "tool_error" and "not found" in bad.content
        assert weather.status == "ok" and json.loads(weather.content)["city"] == "Oslo"
        got = pool.step([(ep, "get_note", {"note_id": note["id"]})])[0]
        assert got.status == "ok" and json.loads(got.content) == note  # state kept


@pytest.mark.slow
def test_harvest_real_registry_servers(tmp_path):
    """Networked: harvests three small real servers from PyPI and npm."""
    lst = tmp_path / "p.txt"
    lst.write_text("pypi:mcp-server-time==2026.10.19\npypi:duckduckgo-mcp-server==0.7.0\n"
                   "npm:@modelcontextprotocol/server-memory@2026.8.31\n")
    s = harvest_servers.main(["--packages", str(lst), "--out", str(tmp_path / "out"), "--jobs", "2"])
    assert s["ok"] == 3 and s["tools"] >= 3 + 2 + 9, s
