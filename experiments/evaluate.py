"""Evaluate a checkpoint: `python -m experiments.evaluate --config configs/eval_bfcl.py --workdir DIR`.

Overrides: `--config.checkpoint=DIR` (HF dir or training workdir), `--config.policy=oracle`
(BFCL ground-truth replay, the harness self-test), `--config.bfcl.limit=5`. The benchmark is
looked up by `config.benchmark` in toolverse_jax.eval.registry (bfcl, gust, ...). Writes
DIR/results.json, DIR/results.md, DIR/episodes.jsonl and prints the category table.
"""

from __future__ import annotations

import json

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", "configs/eval_bfcl.py",
                                          "evaluation config file (get_config())")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/toolverse_eval", "output directory")
_PROGRESS = flags.DEFINE_bool("progress", True, "show a progress bar")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    import logging as pylog

    pylog.getLogger("toolverse_jax.envs.catalog").setLevel(pylog.ERROR)  # other kinds' install notes
    from toolverse_jax.eval import registry

    config = _CONFIG.value
    results = registry.get(config.benchmark)(config, _WORKDIR.value, _PROGRESS.value)
    with open(f"{_WORKDIR.value}/results.md") as f:
        print(f.read().split("### Failure examples")[0])
    print(json.dumps({"benchmark": results["benchmark"], "categories": results["categories"],
                      "workdir": _WORKDIR.value}))


if __name__ == "__main__":
    app.run(main)
