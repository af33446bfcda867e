"""The generic registries and import strings of `platoon.registry`."""

from __future__ import annotations

import json
import os.path
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from platoon import registry
from platoon.errors import ExtensionError
from platoon.registry import (
    KINDS,
    ImportStringError,
    lookup,
    register_dataset_loader,
    register_reward_processor,
    register_rollout,
    register_task_loader,
    register_trainer_config,
    register_workflow,
    registered,
    resolve_import_string,
)


@pytest.fixture(autouse=True)
def _clean_registries() -> Iterator[None]:
    saved = {kind: dict(entries) for kind, entries in registry._registries.items()}
    yield
    for kind, entries in saved.items():
        registry._registries[kind].clear()
        registry._registries[kind].update(entries)


def loader_a() -> list[str]:
    return ["a"]


def loader_b() -> list[str]:
    return ["b"]


def test_kinds() -> None:
    assert KINDS == (
        "dataset_loader",
        "task_loader",
        "rollout",
        "reward_processor",
        "workflow",
        "trainer_config",
    )


@pytest.mark.parametrize(
    ("register", "kind"),
    [
        (register_dataset_loader, "dataset_loader"),
        (register_task_loader, "task_loader"),
        (register_rollout, "rollout"),
        (register_reward_processor, "reward_processor"),
        (register_workflow, "workflow"),
        (register_trainer_config, "trainer_config"),
    ],
)
def test_register_and_lookup(register: Callable[[str, object], object], kind: str) -> None:
    assert lookup(kind, "test-x") is None
    assert register("test-x", loader_a) is loader_a
    assert lookup(kind, "test-x") is loader_a
    assert registered(kind)["test-x"] is loader_a
    # other kinds are separate
    others = [k for k in KINDS if k != kind]
    assert all(lookup(k, "test-x") is None for k in others)


def test_registering_the_same_object_twice_is_a_no_op() -> None:
    register_dataset_loader("same", loader_a)
    register_dataset_loader("same", loader_a)
    assert lookup("dataset_loader", "same") is loader_a


def test_a_different_object_under_a_registered_name_names_both() -> None:
    register_dataset_loader("taken", loader_a)
    with pytest.raises(ValueError) as info:
        register_dataset_loader("taken", loader_b)
    message = str(info.value)
    assert f"{__name__}:loader_a" in message and f"{__name__}:loader_b" in message
    assert "dataset_loader 'taken'" in message
    assert lookup("dataset_loader", "taken") is loader_a


def test_a_reimported_module_replaces_its_record() -> None:
    def make() -> object:
        def loader() -> None: ...

        return loader

    first, second = make(), make()
    register_task_loader("reimport", first)
    register_task_loader("reimport", second)  # same module:qualname
    assert lookup("task_loader", "reimport") is second


def test_registered_returns_a_copy_in_order() -> None:
    register_workflow("w1", loader_a)
    register_workflow("w2", loader_b)
    snapshot = registered("workflow")
    assert list(snapshot)[-2:] == ["w1", "w2"]
    snapshot.clear()
    assert lookup("workflow", "w1") is loader_a


def test_unknown_kind_and_bad_names() -> None:
    with pytest.raises(ValueError, match="unknown registry kind 'harness'"):
        lookup("harness", "x")
    with pytest.raises(ValueError, match="unknown registry kind"):
        registered("nope")
    with pytest.raises(ValueError, match="non-empty string"):
        register_rollout("", loader_a)


def test_resolve_colon_form() -> None:
    assert resolve_import_string("json:dumps") is json.dumps
    assert resolve_import_string("os.path:join") is os.path.join
    assert resolve_import_string("platoon.registry:ImportStringError.__name__") == "ImportStringError"


def test_resolve_legacy_dotted_form() -> None:
    assert resolve_import_string("json.dumps") is json.dumps
    assert resolve_import_string("os.path.join") is os.path.join
    assert resolve_import_string("platoon.registry.ImportStringError") is ImportStringError


@pytest.mark.parametrize(
    ("ref", "text"),
    [
        (
            "no_such_module_xyz:thing",
            "cannot import 'no_such_module_xyz:thing': importing 'no_such_module_xyz'",
        ),
        ("json:no_such_attr", "cannot import 'json:no_such_attr': 'json' has no attribute 'no_such_attr'"),
        ("json:dumps.nope", "'json.dumps' has no attribute 'nope'"),
        ("no_such_module_xyz.thing", "no module named 'no_such_module_xyz'"),
        ("json.no_such_attr", "'json' has no attribute 'no_such_attr'"),
        ("json", "not an import string"),
        (":x", "not an import string"),
        ("a:b:c", "not an import string"),
        ("", "not an import string"),
    ],
)
def test_resolve_failures_are_one_line_value_errors(ref: str, text: str) -> None:
    with pytest.raises(ImportStringError) as info:
        resolve_import_string(ref)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ExtensionError)
    assert text in str(info.value)
    assert "\n" not in str(info.value)


def test_resolve_reports_a_missing_dependency_not_a_shorter_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "needs_missing_dep.py").write_text(
        textwrap.dedent(
            """
            import definitely_missing_dependency_xyz
            value = 1
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for ref in ("needs_missing_dep.value", "needs_missing_dep:value"):
        with pytest.raises(ImportStringError, match="definitely_missing_dependency_xyz"):
            resolve_import_string(ref)
        sys.modules.pop("needs_missing_dep", None)


def test_resolve_wraps_errors_raised_while_importing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_mod_xyz.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportStringError, match=r"RuntimeError: boom at import"):
        resolve_import_string("broken_mod_xyz:anything")
