"""The loading pipeline: extends, per-file paths, schema choice, overrides, named environments,
validation messages and deprecations, against small models and the real training/evaluation schemas."""

from __future__ import annotations

import os
import sys
import textwrap
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from platoon import plugins
from platoon.config import LoadedConfig, load_config, loader, warn_deprecations
from platoon.config.loader import ConfigFileNotFound
from platoon.deprecations import PlatoonDeprecationWarning
from platoon.errors import ConfigError, ExtensionError

TRAIN = {"train": {"model_name": "Qwen/Qwen3-4B", "renderer_name": "qwen3"}, "log_path": "runs"}


@pytest.fixture(autouse=True)
def no_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No site profile and no deprecated variables unless a test sets them."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("PLATOON_SITE", "PLATOON_HARBOR_CACHE", "PLATOON_TOOLCHAINS"):
        monkeypatch.delenv(name, raising=False)


def write(path: Path, content: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)
    path.write_text(textwrap.dedent(text))
    return path


def refused(*args: Any, **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)
    return info.value


# --- files and extends ----------------------------------------------------------------------------------------


def test_extends_merges_bases_in_order_then_the_file(tmp_path: Path) -> None:
    write(tmp_path / "base1.yaml", {"a": {"x": 1, "y": 1}, "l": [1, 2], "s": "base1"})
    write(tmp_path / "base2.yaml", {"a": {"y": 2}, "s": "base2"})
    top = write(tmp_path / "top.yaml", {"extends": ["base1.yaml", "base2.yaml"], "a": {"z": 3}, "l": [9]})
    loaded = load_config(top, cwd=tmp_path)
    assert loaded.data == {"a": {"x": 1, "y": 2, "z": 3}, "l": [9], "s": "base2"}
    assert loaded.sources == [tmp_path / "base1.yaml", tmp_path / "base2.yaml", top]
    assert loaded.schema is None and loaded.config is None and loaded.schema_name == "no schema"


def test_extends_is_relative_to_the_naming_file_and_expands_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write(tmp_path / "home" / "root.yaml", {"r": 1})
    write(tmp_path / "lib" / "deep.yaml", {"extends": "~/root.yaml", "d": 1})
    write(tmp_path / "lib" / "mid.yaml", {"extends": "deep.yaml", "m": 1})
    top = write(tmp_path / "cfg" / "top.yaml", {"extends": "../lib/mid.yaml"})
    loaded = load_config(top, cwd=tmp_path / "cfg")
    assert loaded.data == {"r": 1, "d": 1, "m": 1}
    assert loaded.sources[0] == tmp_path / "home" / "root.yaml"


def test_missing_extends_file(tmp_path: Path) -> None:
    write(tmp_path / "top.yaml", {"extends": "nothere.yaml"})
    error = refused("top.yaml", cwd=tmp_path)
    assert error.problems == ["top.yaml: extends nothere.yaml, which does not exist"]
    assert error.exit_code == 78
    assert str(error) == "invalid config top.yaml:\n  top.yaml: extends nothere.yaml, which does not exist"


def test_extends_cycle(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", {"extends": "b.yaml"})
    write(tmp_path / "b.yaml", {"extends": "a.yaml"})
    assert refused("a.yaml", cwd=tmp_path).problems == ["extends cycle: a.yaml -> b.yaml -> a.yaml"]


@pytest.mark.parametrize("value", [3, [], ["ok.yaml", ""], {"a": 1}])
def test_extends_must_be_a_path_or_list(tmp_path: Path, value: Any) -> None:
    write(tmp_path / "ok.yaml", {})
    write(tmp_path / "top.yaml", {"extends": value})
    (problem,) = refused("top.yaml", cwd=tmp_path).problems
    assert problem.startswith("top.yaml: extends must be a path or a list of non-empty paths, got ")


def test_missing_top_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileNotFound) as info:
        load_config("nope.yaml", cwd=tmp_path)
    assert str(info.value) == "nope.yaml: no such config file"
    assert isinstance(info.value, FileNotFoundError) and info.value.exit_code == 78


def test_empty_file_invalid_yaml_and_non_mapping(tmp_path: Path) -> None:
    # An empty base reads as {}; a config that is empty as a whole is refused (as `platoon train` refuses it).
    write(tmp_path / "empty.yaml", "# nothing yet\n")
    assert load_config(write(tmp_path / "top.yaml", "extends: empty.yaml\na: 1\n"), cwd=tmp_path).data == {
        "a": 1
    }
    assert refused("empty.yaml", cwd=tmp_path).problems == [
        "empty.yaml: the config is empty: write a training config (train, environments) or an evaluation config "
        "(inference, environments); docs/reference/config.md lists the keys"
    ]
    assert load_config("empty.yaml", ["a=1"], cwd=tmp_path).data == {"a": 1}
    write(tmp_path / "bad.yaml", "a: [1, 2\n")
    (problem,) = refused("bad.yaml", cwd=tmp_path).problems
    assert problem.startswith("bad.yaml: invalid YAML: ")
    write(tmp_path / "list.yaml", "- 1\n")
    assert refused("list.yaml", cwd=tmp_path).problems == [
        "list.yaml: the top level must be a mapping, got a list"
    ]


# --- schema choice ----------------------------------------------------------------------------------------------


def test_schema_choice_under_auto(tmp_path: Path) -> None:
    env_only = write(tmp_path / "envs.yaml", {"environments": [{"service": "harbor"}]})
    assert load_config(env_only, cwd=tmp_path).schema.__name__ == "EnvironmentsOnlyConfig"
    ev = write(tmp_path / "eval.yaml", {"inference": {"model_name": "m", "renderer_name": "r"}})
    assert load_config(ev, cwd=tmp_path).schema.__name__ == "PlatoonEvalConfig"
    tr = write(tmp_path / "train.yaml", TRAIN)
    loaded = load_config(tr, cwd=tmp_path)
    assert loaded.schema.__name__ == "PlatoonTinkerRLTrainerConfig" and loaded.kind == "train"
    assert loaded.config.train.batch_size == 32
    other = write(tmp_path / "other.yaml", {"anything": 1})
    assert load_config(other, cwd=tmp_path).schema is None
    assert load_config(tr, kind="none", cwd=tmp_path).config is None


def test_schema_strings(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", {"train": {"model_name": "m", "renderer_name": "r"}, "log_path": "x"})
    loaded = load_config(cfg, schema="platoon.config.training:PlatoonTinkerRLTrainerConfig", cwd=tmp_path)
    assert loaded.config is not None
    assert refused(cfg, schema="not-a-class", cwd=tmp_path).problems == [
        "schema 'not-a-class': expected module:Class"
    ]
    (problem,) = refused(cfg, schema="no_such_module_xyz:Cls", cwd=tmp_path).problems
    assert problem.startswith("schema no_such_module_xyz:Cls: cannot import it (ModuleNotFoundError")
    assert refused(cfg, kind="bogus", cwd=tmp_path).problems[0].startswith("kind 'bogus': expected one of")


# --- validation messages ----------------------------------------------------------------------------------------


def test_unknown_key_wrong_type_and_missing_required(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "c.yaml",
        {"train": {"model_name": "m", "renderer_name": "r", "batchsize": 4, "lora_rank": "big"}, "stats": {}},
    )
    error = refused(cfg, cwd=tmp_path)
    assert error.source == str(cfg)
    assert "train.batchsize: unknown key; did you mean train.batch_size?" in error.problems
    assert "train.lora_rank: 'big' is not an int" in error.problems
    assert any(p.startswith("log_path: required key is missing; ") for p in error.problems)


def test_problems_from_a_base_name_the_base(tmp_path: Path) -> None:
    write(tmp_path / "base.yaml", {"train": {"model_name": "m", "renderer_name": "r", "batch_size": "x"}})
    top = write(
        tmp_path / "top.yaml", {"extends": "base.yaml", "log_path": "runs", "stats": {"trail_name": 1}}
    )
    error = refused(top, cwd=tmp_path)
    assert error.problems == [
        "base.yaml: train.batch_size: 'x' is not an int",
        "stats.trail_name: unknown key; did you mean stats.trial_name?",
    ]


def test_bools_are_not_numbers_and_float_text_is_normalized(tmp_path: Path) -> None:
    cfg = write(
        tmp_path / "c.yaml", {**TRAIN, "train": {**TRAIN["train"], "optimizer": {"learning_rate": "3e-5"}}}
    )
    loaded = load_config(cfg, cwd=tmp_path)
    assert loaded.data["train"]["optimizer"]["learning_rate"] == 3e-5
    assert loaded.config.train.optimizer.learning_rate == 3e-5
    write(tmp_path / "b.yaml", {**TRAIN, "train": {**TRAIN["train"], "batch_size": True}})
    assert refused("b.yaml", cwd=tmp_path).problems == ["train.batch_size: True is not an int"]


# --- overrides --------------------------------------------------------------------------------------------------


def test_overrides_are_typed_by_the_chosen_schema(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", TRAIN)
    loaded = load_config(
        cfg, ["stats.trial_name=1", "train.batch_size=1", "train.max_staleness=null"], cwd=tmp_path
    )
    assert loaded.data["stats"]["trial_name"] == "1"
    assert loaded.config.stats.trial_name == "1"
    assert loaded.config.train.batch_size == 1
    assert loaded.overrides == ["stats.trial_name=1", "train.batch_size=1", "train.max_staleness=null"]


def test_bad_and_malformed_overrides(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", TRAIN)
    error = refused(cfg, ["train.batchsize=2", "oops", "environments.0.name=x"], cwd=tmp_path)
    assert error.problems == [
        "override 'oops' is not of the form key=value or key+=value",
        "override 'train.batchsize=2': train.batchsize: unknown key; did you mean train.batch_size?",
        "override 'environments.0.name=x': environments: has no entries to index",
    ]


def test_library_argv_form(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", TRAIN)
    loaded = load_config(
        None, ["--config", str(cfg), "--train.batch_size=3", "--stats.trial_name", "t"], cwd=tmp_path
    )
    assert loaded.config.train.batch_size == 3 and loaded.config.stats.trial_name == "t"
    assert refused(None, ["--config", str(cfg), "stray"]).problems == [
        "unexpected argument 'stray': overrides are key=value"
    ]


# --- relative input paths --------------------------------------------------------------


def test_relative_paths_resolve_per_file_before_merging(tmp_path: Path) -> None:
    write(tmp_path / "lib" / "tasks.jsonl", "")
    write(tmp_path / "lib" / "agent.toml", "")
    write(
        tmp_path / "lib" / "base.yaml",
        {
            "environments": [
                {"service": "table", "service_kwargs": {"path": "tasks.jsonl"}, "harness": "agent.toml"}
            ]
        },
    )
    top = write(tmp_path / "proj" / "top.yaml", {"extends": "../lib/base.yaml", "anything": 1})
    loaded = load_config(top, cwd=tmp_path)
    entry = loaded.data["environments"][0]
    assert entry["service_kwargs"]["path"] == str(tmp_path / "lib" / "tasks.jsonl")
    assert entry["harness"] == str(tmp_path / "lib" / "agent.toml")


def test_relative_path_that_exists_only_against_the_cwd(tmp_path: Path) -> None:
    write(tmp_path / "tasks.jsonl", "")
    write(
        tmp_path / "cfg" / "c.yaml",
        {"environments": [{"service": "table", "service_kwargs": {"path": "tasks.jsonl"}}]},
    )
    error = refused("cfg/c.yaml", cwd=tmp_path)
    assert error.problems == [
        f"environments.0.service_kwargs.path: tasks.jsonl names {tmp_path / 'cfg' / 'tasks.jsonl'}, which does not "
        f"exist: a relative path in a config file is relative to the file's directory, {tmp_path / 'cfg'}; "
        "tasks.jsonl exists relative to the working directory, where relative paths resolved before: write the "
        "path relative to cfg/c.yaml, or absolute"
    ]


def test_missing_path_in_a_base_is_prefixed_and_has_no_hint_when_absent_everywhere(tmp_path: Path) -> None:
    write(
        tmp_path / "lib" / "base.yaml",
        {"environments": [{"harness": {"x.toml": 1, "codex": 1}, "service": "s"}]},
    )
    write(tmp_path / "top.yaml", {"extends": "lib/base.yaml"})
    assert refused("top.yaml", cwd=tmp_path).problems == [
        f"lib/base.yaml: environments.0.harness.x.toml: x.toml names {tmp_path / 'lib' / 'x.toml'}, which does not "
        f"exist: a relative path in a config file is relative to the file's directory, {tmp_path / 'lib'}"
    ]


def test_override_paths_resolve_against_the_cwd_and_urls_stay(tmp_path: Path) -> None:
    write(
        tmp_path / "cfg" / "c.yaml",
        {
            "environments": [
                {"name": "a", "service": "table", "service_kwargs": {}},
                {"name": "b", "service": "python://m:E"},
            ]
        },
    )
    loaded = load_config(
        "cfg/c.yaml",
        ["environments.0.service_kwargs.path=data/t.jsonl", "environments.1.harness=https://x/a.toml"],
        cwd=tmp_path,
    )
    assert loaded.data["environments"][0]["service_kwargs"]["path"] == str(tmp_path / "data" / "t.jsonl")
    assert loaded.data["environments"][1]["harness"] == "https://x/a.toml"


def test_service_path_options_come_from_the_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from platoon.config.paths import PathOption

    options = (
        "dataset_dir",
        "mounts[].source",
        PathOption("lock", written=True),
        PathOption("splits", relative_to="dataset_dir"),
    )
    monkeypatch.setattr(
        plugins, "get_service_path_options", lambda service: options if service == "svc" else ()
    )
    write(tmp_path / "cfg" / "data" / "x", "")
    kwargs = {
        "dataset_dir": "data",
        "mounts": [{"source": "data/x", "target": "/x"}],
        "lock": "new.lock",
        "splits": "s.json",
    }
    write(tmp_path / "cfg" / "c.yaml", {"environments": [{"service": "svc", "service_kwargs": kwargs}]})
    out = load_config("cfg/c.yaml", cwd=tmp_path).data["environments"][0]["service_kwargs"]
    assert out == {
        "dataset_dir": str(tmp_path / "cfg" / "data"),
        "mounts": [{"source": str(tmp_path / "cfg" / "data" / "x"), "target": "/x"}],
        "lock": str(tmp_path / "cfg" / "new.lock"),
        "splits": "s.json",
    }


def test_outputs_stay_cwd_relative_with_home_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "log_path": "~/runs"})
    assert load_config(cfg, cwd=tmp_path).data["log_path"] == str(tmp_path / "home" / "runs")
    assert load_config(cfg, ["log_path=out"], cwd=tmp_path).data["log_path"] == "out"
    ev = write(tmp_path / "e.yaml", {"inference": {"model_name": "m", "output_dir": "~/ev"}})
    assert load_config(ev, cwd=tmp_path).data["inference"]["output_dir"] == str(tmp_path / "home" / "ev")


# --- trainer_config narrowing -----------------------------------------------------------------------------------


@pytest.fixture
def trainer_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    code = """
        from platoon.config.training import PlatoonTinkerRLTrainerConfig

        class MyTrainer(PlatoonTinkerRLTrainerConfig):
            extra_knob: int = 0

        class Other(PlatoonTinkerRLTrainerConfig):
            pass

        class NotAConfig:
            pass
    """
    write(tmp_path / "mods" / "my_trainer_cfg.py", code)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    yield "my_trainer_cfg"
    sys.modules.pop("my_trainer_cfg", None)


def test_trainer_config_narrows_the_schema(tmp_path: Path, trainer_module: str) -> None:
    cfg = write(
        tmp_path / "c.yaml", {**TRAIN, "environments": [{"trainer_config": f"{trainer_module}:MyTrainer"}]}
    )
    loaded = load_config(cfg, ["extra_knob=5"], cwd=tmp_path)
    assert loaded.schema.__name__ == "MyTrainer" and loaded.config.extra_knob == 5


def test_trainer_config_problems(tmp_path: Path, trainer_module: str) -> None:
    entries = [
        {"name": "a", "trainer_config": f"{trainer_module}:MyTrainer"},
        {"name": "b", "trainer_config": f"{trainer_module}:Other"},
    ]
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "environments": entries})
    assert refused(cfg, cwd=tmp_path).problems == [
        "environments: the entries name different trainer_config classes (MyTrainer, Other); a run has one"
    ]
    cfg = write(
        tmp_path / "d.yaml", {**TRAIN, "environments": [{"trainer_config": f"{trainer_module}:NotAConfig"}]}
    )
    assert refused(cfg, cwd=tmp_path).problems == [
        f"environments.0.trainer_config: {trainer_module}:NotAConfig is not a subclass of PlatoonTinkerRLTrainerConfig"
    ]
    cfg = write(tmp_path / "e.yaml", {**TRAIN, "environments": [{"trainer_config": "never-registered"}]})
    (problem,) = refused(cfg, cwd=tmp_path).problems
    assert problem.startswith("environments.0.trainer_config: never-registered does not resolve")


def test_an_override_may_not_change_the_trainer_config_class(tmp_path: Path, trainer_module: str) -> None:
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "environments": [{"name": "a"}]})
    ov = f"environments.0.trainer_config={trainer_module}:MyTrainer"
    (problem,) = refused(cfg, [ov], cwd=tmp_path).problems
    assert problem == f"override {ov!r} would change the trainer_config class: set trainer_config in a file"


def test_registered_trainer_config_names(tmp_path: Path, trainer_module: str) -> None:
    import importlib

    from platoon import registry

    registry.register_trainer_config("my-trainer-test", importlib.import_module(trainer_module).MyTrainer)
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "environments": [{"trainer_config": "my-trainer-test"}]})
    assert load_config(cfg, cwd=tmp_path).schema.__name__ == "MyTrainer"


# --- named environments -----------------------------------------------------------------------------


class FakeNamed:
    ref = "fake-env@2"

    def entry(self) -> dict[str, Any]:
        return {"service": "table", "service_kwargs": {"path": "rows.jsonl", "limit": 5}, "harness": "codex"}

    def defaults_for(self, harness: Any) -> dict[str, Any]:
        if isinstance(harness, dict):
            raise ValueError(
                "fake-env@2 has harness_defaults for codex, which a harness mixture cannot apply"
            )
        return {"temperature": 0.2, "prompt": {"style": "short"}} if harness == "codex" else {}


@pytest.fixture
def named_env(monkeypatch: pytest.MonkeyPatch) -> None:
    def get_environment(ref: str) -> FakeNamed:
        if not ref.startswith("fake-env"):
            raise ExtensionError(f"environment {ref!r} is not installed")
        return FakeNamed()

    monkeypatch.setattr(loader, "get_environment", get_environment)


def test_named_environment_is_the_lowest_layer(tmp_path: Path, named_env: None) -> None:
    entry = {
        "env": "fake-env",
        "service_kwargs": {"limit": 9},
        "harness_options": {"prompt": {"tone": "dry"}},
    }
    cfg = write(tmp_path / "c.yaml", {"environments": [entry]})
    loaded = load_config(cfg, ["environments.0.seed=3"], cwd=tmp_path)
    (out,) = loaded.data["environments"]
    assert out["env"] == "fake-env@2"
    assert out["service_kwargs"] == {"path": str(tmp_path / "rows.jsonl"), "limit": 9}
    assert out["harness_options"] == {"temperature": 0.2, "prompt": {"style": "short", "tone": "dry"}}
    assert out["seed"] == 3
    assert loaded.config.environments[0].env == "fake-env@2"


def test_named_environment_problems(tmp_path: Path, named_env: None) -> None:
    cfg = write(
        tmp_path / "c.yaml",
        {"environments": [{"env": "missing-env"}, {"env": "fake-env", "harness": {"codex": 1, "x": 1}}]},
    )
    assert refused(cfg, cwd=tmp_path).problems == [
        "environments.0.env: environment 'missing-env' is not installed",
        "environments.1.harness_options: fake-env@2 has harness_defaults for codex, which a harness mixture cannot apply",
    ]
    ok = {"env": "fake-env", "harness": {"codex": 1, "x": 1}, "harness_options": {"a": 1}}
    cfg = write(tmp_path / "d.yaml", {"environments": [ok]})
    assert load_config(cfg, cwd=tmp_path).data["environments"][0]["harness_options"] == {"a": 1}


# --- deprecations -----------------------------------------------------------------------------------------------


def test_deprecated_key_warns(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "train": {**TRAIN["train"], "rollout_group_key": None}})
    loaded = load_config(cfg, cwd=tmp_path)
    (record,) = loaded.deprecations
    assert record.path == "train.rollout_group_key"
    assert record.key.removed_in == "0.3.0"
    assert record.message.startswith("train.rollout_group_key: deprecated; use ")
    assert record.message.endswith(" instead (platoon 0.3.0 removes it)")
    with pytest.warns(PlatoonDeprecationWarning, match=r"train\.rollout_group_key: deprecated; use "):
        warn_deprecations(loaded)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(PlatoonDeprecationWarning):
            warn_deprecations(loaded)


def test_deprecated_variables_come_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLATOON_TOOLCHAINS", str(tmp_path / "tc"))
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "checkpoint": {"strategy": "step"}})
    loaded = load_config(cfg, cwd=tmp_path)
    assert [r.path for r in loaded.deprecations] == ["$PLATOON_TOOLCHAINS", "checkpoint.strategy"]
    assert loaded.deprecations[0].message == (
        "$PLATOON_TOOLCHAINS: deprecated; use the site profile's cache instead (platoon 0.3.0 removes it)"
    )


def test_loaded_config_fields(tmp_path: Path) -> None:
    cfg = write(tmp_path / "c.yaml", TRAIN)
    loaded = load_config(cfg, cwd=tmp_path)
    assert isinstance(loaded, LoadedConfig)
    assert loaded.path == cfg and loaded.site is None and loaded.site_gave == {}
    assert loaded.site_looked_at == Path(os.environ["XDG_CONFIG_HOME"]) / "platoon" / "site.yaml"


def test_deprecated_service_options_come_from_the_service_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from platoon.deprecations import DeprecatedKey

    class Service:
        DEPRECATED_KEYS = {"cache": DeprecatedKey("0.3.0", instead="the site profile's cache")}

    monkeypatch.setattr(
        plugins, "get_service", lambda name: types.SimpleNamespace(factory=Service if name == "svc" else None)
    )
    entry = {"service": "svc", "service_kwargs": {"cache": "/c", "other": 1}}
    cfg = write(tmp_path / "c.yaml", {**TRAIN, "environments": [entry]})
    (record,) = load_config(cfg, cwd=tmp_path).deprecations
    assert record.message == (
        "environments.0.service_kwargs.cache: deprecated; use the site profile's cache instead "
        "(platoon 0.3.0 removes it)"
    )


def test_importing_the_config_package_stays_light(run_python: Any) -> None:
    # The loader asks plugins (entry-point metadata) for named environments and services' path options; the
    # training and evaluation schemas load only when a config of that kind is validated.
    code = (
        "import sys, platoon.config as c; c.load_config; c.apply_overrides; c.describe_site; "
        "heavy = [m for m in ('platoon.config.training', 'platoon.eval.config_defs') "
        "if m in sys.modules]; print(heavy)"
    )
    result = run_python(code, path=tuple(Path(p) for p in sys.path if p))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
