"""The server catalog: declarative entries (catalog/*.json) plus cached tool manifests.

An entry says how to launch a server over stdio, how to lay out its per-episode sandbox, which
arguments are paths (confined to the sandbox), and where its harvested `tools/list` manifest is,
so listing the catalog never launches a server.
"""

import dataclasses
import functools
import glob
import importlib.util
import json
import logging
import os
import shutil
import sys

from toolverse_jax.envs.episode import HIDDEN_PREFIX

log = logging.getLogger(__name__)

PKG_DIR = os.path.dirname(os.path.abspath(__file__))
CATALOG_DIR = os.path.join(PKG_DIR, "catalog")
MANIFEST_DIR = os.path.join(PKG_DIR, "manifests")
REPO_ROOT = os.path.dirname(os.path.dirname(PKG_DIR))
KINDS = ("builtin", "synthesized", "third_party", "bfcl", "tau2", "harvested")
# What Catalog.default() returns when no kinds are named: BFCL's backends (envs/bfcl.py) are an
# evaluation benchmark, kept out of DUSA's training catalog unless asked for by name; so are the
# harvested servers (experiments/harvest_servers.py), which live outside the package.
DEFAULT_KINDS = ("builtin", "synthesized", "third_party")


def harvest_dir() -> str:
    """Returns the local folder of harvested servers (catalog/*.json entries, manifests/*.json)."""
    return os.environ.get("TOOLVERSE_HARVEST_DIR",
                          os.path.join(os.path.expanduser("~"), ".cache", "toolverse", "harvest"))


def npm_root() -> str:
    """Returns the folder holding project-local npm servers (node_modules lives under it)."""
    return os.environ.get("TOOLVERSE_MCP_SERVERS", os.path.join(REPO_ROOT, ".mcp_servers"))


@dataclasses.dataclass(frozen=True)
class ServerEntry:
    """One server of the catalog (see catalog/*.json for the fields)."""

    name: str
    kind: str
    manifest: str
    launch: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)
    description: str = ""
    shared: bool = False          # one process serves many episodes (state keyed by episode id)
    stateful: bool = False        # has a control plane (reset/state/close, builtin/base.py:EpisodeControl)
    sandbox: str = "empty"        # sandbox layout, see sandbox.LAYOUTS
    path_params: tuple = ()
    path_root: str = "{sandbox}"
    requires: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)
    hidden: bool = False          # test-only servers, left out of Catalog.default()
    available: bool = True
    reason: str | None = None

    def format(self, template: str, sandbox: str = "") -> str:
        """Returns `template` with {python}, {sandbox}, {npm}, {servers}, {repo}, {name} filled in."""
        return template.format(python=sys.executable, sandbox=sandbox, npm=os.path.join(npm_root(), "node_modules"),
                               servers=npm_root(),
                               repo=REPO_ROOT, name=self.name, manifest=self.manifest_path)

    @property
    def manifest_path(self) -> str:
        return os.path.join(MANIFEST_DIR, self.manifest)


def _check_requires(entry: ServerEntry) -> str | None:
    req = entry.requires
    mod = req.get("python_module")
    if mod and importlib.util.find_spec(mod) is None:
        return f"python module {mod!r} not installed (run: python -m experiments.install_servers)"
    for exe in req.get("executables", []):
        if shutil.which(exe) is None:
            return f"executable {exe!r} not found on PATH"
    for path in req.get("files", []):
        if not os.path.exists(entry.format(path)):
            return f"{entry.format(path)} not found (run: python -m experiments.install_servers)"
    script = req.get("node_script")
    if script:
        if shutil.which("node") is None:
            return "node not found on PATH (install Node.js >= 18)"
        if not os.path.exists(entry.format(script)):
            return f"npm package not installed at {entry.format(script)} (run: python -m experiments.install_servers)"
    if not os.path.exists(entry.manifest_path):
        return f"no tool manifest {entry.manifest} (run: python -m experiments.install_servers to harvest it)"
    return None


def _entries_from(path: str, manifest_root: str | None = None) -> list[ServerEntry]:
    """Entries of a catalog file; `manifest_root` (harvested entries) anchors relative manifests."""
    with open(path) as f:
        raw = json.load(f)
    out = []
    for d in raw:
        if manifest_root is not None and "manifest" in d:
            d = dict(d, manifest=os.path.join(manifest_root, d["manifest"]))
        if "manifest_glob" in d:  # one entry per manifest file (synthesized corpus)
            tmpl = {k: v for k, v in d.items() if k != "manifest_glob"}
            for mp in sorted(glob.glob(os.path.join(MANIFEST_DIR, d["manifest_glob"]))):
                rel = os.path.relpath(mp, MANIFEST_DIR)
                name = os.path.splitext(os.path.basename(mp))[0]
                out.append(_entry(dict(tmpl, name=name, manifest=rel)))
        else:
            out.append(_entry(d))
    return out


def _entry(d: dict) -> ServerEntry:
    d = dict(d)
    d["path_params"] = tuple(d.get("path_params", ()))
    e = ServerEntry(**d)
    if e.kind not in KINDS:
        raise ValueError(f"catalog entry {e.name!r}: kind must be one of {KINDS}; got {e.kind!r}")
    reason = _check_requires(e)
    if reason:
        log.warning("server %s unavailable: %s", e.name, reason)
        e = dataclasses.replace(e, available=False, reason=reason)
    return e


@functools.lru_cache(maxsize=4096)
def _load_manifest(path: str) -> tuple:
    with open(path) as f:
        m = json.load(f)
    tools = m["tools"] if isinstance(m, dict) else m
    return tuple(json.dumps(t, sort_keys=True) for t in tools if not t["name"].startswith(HIDDEN_PREFIX))


class Catalog:
    """All servers an environment can use; `Catalog.default()` reads the packaged catalog."""

    def __init__(self, entries: list[ServerEntry]):
        names = [e.name for e in entries]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate server names in catalog: {sorted(dup)}")
        self._entries = {e.name: e for e in entries}

    @classmethod
    def default(cls, kinds: tuple[str, ...] | None = None, include_hidden: bool = False,
                catalog_dir: str = CATALOG_DIR) -> "Catalog":
        """Returns the catalog of catalog_dir/*.json (and, when "harvested" is among `kinds`, of
        harvest_dir()/catalog/*.json): the DEFAULT_KINDS, or only `kinds`."""
        for k in kinds or ():
            if k not in KINDS:
                raise ValueError(f"unknown server kind {k!r}; kinds are {KINDS}")
        entries = []
        for p in sorted(glob.glob(os.path.join(catalog_dir, "*.json"))):
            entries += _entries_from(p)
        wanted = DEFAULT_KINDS if kinds is None else kinds
        if "harvested" in wanted:
            root = harvest_dir()
            for p in sorted(glob.glob(os.path.join(root, "catalog", "*.json"))):
                entries += _entries_from(p, manifest_root=root)
        return cls([e for e in entries if e.kind in wanted and (include_hidden or not e.hidden)])

    @property
    def servers(self) -> list[ServerEntry]:
        return list(self._entries.values())

    def entry(self, server: str) -> ServerEntry:
        """Returns the entry of `server` or raises KeyError listing close names."""
        if server not in self._entries:
            near = [n for n in self._entries if server.lower() in n.lower()][:8]
            raise KeyError(f"server {server!r} is not in the catalog; similar: {near or sorted(self._entries)[:8]}")
        return self._entries[server]

    def __contains__(self, server: str) -> bool:
        return server in self._entries

    def list_tools(self, server: str) -> list[dict]:
        """Returns MCP tool specs {name, description, inputSchema, outputSchema?} of `server`."""
        e = self.entry(server)
        if not os.path.exists(e.manifest_path):
            raise KeyError(f"server {server!r} has no harvested manifest: {e.reason}")
        return [json.loads(t) for t in _load_manifest(e.manifest_path)]

    def num_tools(self, server: str) -> int:
        """Returns how many agent-visible tools `server` has (0 without a manifest)."""
        e = self.entry(server)
        return len(_load_manifest(e.manifest_path)) if os.path.exists(e.manifest_path) else 0
