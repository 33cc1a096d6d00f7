"""Per-episode sandbox directories: fresh, seeded fixture state for each server of an episode.

Layouts (the `sandbox.layout` field of a catalog entry):
  empty      an empty directory
  files      a few seeded text/CSV files (filesystem servers)
  git_repo   `repo/`: a git repository with seeded commits (git servers)
  sqlite_db  `fixture.db`: a SQLite database with seeded tables (sqlite servers)
"""

import json
import os
import random
import sqlite3
import subprocess

from toolverse_jax.envs.builtin import fixtures

MAX_STATE_FILES = 200
MAX_STATE_BYTES = 64 * 1024


def _files(root: str, rng: random.Random, seed: int) -> None:
    os.makedirs(os.path.join(root, "docs"), exist_ok=True)
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    ppl = fixtures.people(seed)
    with open(os.path.join(root, "README.md"), "w") as f:
        f.write(f"# Project {rng.randint(100, 999)}\n\nOwner: {ppl[0]['name']} <{ppl[0]['email']}>\n")
    with open(os.path.join(root, "docs", "todo.txt"), "w") as f:
        f.write("\n".join(f"- {rng.choice(['call', 'email', 'review'])} {p['name']}" for p in ppl[:5]) + "\n")
    with open(os.path.join(root, "data", "sales.csv"), "w") as f:
        f.write("month,amount\n" + "".join(f"2026-{m:02d},{rng.randint(1000, 9000)}\n" for m in range(1, 7)))


def _git(cmd: list[str], cwd: str) -> None:
    env = dict(os.environ, GIT_AUTHOR_NAME="Alex Morgan", GIT_AUTHOR_EMAIL="alex.morgan@example.com",
               GIT_COMMITTER_NAME="Alex Morgan", GIT_COMMITTER_EMAIL="alex.morgan@example.com",
               GIT_AUTHOR_DATE="2026-03-01T12:00:00Z", GIT_COMMITTER_DATE="2026-03-01T12:00:00Z")
    subprocess.run(["git", *cmd], cwd=cwd, env=env, check=True, capture_output=True, timeout=30)


def _git_repo(root: str, rng: random.Random, seed: int) -> None:
    repo = os.path.join(root, "repo")
    os.makedirs(repo, exist_ok=True)
    _files(repo, rng, seed)
    _git(["init", "-q", "-b", "main"], repo)
    _git(["add", "."], repo)
    _git(["commit", "-q", "-m", "Initial commit"], repo)
    with open(os.path.join(repo, "CHANGELOG.md"), "w") as f:
        f.write(f"## v0.{rng.randint(1, 9)}.0\n- first release\n")
    _git(["add", "CHANGELOG.md"], repo)
    _git(["commit", "-q", "-m", "Add changelog"], repo)
    with open(os.path.join(repo, "docs", "todo.txt"), "a") as f:
        f.write("- uncommitted item\n")


def _sqlite_db(root: str, rng: random.Random, seed: int) -> None:
    con = sqlite3.connect(os.path.join(root, "fixture.db"))
    con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, email TEXT, city TEXT)")
    con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, product TEXT, amount REAL)")
    for i, p in enumerate(fixtures.people(seed)[:10]):
        con.execute("INSERT INTO customers VALUES (?,?,?,?)", (i + 1, p["name"], p["email"], p["city"]))
    for i in range(20):
        name, _, price = rng.choice(fixtures.PRODUCTS)
        con.execute("INSERT INTO orders VALUES (?,?,?,?)", (i + 1, rng.randint(1, 10), name, price))
    con.commit()
    con.close()


LAYOUTS = {"empty": lambda root, rng, seed: None, "files": _files, "git_repo": _git_repo,
           "sqlite_db": _sqlite_db}


def make_sandbox(root: str, layout: str, seed: int) -> str:
    """Creates `root` with the seeded `layout` and returns its real path."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown sandbox layout {layout!r}; known: {sorted(LAYOUTS)}")
    os.makedirs(root, exist_ok=True)
    LAYOUTS[layout](root, random.Random(f"sandbox:{layout}:{seed}"), seed)
    return os.path.realpath(root)


def _sqlite_dump(path: str) -> dict:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: [list(r) for r in con.execute(f'SELECT * FROM "{t}" LIMIT 1000')] for t in tables}
    finally:
        con.close()


def read_sandbox(root: str) -> dict:
    """Returns the JSON state of a sandbox: {relative path: text | sqlite tables} (bounded)."""
    out: dict = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for fn in sorted(filenames):
            if len(out) >= MAX_STATE_FILES:
                return out
            p = os.path.join(dirpath, fn)
            rel = os.path.relpath(p, root)
            try:
                if fn.endswith((".db", ".sqlite")):
                    out[rel] = _sqlite_dump(p)
                else:
                    with open(p, "rb") as f:
                        out[rel] = f.read(MAX_STATE_BYTES).decode("utf-8", "replace")
            except (OSError, sqlite3.Error) as e:
                out[rel] = f"<unreadable: {e}>"
    return json.loads(json.dumps(out))
