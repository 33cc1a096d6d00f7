"""TRACE at real scale: Qwen3-4B from a local HF checkpoint, multi-hop search / BrowseComp-Plus.

`python -m experiments.train --config configs/trace_qwen3_4b.py --workdir DIR
     --config.model.checkpoint=/path/to/Qwen3-4B --config.tasks.corpus_dir=/path/to/bcp`
Structure of configs/quickstart.py; values from configs/trace_search.py where not set here.
Sized for one 8-accelerator host (fsdp over all devices); a bf16 frozen reference.
"""

from ml_collections import ConfigDict

from configs import trace_search


def get_config() -> ConfigDict:
    c = trace_search.get_config()
    c.model.preset = "qwen3-4b"
    c.model.checkpoint = ""         # required: local HF Qwen3-4B dir (safetensors, no torch)
    c.model.tokenizer = "qwen3"
    c.model.dtype = "bfloat16"
    c.model.remat = True

    c.mesh.shape = (1, -1, 1)       # (data, fsdp, tensor): fully sharded params

    c.tasks.num_tasks = 20000
    c.tasks.search_kinds = ("birth_country", "company_city", "company_founded",
                            "company_country", "capital_of_birth_country")

    c.env.num_workers = 8
    c.env.call_timeout_s = 30.0

    c.rollout.max_turns = 16
    c.rollout.max_context = 16384
    c.rollout.max_new_tokens = 1024
    c.rollout.max_observation_chars = 2000

    c.sft.steps = 0                 # a pretrained instruct model needs no warm start

    c.rl.steps = 300
    c.rl.tasks_per_step = 32
    c.rl.group_size = 8
    c.rl.lr = 1e-6
    c.rl.warmup_steps = 10
    c.rl.kl_coef = 0.001
    c.rl.weight_decay = 0.01

    c.train.num_micro = 8
    c.train.eval_every = 25
    c.train.eval_tasks = 256
    c.train.checkpoint_every = 25
    c.train.progress = False

    c.trace.pad_to = 512
    return c
