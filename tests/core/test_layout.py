"""The rooms of platoon-core and which may import which (docs/architecture.md): read from the source's imports,
those at module level and those inside functions alike."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from source_imports import file_imports

import platoon

CORE_SRC = Path(platoon.__file__).parent
PLUGIN_SRCS = [
    CORE_SRC.parents[2] / name / "src" for name in ("platoon-harnesses", "platoon-sandbox", "platoon-harbor")
]


def _imports(path: Path, src: Path, *, run_time_only: bool = False) -> Iterator[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import statement of one file."""
    for found in file_imports(path, src):
        if not (run_time_only and found.type_checking):
            yield found.target, list(found.names), found.line


def _sources(src: Path, room: str = "") -> list[Path]:
    root = src / room.replace(".", "/") if room else src
    return sorted(root.rglob("*.py"))


def _room(module: str) -> str:
    """`platoon.train.tinker.loop` -> `train`; `platoon.cli` -> `cli`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "platoon" else ""


def _violations(rooms: list[str], forbidden: list[str], *, run_time_only: bool = False) -> list[str]:
    found = []
    for room in rooms:
        for path in _sources(CORE_SRC.parent, f"platoon.{room}"):
            for target, _names, line in _imports(path, CORE_SRC.parent, run_time_only=run_time_only):
                if target.startswith("platoon.") and _room(target) in forbidden:
                    found.append(f"{path.relative_to(CORE_SRC.parent)}:{line} imports {target}")
    return found


def test_nothing_outside_the_test_kit_imports_it():
    found = []
    for src in [CORE_SRC.parent, *PLUGIN_SRCS]:
        for path in _sources(src):
            if path.is_relative_to(CORE_SRC / "testing"):
                continue
            for target, _names, line in _imports(path, src):
                if target == "platoon.testing" or target.startswith("platoon.testing."):
                    found.append(f"{path.relative_to(src)}:{line} imports {target}")
    assert found == []


def test_only_the_command_line_imports_the_trainer():
    rooms = ["eval", "gateway", "config", "envs", "episode", "renderers", "rollouts", "local_server"]
    assert _violations(rooms, ["train"]) == []


def test_no_module_imports_another_modules_private_name():
    found = []
    for src in [CORE_SRC.parent, *PLUGIN_SRCS]:
        for path in _sources(src):
            for target, names, line in _imports(path, src):
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                if target.startswith("platoon") and private:
                    found.append(f"{path.relative_to(src)}:{line} takes {', '.join(private)} from {target}")
    assert found == []


def test_the_biggest_room_holds_under_a_fifth_of_the_lines():
    def lines(paths: list[Path]) -> int:
        return sum(len(path.read_text(encoding="utf-8").splitlines()) for path in paths)

    total = lines(_sources(CORE_SRC))
    rooms = {room.name: lines(_sources(room)) for room in CORE_SRC.iterdir() if room.is_dir()}
    biggest = max(rooms, key=rooms.__getitem__)
    assert rooms[biggest] < total / 5, (biggest, rooms[biggest], total)


def test_renderers_import_only_the_leaves():
    assert _violations(["renderers"], ["gateway", "episode", "rollouts", "train", "eval", "testing"]) == []


def test_the_rollout_runtime_imports_neither_training_nor_evaluation_at_run_time():
    # Type hints aside: a slot's hosted settings are declared with the evaluation config.
    assert _violations(["rollouts"], ["train", "eval", "testing", "cli"], run_time_only=True) == []


def test_the_gateway_imports_nothing_above_it_at_run_time():
    # Type hints aside: the hosted backend's settings are declared with the evaluation config.
    forbidden = ["episode", "rollouts", "train", "eval", "testing", "cli"]
    assert _violations(["gateway"], forbidden, run_time_only=True) == []


#: the rooms below the start-up room (docs/architecture.md's floors)
BELOW_STARTUP = [
    "train",
    "eval",
    "rollouts",
    "episode",
    "gateway",
    "renderers",
    "config",
    "envs",
    "harness",
    "programs",
    "local_server",
]


def test_nothing_below_the_start_up_room_calls_up_into_it():
    assert _violations(BELOW_STARTUP, ["startup"]) == []


def test_the_start_up_room_calls_only_down():
    # It checks a run and then starts training or evaluation: it calls down into train and eval, never into the
    # command line above it.
    assert _violations(["startup"], ["cli", "viz", "testing"]) == []


def test_config_imports_nothing_above_itself():
    # Loading and validating a config needs no check a run makes before it starts: those are the start-up room's.
    above = [room for room in BELOW_STARTUP if room != "config"] + ["startup", "cli", "viz"]
    assert _violations(["config"], above) == []


def test_the_local_server_imports_neither_training_nor_evaluation():
    assert _violations(["local_server"], ["train", "eval", "testing", "rollouts", "gateway", "episode"]) == []


#: the stable import paths (docs/architecture.md), and names each must give
STABLE_PATHS = {
    "platoon.train.tinker.renderers": [
        "ChatTemplateRenderer",
        "get_renderer",
        "register_renderer",
        "get_tokenizer",
        "register_tokenizer",
    ],
    "platoon.train.tinker.renderers.tool_parsers": [
        "ToolCallParser",
        "ParseResult",
        "ParsedToolCall",
        "UnparsedToolCall",
        "register_parser",
    ],
    "platoon.train.tinker.config_defs": ["PlatoonTinkerRLTrainerConfig", "TrainConfig", "WorkflowConfig"],
    "platoon.train.tinker.workflows": ["GroupRolloutWorkflow"],
    "platoon.eval.run": ["PlatoonEvalConfig"],
    "platoon.eval.config_defs": ["EvalWorkflowConfig", "HostedConfig", "PricingConfig"],
    "platoon.envs.named": ["EnvironmentEntry", "get_environment", "environment_record", "REGISTRY"],
    "platoon.testing": ["LocalTinkerServer", "local_tinker_server", "toy_tokenizer", "serve_policy"],
}


@pytest.mark.parametrize("module", sorted(STABLE_PATHS))
def test_the_stable_import_paths_keep_working(module):
    imported = importlib.import_module(module)
    for name in STABLE_PATHS[module]:
        assert getattr(imported, name) is not None, f"{module}.{name}"


def test_the_old_renderer_path_gives_the_same_objects():
    from platoon.renderers import get_renderer
    from platoon.renderers.tool_parsers import ToolCallParser
    from platoon.train.tinker.renderers import get_renderer as old_get_renderer
    from platoon.train.tinker.renderers.tool_parsers import ToolCallParser as OldToolCallParser

    assert old_get_renderer is get_renderer and OldToolCallParser is ToolCallParser
