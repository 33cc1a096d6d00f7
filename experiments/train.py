"""Train an agent: `python -m experiments.train --config configs/quickstart.py --workdir DIR`.

Overrides: `--config.rl.steps=10 --config.model.preset=tiny`. Rerunning resumes from DIR.
"""

from __future__ import annotations

import json

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", "configs/quickstart.py",
                                          "experiment config file (get_config())")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/toolverse_quickstart", "output directory")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
    from toolverse_jax.rl.driver import run_training  # config.method picks the program
    summary = run_training(_CONFIG.value, _WORKDIR.value)
    print(json.dumps(summary))


if __name__ == "__main__":
    app.run(main)
