"""Harvests real MCP servers from PyPI and npm into synthesized catalog entries (ToolVerse's recipe).

    python -m experiments.harvest_servers --packages toolverse_jax/envs/harvest_packages.txt \\
        [--out DIR] [--limit N] [--jobs J] [--resume] [--keep-prefixes]

For each listed package (`pypi:NAME==VERSION`, `npm:NAME@VERSION`): install it into its own prefix
(DIR/prefixes/SERVER: a venv filled by uv, or pip where uv is absent; `npm install --prefix`
without lifecycle scripts), start it over stdio through the env pool's launcher (isolate.py: no
network, writes only in a scratch sandbox that is also its HOME, no credentials in its env), and
record its `tools/list`. A server that fails to install, exits or hangs without network or keys,
or lists no tools is reported with the reason and skipped. Each harvested server gets
DIR/manifests/SERVER.json ({server, source, tools}) and DIR/catalog/SERVER.json: an entry of kind
"harvested" that the synthesizer (toolverse_jax.envs.synth) executes statefully, read by
`Catalog.default(kinds=("harvested", ...))`. DIR defaults to $TOOLVERSE_HARVEST_DIR, else
~/.cache/toolverse/harvest. A package's prefix is deleted once its manifest is written (only the
manifest is needed to execute it); --keep-prefixes keeps them, up to --max-prefix-gb in all.
DIR/report.json has, per package: status, reason, tools, seconds; the last line printed sums it up.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import json
import os
import shutil
import sys
import threading
import time

from toolverse_jax.envs import harvest as hv
from toolverse_jax.envs.catalog import harvest_dir

DEFAULT_PACKAGES = os.path.join(os.path.dirname(hv.__file__), "harvest_packages.txt")


def default_python() -> str:
    """The interpreter harvested PyPI servers run on: a working python3.12 or 3.13 (PATH, then
    pyenv's versions), else this one. Many servers need Python >= 3.12; 3.12 is preferred over
    3.13 because more packages ship wheels for it."""
    import glob
    import subprocess

    cands = [shutil.which(f"python{v}") for v in ("3.12", "3.13")]
    cands += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3")))
    cands += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.13*/bin/python3")))
    for exe in filter(None, cands):
        try:
            if subprocess.run([exe, "-c", "import venv"], capture_output=True, timeout=30).returncode == 0:
                return exe
        except (OSError, subprocess.SubprocessError):
            pass
    return sys.executable


def task_readable(tools: list[dict]) -> tuple[list[dict], list[str]]:
    """Returns (the tools whose schemas DUSA's schema reader accepts, 'name: error' of the rest).

    Workaround: toolverse_jax/tasks/schema.py takes a property named like a keyword ("type",
    "anyOf") for that keyword and raises on such valid schemas; until it reads them, such a tool
    would stop task generation over every harvested server, so it is left out of the manifest."""
    from toolverse_jax.tasks.schema import schema_fields

    keep, dropped = [], []
    for t in tools:
        try:
            for k in ("inputSchema", "outputSchema"):
                schema_fields(t.get(k), "item")
            keep.append(t)
        except Exception as ex:  # noqa: BLE001
            dropped.append(f"{t['name']}: {type(ex).__name__}: {ex}"[:200])
    return keep, dropped


def harvest_one(pkg: hv.Package, out: str, python: str, find_links: str | None, start_timeout: float,
                install_timeout: float, keep_prefix: bool) -> dict:
    """Installs, starts and records one package; returns its report row."""
    t0 = time.monotonic()
    row = {"package": pkg.line, "registry": pkg.registry, "server": pkg.server, "status": "skipped",
           "reason": None, "detail": "", "tools": 0}
    prefix = os.path.join(out, "prefixes", pkg.server)
    try:
        reason, log = "install_failed", ""
        if pkg.registry == "pypi":
            reason, log = hv.install_package(pkg, prefix, python, find_links, install_timeout, hv.PYPI_CONSTRAINTS)
            row["constraints"] = list(hv.PYPI_CONSTRAINTS) if reason is None else []
        if reason:  # npm, or a server that needs the MCP SDK 2.x (or the constraint broke nothing: retry plain)
            reason, log = hv.install_package(pkg, prefix, python, find_links, install_timeout)
        row["install_s"] = round(time.monotonic() - t0, 1)
        if reason:
            row.update(reason=reason, detail=log[-600:])
            return row
        row["prefix_bytes"] = hv.dir_bytes(prefix)
        cmd = hv.server_command(pkg, prefix)
        if cmd is None:
            row.update(reason="no_entry_point", detail="no console script, python -m module or npm bin found")
            return row
        row["command"] = " ".join([os.path.relpath(cmd[0], prefix) if cmd[0].startswith(prefix) else cmd[0],
                                   *(os.path.relpath(a, prefix) if a.startswith(prefix) else a for a in cmd[1])])
        t1 = time.monotonic()
        command, args = cmd
        try:
            while True:
                try:
                    tools = asyncio.run(hv.list_tools_live(hv.probe_entry(pkg, command, args), start_timeout,
                                                           hv.probe_isolation()))
                    break
                except hv.ServerStartError as ex:
                    why = hv.start_reason(str(ex), ex.stderr)
                    # `server {stdio,sse,...}` / `--transport stdio` wanted: one more start with it
                    retry = hv.stdio_args(ex.stderr) if why == "needs_arguments" and args == cmd[1] else None
                    if retry is None:
                        row.update(reason=why, detail=(ex.stderr[-500:] + "\n" + str(ex)[:300]))
                        return row
                    args = [*args, *retry]
            if args != cmd[1]:
                row["command"] += " " + " ".join(args[len(cmd[1]):])
        finally:
            row["start_s"] = round(time.monotonic() - t1, 1)
        tools, dropped = task_readable(tools)
        if dropped:
            row["dropped_tools"] = dropped
        if not tools:
            row.update(reason="no_tools", detail="tools/list returned no tools" + (
                f" DUSA can read ({len(dropped)} dropped)" if dropped else ""))
            return row
        source = f"{pkg.line} (tools/list of the real server, started offline)"
        path = hv.write_harvested(pkg, tools, source, out)
        try:  # the synthesizer must accept what the real server listed
            from toolverse_jax.envs.synth import build_server

            build_server(path)
        except Exception as ex:  # noqa: BLE001
            hv.remove_harvested(pkg, out)
            row.update(reason="synth_failed", detail=f"{type(ex).__name__}: {ex}"[:600])
            return row
        row.update(status="ok", tools=len(tools))
        return row
    except Exception as ex:  # noqa: BLE001 - one package never stops the run
        row.update(reason="harvester_error", detail=f"{type(ex).__name__}: {ex}"[:600])
        return row
    finally:
        if row["status"] != "ok":
            hv.remove_harvested(pkg, out)
        if not (keep_prefix and row["status"] == "ok"):
            shutil.rmtree(prefix, ignore_errors=True)
        row["seconds"] = round(time.monotonic() - t0, 1)


def summarize(rows: list[dict], wall_s: float) -> dict:
    """Returns the run's figures: tried, installed, started (listed tools), ok, tools, reasons."""
    install_reasons = {"install_timeout", "requires_other_python", "not_on_registry", "build_failed",
                       "install_failed", "no_node"}
    reasons = collections.Counter(r["reason"] for r in rows if r["status"] != "ok")
    by_reg = {}
    for reg in hv.REGISTRIES:
        rr = [r for r in rows if r["registry"] == reg]
        by_reg[reg] = {"tried": len(rr), "ok": sum(r["status"] == "ok" for r in rr),
                       "tools": sum(r["tools"] for r in rr)}
    return {"tried": len(rows),
            "installed": sum(r["reason"] not in install_reasons for r in rows),
            "started": sum(r["status"] == "ok" or r["reason"] in ("no_tools", "synth_failed") for r in rows),
            "ok": sum(r["status"] == "ok" for r in rows),
            "tools": sum(r["tools"] for r in rows),
            "reasons": dict(reasons.most_common()), "by_registry": by_reg, "wall_s": round(wall_s, 1)}


def summary_line(s: dict) -> str:
    return (f"harvest: {s['tried']} packages tried, {s['installed']} installed, {s['started']} started offline, "
            f"{s['ok']} harvested with {s['tools']} tools in {s['wall_s']:.0f}s; skipped: "
            + (", ".join(f"{k} {v}" for k, v in s["reasons"].items()) or "none"))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--packages", default=DEFAULT_PACKAGES, help="package list (pypi:NAME==V / npm:NAME@V lines)")
    p.add_argument("--out", default=None, help="harvest folder (default $TOOLVERSE_HARVEST_DIR or ~/.cache/toolverse/harvest)")
    p.add_argument("--limit", type=int, default=0, help="harvest only the first N packages (0: all)")
    p.add_argument("--offset", type=int, default=0, help="skip the first N packages")
    p.add_argument("--only", choices=hv.REGISTRIES, default=None, help="only this registry's packages")
    p.add_argument("--jobs", type=int, default=2, help="packages harvested at once")
    p.add_argument("--python", default=None, help="interpreter of PyPI servers' venvs (default: newest 3.13/3.12)")
    p.add_argument("--find-links", default=None, help="install PyPI packages from this folder only (no index)")
    p.add_argument("--start-timeout", type=float, default=45.0, help="seconds to start and list tools")
    p.add_argument("--install-timeout", type=float, default=600.0)
    p.add_argument("--resume", action="store_true", help="keep the rows of packages already in DIR/report.json")
    p.add_argument("--keep-prefixes", action="store_true", help="keep harvested servers' installs")
    p.add_argument("--max-prefix-gb", type=float, default=5.0, help="with --keep-prefixes: stop keeping past this")
    a = p.parse_args(argv)
    out = os.path.abspath(a.out or harvest_dir())
    os.makedirs(out, exist_ok=True)
    with open(a.packages) as f:
        pkgs = hv.parse_packages(f.read())
    if a.only:
        pkgs = [q for q in pkgs if q.registry == a.only]
    pkgs = pkgs[a.offset:]
    pkgs = pkgs[:a.limit] if a.limit else pkgs
    report_path = os.path.join(out, "report.json")
    done: dict[str, dict] = {}
    if a.resume and os.path.exists(report_path):
        with open(report_path) as f:
            done = {r["package"]: r for r in json.load(f)["packages"]}
        for r in done.values():  # the classifier may have learnt since: re-read the kept stderr tail
            if r["reason"] in hv.START_REASON_NAMES:
                r["reason"] = hv.start_reason(r["detail"].rsplit("\n", 1)[-1], r["detail"])
    python = a.python or default_python()
    lock = threading.Lock()
    rows = [done[q.line] for q in pkgs if q.line in done]
    todo = [q for q in pkgs if q.line not in done]
    kept = [sum(r.get("prefix_bytes", 0) for r in rows if a.keep_prefixes and r["status"] == "ok")]
    t0 = time.monotonic()
    print(f"harvesting {len(todo)} packages ({len(rows)} from the last report) into {out} "
          f"with {a.jobs} jobs; PyPI servers on {python}; installer {'uv' if hv.find_uv() else 'pip'}", flush=True)

    def write_report():
        s = summarize(rows, time.monotonic() - t0)
        tmp = report_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"summary": s, "packages": sorted(rows, key=lambda r: r["package"])}, f, indent=1)
        os.replace(tmp, report_path)
        return s

    def one(q: hv.Package) -> dict:
        keep = a.keep_prefixes and kept[0] < a.max_prefix_gb * 2**30
        r = harvest_one(q, out, python, a.find_links, a.start_timeout, a.install_timeout, keep)
        with lock:
            if keep and r["status"] == "ok":
                kept[0] += r.get("prefix_bytes", 0)
            rows.append(r)
            write_report()
            msg = f"{r['tools']} tools" if r["status"] == "ok" else f"{r['reason']}"
            print(f"[{len(rows)}/{len(pkgs)}] {r['status']:7s} {q.line}: {msg} ({r['seconds']}s)", flush=True)
        return r

    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as ex:
        list(ex.map(one, todo))
    if not a.keep_prefixes:
        shutil.rmtree(os.path.join(out, "prefixes"), ignore_errors=True)
    s = write_report()
    print(summary_line(s), flush=True)
    return s


if __name__ == "__main__":
    main()
