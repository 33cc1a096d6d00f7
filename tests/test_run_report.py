"""experiments.run_report: the RL-phase row of a run from its metrics.jsonl."""

import json

import pytest

from experiments import run_report


def _write_run(d, resumed=False):
    recs = [{"step": 2, "unix_time": 1000.0, "phase": "sft", "eval/success_rate": 0.1,
             "eval/truncated_frac": 0.05}]
    for i in range(12):
        recs.append({"step": 3 + i, "unix_time": 1010.0 + 10 * i, "phase": "rl",
                     "rollout/success_rate": 0.0 if i < 10 else 1.0,
                     "rollout/truncated_frac": 0.5, "rollout/rate_invalid_call": 0.25,
                     "time/step_s": 4.0, "time/rollout_s": 3.0, "time/update_s": 1.0})
    recs[-1].update({"eval/success_rate": 0.35, "eval/truncated_frac": 0.0})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    start = {"time": "1970-01-01T00:15:40+0000", "config": {}}  # unix 940
    (d / "config_history.jsonl").write_text(
        (json.dumps(start) + "\n") * (2 if resumed else 1))


def test_record_reads_lift_windows_timings_and_wall(tmp_path):
    _write_run(tmp_path)
    rec = run_report.run_record(str(tmp_path), window=10)
    assert rec["rl_steps"] == 12 and rec["warm_start"] == 0.1
    assert rec["evals"] == [(12, 0.35)] and rec["lift"] == pytest.approx(0.25)
    assert rec["train_success"] == (0.0, pytest.approx(0.2))   # last 10: two of them at 1.0
    assert rec["eval_truncated"] == (0.05, 0.0)
    assert (rec["step_s"], rec["rollout_s"], rec["update_s"]) == (4.0, 3.0, 1.0)
    assert rec["wall_min"] == pytest.approx((1120.0 - 940.0) / 60)
    row = run_report.markdown_row(rec)
    assert "| 12 |" in row and "+25.0" in row and "10.0 → 35.0" in row
    assert row.count("|") == len(run_report.COLUMNS) + 1


def test_resumed_run_has_no_wall_and_bad_dirs_fail_clearly(tmp_path, capsys):
    _write_run(tmp_path, resumed=True)
    assert run_report.run_record(str(tmp_path))["wall_min"] is None
    missing = tmp_path / "nothing"
    missing.mkdir()
    assert run_report.main([str(missing)]) == 1
    assert "no metrics.jsonl" in capsys.readouterr().err
    sft_only = tmp_path / "sft"
    sft_only.mkdir()
    (sft_only / "metrics.jsonl").write_text(json.dumps({"step": 1, "phase": "sft"}) + "\n")
    with pytest.raises(ValueError, match="no RL step"):
        run_report.run_record(str(sft_only))
