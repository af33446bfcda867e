"""The committed config reference is the generated one, so it cannot drift from the models."""

from __future__ import annotations

from pathlib import Path

from platoon.config.reference import render_reference

DOC = Path(__file__).resolve().parents[3] / "docs" / "reference" / "config.md"


def test_committed_reference_matches_the_models() -> None:
    assert DOC.read_text(encoding="utf-8") == render_reference(), (
        "docs/reference/config.md is stale: regenerate it with "
        "`uv run python -m platoon.config.reference > docs/reference/config.md`"
    )


def test_reference_lists_every_section_with_defaults_and_deprecations() -> None:
    text = render_reference()
    for heading in (
        "### PlatoonTinkerRLTrainerConfig",
        "### TrainConfig",
        "### WorkflowConfig",
        "### EvalConfig",
        "### RolloutConfig",
        "### InferenceParams",
        "### EnvironmentConfig",
        "### AgentsConfig",
        "### PlatoonEvalConfig",
        "### HostedConfig",
        "### PricingConfig",
        "### EnvironmentsOnlyConfig",
    ):
        assert heading in text
    assert "| `batch_size` | int | `32` | tasks per step (at most 8192) |" in text
    assert (
        "WorkflowConfig with group_size: 1, filter_errors: false, filter_zero_advantage_datums: false" in text
    )
    assert "`rollout_group_key`" in text and "use label_by instead" in text
    assert "| `log_path` | str | *required* |" in text
