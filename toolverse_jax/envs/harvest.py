"""Harvests `tools/list` of catalog servers into packaged manifest files (run once per install)."""

import asyncio
import json
import os
import tempfile

from toolverse_jax.envs.catalog import MANIFEST_DIR, Catalog, ServerEntry
from toolverse_jax.envs.episode import HIDDEN_PREFIX

SPEC_KEYS = ("name", "description", "inputSchema", "outputSchema")


def tool_spec(tool) -> dict:
    """Returns the MCP tool spec dict {name, description, inputSchema, outputSchema?} of a Tool."""
    d = tool.model_dump(by_alias=True, exclude_none=True, mode="json")
    out = {k: d[k] for k in SPEC_KEYS if k in d}
    out.setdefault("description", "")
    return out


async def list_tools_live(entry: ServerEntry, timeout: float = 60.0) -> list[dict]:
    """Starts `entry` on a fresh sandbox and returns its tool specs (hidden ones dropped)."""
    from toolverse_jax.envs import sandbox as sandbox_lib
    from toolverse_jax.envs.worker import WorkerCore

    with tempfile.TemporaryDirectory(prefix=f"harvest_{entry.name}_") as tmp:
        sb = sandbox_lib.make_sandbox(os.path.join(tmp, entry.name), entry.sandbox, 0)
        core = WorkerCore(Catalog([]), root=os.path.join(tmp, "w"), in_process=False,
                          call_timeout_s=timeout, start_timeout_s=timeout, max_arg_bytes=1 << 16)
        conn = await core.start_server(entry, entry.name, sb)
        try:
            res = await asyncio.wait_for(conn.client.list_tools(), timeout)
            tools = [tool_spec(t) for t in res.tools]
            while res.next_cursor:
                res = await asyncio.wait_for(conn.client.list_tools(cursor=res.next_cursor), timeout)
                tools += [tool_spec(t) for t in res.tools]
        finally:
            await conn.stop(kill=True)
            core.errlog.close()
    return [t for t in tools if not t["name"].startswith(HIDDEN_PREFIX)]


def write_manifest(entry: ServerEntry, tools: list[dict], source: str) -> str:
    """Writes {server, source, tools} to the entry's manifest path and returns the path."""
    path = os.path.join(MANIFEST_DIR, entry.manifest)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"server": entry.name, "source": source, "tools": tools}, f, indent=1, sort_keys=True)
        f.write("\n")
    return path


def harvest_builtin() -> list[str]:
    """Writes manifests of all built-in servers from their in-process MCPServer objects."""
    from toolverse_jax.envs.builtin.run import DOMAINS, build_server

    cat = {e.name: e for e in Catalog.default(kinds=("builtin",), include_hidden=True).servers}
    out = []
    for d in DOMAINS:
        tools = [tool_spec(t) for t in asyncio.run(build_server(d).list_tools())]
        tools = [t for t in tools if not t["name"].startswith(HIDDEN_PREFIX)]
        out.append(write_manifest(cat[d], tools, f"builtin:toolverse_jax.envs.builtin.{d}"))
    return out


if __name__ == "__main__":
    print("\n".join(harvest_builtin()))
