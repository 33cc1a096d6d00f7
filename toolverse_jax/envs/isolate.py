"""OS-level isolation of the server processes the env pool launches (stdlib only: run by path).

    python toolverse_jax/envs/isolate.py --write DIR [--write DIR ...] [--mem-mb N] [--cpu-s N]
        [--fsize-mb N] [--nofile N] [--nproc N] [--allow-net] -- COMMAND [ARGS ...]

applies, in this order, then execs COMMAND in the same process (same pid, so the pool's
process-tag bookkeeping and pdeathsig are unchanged):
  - resource limits (setrlimit): address space (`--mem-mb`), CPU seconds, the largest file it may
    write, open files, and processes of its user (`--nproc`; the kernel does not enforce this for
    root, see `probe()`);
  - no network: a fresh network namespace holding only a loopback device that is down (unshare
    CLONE_NEWNET; as a non-root user inside a new user namespace mapping the caller's own ids), and
    on kernels with Landlock ABI >= 4 no TCP bind or connect either;
  - a read-only filesystem except the `--write` directories (and writes to the /dev character
    devices like /dev/null): Landlock (Linux >= 5.13) handles every write-like access right, so an
    open for writing, a create, remove, rename, link or truncate outside them fails with EACCES.
    Reads and execution stay allowed everywhere (servers read their interpreters and libraries).

`probe()` says what this machine supports; `EnvPool(isolation="auto")` uses what it finds and
logs what it cannot apply, `"require"` refuses to start servers without filesystem and network
isolation, `"off"` launches servers as they are.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import dataclasses
import functools
import logging
import os
import resource
import signal
import subprocess
import sys

# Landlock (include/uapi/linux/landlock.h); syscall numbers are the same on x86_64 and aarch64.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_FS_WRITE_FILE = 1 << 1
_FS_REMOVE_DIR, _FS_REMOVE_FILE = 1 << 4, 1 << 5
_FS_MAKE = sum(1 << b for b in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
_FS_REFER = 1 << 13      # ABI 2: link/rename across directories
_FS_TRUNCATE = 1 << 14   # ABI 3
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2  # ABI 4
_PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG = 38, 1
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000

MECHANISMS = ("landlock_fs", "landlock_net", "netns", "rlimits")
MODES = ("auto", "require", "off")

log = logging.getLogger(__name__)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@functools.lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _err(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def landlock_abi() -> int:
    """Returns the kernel's Landlock ABI version, 0 where Landlock is absent or disabled."""
    if not sys.platform.startswith("linux"):
        return 0
    r = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(r), 0)


def _fs_write_rights(abi: int) -> int:
    rights = _FS_WRITE_FILE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE
    if abi >= 2:
        rights |= _FS_REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    return rights


def restrict_writes(writable: list[str], abi: int, no_tcp: bool) -> None:
    """Landlock-restricts this process (and what it execs) to writing under `writable` only;
    with `no_tcp` (ABI >= 4) it may neither bind nor connect TCP sockets."""
    libc = _libc()
    fs = _fs_write_rights(abi)
    attr = _RulesetAttr(fs, (_NET_BIND_TCP | _NET_CONNECT_TCP) if (no_tcp and abi >= 4) else 0)
    size = ctypes.sizeof(attr) if attr.handled_access_net else ctypes.sizeof(ctypes.c_uint64)
    rs = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rs < 0:
        raise _err("landlock_create_ruleset")
    try:
        rules = [(p, fs) for p in writable] + [("/dev", _FS_WRITE_FILE | (_FS_TRUNCATE if abi >= 3 else 0))]
        for path, rights in rules:
            if not os.path.exists(path):
                continue
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(rights if os.path.isdir(path) else rights & (_FS_WRITE_FILE | _FS_TRUNCATE), fd)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(rs), ctypes.c_int(_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    raise _err(f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _err("prctl(NO_NEW_PRIVS)")
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(rs), ctypes.c_uint32(0)) < 0:
            raise _err("landlock_restrict_self")
    finally:
        os.close(rs)


def unshare_network() -> None:
    """Moves this (single-threaded) process into a new network namespace with no usable device."""
    libc = _libc()
    if libc.unshare(_CLONE_NEWNET) == 0:
        return
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        raise _err("unshare(CLONE_NEWNET)")
    # Map our own ids onto themselves, so files we create keep their owner.
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def _user_processes() -> int:
    uid, n = os.getuid(), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def set_limits(mem_mb: int, cpu_s: int, fsize_mb: int, nofile: int, nproc: int) -> None:
    """Sets hard and soft resource limits (0 = leave that one as it is). `nproc` counts on top of
    the processes this user already runs (RLIMIT_NPROC is per user)."""
    lims = [(resource.RLIMIT_AS, mem_mb << 20), (resource.RLIMIT_CPU, cpu_s),
            (resource.RLIMIT_FSIZE, fsize_mb << 20), (resource.RLIMIT_NOFILE, nofile)]
    if nproc:
        lims.append((resource.RLIMIT_NPROC, _user_processes() + nproc))
    for which, value in lims:
        if value:
            soft, hard = resource.getrlimit(which)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))


def _probe_child(kind: str) -> bool:
    code = ("import sys; sys.path.insert(0, %r); import isolate as i; " % os.path.dirname(os.path.abspath(__file__)))
    code += {"netns": "i.unshare_network()",
             "landlock_fs": "i.restrict_writes([], i.landlock_abi(), False); open('/dev/null', 'w').close()"}[kind]
    try:
        return subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.lru_cache(maxsize=1)
def probe() -> dict:
    """What this machine can apply, each tried in a throwaway child process:
    {"landlock_abi", "landlock_fs", "landlock_net", "netns", "rlimits", "nproc_enforced", "missing"}."""
    abi = landlock_abi()
    out = {"landlock_abi": abi, "landlock_fs": abi >= 1 and _probe_child("landlock_fs"),
           "netns": sys.platform.startswith("linux") and _probe_child("netns"), "rlimits": True,
           "nproc_enforced": os.getuid() != 0}
    out["landlock_net"] = out["landlock_fs"] and abi >= 4
    out["missing"] = [m for m in MECHANISMS if not out[m]]
    return out


def launcher(writable: list[str], *, mem_mb: int = 0, cpu_s: int = 0, fsize_mb: int = 0, nofile: int = 0,
             nproc: int = 0, allow_net: bool = False, landlock: bool = True, netns: bool = True) -> list[str]:
    """Returns the argv prefix that runs a command under this module's isolation."""
    argv = [sys.executable, "-I", "-S", os.path.abspath(__file__)]
    argv += [] if landlock else ["--no-landlock"]
    argv += [] if netns else ["--no-netns"]
    for w in writable:
        argv += ["--write", w]
    for flag, v in (("--mem-mb", mem_mb), ("--cpu-s", cpu_s), ("--fsize-mb", fsize_mb), ("--nofile", nofile),
                    ("--nproc", nproc)):
        if v:
            argv += [flag, str(int(v))]
    if allow_net:
        argv.append("--allow-net")
    return argv + ["--"]


@dataclasses.dataclass(frozen=True)
class Isolation:
    """How the env pool isolates the server processes it launches (`EnvPool(isolation=...)`).

    mode: "auto" applies what `probe()` finds and logs once what it cannot; "require" raises
    when Landlock or both network mechanisms are missing; "off" launches servers unconfined.
    Limits (0 = none): address space, CPU seconds of an episode's own server (a shared server
    lives as long as its worker and gets none), file size, open files, processes.
    """

    mode: str = "auto"
    mem_mb: int = 4096   # node's V8 reserves more than 1 GiB of address space at start
    cpu_s: int = 600
    fsize_mb: int = 256
    nofile: int = 1024
    nproc: int = 256

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"isolation mode must be one of {MODES}; got {self.mode!r}")

    def prefix(self, writable: list[str], shared: bool) -> list[str]:
        """Returns the argv prefix for one server process ([] when mode is "off")."""
        if self.mode == "off":
            return []
        p = probe()
        if self.mode == "require" and not (p["landlock_fs"] and (p["netns"] or p["landlock_net"])):
            raise RuntimeError(f"isolation='require' but this machine lacks {p['missing']} (probe: {p}); "
                               "Landlock needs Linux >= 5.13 with it enabled, a network namespace needs "
                               "root or unprivileged user namespaces")
        if p["missing"]:
            _warn_once(tuple(p["missing"]))
        return launcher(writable, mem_mb=self.mem_mb, cpu_s=0 if shared else self.cpu_s, fsize_mb=self.fsize_mb,
                        nofile=self.nofile, nproc=self.nproc, landlock=p["landlock_fs"], netns=p["netns"])


@functools.lru_cache(maxsize=None)
def _warn_once(missing: tuple) -> None:
    log.warning("env servers run without %s here (isolation='auto' applies the rest; see "
                "toolverse_jax/envs/isolate.py)", ", ".join(missing))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write", action="append", default=[], help="a directory the command may write under")
    p.add_argument("--mem-mb", type=int, default=0)
    p.add_argument("--cpu-s", type=int, default=0)
    p.add_argument("--fsize-mb", type=int, default=0)
    p.add_argument("--nofile", type=int, default=0)
    p.add_argument("--nproc", type=int, default=0)
    p.add_argument("--allow-net", action="store_true")
    p.add_argument("--no-landlock", action="store_true", help="skip the filesystem restriction")
    p.add_argument("--no-netns", action="store_true", help="skip the network namespace")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no command to run after --")
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the pool worker
    set_limits(a.mem_mb, a.cpu_s, a.fsize_mb, a.nofile, a.nproc)
    if not a.allow_net and not a.no_netns:
        unshare_network()
    abi = 0 if a.no_landlock else landlock_abi()
    if abi:
        restrict_writes([os.path.abspath(w) for w in a.write], abi, no_tcp=not a.allow_net)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
