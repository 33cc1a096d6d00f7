"""Orbax checkpoints of the whole training run: train state, reference params, loop metadata.

Saves are asynchronous: `save` returns once the arrays are copied to host memory and orbax
writes them on a background thread while training goes on; the write is waited for at the next
save, before any restore, and at `close`. They are atomic (orbax finalizes a step directory only
when complete), so a run killed with SIGKILL resumes from the last finished step; a step that
does not match the run (other model config) or cannot be read fails with a message that names
the directory and the fix. `restore_params` reads the policy params alone (no optimizer moments,
no reference), for evaluation.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointMismatchError(ValueError):
    """The checkpoint in a workdir belongs to a different run configuration."""


class CorruptCheckpointError(RuntimeError):
    """A checkpoint step directory exists but cannot be restored."""


class RunCheckpointer:
    """Thin lifetime wrapper over an orbax CheckpointManager rooted at `workdir/checkpoints`.

    A step holds items `state` (TrainState: step, params, opt_state), `meta` (JSON) and, when
    the run has one, `ref` (frozen reference params)."""

    def __init__(self, workdir: str, keep: int = 2, preserve: tuple[int, ...] = (), *,
                 directory: str | None = None):
        """Keeps the latest `keep` steps plus every step in `preserve` (e.g. the SFT end, which
        warm starts and `experiments.inspect_rollouts --step` read after RL moved on).
        `directory` replaces `workdir/checkpoints` (to read a checkpoint folder of any name)."""
        self.directory = os.path.abspath(directory or os.path.join(workdir, "checkpoints"))
        if preserve:
            from orbax.checkpoint.checkpoint_managers import preservation_policy as pp
            options = ocp.CheckpointManagerOptions(
                create=True, preservation_policy=pp.AnyPreservationPolicy(
                    [pp.LatestN(keep), pp.CustomSteps(list(preserve))]))
        else:
            options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._mngr = ocp.CheckpointManager(self.directory, options=options)
        self._reader: ocp.CheckpointManager | None = None   # params-only restores, made lazily

    def latest_step(self) -> int | None:
        """Returns the newest saved step (an in-flight async save counts), or None."""
        return self._mngr.latest_step()

    def save(self, step: int, state: Any, ref_params: Any, meta: dict) -> None:
        """Starts saving `step` and returns once the arrays are on the host (so the caller may
        donate or overwrite them); the previous save, if still writing, is waited for first."""
        self.wait_until_finished()
        items = {"state": ocp.args.StandardSave(state),
                 "meta": ocp.args.JsonSave(meta)}
        if ref_params is not None:
            items["ref"] = ocp.args.StandardSave(ref_params)
        self._mngr.save(step, args=ocp.args.Composite(**items), force=True)

    def wait_until_finished(self) -> None:
        """Blocks until the in-flight save (if any) is written and finalized; raises its error."""
        self._mngr.wait_until_finished()

    def read_meta(self, step: int) -> dict:
        """Returns the JSON metadata of `step`; CorruptCheckpointError if it cannot be read."""
        self.wait_until_finished()
        try:
            meta = self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            return dict(meta["meta"])
        except Exception as e:
            raise CorruptCheckpointError(
                f"checkpoint {os.path.join(self.directory, str(step))} has no readable metadata "
                f"({type(e).__name__}: {e}); delete that step directory to resume from an earlier "
                f"one, or use a new --workdir") from e

    def restore_params(self, step: int, params_like: Any = None) -> Any:
        """Returns the policy params of `step` alone: the optimizer moments and the reference
        are not read. `params_like` (arrays or ShapeDtypeStructs with shardings) sets structure,
        dtypes and placement; None takes them from the checkpoint, on the first local device."""
        self.wait_until_finished()
        path = os.path.join(self.directory, str(step))
        if self._reader is None:
            # The writer's `state` item is bound to StandardCheckpointHandler, which cannot
            # restore part of a tree; a read-only manager with the PyTree handler can.
            self._reader = ocp.CheckpointManager(
                self.directory, options=ocp.CheckpointManagerOptions(read_only=True),
                item_handlers={"state": ocp.PyTreeCheckpointHandler()})
        try:
            if params_like is None:
                tree = self._reader.item_metadata(step)["state"]
                dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
                params_like = jax.tree.map(
                    lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=dev),
                    getattr(tree, "tree", tree)["params"])
            item = {"params": params_like}
            out = self._reader.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
                item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                partial_restore=True)))
        except Exception as e:
            raise CorruptCheckpointError(
                f"checkpoint {path} has no readable policy params ({type(e).__name__}: "
                f"{str(e)[:300]}); pick another step or retrain") from e
        return out["state"]["params"]

    def restore(self, step: int, state_like: Any, ref_like: Any, expect: dict,
                defaults: dict | None = None) -> tuple:
        """Returns (state, ref_params or None, meta) of `step`; checks `expect` against meta.

        `defaults` {key: {field: default}}: a dict-valued meta entry written before a field
        existed (a ModelConfig field added later) reads that field as its default, so new
        fields at their defaults do not orphan older checkpoints."""
        path = os.path.join(self.directory, str(step))
        meta = self.read_meta(step)
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
        """Waits for the in-flight save, then releases orbax's threads."""
        self._mngr.close()
        if self._reader is not None:
            self._reader.close()
