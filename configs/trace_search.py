"""CPU TRACE on multi-hop search: tiny Qwen3, built-in BM25 `search` server, advantage="trace".

`python -m experiments.train --config configs/trace_search.py --workdir /tmp/trace_search`
Same structure as configs/quickstart.py (its values unless set here); what differs: the task
source (synthetic multi-hop questions over the seeded search world, or a BrowseComp-Plus dir),
the hidden `search` server (opted into the catalog), and the TRACE advantage with its scorer.
"""

from ml_collections import ConfigDict

from configs import quickstart


def trace_constants() -> ConfigDict:
    """Returns the DESIGN.md §5 TRACE constants (read by rl.registry's "trace" adapter)."""
    return ConfigDict({
        "eps": 1e-6,            # GRPO std epsilon of A_out
        "trace_eps": 0.1,       # ε of the gap d_k = -ℓ̄_k + ε
        "mode": "log_ratio",    # "log_ratio" | "raw" | "gap_normalized"
        "k_steps": 3,           # K of the K-step backup
        "gamma_td": 0.8,
        "fill": 2.0,            # terminal fill coefficient (× γ^{T-k} A_out)
        "alpha_out": 1.0,
        "alpha_turn": 0.2,
    })


def get_config() -> ConfigDict:
    c = quickstart.get_config()
    c.model.preset = "tiny"

    c.tasks.source = "search"       # toolverse_jax.tasks.search_tasks
    c.tasks.num_tasks = 400
    c.tasks.servers = ("search",)
    c.tasks.search_kinds = ("birth_country", "company_city", "company_founded")  # 2-hop first
    c.tasks.corpus_dir = ""         # BrowseComp-Plus dir (queries + corpus .jsonl); "" = synthetic
    c.tasks.split_by = "task"

    c.env.include_hidden = True     # `search` is opt-in (hidden) in the catalog
    c.env.corpus_env = "TOOLVERSE_SEARCH_CORPUS"  # set to tasks.corpus_dir for the server processes

    c.rollout.max_turns = 4
    c.rollout.max_context = 1536
    c.rollout.prompt_tools = "all"
    c.rollout.max_observation_chars = 400

    # The budget its README comparison was measured with (the quickstart's defaults have moved).
    c.sft.steps = 250
    c.rl.steps, c.rl.tasks_per_step, c.rl.group_size = 60, 6, 6
    c.rl.lr, c.rl.arg_match_bonus = 5e-4, 0.0
    c.train.eval_every, c.train.eval_tasks = 10, 32

    c.rl.advantage = "trace"
    c.rl.adv = trace_constants()

    # π_ref is the policy when RL starts (the SFT warm start); scorer knobs: configs/common.py.
    c.trace.scorer = "single_pass"
    return c
