"""Server-process bookkeeping through /proc: find our children by an environment tag, kill a
process group, and die with the parent.

Server processes are started with `SERVER_TAG_VAR=<uuid>` in their environment, so a worker can
find (and kill) exactly the processes it started, even ones the MCP SDK launched for it.
"""

import ctypes
import os
import signal

SERVER_TAG_VAR = "TOOLVERSE_SERVER_TAG"


def set_pdeathsig() -> None:
    """Makes the kernel SIGKILL this process when its parent dies (Linux; a no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def child_pids() -> list[int]:
    """Returns the pids of this process's direct children (all threads), [] without /proc."""
    out = []
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def pid_with_tag(tag: str) -> int | None:
    """Returns the pid of our child started with SERVER_TAG_VAR=tag, or None."""
    needle = f"{SERVER_TAG_VAR}={tag}".encode()
    for pid in child_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    return pid
        except OSError:
            continue
    return None


def tag_of(pid: int) -> str | None:
    """Returns the SERVER_TAG_VAR value in the environment of `pid`, or None."""
    prefix = f"{SERVER_TAG_VAR}=".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(prefix):
                    return item[len(prefix):].decode()
    except OSError:
        pass
    return None


def kill_group(pid: int | None) -> None:
    """SIGKILLs the process group led by `pid` (or the process alone); gone is fine."""
    if not pid:
        return
    for fn in (os.killpg, os.kill):
        try:
            fn(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass

