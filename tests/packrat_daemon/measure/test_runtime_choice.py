"""--runtime auto's choice: expected latency first, and on a near tie the runtime least behind at its worst batch."""

from __future__ import annotations

import pytest

from packrat_daemon.measure.runtime_choice import RuntimeOption, choose_checked, choose_runtime, worst_lag

# Shaped like ResNet-50 on this machine: ONNX Runtime wins the mean by 1%, but is 8% slower at B=1.
ORT = RuntimeOption("onnxruntime", 281.1, {1: 41.8, 4: 159.1, 8: 318.4, 16: 605.0})
OV = RuntimeOption("openvino", 283.9, {1: 38.6, 4: 160.2, 8: 324.3, 16: 612.5})
TORCH = RuntimeOption("torch", 343.9, {1: 67.3, 4: 213.3, 8: 403.3, 16: 691.7})


def test_a_clear_winner_on_expected_latency_is_served() -> None:
    choice = choose_runtime([TORCH, ORT])
    assert choice.runtime == "onnxruntime"
    assert choice.reason == "predicted: torch 343.9 ms, onnxruntime 281.1 ms"


def test_on_a_near_tie_the_runtime_least_behind_at_its_worst_batch_wins() -> None:
    choice = choose_runtime([TORCH, ORT, OV])
    assert choice.runtime == "openvino"
    assert "within 2% of each other" in choice.reason
    assert "onnxruntime 8.3% at batch 1" in choice.reason
    assert "openvino 1.9% at batch 8" in choice.reason


def test_outside_the_tie_band_expected_latency_decides() -> None:
    assert choose_runtime([ORT, OV], near_tie=0.005).runtime == "onnxruntime"
    far = RuntimeOption("openvino", 300.0, OV.batch_ms)
    assert choose_runtime([ORT, far]).runtime == "onnxruntime"


def test_missing_predictions_leave_the_choice_to_expected_latency() -> None:
    unknown = RuntimeOption("openvino", 283.9, {1: None, 4: 160.2, 8: 324.3, 16: 612.5})
    assert choose_runtime([ORT, unknown]).runtime == "onnxruntime"
    assert worst_lag(unknown, [ORT, unknown]) is None
    no_table = RuntimeOption("openvino", 283.9, {})
    assert choose_runtime([ORT, no_table]).runtime == "onnxruntime"


def test_one_runtime_is_its_own_choice_and_none_is_an_error() -> None:
    assert choose_runtime([OV]).runtime == "openvino"
    with pytest.raises(ValueError):
        choose_runtime([])


def test_worst_lag_names_the_batch() -> None:
    lag, batch = worst_lag(ORT, [ORT, OV])  # type: ignore[misc]
    assert batch == 1
    assert lag == pytest.approx(41.8 / 38.6 - 1.0)


def _checked_choice(predicted: dict[str, float], measured: dict[str, float]) -> tuple[str, list[str]]:
    """choose_checked over candidates whose check replaces the prediction with what a split check measured."""
    checks: list[str] = []

    def check(key: str) -> None:
        checks.append(key)
        predicted[key] = measured[key]

    return choose_checked(lambda: min(predicted, key=predicted.__getitem__), check), checks


def test_a_runtime_whose_checked_split_measured_slower_than_another_plan_is_not_served() -> None:
    # BERT-base as a run here had it: ONNX Runtime chosen at 639 ms, its split checked at 949 ms, above
    # OpenVINO's 669 ms. OpenVINO is then checked too, and served.
    chosen, checks = _checked_choice(
        {"onnxruntime": 639.1, "openvino": 669.1}, {"onnxruntime": 948.7, "openvino": 815.0}
    )
    assert (chosen, checks) == ("openvino", ["onnxruntime", "openvino"])


def test_a_check_that_keeps_the_lead_checks_one_candidate_only() -> None:
    chosen, checks = _checked_choice({"onnxruntime": 190.5, "openvino": 261.5}, {"onnxruntime": 196.6, "openvino": 0.0})
    assert (chosen, checks) == ("onnxruntime", ["onnxruntime"])


def test_after_every_check_the_best_checked_candidate_is_served() -> None:
    # Each check makes the chosen one the slowest: all are checked once, and the best measured wins.
    chosen, checks = _checked_choice({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 9.0, "b": 8.0, "c": 7.0})
    assert (chosen, sorted(checks)) == ("c", ["a", "b", "c"])


def test_each_candidate_gets_a_verdict_saying_why_it_won_or_lost() -> None:
    from packrat_daemon.measure.runtime_choice import REFUSED, SERVED, SLOWER, Verdict, verdicts

    predicted = {"torch": 40.0, "openvino": 20.0, "openvino/bf16": 10.0, "onnxruntime": float("inf")}
    judged = verdicts("openvino/bf16", "predicted: …", predicted, {"torch/bf16": "max relative error 0.2: failed"})
    by = {v.candidate: v for v in judged}
    assert by["openvino/bf16"] == Verdict("openvino/bf16", SERVED, 10.0, "predicted: …")
    assert by["torch"].verdict == SLOWER and by["torch"].why == "+300.0% on openvino/bf16's 10 ms"
    assert by["onnxruntime"].verdict == SLOWER and by["onnxruntime"].predicted_ms is None
    assert by["torch/bf16"] == Verdict("torch/bf16", REFUSED, None, "accuracy guard: max relative error 0.2: failed")
    assert [Verdict.from_json(v.to_json()) for v in judged] == judged
    assert verdicts("torch", "r", {"torch": 5.0}, {})[0].why == "the only candidate"
    with pytest.raises(ValueError, match="unknown verdict"):
        Verdict.from_json({"candidate": "torch", "verdict": "best", "predicted_ms": 1.0})


def test_a_candidate_screened_beyond_the_margin_of_the_fastest_is_not_profiled_and_says_why() -> None:
    from packrat_daemon.measure.runtime_choice import SCREEN_MARGIN, screened_slower, verdicts

    assert screened_slower(150.0, 100.0, "openvino/bf16") is None  # at the margin: profiled
    why = screened_slower(151.0, 100.0, "openvino/bf16")
    assert why is not None and "1.51× openvino/bf16's" in why and f"{SCREEN_MARGIN:.2f}×" in why
    assert screened_slower(120.0, 100.0, "torch", margin=1.1) is not None
    judged = verdicts("openvino/bf16", "predicted: …", {"openvino/bf16": 100.0}, {}, {"torch": why})
    (left,) = [v for v in judged if v.candidate == "torch"]
    assert left.verdict == "slower" and left.predicted_ms is None and left.why == f"not profiled: {why}"
