"""The site profile: location, keys, expansion, providers, application, visibility."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from platoon.config import describe_site, load_config, load_site
from platoon.config.site import apply_site, deprecated_variables, parse_site, site_location
from platoon.errors import ConfigError

TRAIN = {"train": {"model_name": "Qwen/Qwen3-4B", "renderer_name": "qwen3"}}


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("PLATOON_SITE", "PLATOON_HARBOR_CACHE", "PLATOON_TOOLCHAINS"):
        monkeypatch.delenv(name, raising=False)


def write(path: Path, content: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        textwrap.dedent(content) if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)
    )
    return path


def site_file(tmp_path: Path, content: Any) -> Path:
    return write(tmp_path / "xdg" / "platoon" / "site.yaml", content)


def site_problems(tmp_path: Path, content: Any) -> list[str]:
    path = site_file(tmp_path, content)
    with pytest.raises(ConfigError) as info:
        load_site()
    assert info.value.source == str(path)
    return info.value.problems


# --- location ---------------------------------------------------------------------------------------------------


def test_no_profile(tmp_path: Path) -> None:
    assert load_site() is None
    looked = tmp_path / "xdg" / "platoon" / "site.yaml"
    assert site_location() == (None, looked)
    assert describe_site(None, mention_absence=True) == [
        f"no site profile ({looked} does not exist): cache root ~/.cache/platoon"
    ]
    assert describe_site(None) == []  # a run says nothing of a profile it does not have


def test_default_location_without_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME")
    write(tmp_path / "home" / ".config" / "platoon" / "site.yaml", {"runs": "r"})
    profile = load_site()
    assert profile is not None and profile.runs == tmp_path / "home" / ".config" / "platoon" / "r"


def test_platoon_site_must_name_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load_site()
    assert str(info.value) == f"$PLATOON_SITE names {tmp_path}, which is not a file"
    assert info.value.exit_code == 78
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="which is not a file"):
        load_site()


def test_platoon_site_dev_null_is_an_empty_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The usual way to say "no profile", even where the default location holds one.
    site_file(tmp_path, {"runs": "/default/runs"})
    monkeypatch.setenv("PLATOON_SITE", os.devnull)
    profile = load_site()
    assert profile is not None and profile.values == {}
    assert describe_site(profile) == [f"site profile {os.devnull}: sets nothing"]
    loaded = load_config(write(tmp_path / "exp.yaml", {**TRAIN, "log_path": "logs"}))
    assert loaded.site is not None and loaded.site.path == Path(os.devnull)
    assert loaded.site_gave == {}  # nothing of the default location's profile applied


def test_platoon_site_wins_and_empty_counts_as_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site_file(tmp_path, {"runs": "/default/runs"})
    other = write(tmp_path / "other.yaml", {"runs": "/other/runs"})
    monkeypatch.setenv("PLATOON_SITE", str(other))
    assert load_site().runs == Path("/other/runs")
    monkeypatch.setenv("PLATOON_SITE", "")
    assert load_site().runs == Path("/default/runs")


# --- values -----------------------------------------------------------------------------------------------------


def test_empty_profile_sets_nothing(tmp_path: Path) -> None:
    path = site_file(tmp_path, "")
    profile = load_site()
    assert profile is not None and profile.values == {}
    assert profile.cache_root == tmp_path / "home" / ".cache" / "platoon"
    assert describe_site(profile) == [f"site profile {path}: sets nothing"]


def test_unknown_keys_are_refused_with_the_hint(tmp_path: Path) -> None:
    assert site_problems(tmp_path, {"runs": "r", "train": {"batch_size": 4}}) == [
        "train: unknown key; a site profile holds only file locations (cache, runs) and the sandbox runtime "
        "(provider, provider_options), never training settings"
    ]


def test_expansion_and_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCRATCH", "/scratch/me")
    path = site_file(
        tmp_path,
        {
            "cache": "~/cache",
            "runs": "runs",
            "provider": "singularity",
            "provider_options": {
                "scratch_root": "${SCRATCH}/sb",
                "image_cache": "$SCRATCH/img",
                "gpu": "all",
            },
        },
    )
    profile = load_site()
    assert profile.cache == tmp_path / "home" / "cache"
    assert profile.runs == path.parent / "runs"
    assert profile.provider == "singularity"
    assert profile.provider_options == {
        "scratch_root": "/scratch/me/sb",
        "image_cache": "/scratch/me/img",
        "gpu": "all",
    }
    assert profile.harbor_cache == tmp_path / "home" / "cache" / "harbor"
    assert profile.toolchains == tmp_path / "home" / "cache" / "toolchains"


def test_unset_variable_is_an_error(tmp_path: Path) -> None:
    assert site_problems(tmp_path, {"cache": "$NO_SUCH_VAR_PLATOON/x"}) == [
        "cache: $NO_SUCH_VAR_PLATOON is not set"
    ]


def test_providers_must_isolate(tmp_path: Path) -> None:
    (problem,) = site_problems(tmp_path, {"provider": "process"})
    assert problem.startswith(
        "provider: process does not isolate sandboxes, so a site profile may not choose it"
    )
    (problem,) = site_problems(tmp_path, {"provider": "no_such_module_q:Provider"})
    assert problem.startswith("provider: no_such_module_q:Provider does not resolve")


def test_provider_options_are_limited(tmp_path: Path) -> None:
    found = site_problems(
        tmp_path,
        {
            "provider": "docker",
            "provider_options": {"network": "host", "stage_images": "sometimes", "gpu": "0"},
        },
    )
    assert found == [
        "provider_options.network: a site profile may set only allow_network_none, egress_allow, rootfs_layout, "
        "scratch_root, image_cache, stage_images, gpu, runtime, egress_runtime (other options belong in a run config's "
        "provider_options)",
        "provider_options.stage_images: 'sometimes' is not a bool",
    ]
    options = {"runtime": "runsc", "egress_runtime": "gvisor-hostinet"}
    site_file(tmp_path, {"provider": "docker", "provider_options": options})
    assert load_site().provider_options == options
    assert site_problems(tmp_path, {"provider_options": {"gpu": "all"}}) == [
        "provider_options: set without a provider; name the provider they are for"
    ]


def test_egress_allow_names_the_destinations_the_site_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one option that loosens isolation: which private or host destinations public and allowlist sandboxes
    may reach, by name (the provider checks each entry's form when it is built)."""
    monkeypatch.setenv("MIRROR", "mirror.internal")
    site_file(
        tmp_path,
        {"provider": "docker", "provider_options": {"egress_allow": ["${MIRROR}:443", "127.0.0.1:8000"]}},
    )
    profile = load_site()
    assert profile is not None
    assert profile.provider_options == {"egress_allow": ["mirror.internal:443", "127.0.0.1:8000"]}
    assert site_problems(
        tmp_path, {"provider": "docker", "provider_options": {"egress_allow": "pypi.org"}}
    ) == ["provider_options.egress_allow: expected a list of host or host:port entries, got 'pypi.org'"]


def test_profile_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = site_file(tmp_path, {"runs": "/a"})
    first = load_site()
    assert load_site() is first
    path.write_text("runs: /bb\n")
    os.utime(path, ns=(1, 1))
    assert load_site().runs == Path("/bb")


# --- deprecated variables ---------------------------------------------------------------------------------------


def test_deprecated_variables_must_agree_with_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site_file(tmp_path, {"cache": "/c"})
    profile = load_site()
    monkeypatch.setenv("PLATOON_HARBOR_CACHE", "/c/harbor")
    assert [d.path for d in deprecated_variables(profile)] == ["$PLATOON_HARBOR_CACHE"]
    monkeypatch.setenv("PLATOON_TOOLCHAINS", "/elsewhere")
    with pytest.raises(ConfigError) as info:
        deprecated_variables(profile)
    assert info.value.problems == [
        "$PLATOON_TOOLCHAINS is /elsewhere, but the site profile's cache puts it at /c/toolchains: "
        "unset $PLATOON_TOOLCHAINS (deprecated) or point it at /c/toolchains"
    ]


# --- application ------------------------------------------------------------------------------------------------


def test_runs_fills_log_path_and_names_the_experiment(tmp_path: Path) -> None:
    site = site_file(tmp_path, {"runs": "/data/runs"})
    cfg = write(tmp_path / "proj" / "my-exp.yaml", TRAIN)
    loaded = load_config(cfg, cwd=tmp_path)
    assert loaded.data["log_path"] == "/data/runs"
    assert loaded.config.stats.experiment_name == "my-exp"
    assert loaded.site_gave == {"log_path": "/data/runs", "stats.experiment_name": "my-exp"}
    assert loaded.named_after == str(cfg)
    assert describe_site(loaded.site, loaded.site_gave) == [
        f"site profile {site}: runs /data/runs",
        "from the site profile: log_path=/data/runs, stats.experiment_name=my-exp",
    ]


def test_explicit_settings_are_never_moved(tmp_path: Path) -> None:
    site_file(tmp_path, {"runs": "/data/runs"})
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "log_path": "mine", "stats": {"experiment_name": "e"}})
    loaded = load_config(cfg, cwd=tmp_path)
    assert loaded.data["log_path"] == "mine" and loaded.site_gave == {}
    cfg = write(tmp_path / "d.yaml", {**TRAIN, "stats": {"experiment_name": "e"}})
    loaded = load_config(cfg, cwd=tmp_path)
    assert loaded.site_gave == {"log_path": "/data/runs"} and loaded.named_after is None
    ev = write(tmp_path / "e.yaml", {"inference": {"model_name": "m"}})
    assert "output_dir" not in load_config(ev, cwd=tmp_path).data["inference"]


def test_without_runs_log_path_stays_required(tmp_path: Path) -> None:
    site_file(tmp_path, {"cache": "/c"})
    cfg = write(tmp_path / "c.yaml", TRAIN)
    with pytest.raises(ConfigError) as info:
        load_config(cfg, cwd=tmp_path)
    assert any(p.startswith("log_path: required key is missing") for p in info.value.problems)


def test_use_site_false_ignores_the_profile(tmp_path: Path) -> None:
    site_file(tmp_path, {"runs": "/data/runs"})
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "log_path": "x"})
    loaded = load_config(cfg, cwd=tmp_path, use_site=False)
    assert loaded.site is None and loaded.site_gave == {}


def test_harbor_entries_get_the_profile_provider_with_options_laid_under(tmp_path: Path) -> None:
    site = site_file(
        tmp_path, {"provider": "singularity", "provider_options": {"allow_network_none": True, "gpu": "all"}}
    )
    entries = [
        {"name": "a", "service": "harbor", "service_kwargs": {"provider_options": {"gpu": "0"}}},
        {"name": "b", "service": "harbor", "service_kwargs": {"provider": "docker"}},
        {"name": "c", "service": "harbor", "service_kwargs": {"provider": None}},
        {"name": "d", "service": "table", "service_kwargs": {"path": "/abs/t.jsonl"}},
    ]
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "log_path": "x", "environments": entries})
    loaded = load_config(cfg, cwd=tmp_path)
    a, b, c, d = (e["service_kwargs"] for e in loaded.data["environments"])
    assert a == {"provider_options": {"allow_network_none": True, "gpu": "0"}, "provider": "singularity"}
    assert b == {"provider": "docker"}
    assert c["provider"] == "singularity"
    assert "provider" not in d
    assert loaded.site_gave == {
        "environments.0.service_kwargs.provider": "singularity",
        "environments.0.service_kwargs.provider_options.allow_network_none": True,
        "environments.2.service_kwargs.provider": "singularity",
        "environments.2.service_kwargs.provider_options.allow_network_none": True,
        "environments.2.service_kwargs.provider_options.gpu": "all",
    }
    assert describe_site(loaded.site)[0] == (
        f"site profile {site}: provider singularity, provider_options {{allow_network_none: true, gpu: all}}"
    )


def test_apply_site_without_profile_changes_nothing() -> None:
    data: dict[str, Any] = {"train": {}}
    assert apply_site(data, None, training=True, config_path=None).gave == {}
    assert data == {"train": {}}


def test_parse_site_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        parse_site(tmp_path / "s.yaml", "cache: [\n")
    assert info.value.problems[0].startswith("invalid YAML: ")


def test_a_site_profile_giving_a_key_twice_is_refused_with_its_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        parse_site(tmp_path / "s.yaml", f"cache: {tmp_path / 'a'}\nruns: r\ncache: {tmp_path / 'b'}\n")
    assert info.value.problems == ["line 3: duplicate key 'cache' (first given on line 1); give the key once"]


def test_site_problems_refuse_loading(tmp_path: Path) -> None:
    site = site_file(tmp_path, {"runs": "r", "batch_size": 3})
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "log_path": "x"})
    with pytest.raises(ConfigError) as info:
        load_config(cfg, cwd=tmp_path)
    assert info.value.source == str(site)
    assert info.value.problems[0].startswith("batch_size: unknown key; a site profile holds only")
