"""Launch a sweep: `python -m experiments.launch --config configs/X.py --sweep sweeps/Y.py`.

An experiment is a config plus a sweep (a list of override dicts, `get_sweep()` in the sweep
file); each override dict is a work unit that runs `python -m experiments.train` in its own
process with its own workdir and log under --root. Any `--config.KEY=VALUE` flag given here is
passed to every unit (the unit's own overrides win). Prints a summary table when all are done;
exits 1 if any unit failed. Relaunching the same --root skips units that already succeeded.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

from toolverse_jax.launch import Experiment, LocalExecutor, check_overrides, load_sweep
from toolverse_jax.launch.experiment import DEFAULT_COLUMNS, FAILED


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="config file with get_config()")
    p.add_argument("--sweep", required=True, help="sweep file with get_sweep()")
    p.add_argument("--root", default="", help="experiment dir (default runs/<sweep>_<time>)")
    p.add_argument("--max_parallel", type=int, default=1, help="work units running at once")
    p.add_argument("--timeout_s", type=float, default=0.0, help="per unit; 0 = no limit")
    p.add_argument("--module", default="experiments.train", help="entry point of a unit")
    p.add_argument("--columns", default=",".join(DEFAULT_COLUMNS),
                   help="final-metric keys shown in the summary table")
    p.add_argument("--keep_failed", action="store_true",
                   help="leave units that failed in an earlier launch of --root as they are")
    p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    args, rest = p.parse_known_args(argv)
    bad = [a for a in rest if not a.startswith("--config.")]
    if bad:
        p.error(f"unrecognized arguments {bad}; only --config.KEY=VALUE flags pass through")
    return args, rest


def main(argv=None) -> int:
    args, extra = parse_args(argv)
    sweep = load_sweep(args.sweep)
    root = args.root or os.path.join(
        "runs", os.path.splitext(os.path.basename(args.sweep))[0] + "_" +
        datetime.datetime.now().strftime("%Y%m%d_%H%M%S"))
    executor = LocalExecutor(args.max_parallel, module=args.module, timeout_s=args.timeout_s)
    exp = Experiment(root, args.config, executor, extra_flags=extra)
    check_overrides(exp.config, {a[len("--config."):].split("=", 1)[0]: None for a in extra})
    for overrides in sweep:
        exp.add(overrides, rerun_failed=not args.keep_failed)
    if args.dry_run:
        for wu in exp.work_units():
            print(" ".join(executor.command(args.config, wu, extra)))
        return 0
    exp.run()
    print(exp.summary_table(tuple(c for c in args.columns.split(",") if c)))
    print(f"record: {exp.record_path}")
    return 1 if any(u.status == FAILED for u in exp.work_units()) else 0


if __name__ == "__main__":
    sys.exit(main())
