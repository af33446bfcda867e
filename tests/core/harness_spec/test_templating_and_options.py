"""Rendering templates (one pass, argv stays a list) and harness options."""

from __future__ import annotations

import json

import pytest

from platoon.harness.spec import (
    SpecError,
    check_options,
    format_value,
    load_spec,
    option_problems,
    option_values,
    placeholders,
    render,
)


def test_substitution_is_one_pass():
    # a value that looks like a placeholder stays as it is: substituted text is never scanned again
    values = {
        "instruction": "print {api_key} and {options.mode}",
        "api_key": "sk-secret",
        "options.mode": "x",
    }
    assert render("--task={instruction}", values) == "--task=print {api_key} and {options.mode}"
    assert (
        render("{instruction}{instruction}", {"instruction": "{instruction}"}) == "{instruction}{instruction}"
    )


def test_rendering_never_splices_into_a_shell():
    # argv is a list of templates, each rendered on its own: a value with spaces, quotes or `;` stays one argument
    spec_argv = ["sh", "-c", 'agent "$1"', "agent", "{instruction}"]
    hostile = "x'; rm -rf / #\n$(touch /tmp/pwned) `id`"
    argv = [render(arg, {"instruction": hostile}) for arg in spec_argv]
    assert argv == ["sh", "-c", 'agent "$1"', "agent", hostile]


def test_literal_braces_pass_through_and_values_are_formatted():
    assert (
        render('${HOME} {"a": 1} {Upper} {model}', {"model": "policy"}) == '${HOME} {"a": 1} {Upper} policy'
    )
    assert render(
        "{max_steps} {options.on} {options.t}", {"max_steps": 20, "options.on": True, "options.t": 1e-7}
    ) == ("20 true 0.0000001")
    assert placeholders("{a}{b.c}{D}{e-f}") == ["a", "b.c"]


def test_a_placeholder_without_a_value_is_a_spec_error():
    with pytest.raises(SpecError, match=r"^placeholder \{max_steps\} has no value for this launch$"):
        render("--steps {max_steps}", {"max_steps": None})


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (False, "false"),
        (3, "3"),
        (0.5, "0.5"),
        (2.0, "2.0"),
        (1e-7, "0.0000001"),
        (1.5e20, "150000000000000000000.0"),
        (-3.25, "-3.25"),
        ("café", "café"),
    ],
)
def test_option_values_render_plainly(value, text):
    assert format_value(value) == text


@pytest.fixture
def spec(write_spec):
    return load_spec(write_spec())


def test_options_render_with_defaults_filled_and_sorted_json(spec):
    checked = check_options(spec, {"temperature": 1, "mode": "careful"})
    assert checked == {"temperature": 1.0, "mode": "careful", "retries": 1, "replay": True}
    assert isinstance(checked["temperature"], float)  # an int given for a float option becomes a float
    values = option_values(spec, checked)
    assert values["options.temperature"] == "1.0"
    assert values["options.replay"] == "true"
    assert json.loads(values["options"]) == checked
    assert values["options"] == '{"mode":"careful","replay":true,"retries":1,"temperature":1.0}'
    env = {name: render(value, {"api_key": "k", **values}) for name, value in spec.launch.env.items()}
    assert env == {"ACME_API_KEY": "k", "ACME_OPTIONS": values["options"]}


#: (options, the line each problem gives after `harness_options.`)
OPTION_MISTAKES = [
    (
        {"temprature": 0.5},
        "temprature: not an option of harness acme-bash@1.2 ({path}) (did you mean temperature?); "
        "its options: temperature, mode, retries, replay",
    ),
    (
        {"zzz": 1},
        "zzz: not an option of harness acme-bash@1.2 ({path}); its options: temperature, mode, retries, replay",
    ),
    (
        {"retries": True},
        "retries: true is a bool, not an int (option retries of harness acme-bash@1.2, {path})",
    ),
    (
        {"retries": 1.0},
        "retries: 1.0 is a float, not an int (option retries of harness acme-bash@1.2, {path})",
    ),
    ({"retries": -1}, "retries: -1 is below the minimum 0 (option retries of harness acme-bash@1.2, {path})"),
    (
        {"temperature": 2.5},
        "temperature: 2.5 is above the maximum 2.0 (option temperature of harness acme-bash@1.2, {path})",
    ),
    (
        {"temperature": float("inf")},
        "temperature: inf is not a finite float (option temperature of harness acme-bash@1.2, {path})",
    ),
    (
        {"temperature": "0.5"},
        'temperature: "0.5" is a str, not a float (option temperature of harness acme-bash@1.2, {path})',
    ),
    (
        {"mode": "slow"},
        'mode: "slow" is not one of "fast", "careful" (option mode of harness acme-bash@1.2, {path})',
    ),
    (
        {"replay": "yes"},
        'replay: "yes" is a str, not a bool (option replay of harness acme-bash@1.2, {path})',
    ),
    (
        {"mode": {"a": 1}},
        "mode: {{'a': 1}} is a mapping, not a str (option mode of harness acme-bash@1.2, {path})",
    ),
]


@pytest.mark.parametrize(("options", "line"), OPTION_MISTAKES)
def test_each_bad_option_is_one_line_with_a_dotted_path(spec, options, line):
    expected = "environments.0.harness_options." + line.format(path=spec.path)
    assert option_problems(spec, options, where="environments.0.harness_options") == [expected]
    with pytest.raises(SpecError) as caught:
        check_options(spec, options, where="environments.0.harness_options")
    assert str(caught.value) == expected and caught.value.exit_code == 78


def test_a_spec_without_options_takes_none(write_spec):
    bare = load_spec(write_spec('name = "acme-bare"\nversion = "1"\n[launch]\nargv = ["a", "{options}"]\n'))
    assert check_options(bare, {}) == {}
    assert option_values(bare, {})["options"] == "{}"
    assert option_problems(bare, {"x": 1}) == [
        f"harness_options.x: harness acme-bare@1 ({bare.path}) takes no options: harness_options must be empty"
    ]


def test_every_problem_is_reported_once(spec):
    problems = option_problems(spec, {"temprature": 1, "mode": "slow", "retries": 2})
    assert [p.split(":")[0] for p in problems] == ["harness_options.temprature", "harness_options.mode"]
    with pytest.raises(SpecError) as caught:
        check_options(spec, {"temprature": 1, "mode": "slow"})
    assert caught.value.problems == problems[:2]
