"""Generates a GUST task set: `python -m experiments.generate_tasks --config configs/gust.py
--out DIR [--config.num_tasks=50] [--config.instruction_level=recipe]`. Writes JSONL shards and
DIR/manifest.json (counts, horizon histogram, and per-horizon `quality`: effective horizons,
fraction of discovery calls the instructions name, drops by reason)."""

import json

from absl import app, flags
from ml_collections import config_flags

from toolverse_jax.tasks.gust import generate_gust

_CONFIG = config_flags.DEFINE_config_file("config", "configs/gust.py", "GUST generation config.")
_OUT = flags.DEFINE_string("out", None, "Output directory for shards and manifest.json.")


def main(argv):
    del argv
    if not _OUT.value:
        raise app.UsageError("--out DIR is required (where shards and manifest.json go)")
    _, manifest = generate_gust(_CONFIG.value, out_dir=_OUT.value, progress=True)
    keys = ("num_tasks", "attempts", "dropped", "horizon_histogram", "cross_server_tasks",
            "tasks_per_s", "elapsed_s")
    out = {k: manifest[k] for k in keys}
    q = manifest["quality"]["by_horizon"]
    out["quality"] = {h: {k: v[k] for k in ("effective_ratio_mean", "named_discovery_fraction")}
                      for h, v in q.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    app.run(main)
