"""`platoon config show|validate` on real files: every problem a user can make, its exit code and its message."""

from __future__ import annotations

import sys
import textwrap
import warnings

import pytest

from platoon.cli import main

BASE = """
    log_path: runs
    tinker_base_url: local
    train:
      model_name: platoon/toy
      renderer_name: qwen3_instruct
      batch_size: 2
      max_training_steps: 5
    environments:
      - service: table
        service_kwargs: {rows: [one, two]}
        harness: acme-solver@1
    stats:
      wandb: {mode: disabled}
"""


@pytest.fixture
def configs(tmp_path, monkeypatch):
    """Write configs into a temporary project and run from there: `configs(name=text, ...)`."""
    monkeypatch.chdir(tmp_path)

    def write(**files: str) -> None:
        for name, text in files.items():
            (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(text))

    write(base=BASE)
    return write


def validate(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(["config", "validate", *argv])
    return code, capsys.readouterr().out.splitlines()


def test_a_valid_config(configs, capsys):
    assert validate(capsys, "--no-resolve", "base.yaml") == (
        0,
        ["ok   base.yaml (PlatoonTinkerRLTrainerConfig)"],
    )


def test_unknown_key_with_did_you_mean(configs, capsys):
    configs(c="extends: base.yaml\ntrain:\n  batch_sise: 4\n")
    assert validate(capsys, "--no-resolve", "c.yaml") == (
        78,
        ["FAIL c.yaml", "  train.batch_sise: unknown key; did you mean train.batch_size?"],
    )


def test_wrong_types_reported_together(configs, capsys):
    configs(c="extends: base.yaml\ntrain:\n  batch_size: many\n  num_epochs: true\n")
    code, lines = validate(capsys, "--no-resolve", "c.yaml")
    assert code == 78
    assert lines[0] == "FAIL c.yaml"
    assert sorted(lines[1:]) == [
        "  train.batch_size: 'many' is not an int",
        "  train.num_epochs: True is not an int",
    ]


def test_missing_extends_file(configs, capsys):
    configs(c="extends: nowhere.yaml\n")
    assert validate(capsys, "c.yaml") == (
        78,
        ["FAIL c.yaml", "  c.yaml: extends nowhere.yaml, which does not exist"],
    )


def test_cyclic_extends(configs, capsys):
    configs(a="extends: b.yaml\n", b="extends: a.yaml\n")
    assert validate(capsys, "a.yaml") == (78, ["FAIL a.yaml", "  extends cycle: a.yaml -> b.yaml -> a.yaml"])


def test_bad_override_paths(configs, capsys):
    code, lines = validate(
        capsys, "--no-resolve", "base.yaml", "train.bach_size=3", "environments.5.name=x", "x"
    )
    assert code == 78
    assert lines[:3] == [
        "FAIL base.yaml",
        "  override 'train.bach_size=3': train.bach_size: unknown key; did you mean train.batch_size?",
        "  override 'environments.5.name=x': environments.5: index 5 is out of range (the list has 1 entry)",
    ]
    assert lines[3:] == ["FAIL x", "  x: no such config file"]


def test_overrides_are_typed_by_the_schema(configs, capsys):
    assert main(["config", "show", "base.yaml", "train.batch_size=8", "stats.trial_name=1"]) == 0
    out = capsys.readouterr().out
    assert "  batch_size: 8\n" in out
    assert "  trial_name: '1'\n" in out


DEPRECATED = """
    extends: base.yaml
    train:
      rollout_group_key: task_family
      workflow_config:
        rollout_config:
          propogate_root_success: true
"""
DEPRECATION_LINES = [
    "  train.rollout_group_key: deprecated; use label_by instead (platoon 0.3.0 removes it)",
    "  train.workflow_config.rollout_config.propogate_root_success: deprecated; use propagate_root_success "
    "instead (platoon 0.3.0 removes it)",
]


def test_deprecated_keys_warn_but_work(configs, capsys):
    configs(c=DEPRECATED)
    assert validate(capsys, "--no-resolve", "c.yaml") == (
        0,
        ["ok   c.yaml (PlatoonTinkerRLTrainerConfig)", *DEPRECATION_LINES],
    )
    assert main(["config", "show", "--defaults", "c.yaml"]) == 0
    captured = capsys.readouterr()
    assert "label_by: task_family" in captured.out
    assert "propagate_root_success: true" in captured.out
    assert captured.err.splitlines() == [f"platoon: {line.strip()}" for line in DEPRECATION_LINES]


def test_strict_fails_on_deprecations(configs, capsys):
    configs(c=DEPRECATED)
    assert validate(capsys, "--no-resolve", "--strict", "c.yaml") == (78, ["FAIL c.yaml", *DEPRECATION_LINES])


def test_an_error_warning_filter_makes_a_deprecation_exit_78(configs, capsys):
    configs(c=DEPRECATED)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert main(["config", "show", "c.yaml"]) == 78
    assert capsys.readouterr().err == (
        "platoon: train.rollout_group_key: deprecated; use label_by instead (platoon 0.3.0 removes it); "
        "the warning filters make deprecations errors\n"
    )


def test_rollouts_that_could_never_train_are_refused(configs, capsys):
    configs(
        endless="extends: base.yaml\ntrain:\n  max_training_steps: null\n",
        judgeless="extends: base.yaml\ntrain:\n  workflow_config:\n    rollout_config:\n      judges: false\n",
        empty="extends: base.yaml\nenvironments: []\n",
    )
    assert validate(capsys, "--no-resolve", "endless.yaml") == (
        78,
        [
            "FAIL endless.yaml",
            "  train: set num_epochs or max_training_steps (at least one is required to train)",
        ],
    )
    assert validate(capsys, "--no-resolve", "judgeless.yaml") == (
        78,
        [
            "FAIL judgeless.yaml",
            "  train.workflow_config.rollout_config.judges: false: a training config may not turn judges off",
        ],
    )
    assert validate(capsys, "--no-resolve", "empty.yaml") == (
        78,
        ["FAIL empty.yaml", "  environments: Config must define at least one environment in `environments`"],
    )


def test_mixture_rules(configs, capsys):
    configs(
        mix="""
        extends: base.yaml
        environments:
          - {name: a, service: table, weight: 2}
          - {name: a, service: table}
        """
    )
    code, lines = validate(capsys, "--no-resolve", "mix.yaml")
    assert code == 78 and lines[0] == "FAIL mix.yaml"
    assert any(line.startswith("  environments.1.name: ") for line in lines)
    assert any("weight" in line for line in lines[1:])


def test_components_are_resolved_and_extensions_loaded_when_named(configs, capsys, with_extensions):
    assert "acme_agents" not in sys.modules
    assert validate(capsys, "base.yaml") == (0, ["ok   base.yaml (PlatoonTinkerRLTrainerConfig)"])
    assert "acme_agents.solver" in sys.modules  # the config named acme-solver@1
    configs(c="extends: base.yaml\nenvironments:\n  - service: tabel\n    harness: acme-broken\n")
    code, lines = validate(capsys, "c.yaml")
    assert code == 78 and lines[0] == "FAIL c.yaml"
    assert lines[1].startswith(
        "  environments.0.harness: acme-broken (acme-broken, entry point platoon.harnesses"
    )
    assert lines[2].startswith("  environments.0.service: unknown service 'tabel' (did you mean table?).")


def test_harbor_is_named_with_the_distribution_to_install_where_it_is_not_installed(configs, capsys):
    from platoon import plugins

    configs(
        c="extends: base.yaml\ntinker_base_url: local\n"
        "environments:\n  - service: harbor\n    harness: platoon-bandit-answer\n"
    )
    missing = "service 'harbor' is provided by platoon-harbor, which is not installed: "
    if plugins.candidates("service", "harbor"):
        # the workspace: harbor resolves, and the service itself refuses an entry that names no data
        assert main(["config", "validate", "c.yaml"]) == 78
        said = capsys.readouterr()
        assert missing not in said.out + said.err
        assert "a harbor entry needs dataset_dir, task_dirs, dataset or lock" in said.out + said.err
    else:  # platoon-core alone (CI's package step)
        code, lines = validate(capsys, "c.yaml")
        assert code == 78
        assert lines == [
            "FAIL c.yaml",
            f"  environments.0.service: {missing}install it with `uv add platoon-harbor`",
        ]


def test_named_environment_expands_as_the_lowest_layer(configs, capsys, with_extensions):
    configs(c="extends: base.yaml\nenvironments:\n  - env: acme-arith\n    harness_options: {top_k: 5}\n")
    assert main(["config", "show", "c.yaml"]) == 0
    out = capsys.readouterr().out
    assert "- env: acme-arith@2\n" in out
    assert "  service: table\n  harness: acme-solver\n" in out
    assert "    temperature: 0.5\n    top_k: 5\n" in out


def test_missing_file_and_no_file(configs, capsys):
    assert main(["config", "show", "nothere.yaml"]) == 78
    assert capsys.readouterr().err == "platoon: nothere.yaml: no such config file\n"
    assert main(["config", "validate"]) == 64
    assert capsys.readouterr().err == "platoon config validate: name at least one config file\n"
    assert main(["config", "show", "base.yaml", "--kind", "yaml"]) == 64


def test_tasks_lists_a_training_configs_tasks_and_prints_the_plan(configs, capsys, tmp_path):
    (tmp_path / "tasks.jsonl").write_text("".join(f'{{"id": "t{i}", "goal": "g"}}\n' for i in range(40)))
    configs(
        t="extends: base.yaml\ntrain: {batch_size: 32}\nenvironments:\n  - service: table\n"
        "    service_kwargs: {path: tasks.jsonl}\n    harness: platoon-bandit-answer\n"
    )
    code, lines = validate(capsys, "--tasks", "t.yaml")
    assert code == 0
    assert lines == [
        "ok   t.yaml (PlatoonTinkerRLTrainerConfig)",
        "  training tasks: 40, drawn in epochs of 32 (1 batches of 32), 5 steps planned",
        "  environments[default]: share 100.0% (weight tasks, 40 tasks), each task drawn about 4 times over the "
        "run's 5 steps",
    ]
    # A service that cannot list fails the file, as the run would.
    code, lines = validate(capsys, "--tasks", "t.yaml", "environments.0.service_kwargs.path=missing.jsonl")
    assert code == 78
    assert lines[0] == "FAIL t.yaml"
    assert lines[1].startswith("  environments.0: listing split 'train' failed: table 'table': cannot read ")
    # Without resolving the components (the harness is not imported), the tasks are still listed.
    configs(u="extends: t.yaml\nenvironments:\n  - service: table\n    service_kwargs: {path: tasks.jsonl}\n")
    assert validate(capsys, "--no-resolve", "--tasks", "u.yaml")[1][1] == (
        "  training tasks: 40, drawn in epochs of 32 (1 batches of 32), 5 steps planned"
    )


def test_validate_refuses_everything_platoon_train_refuses_at_start_all_at_once(
    configs, capsys, monkeypatch, tmp_path
):
    # The getting-started story: validate said ok; the batch, then the W&B key, then the Tinker key were refused
    # by `platoon train` one start at a time. validate now runs the start's checks, the task listing included.
    for variable in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a W&B login
    configs(
        c="extends: base.yaml\ntinker_base_url: null\ntrain: {batch_size: 32}\nstats: {wandb: {mode: online}}\n"
        "environments:\n  - service: table\n    service_kwargs: {rows: [a, b, c]}\n"
        "    harness: platoon-bandit-answer\n"
    )
    code, lines = validate(capsys, "--strict", "c.yaml")
    assert code == 78 and lines[0] == "FAIL c.yaml"
    problems = [line.strip() for line in lines[1:]]
    assert len(problems) == 3, problems
    assert problems[0].startswith("TINKER_API_KEY is not set")
    assert problems[1].startswith("stats.wandb.mode is online but no W&B key is set")
    assert problems[2].startswith("train.batch_size: 32 is larger than the 3 training tasks")
    # ... and they are what the start refuses, with the same lines (nothing written)
    monkeypatch.setenv("TINKER_API_KEY", "tml-not-a-real-key")
    assert validate(capsys, "c.yaml")[1][1:] == [f"  {problem}" for problem in problems[1:]]
    assert main(["train", "c.yaml"]) == 78
    assert capsys.readouterr().err.splitlines()[-2:] == [f"  {problem}" for problem in problems[1:]]
    assert not (tmp_path / "runs").exists()


def test_a_run_mentions_the_site_profile_only_when_there_is_one(configs, capsys, monkeypatch, tmp_path):
    for variable in ("TINKER_API_KEY", "TINKER_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    configs(c="extends: base.yaml\ntinker_base_url: null\n")  # refused at start: no Tinker key
    assert main(["train", "c.yaml"]) == 78
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("platoon: TINKER_API_KEY is not set"), lines
    site = tmp_path / "site.yaml"
    site.write_text("runs: /srv/runs\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    assert main(["train", "c.yaml"]) == 78
    assert capsys.readouterr().err.splitlines()[0] == f"platoon: site profile {site}: runs /srv/runs"


def test_validate_refuses_a_run_directory_a_live_run_holds(configs, capsys, tmp_path):
    import subprocess

    run_dir = tmp_path / "runs" / "platoon_tinker" / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom platoon.rollouts import records\nrecords.hold_run_dir(sys.argv[1])\n"
            "print('held', flush=True)\ntime.sleep(120)",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        code, lines = validate(capsys, "base.yaml", "environments.0.harness=platoon-bandit-answer")
    finally:
        holder.kill()
        holder.wait()
    assert code == 78 and lines[0] == "FAIL base.yaml"
    assert lines[1] == (
        f"  {run_dir} is in use: process.json names pid {holder.pid} (train) running on this host; stop that run, "
        "or set stats.trial_name to start another"
    )
    # the holder is gone: the directory is free again
    assert validate(capsys, "base.yaml", "environments.0.harness=platoon-bandit-answer")[0] == 0


def test_an_eval_config_takes_tinker_base_url_and_validate_makes_the_eval_start_checks(
    configs, capsys, monkeypatch
):
    from pathlib import Path

    bandit_eval = str(Path(__file__).resolve().parents[2] / "examples" / "bandit" / "eval.yaml")
    for variable in ("TINKER_API_KEY", "TINKER_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    # the key `platoon train` configs have (the example sets `tinker_base_url: local`, which needs no key)
    assert validate(capsys, bandit_eval) == (0, [f"ok   {bandit_eval} (PlatoonEvalConfig)"])
    # without it, what `platoon eval` would refuse first, naming the way to the local server
    code, lines = validate(capsys, bandit_eval, "tinker_base_url=null")
    assert code == 78
    assert lines[1] == (
        "  TINKER_API_KEY is not set: the policy is sampled through Tinker, which needs it; for the embedded local "
        "server, which needs none, set TINKER_BASE_URL=local (or tinker_base_url: local in the config)"
    )
    code, lines = validate(capsys, bandit_eval, "tinker_base_url=local", "inference.model_path=tinker://...")
    assert code == 78 and lines[1].startswith(
        "  inference.model_path: ValueError: 'tinker://...' is not a checkpoint"
    )
    hosted = "inference={model_name: m, renderer_name: null, hosted: {base_url: 'http://127.0.0.1:9/v1', api_key_env: null}}"
    code, lines = validate(capsys, bandit_eval, "tinker_base_url=local", hosted)
    assert code == 78
    assert "tinker_base_url does not apply to a hosted model (inference.hosted is set)" in lines[1]
