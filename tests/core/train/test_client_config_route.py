"""A Tinker service without `/api/v1/client/config` (skyrl-tx 0.3.0 answers it 404): SDKs from 0.25 ask it before
their first call, so `platoon train`, `platoon eval` and `config validate` refuse the run in one line (exit 78) that
names the SDK to install; older SDKs never ask it, and train there as before.

The service is platoon's local server at a URL with that one route taken out of its app, talked to by the real SDK.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from platoon.cli import main
from platoon.local_server import LocalTinkerServer

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit"
SDK = importlib.metadata.version("tinker")
ASKS_ROUTE = tuple(int(part) for part in SDK.split(".")[:2]) >= (0, 25)
ROUTE = "/api/v1/client/config"
#: one short run of the bandit: a step of 2 tasks x 2 rollouts
ONE_STEP = ("train.max_training_steps=1", "train.batch_size=2", "train.workflow_config.group_size=2")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTinkerServer]:
    """The local server serving platoon/toy at a URL, without the client-config route."""
    import platoon.local_server.app as app_module

    build_app = app_module.build_app

    def without_client_config(state: app_module.ServerState) -> object:
        app = build_app(state)
        app.router.routes[:] = [route for route in app.router.routes if getattr(route, "path", None) != ROUTE]
        return app

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app_module, "build_app", without_client_config)
        with LocalTinkerServer(state_dir=tmp_path_factory.mktemp("service")) as running:
            yield running


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: LocalTinkerServer) -> Path:
    """A site profile of the test's own, and the service's key."""
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    monkeypatch.setenv("TINKER_API_KEY", server.api_key)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    return tmp_path


def _line(server: LocalTinkerServer) -> str:
    return (
        f"the Tinker service at {server.base_url} does not answer {ROUTE}, which Tinker SDKs from 0.25 on need "
        f"(tinker {SDK} is installed): for this server install tinker<0.25, e.g. uv add 'tinker>=0.16.1,<0.25'"
    )


def test_the_route_is_missing_from_the_server(server):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        server.base_url + ROUTE, data=b"{}", headers={"X-API-Key": server.api_key}, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=30)
    assert answer.value.code == 404


def test_train_refuses_in_one_line_where_the_sdk_asks_the_route_and_trains_where_it_does_not(
    server, project, capsys
):
    argv = [str(BANDIT / "train.yaml"), f"log_path={project / 'runs'}", f"tinker_base_url={server.base_url}"]
    argv += ONE_STEP
    if ASKS_ROUTE:
        assert main(["config", "validate", *argv]) == 78
        assert [line.strip() for line in capsys.readouterr().out.splitlines()[1:]] == [_line(server)]
        assert main(["train", *argv]) == 78
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert err.splitlines()[-1] == f"platoon: {_line(server)}"
        assert not (project / "runs" / "bandit" / "run" / "checkpoints.jsonl").exists()
    else:
        assert main(["config", "validate", *argv]) == 0, capsys.readouterr().out
        assert main(["train", *argv]) == 0, capsys.readouterr().err
        rows = (project / "runs" / "bandit" / "run" / "checkpoints.jsonl").read_text().splitlines()
        assert json.loads(rows[-1])["kind"] == "final"


@pytest.mark.skipif(
    not ASKS_ROUTE, reason="SDKs before 0.25 never ask the route (the train test runs on them)"
)
def test_eval_refuses_in_one_line_before_any_rollout(server, project, capsys):
    argv = [
        str(BANDIT / "eval.yaml"),
        f"tinker_base_url={server.base_url}",
        "inference.model_path=tinker://run/sampler_weights/final",
        f"inference.output_dir={project / 'eval'}",
    ]
    assert main(["config", "validate", *argv]) == 78
    assert [line.strip() for line in capsys.readouterr().out.splitlines()[1:]] == [_line(server)]
    assert main(["eval", *argv]) == 78
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == f"platoon: {_line(server)}"
    assert not (project / "eval").exists()
