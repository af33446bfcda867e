"""Core's side of a run's sandboxes: the run label in the environment, the providers a run could
have used, refusing a provider no installed distribution provides, and a reap that never raises. Runs with
platoon-core alone (the reaping itself, with real sandboxes, is tested in tests/sandbox/test_run_reaping.py)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from platoon.config.environments import EnvironmentConfig
from platoon.sandbox_runs import (
    LABELS_ENV,
    carry_labels,
    install_hint,
    provider_problems,
    reap_run,
    reap_run_async,
    run_label,
    run_providers,
    set_run_label,
)
from platoon.startup.checks import component_problems


def test_the_run_label_is_the_absolute_run_dir_carried_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    assert set_run_label("runs/../runs/a") == str(tmp_path / "runs" / "a")
    carry_labels({"platoon.worker": "r1"})
    assert json.loads(os.environ[LABELS_ENV]) == {
        "platoon.run": str(tmp_path / "runs/a"),
        "platoon.worker": "r1",
    }
    assert run_label(tmp_path / "x") == str(tmp_path / "x")


def test_a_run_uses_its_entries_providers_the_profiles_or_docker():
    data = {
        "environments": [
            {"service": "harbor", "service_kwargs": {"provider": "process", "provider_options": {"a": 1}}},
            {"service": "harbor", "service_kwargs": {"provider_options": {"gpu": "0"}}},
            {"service": "harbor"},
            {"service": "table", "service_kwargs": {"provider": "ignored"}},
        ]
    }
    site = SimpleNamespace(provider="singularity", provider_options={"gpu": "all", "stage_images": True})
    assert run_providers(data, site) == [
        ("process", {"a": 1}),
        ("singularity", {"gpu": "0", "stage_images": True}),  # the entry's options over the profile's
        ("singularity", {"gpu": "all", "stage_images": True}),
    ]
    assert run_providers(data) == [("process", {"a": 1}), ("docker", {"gpu": "0"}), ("docker", {})]


def test_a_provider_no_distribution_provides_is_one_line_naming_what_to_install():
    assert install_hint("enroot") == "install it with `uv add 'platoon-sandbox[hpc]'`"
    assert install_hint("docker") == "install it with `uv add platoon-sandbox`"
    entries = [
        EnvironmentConfig(env="x"),
        EnvironmentConfig(service="harbor", service_kwargs={"provider": "nosuch_runtime_q"}),
        EnvironmentConfig(
            service="harbor", service_kwargs={"provider": "mypkg.mod:Provider"}
        ),  # the user's own
    ]
    assert provider_problems(entries) == [
        "environments.1.service_kwargs.provider: sandbox provider 'nosuch_runtime_q' is not installed: install a "
        "distribution whose `platoon.sandbox_runtimes` entry point provides 'nosuch_runtime_q'"
    ]
    config = SimpleNamespace(environments=entries[1:2])
    assert any("'nosuch_runtime_q' is not installed" in p for p in component_problems(config))


def test_reaping_never_raises_and_never_reaps_with_an_empty_label(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert reap_run(run_dir) == 0  # no resolved config: a start refused before it wrote one
    (run_dir / "config.resolved.yaml").write_text(
        yaml.safe_dump({"environments": [{"service": "harbor", "service_kwargs": {"provider": "nosuch_q"}}]})
    )
    assert reap_run(run_dir) == 0  # its only provider is not installed: nothing could have started
    (run_dir / "config.resolved.yaml").write_text(": not yaml: [")
    assert reap_run(run_dir) == 0
    with pytest.raises(ValueError, match="empty label"):
        asyncio.run(reap_run_async([("process", {})], ""))


REPO = Path(__file__).resolve().parents[2]


def test_a_site_profile_provider_that_is_not_installed_is_refused_by_validate_and_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from platoon.cli import main
    from platoon.sandbox_runs import provider_missing

    # A built-in name a profile may choose whose distribution is missing (platoon-core alone, as CI's package step
    # runs it); where every one is installed (the workspace), a name no installed distribution provides.
    missing = next((name for name in ("enroot", "singularity", "docker") if provider_missing(name)), None)
    site = tmp_path / "site.yaml"
    site.write_text(f"provider: {missing or 'nosuch-q'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    config = str(REPO / "examples" / "bandit" / "train.yaml")
    if missing:
        line = f"site profile {site}: provider: {missing}: sandbox provider {missing!r} is not "
    else:
        line = "provider: nosuch-q does not resolve (ExtensionError: unknown sandbox runtime"
    assert main(["config", "validate", config, f"log_path={tmp_path / 'runs'}"]) == 78
    assert f"\n  {line}" in capsys.readouterr().out
    assert main(["train", config, f"log_path={tmp_path / 'runs'}"]) == 78
    assert line in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / "runs").exists()  # refused before anything was written
