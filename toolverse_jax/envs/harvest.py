"""Harvests `tools/list` of MCP servers into manifest files: the catalog's own servers into the
package (run once per install), and registry packages (PyPI, npm) into harvest_dir(), whose
manifests the synthesizer executes (see experiments/harvest_servers.py)."""

import asyncio
import configparser
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
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


class ServerStartError(RuntimeError):
    """A server that did not start or list its tools; `stderr` is the tail of what it printed."""

    def __init__(self, message: str, stderr: str):
        super().__init__(message)
        self.stderr = stderr


async def list_tools_live(entry: ServerEntry, timeout: float = 60.0, isolation=None) -> list[dict]:
    """Starts `entry` on a fresh sandbox (under `isolation`, default the pool's) and returns its
    tool specs (hidden ones dropped); raises ServerStartError with the server's stderr tail."""
    from toolverse_jax.envs import isolate as isolate_lib
    from toolverse_jax.envs import sandbox as sandbox_lib
    from toolverse_jax.envs.worker import WorkerCore

    with tempfile.TemporaryDirectory(prefix=f"harvest_{entry.name}_") as tmp:
        sb = sandbox_lib.make_sandbox(os.path.join(tmp, entry.name), entry.sandbox, 0)
        core = WorkerCore(Catalog([]), root=os.path.join(tmp, "w"), in_process=False,
                          call_timeout_s=timeout, start_timeout_s=timeout, max_arg_bytes=1 << 16,
                          isolation=isolation or isolate_lib.Isolation())
        conn = None
        try:
            conn = await core.start_server(entry, entry.name, sb)
            res = await asyncio.wait_for(conn.client.list_tools(), timeout)
            tools = [tool_spec(t) for t in res.tools]
            while res.next_cursor:
                res = await asyncio.wait_for(conn.client.list_tools(cursor=res.next_cursor), timeout)
                tools += [tool_spec(t) for t in res.tools]
        except Exception as ex:  # noqa: BLE001 - the caller classifies it with the stderr
            raise ServerStartError(f"{type(ex).__name__}: {ex}", _tail(core.errlog.name)) from ex
        finally:
            if conn is not None:
                await conn.stop(kill=True)
            core.errlog.close()
    return [t for t in tools if not t["name"].startswith(HIDDEN_PREFIX)]


def _tail(path: str, n: int = 4000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


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



# ----------------------------------------------------------------------------- registry packages
# experiments/harvest_servers.py: install a PyPI/npm MCP server into its own prefix, start it
# offline with no credentials, keep its tools/list as a manifest the synthesizer executes.

REGISTRIES = ("pypi", "npm")
# Why a server did not start, first match wins (lower-cased stderr + error text).
START_REASONS = (
    ("needs_mcp_v1", r"pin 'mcp<2'|fastmcp-renamed-to-mcpserver"),
    ("broken_package", r"modulenotfounderror|importerror|cannot find module|err_module_not_found|syntaxerror|"
                       r"err_require_esm|cannot find package|no module named"),
    ("needs_network", r"getaddrinfo|\benotfound\b|\beai_again\b|network is unreachable|enetunreach|name or service not known|"
                      r"temporary failure in name resolution|name resolution|connection refused|econnrefused|"
                      r"max retries exceeded|connecterror|connecttimeout|failed to fetch|fetch failed|"
                      r"could not connect|unable to connect|failed to connect|econnreset"),
    ("needs_credentials", r"api[ _-]?key|apikey|access[ _-]?token|auth[ _-]?token|bearer|credential|secret|"
                          r"unauthori[sz]ed|password|not authenticated|authenticat|login required|"
                          r"_token\b|token is required|token not|missing token|client[ _-]?id|oauth|keys\.json"),
    ("needs_arguments", r"usage:|required argument|arguments are required|missing required|unknown option|"
                        r"no such option|error: argument|please provide|must be provided|must specify|not set|"
                        r"is required|required env|environment variable|required option|config file|"
                        r"cannot find config|no config"),
    ("needs_writes", r"read-only file system|erofs|permission denied|eacces|operation not permitted"),
    ("not_stdio", r"uvicorn running|listening on|running on http|server started on port|\bsse\b|streamable[- ]http"),
)


@dataclasses.dataclass(frozen=True)
class Package:
    """One line of a package list: `pypi:NAME==VERSION` or `npm:NAME@VERSION`."""

    registry: str
    name: str
    version: str | None = None

    @property
    def spec(self) -> str:
        """The installer's requirement string (`name==v` for pip/uv, `name@v` for npm)."""
        if not self.version:
            return self.name
        return f"{self.name}=={self.version}" if self.registry == "pypi" else f"{self.name}@{self.version}"

    @property
    def line(self) -> str:
        return f"{self.registry}:{self.spec}"

    @property
    def server(self) -> str:
        """The catalog name of the harvested server: registry plus the package name, slugged."""
        return f"{self.registry}-" + re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")


def parse_packages(text: str) -> list[Package]:
    """Returns the packages of a list file (`#` comments and blank lines skipped, duplicates once)."""
    out, seen = [], set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        reg, sep, rest = line.partition(":")
        if not sep or reg not in REGISTRIES:
            raise ValueError(f"package list line {n}: {raw!r} must start with one of {[r + ':' for r in REGISTRIES]}")
        if reg == "pypi":
            name, _, ver = rest.partition("==")
        else:  # npm: the version is after the last '@' that is not the scope's
            at = rest.rfind("@")
            name, ver = (rest[:at], rest[at + 1:]) if at > 0 else (rest, "")
        p = Package(reg, name.strip(), ver.strip() or None)
        if p.server not in seen:
            seen.add(p.server)
            out.append(p)
    return out


def _run(cmd: list[str], timeout: float, cwd: str | None = None, env: dict | None = None) -> tuple[int, str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                           env=None if env is None else {**os.environ, **env})
        return r.returncode, (r.stdout[-3000:] + "\n" + r.stderr[-6000:]).strip()
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f}s: {' '.join(cmd[:6])}"


def find_uv() -> str | None:
    """Returns the uv executable (PATH, or the `uv` Python package) or None (pip is used then)."""
    exe = shutil.which("uv")
    if exe:
        return exe
    try:
        import uv  # type: ignore[import-not-found]

        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        return None


def _install_reason(out: str) -> str:
    o = out.lower()
    if "timed out after" in o:
        return "install_timeout"
    if re.search(r"requires-python|requires a different python|python>=|python_version|no matching distribution.*python|"
                 r"the current python version", o):
        return "requires_other_python"
    if re.search(r"no solution found|because .* was not found|not found in the package registry|"
                 r"no matching distribution|could not find a version|e404|etarget|no matching version|"
                 r"404 not found", o):
        return "not_on_registry"
    if re.search(r"failed to build|build backend|building wheel|gyp err|failed to download", o):
        return "build_failed"
    return "install_failed"


# Most PyPI servers were written against the MCP SDK 1.x and declare `mcp>=1.x` with no upper
# bound; the SDK 2.x renamed FastMCP to MCPServer, so the newest resolution breaks them at import.
# They are installed with this constraint first, and without it where it cannot be met.
PYPI_CONSTRAINTS = ("mcp<2",)


def install_package(pkg: Package, prefix: str, python: str, find_links: str | None = None,
                    timeout: float = 600.0, constraints: tuple[str, ...] = ()) -> tuple[str | None, str]:
    """Installs `pkg` into its own `prefix` (a venv for PyPI, `npm --prefix` for npm) and returns
    (None, log) or (reason, log). `constraints`: PyPI requirement constraints (e.g. PYPI_CONSTRAINTS).
    npm lifecycle scripts are not run (no downloads of browsers or prebuilt binaries; a package
    that needs them fails to start and is reported as such)."""
    shutil.rmtree(prefix, ignore_errors=True)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    if pkg.registry == "npm":
        if shutil.which("npm") is None or shutil.which("node") is None:
            return "no_node", "node/npm not found on PATH (install Node.js >= 18)"
        os.makedirs(prefix)
        rc, out = _run(["npm", "install", "--prefix", prefix, "--ignore-scripts", "--no-audit", "--no-fund",
                        "--omit=dev", "--no-package-lock", "--loglevel=error", pkg.spec], timeout)
        return (None if rc == 0 else _install_reason(out)), out
    links = ["--no-index", "--find-links", find_links] if find_links else []
    if constraints:
        cfile = prefix.rstrip("/") + ".constraints.txt"
        with open(cfile, "w") as f:
            f.write("\n".join(constraints) + "\n")
        links += ["--constraint", cfile]
    uv = find_uv()
    if uv:
        rc, out = _run([uv, "venv", "-q", "-p", python, prefix], 120)
        if rc == 0:
            rc, out = _run([uv, "pip", "install", "-q", "--python", os.path.join(prefix, "bin", "python"),
                            *links, pkg.spec], timeout)
    else:  # no uv: a bare venv filled by this interpreter's pip (pip >= 22.3 has --python)
        rc, out = _run([python, "-m", "venv", "--without-pip", prefix], 120)
        if rc == 0:
            rc, out = _run([sys.executable, "-m", "pip", "--python", os.path.join(prefix, "bin", "python"),
                            "install", "-q", "--disable-pip-version-check", *links, pkg.spec], timeout)
    if constraints:
        os.remove(cfile)
    return (None if rc == 0 else _install_reason(out)), out


def _pick(names: list[str], pkg: Package) -> str | None:
    """The executable among `names` that best matches the package: its own name, then 'mcp'/'server'."""
    if not names:
        return None
    base = pkg.name.split("/")[-1].lower()
    norm = lambda s: re.sub(r"[^a-z0-9]", "", s.lower())  # noqa: E731
    for key in (lambda n: norm(n) == norm(base), lambda n: norm(base) in norm(n) or norm(n) in norm(base),
                lambda n: "mcp" in n.lower(), lambda n: "server" in n.lower()):
        hits = sorted(n for n in names if key(n))
        if hits:
            return hits[0]
    return sorted(names)[0]


def server_command(pkg: Package, prefix: str) -> tuple[str, list[str]] | None:
    """Returns (command, args) that starts the installed package's server over stdio, or None.

    PyPI: the package's console script (entry_points.txt), else `python -m` its module with a
    __main__; npm: `node` on its `bin` script."""
    if pkg.registry == "npm":
        pj = os.path.join(prefix, "node_modules", *pkg.name.split("/"), "package.json")
        try:
            with open(pj) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return None
        b = meta.get("bin")
        bins = {meta.get("name", pkg.name).split("/")[-1]: b} if isinstance(b, str) else dict(b or {})
        name = _pick(list(bins), pkg)
        if name is None:
            return None
        return "node", [os.path.normpath(os.path.join(os.path.dirname(pj), bins[name]))]
    sites = glob.glob(os.path.join(prefix, "lib", "python*", "site-packages"))
    if not sites:
        return None
    want = re.sub(r"[-_.]+", "_", pkg.name).lower()
    dists = [d for d in glob.glob(os.path.join(sites[0], "*.dist-info"))
             if re.sub(r"[-_.]+", "_", os.path.basename(d)[:-len(".dist-info")].rsplit("-", 1)[0]).lower() == want]
    if not dists:
        return None
    scripts, modules = [], []
    ep = os.path.join(dists[0], "entry_points.txt")
    if os.path.exists(ep):
        cp = configparser.ConfigParser(interpolation=None)
        cp.optionxform = str
        cp.read(ep)
        if cp.has_section("console_scripts"):
            scripts = [s for s in cp.options("console_scripts") if os.path.exists(os.path.join(prefix, "bin", s))]
    name = _pick(scripts, pkg)
    if name:
        return os.path.join(prefix, "bin", name), []
    top = os.path.join(dists[0], "top_level.txt")
    modules = open(top).read().split() if os.path.exists(top) else [want]
    for m in modules:
        if os.path.exists(os.path.join(sites[0], m, "__main__.py")):
            return os.path.join(prefix, "bin", "python"), ["-m", m]
    return None


START_REASON_NAMES = frozenset([r for r, _ in START_REASONS] + ["start_timeout", "start_failed"])


def start_reason(message: str, stderr: str) -> str:
    """Returns why a server did not start, from its error and stderr (see START_REASONS)."""
    text = f"{stderr}\n{message}".lower()
    if "timeout" in message.lower() or "timed out" in message.lower():
        for reason in ("not_stdio", "needs_network"):
            if re.search(dict(START_REASONS)[reason], text):
                return reason
        return "start_timeout"
    for reason, pattern in START_REASONS:
        if re.search(pattern, text):
            return reason
    return "start_failed"


def probe_isolation():
    """The isolation harvested servers start under: the pool's (no network, writes only in the
    sandbox, CPU/file/process limits) without its address-space cap, since node's WebAssembly
    (undici's fetch, loaded at start by many npm servers) reserves more than 4 GiB of it."""
    from toolverse_jax.envs import isolate as isolate_lib

    return isolate_lib.Isolation(mem_mb=0, cpu_s=120)


def probe_entry(pkg: Package, command: str, args: list[str]) -> ServerEntry:
    """Returns a throwaway third-party entry that runs the real server offline, HOME and caches in
    its sandbox (the isolation lets a server write there only) and no credentials in its env."""
    home = ["HOME={sandbox}", "XDG_CACHE_HOME={sandbox}/.cache", "XDG_CONFIG_HOME={sandbox}/.config",
            "XDG_DATA_HOME={sandbox}/.local/share", "NPM_CONFIG_CACHE={sandbox}/.npm", "NO_COLOR=1",
            "PYTHONUNBUFFERED=1", "NODE_NO_WARNINGS=1", "DO_NOT_TRACK=1"]
    return ServerEntry(name=pkg.server, kind="third_party", manifest=f"{pkg.server}.json", sandbox="empty",
                       launch={"command": "env", "args": [*home, command, *args], "cwd": "{sandbox}"})


def harvested_entry(pkg: Package, source: str) -> dict:
    """Returns the catalog entry (JSON dict) of a harvested server, executed by the synthesizer."""
    return {"name": pkg.server, "kind": "harvested", "manifest": f"manifests/{pkg.server}.json",
            "shared": True, "stateful": True,
            "description": f"Synthesized (toolverse_jax.envs.synth) from the tools/list of {source}.",
            "launch": {"command": "{python}", "args": ["-m", "toolverse_jax.envs.synth", "{manifest}"]}}


def write_harvested(pkg: Package, tools: list[dict], source: str, root: str) -> str:
    """Writes root/manifests/SERVER.json ({server, source, tools}) and root/catalog/SERVER.json
    (its entry, a list of one) and returns the manifest path."""
    d = harvested_entry(pkg, source)
    e = ServerEntry(**{**d, "manifest": os.path.join(root, d["manifest"])})
    path = write_manifest(e, tools, source)
    os.makedirs(os.path.join(root, "catalog"), exist_ok=True)
    tmp = os.path.join(root, "catalog", f".{pkg.server}.json.tmp")
    with open(tmp, "w") as f:
        json.dump([d], f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(root, "catalog", f"{pkg.server}.json"))
    return path


def remove_harvested(pkg: Package, root: str) -> None:
    """Removes a package's manifest and entry (a re-harvest that failed leaves no stale server)."""
    for p in (os.path.join(root, "manifests", f"{pkg.server}.json"), os.path.join(root, "catalog", f"{pkg.server}.json")):
        if os.path.exists(p):
            os.remove(p)


def dir_bytes(path: str) -> int:
    """Returns the apparent size of the files under `path` (0 if absent)."""
    total = 0
    for dp, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dp, f)).st_size
            except OSError:
                pass
    return total


def stdio_args(stderr: str) -> list[str] | None:
    """Returns the arguments that select the stdio transport when a server's usage message asks
    for one (`--transport {stdio,sse}` or a positional `{stdio,sse,...}`), else None."""
    low = stderr.lower()
    if "stdio" not in low:
        return None
    if re.search(r"--transport\b", low):
        return ["--transport", "stdio"]
    if re.search(r"\{[^}]*\bstdio\b[^}]*\}", low) or re.search(r"required: transport", low):
        return ["stdio"]
    return None


if __name__ == "__main__":
    print("\n".join(harvest_builtin()))
