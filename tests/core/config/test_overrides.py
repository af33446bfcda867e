"""`k=v` overrides typed by the schema and the library argv form."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest

from platoon.config import apply_overrides, parse_override, split_library_argv
from platoon.config.base import StrictModel
from platoon.errors import ConfigError


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Optim(StrictModel):
    learning_rate: float = 3e-5
    beta1: float = 0.9


class Stats(StrictModel):
    experiment_name: str = "platoon_tinker"
    trial_name: str = "run"
    tags: list[str] = []


class Entry(StrictModel):
    name: str | None = None
    weight: float | Literal["tasks"] = "tasks"
    harness: str | dict[str, float] | None = None
    harness_options: dict[str, Any] = {}
    seed: int = 0


class Train(StrictModel):
    UNKNOWN_KEY_HINTS: ClassVar[dict[str, str]] = {"backend": "the backend is chosen by tinker_base_url"}

    batch_size: int = 32
    max_staleness: int | None = None
    model_name: str = "m"
    optimizer: Optim = Optim()
    loss_fn_config: dict[str, Any] = {}
    task_order: Literal["auto", "weighted"] = "auto"
    color: Color = Color.RED
    every: int | str = 0
    enabled: bool = True
    log_dir: Path | None = None
    extra: Any = None


class Top(StrictModel):
    train: Train = Train()
    stats: Stats = Stats()
    environments: list[Entry] = []
    label_limits: dict[str, int] = {}


def apply(data: dict[str, Any], *overrides: str, schema: Any = Top) -> dict[str, Any]:
    return apply_overrides(data, overrides, schema)


def problems(data: dict[str, Any], *overrides: str, schema: Any = Top) -> list[str]:
    with pytest.raises(ConfigError) as info:
        apply_overrides(data, overrides, schema)
    return info.value.problems


# --- parsing -------------------------------------------------------------------------------------------------


def test_parse_override_forms() -> None:
    ov = parse_override("a.b=1")
    assert (ov.key, ov.value, ov.append) == ("a.b", "1", False)
    ov = parse_override("a.b+=x=y")
    assert (ov.key, ov.value, ov.append) == ("a.b", "x=y", True)
    assert parse_override("a=").value == ""


@pytest.mark.parametrize("text", ["novalue", "=3", "a..b=1", ".a=1", "a.=1", " =1", "+=1"])
def test_malformed_override(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_override(text)
    assert str(info.value) == f"override {text!r} is not of the form key=value or key+=value"


def test_malformed_overrides_are_reported_with_the_others() -> None:
    found = problems({}, "oops", "train.batch_size=x", "train.nope=1")
    assert found == [
        "override 'oops' is not of the form key=value or key+=value",
        "override 'train.batch_size=x': train.batch_size: 'x' is not an int",
        "override 'train.nope=1': train.nope: unknown key",
    ]


# --- typing -----------------------------------------------------------------------------------------


def test_str_fields_take_text_verbatim_and_ints_are_ints() -> None:
    out = apply({}, "stats.trial_name=1", "train.batch_size=1", "train.model_name=None", "train.log_dir=~/x")
    assert out["stats"]["trial_name"] == "1"
    assert out["train"]["batch_size"] == 1
    assert out["train"]["model_name"] == "None"
    assert out["train"]["log_dir"] == "~/x"


def test_underscores_in_numbers() -> None:
    out = apply({}, "train.batch_size=1_000", "train.optimizer.learning_rate=1_0.5")
    assert out["train"]["batch_size"] == 1000
    assert out["train"]["optimizer"]["learning_rate"] == 10.5


@pytest.mark.parametrize("word", ["null", "Null", "NULL", "none", "None", "~"])
def test_null_words_only_where_none_is_allowed(word: str) -> None:
    assert apply({}, f"train.max_staleness={word}")["train"]["max_staleness"] is None
    assert problems({}, f"train.batch_size={word}") == [
        f"override 'train.batch_size={word}': train.batch_size: null is not allowed (expected int)"
    ]


@pytest.mark.parametrize(
    ("word", "value"),
    [
        ("true", True),
        ("YES", True),
        ("On", True),
        ("1", True),
        ("false", False),
        ("no", False),
        ("OFF", False),
        ("0", False),
    ],
)
def test_bool_words(word: str, value: bool) -> None:
    assert apply({}, f"train.enabled={word}")["train"]["enabled"] is value


def test_bad_bool() -> None:
    assert problems({}, "train.enabled=maybe") == [
        "override 'train.enabled=maybe': train.enabled: 'maybe' is not a bool"
    ]


def test_literal_and_enum() -> None:
    out = apply({}, "train.task_order=weighted", "train.color=BLUE")
    assert out["train"]["task_order"] == "weighted"
    assert out["train"]["color"] == "blue"
    assert apply({}, "train.color=red")["train"]["color"] == "red"
    assert problems({}, "train.task_order=random") == [
        "override 'train.task_order=random': train.task_order: 'random' is not one of 'auto', 'weighted'"
    ]


def test_unions_try_typed_members_before_str() -> None:
    assert apply({}, "train.every=5")["train"]["every"] == 5
    assert apply({}, "train.every=often")["train"]["every"] == "often"
    out = apply({"environments": [{}]}, "environments.0.weight=2.5")
    assert out["environments"][0]["weight"] == 2.5
    assert (
        apply({"environments": [{}]}, "environments.0.weight=tasks")["environments"][0]["weight"] == "tasks"
    )
    found = problems({"environments": [{}]}, "environments.0.weight=lots")
    assert found == [
        "override 'environments.0.weight=lots': environments.0.weight: 'lots' is not a float or one of 'tasks'"
    ]
    out = apply({"environments": [{}]}, "environments.0.harness={a: 1, b: 3}")
    assert out["environments"][0]["harness"] == {"a": 1, "b": 3}
    assert (
        apply({"environments": [{}]}, "environments.0.harness=codex")["environments"][0]["harness"] == "codex"
    )


def test_containers_and_models_are_yaml() -> None:
    out = apply({}, "stats.tags=[a, b]", "label_limits={x: 2}")
    assert out["stats"]["tags"] == ["a", "b"]
    assert out["label_limits"] == {"x": 2}
    assert problems({}, "stats.tags=a") == [
        "override 'stats.tags=a': stats.tags: expected a list, got a string"
    ]
    assert problems({}, "train.optimizer=[1]") == [
        "override 'train.optimizer=[1]': train.optimizer: expected a mapping (Optim), got a list"
    ]
    assert problems({}, "stats.tags=[a")[0].startswith(
        "override 'stats.tags=[a': stats.tags: '[a' is not valid YAML"
    )


def test_free_form_values_turn_exponents_into_numbers_but_not_inf_words() -> None:
    out = apply({}, "train.extra=1e-5", "train.loss_fn_config={lr: 3e-4, name: inf}")
    assert out["train"]["extra"] == 1e-5
    assert out["train"]["loss_fn_config"] == {"lr": 3e-4, "name": "inf"}
    assert apply({}, "train.extra=nan")["train"]["extra"] == "nan"
    assert apply({}, "train.extra=abc")["train"]["extra"] == "abc"
    out = apply({"environments": [{}]}, "environments.0.harness_options.temperature=5e-1")
    assert out["environments"][0]["harness_options"] == {"temperature": 0.5}


def test_mapping_values_deep_merge() -> None:
    data = {"train": {"optimizer": {"learning_rate": 1e-4, "beta1": 0.8}}, "label_limits": {"a": 1}}
    out = apply(data, "train.optimizer={beta1: 0.5}", "label_limits={b: 2}")
    assert out["train"]["optimizer"] == {"learning_rate": 1e-4, "beta1": 0.5}
    assert out["label_limits"] == {"a": 1, "b": 2}
    assert data["train"]["optimizer"]["beta1"] == 0.8  # the input is not changed


# --- paths, lists and append ------------------------------------------------------------------------------------


def test_walking_into_missing_keys_creates_mappings() -> None:
    assert apply({}, "train.optimizer.beta1=0.7") == {"train": {"optimizer": {"beta1": 0.7}}}


def test_list_indices_including_negative() -> None:
    data = {"environments": [{"name": "a"}, {"name": "b"}]}
    out = apply(data, "environments.0.seed=3", "environments.-1.name=z")
    assert out["environments"] == [{"name": "a", "seed": 3}, {"name": "z"}]


def test_list_index_errors() -> None:
    data = {"environments": [{"name": "a"}]}
    assert problems(data, "environments.3.seed=1", "environments.x.seed=1", "environments.-2.seed=1") == [
        "override 'environments.3.seed=1': environments.3: index 3 is out of range (the list has 1 entry)",
        "override 'environments.x.seed=1': environments.x: 'x' is not a list index (an integer)",
        "override 'environments.-2.seed=1': environments.-2: index -2 is out of range (the list has 1 entry)",
    ]


def test_list_field_that_is_missing_has_no_entries_to_index() -> None:
    assert problems({}, "environments.0.seed=1") == [
        "override 'environments.0.seed=1': environments: has no entries to index"
    ]


def test_append_one_item_creating_the_list() -> None:
    out = apply({}, "stats.tags+=a", "stats.tags+=[b, c]")
    assert out["stats"]["tags"] == ["a", "[b, c]"]
    out = apply({"environments": None}, "environments+={name: x}")
    assert out["environments"] == [{"name": "x"}]
    out = apply({"environments": [{"name": "a"}]}, "environments+={name: b}")
    assert [e["name"] for e in out["environments"]] == ["a", "b"]


def test_append_errors() -> None:
    assert problems({}, "train.batch_size+=1") == [
        "override 'train.batch_size+=1': train.batch_size: += appends to a list, but train.batch_size is an int"
    ]
    found = problems({"stats": {"tags": "x"}}, "stats.tags+=a", schema=None)
    assert found == [
        "override 'stats.tags+=a': stats.tags: += appends to a list, but the current value is 'x'"
    ]


def test_unknown_keys_name_the_full_path_and_suggest() -> None:
    assert problems({}, "train.batchsize=4") == [
        "override 'train.batchsize=4': train.batchsize: unknown key; did you mean train.batch_size?"
    ]
    assert problems({}, "train.optimizer.learnig_rate=1") == [
        "override 'train.optimizer.learnig_rate=1': train.optimizer.learnig_rate: unknown key; "
        "did you mean train.optimizer.learning_rate?"
    ]
    assert problems({}, "train.backend=x") == [
        "override 'train.backend=x': train.backend: unknown key; the backend is chosen by tinker_base_url"
    ]
    assert problems({}, "trian.batch_size=1") == [
        "override 'trian.batch_size=1': trian: unknown key; did you mean train?"
    ]


def test_a_key_given_at_the_wrong_level_is_named_where_it_lives() -> None:
    assert problems({}, "batch_size=4") == [
        "override 'batch_size=4': batch_size: unknown key; did you mean train.batch_size?"
    ]
    assert problems({}, "learning_rate=0.1") == [
        "override 'learning_rate=0.1': learning_rate: unknown key; did you mean train.optimizer.learning_rate?"
    ]
    # below a section too, and every section that has it (a training config's own schema)
    from platoon.config.training import PlatoonTinkerRLTrainerConfig as Training

    assert problems({}, "train.group_size=4", schema=Training) == [
        "override 'train.group_size=4': train.group_size: unknown key; "
        "did you mean train.workflow_config.group_size?"
    ]
    assert problems({}, "group_size=4", schema=Training) == [
        "override 'group_size=4': group_size: unknown key; "
        "did you mean train.workflow_config.group_size or eval.workflow_config.group_size?"
    ]


def test_cannot_walk_into_a_scalar() -> None:
    found = problems({"train": {"batch_size": 3}}, "train.batch_size.x=1")
    assert found == [
        "override 'train.batch_size.x=1': train.batch_size.x: train.batch_size is an int, which has no key 'x'"
    ]


def test_untyped_overrides_are_yaml() -> None:
    out = apply({"a": {"b": 1}}, "a.c=[1, 2]", "a.b=x", "n=3", "f=1e-3", "z=null", schema=None)
    assert out == {"a": {"b": "x", "c": [1, 2]}, "n": 3, "f": 1e-3, "z": None}
    assert apply({"l": [1, 2]}, "l.-1=5", "l+=6", schema=None) == {"l": [1, 5, 6]}


# --- library argv -----------------------------------------------------------------------------------------------


def test_split_library_argv() -> None:
    argv = [
        "--config",
        "a.yaml",
        "--train.batch_size=4",
        "--stats.trial_name",
        "x",
        "--flag",
        "k=v",
        "--last",
    ]
    assert split_library_argv(argv) == (
        "a.yaml",
        ["train.batch_size=4", "stats.trial_name=x", "flag=true", "k=v", "last=true"],
    )
    assert split_library_argv(["-c", "b.yaml"]) == ("b.yaml", [])
    assert split_library_argv(["--config=c.yaml", "--a", "--b", "2"]) == ("c.yaml", ["a=true", "b=2"])


@pytest.mark.parametrize("arg", ["positional", "-x", "-"])
def test_split_library_argv_refuses_other_arguments(arg: str) -> None:
    with pytest.raises(ConfigError) as info:
        split_library_argv([arg])
    assert str(info.value) == f"unexpected argument {arg!r}: overrides are key=value"
