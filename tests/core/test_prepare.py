"""`platoon prepare CONFIG` in core: the steps a service's plugin and the policy contribute, the
statuses and verdict lines, the tokenizer step offline, and the run-start refusal naming the prepare command.

The service seams are served here by functions registered with `platoon.hooks.register`, as a plugin's hookimpls
would serve them (Harbor's own steps are tested in tests/harbor/test_prepare.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon import hooks, registry
from platoon.cli import main
from platoon.hookspecs import PrepareStep

TABLE = "{service: table, service_kwargs: {rows: [{id: t1, goal: hi}]}}"


@pytest.fixture
def seams(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A `table` service whose prepare step is `current` once made, and whose run check fails until then."""
    monkeypatch.setattr(registry, "_seams", {})
    state: dict[str, Any] = {"made": False, "calls": []}

    def prepare(service: str, options: Any, cache_root: Any, dry_run: bool, config: Any) -> Any:
        if service != "table":
            return None
        state["calls"].append(("prepare", dry_run, config))

        def steps() -> Iterator[PrepareStep]:
            if state["made"]:
                yield PrepareStep("rows", "current", "1 row")
            elif dry_run:
                yield PrepareStep("rows", "missing", "1 row would be made")
            else:
                state["made"] = True
                yield PrepareStep("rows", "done", "1 row")

        return steps()

    def problems(service: str, options: Any, cache_root: Any, config: Any) -> list[str] | None:
        if service != "table":
            return None
        return [] if state["made"] else ["the rows are not made"]

    hooks.register("service.prepare", prepare)
    hooks.register("service.problems", problems)
    yield state


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_prepare_makes_each_step_once_then_reports_everything_current(tmp_path, seams, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("c.yaml").write_text(f"environments: [{TABLE}]\n")
    code, out, err = run(["prepare", "c.yaml", "--dry-run"], capsys)
    assert (code, out) == (
        1,
        [
            "environments[0] rows: missing: 1 row would be made",
            "policy tokenizer: none: no renderer, so no Tinker policy is served",
            "not ready: 1 step(s) would make something (a dry run changes nothing)",
        ],
    )
    assert err.startswith("platoon: no site profile")
    assert seams["made"] is False  # a dry run changes nothing
    code, out, _ = run(["prepare", "c.yaml"], capsys)
    assert (
        code == 0
        and out[0] == "environments[0] rows: done: 1 row"
        and out[-1] == "ready: 1 made now, 0 already current"
    )
    code, out, _ = run(["prepare", "c.yaml"], capsys)
    assert (
        code == 0
        and out[0] == "environments[0] rows: current: 1 row"
        and out[-1] == "ready: 1 already current"
    )
    assert seams["calls"] == [
        ("prepare", True, "c.yaml"),
        ("prepare", False, "c.yaml"),
        ("prepare", False, "c.yaml"),
    ]


def test_a_failed_step_makes_prepare_not_ready(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(registry, "_seams", {})
    hooks.register(
        "service.prepare",
        lambda service, options, cache_root, dry_run, config: [
            PrepareStep("rows", "failed", "the disk is full")
        ],
    )
    (tmp_path / "c.yaml").write_text(f"environments: [{{name: rows, {TABLE[1:]}]\n")
    code, out, _ = run(["prepare", str(tmp_path / "c.yaml")], capsys)
    assert code == 1
    assert out[0] == "environments[rows] rows: failed: the disk is full"
    assert out[-1] == "not ready: 1 step(s) failed (environments[rows] rows)"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("environments: []\n", "lists no environments"),
        ("train: {model_name: m}\n", "lists no environments"),
        ("environments: [{service: table, bogus: 1}]\n", "environments.0.bogus"),
    ],
)
def test_a_config_prepare_cannot_read_is_refused_with_78(tmp_path, capsys, text, line):
    (tmp_path / "c.yaml").write_text(text)
    code, out, err = run(["prepare", str(tmp_path / "c.yaml")], capsys)
    assert code == 78 and out == []
    assert line in err and "Traceback" not in err


def test_only_environments_are_read_and_overrides_are_untyped(tmp_path, seams, capsys):
    # a training config whose train section would not validate: prepare reads only its environments
    (tmp_path / "c.yaml").write_text(f"train: {{renderer_name: qwen3_instruct}}\nenvironments: [{TABLE}]\n")
    code, out, _ = run(
        ["prepare", str(tmp_path / "c.yaml"), "environments.0.name=renamed", "--dry-run"], capsys
    )
    assert code == 1 and out[0].startswith("environments[renamed] rows: missing")


def test_tokenizer_step_registered_seeded_and_missing(tmp_path, monkeypatch, capsys):
    hub = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(hub))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    config = tmp_path / "c.yaml"

    def step(model: str, *extra: str) -> tuple[int, list[str]]:
        config.write_text(
            f"train: {{model_name: {model}, renderer_name: qwen3_instruct}}\nenvironments: [{TABLE}]\n"
        )
        code, out, _ = run(["prepare", str(config), *extra], capsys)
        return code, [line for line in out if line.startswith("policy")]

    assert step("platoon/toy") == (0, ["policy tokenizer: current: platoon/toy (registered with platoon)"])
    assert step(str(tmp_path)) == (0, [f"policy tokenizer: current: {tmp_path} (a local directory)"])
    # a tokenizer seeded into the Hugging Face cache counts as there
    snapshot = hub / "hub" / "models--acme--tiny" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 8}))
    (hub / "hub" / "models--acme--tiny" / "refs").mkdir()
    (hub / "hub" / "models--acme--tiny" / "refs" / "main").write_text("a" * 40)
    assert step("acme/tiny") == (0, ["policy tokenizer: current: acme/tiny (in the Hugging Face cache)"])
    # not there: a dry run says it would download; offline, the download fails and prepare is not ready
    assert step("acme/absent", "--dry-run") == (
        1,
        ["policy tokenizer: missing: acme/absent would be downloaded into the Hugging Face cache"],
    )
    code, lines = step("acme/absent")
    assert code == 1 and lines[0].startswith("policy tokenizer: failed: acme/absent: ")


def test_a_hosted_model_needs_no_tokenizer(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(
        "inference: {model_name: gpt-x, hosted: {base_url: 'http://127.0.0.1:9/v1'}}\n"
        f"environments: [{TABLE}]\n"
    )
    code, out, _ = run(["prepare", str(tmp_path / "c.yaml")], capsys)
    assert code == 0 and "policy tokenizer: none: a hosted model needs no tokenizer here" in out


def test_a_run_whose_service_is_not_prepared_stops_before_anything_naming_prepare(
    tmp_path, seams, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    Path("train.yaml").write_text(
        "log_path: runs\ntinker_base_url: local\n"
        "train: {model_name: platoon/toy, renderer_name: qwen3_instruct, max_training_steps: 1}\n"
        f"environments: [{TABLE}]\n"
    )
    code, out, err = run(["train", "train.yaml", "stats.trial_name=a b"], capsys)
    assert code == 78 and out == []
    assert (
        "platoon: what the run needs is not prepared on this site:\n"
        "  environments.0.service_kwargs: the rows are not made\n"
        "prepare it with: platoon prepare train.yaml 'stats.trial_name=a b'\n"
    ) in err
    assert not Path("runs").exists()  # nothing was written, no rollout ran
    # `--prepare` runs prepare first with its lines on stderr, and stops with its status when it is not ready
    seams["made"] = False
    code, out, err = run(["train", "train.yaml", "--prepare", "train.max_training_steps=0"], capsys)
    assert (
        code == 78
    )  # max_training_steps must be positive: the config is refused before anything is prepared
    assert seams["calls"] == []
    hooks.register(
        "service.prepare",
        lambda service, options, cache_root, dry_run, config: [
            PrepareStep("disk", "failed", "the disk is full")
        ],
    )
    monkeypatch.setattr(registry, "_seams", {"service.prepare": registry._seams["service.prepare"][1:]})
    code, out, err = run(["train", "train.yaml", "--prepare"], capsys)
    assert code == 1 and out == []
    assert "platoon: environments[0] disk: failed: the disk is full\n" in err
    assert err.endswith("platoon: not ready: 1 step(s) failed (environments[0] disk)\n")
    # once prepared, the check passes
    from platoon.config import load_config
    from platoon.startup.prepare import check_prepared

    seams["made"] = True
    check_prepared(load_config("train.yaml"), "train.yaml")


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "run.yaml"],
        ["eval", "eval.yaml"],
        ["rollout", "run.yaml", "--task", "t1"],
        ["rollout", "eval.yaml", "--task", "t1"],
    ],
    ids=["train", "eval", "rollout-of-train", "rollout-of-eval"],
)
def test_every_run_command_refuses_an_unprepared_service_alike(tmp_path, seams, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text(
        "log_path: runs\ntinker_base_url: local\n"
        "train: {model_name: platoon/toy, renderer_name: qwen3_instruct, max_training_steps: 1}\n"
        f"environments: [{TABLE}]\n"
    )
    Path("eval.yaml").write_text(
        "tinker_base_url: local\ninference: {model_name: platoon/toy, renderer_name: qwen3_instruct, output_dir: out}\n"
        f"environments: [{TABLE}]\n"
    )
    code, out, err = run(argv, capsys)
    assert code == 78 and out == []
    assert err.endswith(
        "platoon: what the run needs is not prepared on this site:\n"
        "  environments.0.service_kwargs: the rows are not made\n"
        f"prepare it with: platoon prepare {argv[1]}\n"
    )
    assert not Path("runs").exists() and not Path("out").exists()  # nothing written, no rollout ran
