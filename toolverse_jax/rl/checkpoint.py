"""Orbax checkpoints of the whole training run: train state, reference params, loop metadata.

Saves are atomic (orbax finalizes a step directory only when complete), so a run killed with
SIGKILL resumes from the last finished step; a step that does not match the run (other model
config) or cannot be read fails with a message that names the directory and the fix.
"""

from __future__ import annotations

import json
import os
from typing import Any

import orbax.checkpoint as ocp


class CheckpointMismatchError(ValueError):
    """The checkpoint in a workdir belongs to a different run configuration."""


class CorruptCheckpointError(RuntimeError):
    """A checkpoint step directory exists but cannot be restored."""


class RunCheckpointer:
    """Thin lifetime wrapper over an orbax CheckpointManager rooted at `workdir/checkpoints`."""

    def __init__(self, workdir: str, keep: int = 2, preserve: tuple[int, ...] = ()):
        """Keeps the latest `keep` steps plus every step in `preserve` (e.g. the SFT end, which
        warm starts and `experiments.inspect_rollouts --step` read after RL moved on)."""
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        if preserve:
            from orbax.checkpoint.checkpoint_managers import preservation_policy as pp
            options = ocp.CheckpointManagerOptions(
                create=True, preservation_policy=pp.AnyPreservationPolicy(
                    [pp.LatestN(keep), pp.CustomSteps(list(preserve))]))
        else:
            options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._mngr = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def save(self, step: int, state: Any, ref_params: Any, meta: dict) -> None:
        items = {"state": ocp.args.StandardSave(state),
                 "meta": ocp.args.JsonSave(meta)}
        if ref_params is not None:
            items["ref"] = ocp.args.StandardSave(ref_params)
        self._mngr.save(step, args=ocp.args.Composite(**items), force=True)
        self._mngr.wait_until_finished()

    def restore(self, step: int, state_like: Any, ref_like: Any, expect: dict,
                defaults: dict | None = None) -> tuple:
        """Returns (state, ref_params or None, meta) of `step`; checks `expect` against meta.

        `defaults` {key: {field: default}}: a dict-valued meta entry written before a field
        existed (a ModelConfig field added later) reads that field as its default, so new
        fields at their defaults do not orphan older checkpoints."""
        path = os.path.join(self.directory, str(step))
        try:
            meta = self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            meta = dict(meta["meta"])
        except Exception as e:
            raise CorruptCheckpointError(
                f"checkpoint {path} has no readable metadata ({type(e).__name__}: {e}); delete "
                f"that step directory to resume from an earlier one, or use a new --workdir") from e
        for key, want in expect.items():
            got = meta.get(key)
            if isinstance(got, dict) and key in (defaults or {}):
                got = {**{k: v for k, v in defaults[key].items() if k in want}, **got}
            if json.dumps(got, sort_keys=True) != json.dumps(want, sort_keys=True):
                raise CheckpointMismatchError(
                    f"checkpoint {path} was written with {key}={got!r}, this run has {want!r}; "
                    f"use a new --workdir (or the original config) to resume")
        items = {"state": ocp.args.StandardRestore(state_like)}
        if meta.get("has_ref"):
            items["ref"] = ocp.args.StandardRestore(ref_like)
        try:
            out = self._mngr.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:
            raise CorruptCheckpointError(
                f"checkpoint {path} cannot be restored ({type(e).__name__}: {str(e)[:300]}); "
                f"delete that step directory to resume from an earlier one, or use a new "
                f"--workdir") from e
        return out["state"], out.get("ref") if meta.get("has_ref") else None, meta

    def close(self) -> None:
        self._mngr.close()
