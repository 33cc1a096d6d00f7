"""TRACE at real scale: Qwen3-4B from a local HF checkpoint, multi-hop search / BrowseComp-Plus.

`python -m experiments.train --config configs/trace_qwen3_4b.py --workdir DIR
     --config.model.checkpoint=/path/to/Qwen3-4B --config.tasks.corpus_dir=/path/to/bcp`
Structure of configs/quickstart.py; values from configs/trace_search.py where not set here.
Sized for one 8-accelerator host (fsdp over all devices); a bf16 frozen reference.
"""

from ml_collections import ConfigDict

from configs import toolverse_qwen3_4b, trace_search


def get_config() -> ConfigDict:
    c = toolverse_qwen3_4b.scale_up(trace_search.get_config())
    c.mesh.shape = (1, -1, 1)       # (data, fsdp, tensor): fully sharded params
    c.tasks.num_tasks = 20000
    c.tasks.search_kinds = ("birth_country", "company_city", "company_founded",
                            "company_country", "capital_of_birth_country")
    c.rollout.max_observation_chars = 2000
    c.rl.weight_decay = 0.01
    c.train.eval_tasks = 256
    c.train.progress = False
    c.trace.pad_to = 512
    return c
