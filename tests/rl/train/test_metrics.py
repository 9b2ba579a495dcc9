"""Per-iteration metrics: aggregates of hand-made rollouts, JSONL round trip, a PNG."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl.train.metrics import (
    SFT_PLOTS,
    append_metrics,
    percentile,
    plot_metrics,
    plot_panels,
    read_metrics,
    rollout_metrics,
    wide_range,
)
from rl.types import GradeResult, Rollout, RolloutStatus, Segment


def _r(passed: bool, *, status: RolloutStatus = RolloutStatus.FINISHED, sampled: int = 4, **metrics: float) -> Rollout:
    return Rollout(run_id="r", iteration=0, task_id="t", sample=0, status=status,
                   segments=[Segment([1, 2], False), Segment(list(range(sampled)), True, [0.0] * sampled)],
                   reward=1.0 if passed else 0.0, grade=GradeResult(passed, "", 0.1), metrics=dict(metrics))


def test_rollout_aggregates_are_ratios_of_sums_and_exclude_infra_errors() -> None:
    rs = [_r(True, sampled=10, model_calls=2, tool_calls=6, parallel_steps=2, edits=1, blind_edits=0, wall_s=1.0),
          _r(False, sampled=4, model_calls=8, tool_calls=4, parallel_steps=0, edits=3, blind_edits=3, wall_s=3.0),
          _r(False, status=RolloutStatus.INFRA_ERROR, model_calls=100, wall_s=99.0)]
    m = rollout_metrics(rs)
    assert m["success_rate"] == 0.5 and m["mean_reward"] == 0.5 and m["status_infra_error"] == 1
    assert m["tokens_per_solved"] == 10
    assert m["tool_calls_per_model_call"] == pytest.approx(10 / 10)
    assert m["parallel_call_share"] == pytest.approx(2 / 10)
    assert m["blind_edit_rate"] == pytest.approx(3 / 4)
    assert m["rollout_model_calls"] == 5 and m["rollout_wall_s_max"] == 3.0
    assert "malformed_call_rate" not in m  # no producer recorded malformed_calls
    assert "solved_by_command_share" not in m  # nor file_writes


def test_the_share_solved_by_a_command_counts_solved_rollouts_without_file_writes() -> None:
    rs = [_r(True, file_writes=0), _r(True, file_writes=2), _r(True, file_writes=0), _r(True),
          _r(False, file_writes=0), _r(False, status=RolloutStatus.INFRA_ERROR, file_writes=0)]
    # three solved rollouts recorded file_writes, two of them made none; failures do not count
    assert rollout_metrics(rs)["solved_by_command_share"] == pytest.approx(2 / 3)
    assert "solved_by_command_share" not in rollout_metrics([_r(False, file_writes=0)])  # nothing solved


def test_training_success_per_family_partitions_the_scored_rollouts() -> None:
    import dataclasses

    rs = [dataclasses.replace(_r(p), task_id=t) for p, t in
          [(True, "a1"), (False, "a1"), (False, "b1"), (False, "b2"), (True, "c9")]]
    rs.append(dataclasses.replace(_r(True, status=RolloutStatus.INFRA_ERROR), task_id="b1"))
    m = rollout_metrics(rs, families={"a1": "rename", "b1": "fix_bug", "b2": "fix_bug"})
    assert m["success_rate_rename"] == 0.5 and m["success_rate_fix_bug"] == 0.0  # the infra error is not scored
    assert m["success_rate_unknown"] == 1.0  # c9 is in no family
    assert m["success_rate"] == pytest.approx(2 / 5)
    assert not any(k.startswith("success_rate_") for k in rollout_metrics(rs))  # only with families


def test_percentile() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([0.0, 10.0], 90) == 9.0


def test_jsonl_and_png(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    for i in range(3):
        append_metrics(path, {"iteration": i, "success_rate": i / 3, "grad_norm": 1.0, "entropy": 2.0 - i})
    recs = read_metrics(path)
    assert [r["iteration"] for r in recs] == [0, 1, 2]
    png = plot_metrics(recs, tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        append_metrics(path, {"iteration": 3, "loss": float("nan")})  # never a silent NaN in the log


def test_the_sft_curve_has_its_own_panels_and_a_blank_figure_is_refused(tmp_path: Path) -> None:
    curve = [{"step": 0, "train_loss": 1.2, "heldout_loss": 3.4, "heldout_copy_acc": 0.2, "heldout_copy_loss": 4.4,
              "heldout_exit_acc": 0.5},
             {"step": 50, "train_loss": 0.3, "heldout_loss": 0.4, "heldout_copy_acc": 0.9, "heldout_copy_loss": 0.3,
              "heldout_exit_acc": 0.8}]
    assert [t for t, _ in plot_panels(curve, SFT_PLOTS)] == [t for t, _ in SFT_PLOTS]
    assert plot_panels([{"step": 0, "train_loss": 1.0, "heldout_loss": 2.0}], SFT_PLOTS) == [
        ("SFT loss", ["train_loss", "heldout_loss"])]
    assert plot_metrics(curve, tmp_path / "sft.png", x_key="step", plots=SFT_PLOTS).stat().st_size > 10_000
    # the SFT curve's keys are not the RL run's: with the default panels nothing would be drawn
    assert plot_panels(curve) == []
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_metrics(curve, tmp_path / "blank.png")
    assert not (tmp_path / "blank.png").exists()


def test_a_panel_whose_series_differ_by_orders_of_magnitude_gets_a_log_axis(tmp_path: Path) -> None:
    # generation time summed over 64 concurrent rollouts vs grading time: linear flattens grading to 0
    assert wide_range([[13_000.0, 17_500.0], [40.0, 55.0], [0.0, 0.0]])
    assert not wide_range([[0.12, 0.14], [0.08, 0.1]])  # rates of one size stay linear
    assert not wide_range([[2.5, 1.4], [0.0, 0.0]])  # an all-zero series is no reason
    assert not wide_range([[-1.0, 500.0], [1.0, 2.0]])  # negative values: never a log axis
    assert not wide_range([[], [3.0]])
    assert not wide_range([[3e-5, 1e-5], [1e-9, 2e-9]])  # below the symlog threshold: nothing to gain
    png = plot_metrics([{"iteration": i, "time_generation_s": 15_000.0 + i, "time_grading_s": 20.0 + i}
                        for i in range(3)], tmp_path / "t.png", title="t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_key_ending_in_a_star_is_every_recorded_key_with_that_prefix() -> None:
    recs = [{"iteration": 0, "heldout_pass_at_1": 0.5, "heldout_pass_at_1_rename": 0.0,
             "heldout_pass_at_1_fix_bug": 1.0}, {"iteration": 1, "heldout_pass_at_1_zeta": 0.5}]
    assert plot_panels(recs, [("by family", ("heldout_pass_at_1_*",)), ("none", ("absent_*",))]) == [
        ("by family", ["heldout_pass_at_1_fix_bug", "heldout_pass_at_1_rename", "heldout_pass_at_1_zeta"])]
