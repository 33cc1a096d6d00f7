"""CPU quickstart: tiny Qwen3-style model, trained BPE tokenizer, built-in MCP servers, minutes.

Goal-level GUST tasks. SFT warm-start on DUSA gold chains of a quarter of the train tasks, then
GRPO over live multi-turn rollouts on the other three quarters (verifier reward plus gold-turn
and argument-match shaping), with held-out GUST evaluation. `python -m experiments.train --config configs/quickstart.py --workdir /tmp/qs`
Every knob and its default: configs/common.py (`tool_use()`); what the quickstart sets is below.
"""

from ml_collections import ConfigDict

from configs import common


def get_config() -> ConfigDict:
    c = common.tool_use()
    c.model.preset = "tiny"
    c.model.tokenizer = "trained"

    c.tasks.num_tasks = 2100        # 884 kept by the filters below: 751 train, 133 held-out
    c.tasks.max_literal_chars = 24  # keep tasks whose gold literals are at most this long
    # Goal-level instructions (issue 24): the task states what the user wants and the values the
    # user knows, not the tool. At horizon 1 whole-chain tasks have no id to discover, so the
    # set is one call a task over 11 tools (create_ticket 58%, create_note 24%, create_event 14%);
    # the recipe-level set has 32 tools.
    # `--config.tasks.instruction_level=recipe --config.tasks.num_tasks=2000` is the earlier
    # recipe-level set (every call named), shipped too.
    c.tasks.instruction_level = "goal"
    # SFT demonstrates a quarter of the train tasks (188) for 420 steps; RL runs on the other
    # 563, which no demonstration showed. The warm start decides whether RL has anything to
    # work with (README "Quickstart result"): with half demonstrated for 300 steps it landed at
    # 7.8-54.7% over five seeds and RL took off only from the three at 33-55%; 420 steps on
    # half left 74-81% (little to gain: +6.2) or 2.3%; a quarter for 420 steps lands at 7-31%
    # over five seeds and RL adds +39.1 +- 11.6, every seed >= +19.5 (rl_scarce_sweep.md).
    c.tasks.sft_fraction = 0.25

    c.sft.steps = 420
    c.rl.steps = 100
    c.rl.tasks_per_step = 8
    c.rl.group_size = 8
    c.rl.advantage = "grpo"
    c.rl.gold_turn_bonus = 0.5      # + bonus x fraction of turns matching the gold stage
    c.rl.arg_match_bonus = 0.5      # + bonus x fraction of gold argument values reproduced
    c.rl.lr = 1e-3
    c.rl.neg_adv_scale = 0.2        # failed samples share the call syntax of the successes
    # Exploration: the warm start is sharp (SFT loss 0.02, rollout entropy ~0.1), so most groups
    # of 8 score alike. T=1.3 spreads the literal choices; top-p 0.95 keeps the call syntax
    # (plain T=1.3 broke it: 74% invalid calls). At the recipe level, six runs: +11.7 +- 1.2
    # held-out points vs +9.4 +- 1.4 at T=1, truncation not growing (rl_scarce_sweep.md).
    c.rollout.temperature = 1.3
    c.rollout.top_p = 0.95

    c.train.eval_every = 20
    c.train.eval_at_start = False   # the random init scores 0% (every turn truncated): ~15 s saved
    c.train.eval_tasks = 128        # >= 128 held-out: 32 gives +-9 points of noise
    c.train.probe_tasks = 64
    return c
