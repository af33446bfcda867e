"""Validation errors as one-line problems."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import pytest
from pydantic import AfterValidator, ValidationError, model_validator

from platoon.config.base import StrictModel
from platoon.config.messages import bool_number_problems, validation_problems


def _positive(value: int) -> int:
    if value <= 0:
        raise ValueError("must be positive")
    return value


class Exit(StrictModel):
    timeout: Literal["grade", "exclude"] = "exclude"


class Entry(StrictModel):
    name: str | None = None
    weight: float | Literal["tasks"] = "tasks"
    harness: str | dict[str, float] | None = None
    on_exit: Literal["grade", "exclude"] | Exit = "exclude"
    harness_options: dict[str, Any] = {}
    seed: Annotated[int, AfterValidator(_positive)] = 1


class Train(StrictModel):
    UNKNOWN_KEY_HINTS: ClassVar[dict[str, str]] = {"hosted": "hosted models are evaluation-only"}

    model_name: str
    batch_size: int = 32
    learning_rate: float = 3e-5
    tags: list[str] = []


class Top(StrictModel):
    REQUIRED_KEY_HINTS: ClassVar[dict[str, str]] = {"log_path": "or set `runs` in the site profile"}

    train: Train
    log_path: str
    environments: list[Entry] = []

    @model_validator(mode="after")
    def _rule(self) -> Top:
        if self.train.batch_size == 7:
            raise ValueError("batch_size 7 is unlucky")
        return self


def problems(data: Any, schema: Any = Top) -> list[str]:
    with pytest.raises(ValidationError) as info:
        schema.model_validate(data)
    return validation_problems(info.value, data, schema)


GOOD: dict[str, Any] = {"train": {"model_name": "m"}, "log_path": "runs"}


def test_unknown_key_with_did_you_mean_and_hint() -> None:
    data = {**GOOD, "train": {"model_name": "m", "batch_sise": 3, "hosted": {}, "zzz": 1}}
    assert problems(data) == [
        "train.batch_sise: unknown key; did you mean train.batch_size?",
        "train.hosted: unknown key; hosted models are evaluation-only",
        "train.zzz: unknown key",
    ]


def test_top_level_unknown_key() -> None:
    assert problems({**GOOD, "log_pth": "x"}) == ["log_pth: unknown key; did you mean log_path?"]


def test_missing_required_with_hint() -> None:
    assert problems({"train": {}}) == [
        "train.model_name: required key is missing",
        "log_path: required key is missing; or set `runs` in the site profile",
    ]


def test_type_errors_name_repr_and_type() -> None:
    data = {**GOOD, "train": {"model_name": "m", "batch_size": "many", "learning_rate": "fast", "tags": "x"}}
    assert problems(data) == [
        "train.batch_size: 'many' is not an int",
        "train.learning_rate: 'fast' is not a float",
        "train.tags: expected a list, got a string",
    ]


def test_null_is_not_allowed() -> None:
    assert problems({**GOOD, "log_path": None}) == ["log_path: null is not allowed (expected string)"]


def test_literal_and_models() -> None:
    data = {**GOOD, "environments": [{"on_exit": {"timeout": "maybe"}}, 3], "train": [1]}
    assert problems(data) == [
        "train: expected a mapping (Train), got a list",
        "environments.0.on_exit.timeout: 'maybe' is not one of 'grade', 'exclude'",
        "environments.1: expected a mapping (Entry), got an int",
    ]


def test_union_members_are_never_printed() -> None:
    data = {**GOOD, "environments": [{"harness": 5, "weight": "lots", "on_exit": "sometimes"}]}
    assert problems(data) == [
        "environments.0.weight: 'lots' is not a float or one of 'tasks'",
        "environments.0.harness: 5 is not a string or a mapping",
        "environments.0.on_exit: 'sometimes' is not one of 'grade', 'exclude' or a mapping (Exit)",
    ]
    data = {**GOOD, "environments": [{"harness": {"a": "heavy"}}]}
    assert problems(data) == ["environments.0.harness.a: 'heavy' is not a float"]


def test_value_errors() -> None:
    data = {**GOOD, "environments": [{"seed": -1}]}
    assert problems(data) == ["environments.0.seed: ValueError: must be positive"]
    assert problems({**GOOD, "train": {"model_name": "m", "batch_size": 7}}) == [
        "config: ValueError: batch_size 7 is unlucky"
    ]


def test_a_sections_rule_is_placed_at_the_field_its_message_starts_with() -> None:
    class Ruled(StrictModel):
        train: Train
        log_path: str = "runs"

        @model_validator(mode="after")
        def _rule(self) -> Ruled:
            if self.log_path == "/":
                raise ValueError("log_path: the root directory is not a run directory; name one below it")
            if self.train.batch_size == 7:
                raise ValueError("train.batch_size 7 is unlucky (pick 8)")
            return self

    assert problems({"train": {"model_name": "m"}, "log_path": "/"}, Ruled) == [
        "log_path: ValueError: the root directory is not a run directory; name one below it"
    ]
    assert problems({"train": {"model_name": "m", "batch_size": 7}}, Ruled) == [
        "train.batch_size: ValueError: train.batch_size 7 is unlucky (pick 8)"
    ]


def test_float_hint_for_numeric_text() -> None:
    from pydantic import StrictFloat

    class Strict(StrictModel):
        lr: StrictFloat = 1.0

    assert problems({"lr": "1e-5"}, Strict) == [
        "lr: '1e-5' is not a float; YAML reads an exponent without a dot as text; write 1.0e-5"
    ]


def test_attribution_prefixes_another_file() -> None:
    data = {**GOOD, "train": {"model_name": "m", "batch_size": "x"}}
    with pytest.raises(ValidationError) as info:
        Top.model_validate(data)
    lines = validation_problems(
        info.value, data, Top, attribute=lambda path: "base.yaml" if list(path)[:1] == ["train"] else None
    )
    assert lines == ["base.yaml: train.batch_size: 'x' is not an int"]


def test_bools_are_not_numbers() -> None:
    data = {**GOOD, "train": {"model_name": "m", "batch_size": True, "learning_rate": False}}
    assert [p for _, p in bool_number_problems(data, Top)] == [
        "train.batch_size: True is not an int",
        "train.learning_rate: False is not a float",
    ]


def test_real_training_config_messages() -> None:
    from platoon.config.training import PlatoonTinkerRLTrainerConfig as Schema

    data = {
        "train": {"model_name": "m", "renderer_name": "r", "batchsize": 3, "task_order": "random"},
        "log_path": "runs",
        "inference": {},
        "environments": [{"weight": "tasks", "bogus": 1}],
    }
    found = problems(data, Schema)
    assert "train.batchsize: unknown key; did you mean train.batch_size?" in found
    assert "train.task_order: 'random' is not one of 'auto', 'weighted'" in found
    assert "environments.0.bogus: unknown key" in found
    assert any(p.startswith("inference: unknown key; ") for p in found)
