"""The start's capability check, with the real Tinker SDK against platoon's local server: a loss the installed SDK
does not know, a loss the service does not compute, a model the service does not serve (a retired one with its
replacement) and a context window past the model's are each refused in one line, exit 78, before anything is
written, and `platoon config validate` says the same line. A service that lists no losses is asked with a
one-datum forward, which is refused as the service refuses the loss.

The local server runs here as a service of its own at a URL (`tinker_base_url`), as hosted Tinker or skyrl-tx would.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.local_server import LocalTinkerServer
from platoon.local_server.losses import LOSS_NAMES

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"
SDK = importlib.metadata.version("tinker")
#: the losses the local server computes, as its answers list them
COMPUTED = ", ".join(LOSS_NAMES)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTinkerServer]:
    """The local server serving platoon/toy at a URL, as a service of its own."""
    with LocalTinkerServer(state_dir=tmp_path_factory.mktemp("service")) as running:
        yield running


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site profile of the test's own (its cache holds the listing and the local server's checkpoints)."""
    for name in ("TINKER_API_KEY", "TINKER_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    return tmp_path


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[list[str], list[str]]:
    """(what `config validate` says of the config, what `platoon train` says) of a config both refuse with 78."""
    config, overrides = argv[0], argv[1:]
    assert main(["config", "validate", config, *overrides]) == 78
    validated = [line.strip() for line in capsys.readouterr().out.splitlines()[1:]]
    assert main(["train", config, *overrides]) == 78
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "platoon: step " not in err  # refused before the first rollout
    last = err.splitlines()[-1]
    if last.startswith("platoon: invalid config"):
        return validated, [line.strip() for line in err.splitlines() if line.startswith("  ")]
    return validated, [last.removeprefix("platoon: ")]


def _on_service(
    server: LocalTinkerServer, project: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str
) -> list[str]:
    monkeypatch.setenv("TINKER_API_KEY", server.api_key)
    return [str(BANDIT), f"log_path={project / 'runs'}", f"tinker_base_url={server.base_url}", *overrides]


def _nothing_written(project: Path) -> bool:
    return not (project / "runs" / "bandit" / "run" / "metrics.jsonl").exists()


@pytest.mark.skipif(not SDK.startswith(("0.16.", "0.38.")), reason="the lines name the oldest or newest SDK")
def test_a_loss_the_installed_sdk_does_not_know_is_refused_before_anything_starts(
    project, capsys, monkeypatch
):
    # SDK 0.16.1 has no stable_reinforce; 0.38 knows it and names no reinforce_pp.
    loss, line = {
        "0.16.": (
            "stable_reinforce",
            "train.loss_fn: the installed Tinker SDK (tinker 0.16.1) has no loss function 'stable_reinforce'; it "
            "knows cross_entropy, importance_sampling, ppo, cispo, dro: set train.loss_fn to one of them, or install "
            "a newer tinker (platoon allows up to 0.38)",
        ),
        "0.38.": (
            "reinforce_pp",
            "train.loss_fn: the installed Tinker SDK (tinker 0.38.0) has no loss function 'reinforce_pp' (did you "
            "mean stable_reinforce?); it knows cross_entropy, importance_sampling, ppo, cispo, dro, gspo, "
            "stable_reinforce, custom: set train.loss_fn to one of them",
        ),
    }[SDK[:5]]
    # refused from the SDK alone, before any service is asked
    monkeypatch.setenv("TINKER_API_KEY", "tml-" + "k" * 20)
    argv = [str(BANDIT), f"log_path={project / 'runs'}", "tinker_base_url=https://tinker.example"]
    validated, trained = _refused(capsys, [*argv, f"train.loss_fn={loss}"])
    assert validated == trained == [line]
    assert not (project / "runs").exists()


def test_the_sdk_loss_functions_are_read_from_the_installed_sdk_without_importing_it():
    import subprocess
    import sys
    import typing

    from tinker.types import LossFnType

    from platoon.startup.tinker import sdk_loss_fns

    assert sdk_loss_fns() == typing.get_args(LossFnType)
    code = "import sys; from platoon.startup.tinker import sdk_loss_fns; sdk_loss_fns(); print('tinker' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )


def test_a_loss_the_service_does_not_compute_is_refused_before_anything_is_written(
    server, project, capsys, monkeypatch
):
    # dro is the SDK's (both ends of the range) but not the local server's, which lists its losses
    argv = _on_service(server, project, monkeypatch, "train.loss_fn=dro")
    validated, trained = _refused(capsys, argv)
    assert (
        validated
        == trained
        == [
            f"train.loss_fn: the Tinker service at {server.base_url} does not compute the loss 'dro'; it computes "
            f"{COMPUTED}: set train.loss_fn to one of them"
        ]
    )
    assert _nothing_written(project)


def test_a_retired_model_is_refused_with_the_replacement_and_the_models_the_service_serves(
    server, project, capsys, monkeypatch
):
    argv = _on_service(server, project, monkeypatch, "train.model_name=Qwen/Qwen3-30B-A3B")
    validated, trained = _refused(capsys, argv)
    assert (
        validated
        == trained
        == [
            f"train.model_name: the Tinker service at {server.base_url} does not serve 'Qwen/Qwen3-30B-A3B' (hosted "
            "Tinker retired it on 2026-06-12 and recommends Qwen/Qwen3.6-35B-A3B); it serves platoon/toy: set "
            "train.model_name to one of them"
        ]
    )
    assert _nothing_written(project)


def test_a_context_window_past_the_models_is_refused(server, project, capsys, monkeypatch):
    argv = _on_service(server, project, monkeypatch, "train.context_window_length=40000")
    validated, trained = _refused(capsys, argv)
    assert (
        validated
        == trained
        == [
            f"train.context_window_length: 40000 is over the 32768 tokens the Tinker service at {server.base_url} "
            "gives 'platoon/toy': lower it to 32768 or less, or leave it unset"
        ]
    )
    assert _nothing_written(project)


def test_a_config_the_service_can_run_passes_validate(server, project, capsys, monkeypatch):
    argv = _on_service(server, project, monkeypatch, "train.context_window_length=32768")
    assert main(["config", "validate", *argv]) == 0, capsys.readouterr().out


def _training_client(server: LocalTinkerServer) -> Any:
    import tinker

    service = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
    made = service.create_lora_training_client(base_model="platoon/toy", rank=8)
    # SDK 0.38 hands back a future of the client
    return service, made if hasattr(made, "forward") and not hasattr(made, "result") else made.result()


def test_the_loss_probe_is_refused_as_the_service_refuses_the_loss(server):
    from tinker import types

    from platoon.gateway.tinker_service import close_session
    from platoon.startup.capabilities import loss_probe_problem

    service, client = _training_client(server)
    try:

        def probe(loss: str, config: dict[str, float] | None = None) -> str | None:
            return asyncio.run(loss_probe_problem(client, loss, config, who="the service"))

        text = [ord(c) for c in "Hello"]
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(text[:-1]), loss_fn_inputs={"target_tokens": text[1:]}
        )

        def logprobs() -> list[float]:
            return list(client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data)

        before = logprobs()
        assert probe("cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": 5.0}) is None
        assert probe("cross_entropy") is None
        assert probe("dro") == (
            "train.loss_fn: the service refused a forward with the loss 'dro' (HTTP 400: unknown loss_fn 'dro'; the "
            f"local server knows {COMPUTED}): set train.loss_fn (and train.loss_fn_config) to what it computes"
        )
        assert logprobs() == before  # the probes changed no weights
    finally:
        close_session(service)


EVAL = REPO / "examples" / "bandit" / "eval.yaml"


def test_an_evaluation_of_a_model_the_service_does_not_serve_is_refused_before_any_rollout(
    server, project, capsys, monkeypatch
):
    monkeypatch.setenv("TINKER_API_KEY", server.api_key)
    argv = [
        str(EVAL),
        f"tinker_base_url={server.base_url}",
        "inference.model_name=Qwen/Qwen3-30B-A3B-Instruct-2507",
        f"inference.output_dir={project / 'eval'}",
    ]
    line = (
        f"inference.model_name: the Tinker service at {server.base_url} does not serve "
        "'Qwen/Qwen3-30B-A3B-Instruct-2507' (hosted Tinker retired it on 2026-06-12 and recommends "
        "Qwen/Qwen3.6-35B-A3B (in non-thinking mode)); it serves platoon/toy: set inference.model_name to one of them"
    )
    assert main(["config", "validate", *argv]) == 78
    assert [text.strip() for text in capsys.readouterr().out.splitlines()[1:]] == [line]
    assert main(["eval", *argv]) == 78
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"platoon: {line}"
    assert not (project / "eval").exists()


def test_no_example_default_or_doc_names_a_model_hosted_tinker_retired():
    from platoon.startup.retired_models import RETIRED_MODELS

    places = [REPO / "README.md", *(REPO / folder for folder in ("docs", "examples", "recipes"))]
    places += list((REPO / "packages").iterdir())  # each package's code, configs and README
    named = []
    for place in places:
        files = (
            [place]
            if place.is_file()
            else [p for p in place.rglob("*") if p.suffix in (".md", ".yaml", ".toml", ".py")]
        )
        for path in files:
            if path.name == "retired_models.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                # a line about a retired model (a refusal it shows) names it on purpose
                if "retired" not in line:
                    named += [
                        f"{path.relative_to(REPO)}:{number}: {model}"
                        for model in RETIRED_MODELS
                        if model in line
                    ]
    assert named == []


def test_stable_reinforce_is_not_probed_where_the_service_lists_no_losses(server):
    """A one-token probe cannot name sequences the service sampled, so a stable_reinforce probe is refused whether or
    not the service computes the loss (the local server refuses it so): the start leaves that loss unprobed."""
    from types import SimpleNamespace

    from platoon.gateway.tinker_service import close_session
    from platoon.startup.capabilities import Capabilities, TrainingServiceCheck, loss_probe_problem

    service, client = _training_client(server)
    try:
        if "stable_reinforce" in _sdk_losses():
            made_up = asyncio.run(loss_probe_problem(client, "stable_reinforce", None, who="the service"))
            assert made_up is not None and "refused a forward with the loss 'stable_reinforce'" in made_up
        train = SimpleNamespace(loss_fn="stable_reinforce", loss_fn_config=None)
        check = TrainingServiceCheck(SimpleNamespace(train=train, tinker_base_url=server.base_url))  # type: ignore[arg-type]
        check.capabilities = Capabilities(
            models=(), loss_fns=None
        )  # as hosted Tinker answers: no losses listed
        asyncio.run(check.with_training_client(client, server.base_url))  # no refusal
    finally:
        close_session(service)


def _sdk_losses() -> tuple[str, ...]:
    from platoon.startup.tinker import sdk_loss_fns

    return sdk_loss_fns()


def test_a_retired_model_names_the_replacement_only_where_a_source_gives_one():
    from platoon.startup.retired_models import retired

    assert retired("Qwen/Qwen3-4B-Instruct-2507") == (
        "hosted Tinker retired it on 2026-06-12 and recommends Qwen/Qwen3.5-4B (in non-thinking mode: "
        "qwen3_5_disable_thinking)"
    )
    assert retired("Qwen/Qwen3-32B") == "hosted Tinker no longer serves it (not in its lineup of 2026-07-25)"
    assert retired("Qwen/Qwen3-8B") is None  # still served
