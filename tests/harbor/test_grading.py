"""The verdict of a Harbor grading from the files as the sandbox's shell read them: its order,
the reward files, the reward contract, the log classifiers; and the tools' output rules. No sandbox here: the
Docker tests in test_service.py run the same code against real forgeries."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from platoon.envs.service import Outcome
from platoon.errors import ConfigError
from platoon_harbor.grading import (
    LOG_FILES,
    REWARD_FILES,
    FileRead,
    OutputError,
    RewardContract,
    VerifierRun,
    parse_classifiers,
    parse_read,
    verdict,
)
from platoon_harbor.session import cut_middle, format_bash


def run(reward_json=None, reward_txt=None, *, kinds=None, log="", stderr="", timed_out=False, exit_code=0):
    files = {name: FileRead(name, "missing") for name in (*REWARD_FILES, *LOG_FILES)}
    for name, text in (("reward.json", reward_json), ("reward.txt", reward_txt)):
        if text is not None:
            data = text.encode()
            files[name] = FileRead(name, "regular", len(data), data)
    files["test-stdout.txt"] = FileRead("test-stdout.txt", "regular", len(log), log.encode())
    files["test-stderr.txt"] = FileRead("test-stderr.txt", "regular", len(stderr), stderr.encode())
    for name, kind in (kinds or {}).items():
        files[name] = FileRead(name, kind, 2 << 20 if kind == "too_large" else 0)
    return VerifierRun(exit_code, 1.5, timed_out, files)


def contract(value=None):
    return RewardContract.parse(value)


def test_a_reward_txt_scores_and_json_is_preferred():
    out = verdict(run(reward_txt="0.75\n"), contract())
    assert (out.status, out.rewards, out.primary) == ("scored", {"reward": 0.75}, "reward")
    assert out.metadata["verifier_mode"] == "shared" and out.metadata["verifier_exit_code"] == 0
    out = verdict(run(json.dumps({"reward": 1, "style": 0.5}), "0"), contract())
    assert out.rewards == {"reward": 1.0, "style": 0.5}
    out = verdict(run(json.dumps({"reward": True})), contract())
    assert out.rewards == {"reward": 1.0}  # booleans pass as numbers


@pytest.mark.parametrize(
    ("reward_json", "reward_txt"),
    [
        (None, None),
        (None, ""),
        (None, "one"),
        (None, "nan"),
        ("[1]", None),
        ('{"reward": "1"}', None),
        ('{"reward": NaN}', None),
        ("{not json", None),
    ],
)
def test_missing_empty_or_malformed_rewards_are_infra_errors_never_zero(reward_json, reward_txt):
    out = verdict(run(reward_json, reward_txt), contract())
    assert (out.status, out.failure_kind) == ("error", "verifier_no_reward")
    assert not out.trainable and out.reward is None


def test_the_verdict_order_timeout_then_forged_files_then_classifiers_then_the_contract():
    timed = verdict(run(reward_txt="1", kinds={"reward.json": "symlink"}, timed_out=True), contract())
    assert (timed.status, timed.failure_kind) == ("invalid", "verifier_timeout")
    forged = verdict(
        run(reward_txt="1", kinds={"reward.json": "special"}, stderr="No module named pytest"),
        contract(["a", "b"]),
        classifiers=parse_classifiers("harbor-common"),
    )
    assert (forged.status, forged.rewards, forged.primary, forged.reason) == (
        "scored",
        {"a": 0.0},
        "a",
        "reward_file_not_regular",
    )
    assert forged.metadata["platoon_zero"] is True
    classified = verdict(
        run(reward_txt="1", stderr="E   ModuleNotFoundError: No module named 'pytest'"),
        contract(),
        classifiers=parse_classifiers("harbor-common"),
    )
    assert (classified.status, classified.failure_kind) == ("invalid", "verifier_missing_tool")


@pytest.mark.parametrize(
    ("kinds", "reason"),
    [
        ({"reward.txt": "symlink"}, "reward_file_not_regular"),
        ({"reward.txt": "special"}, "reward_file_not_regular"),
        ({"reward.txt": "mount"}, "reward_file_not_regular"),
        ({"reward.json": "unreadable"}, "reward_file_not_regular"),
        ({"reward.txt": "too_large"}, "reward_file_too_large"),
        ({"reward.txt": "too_large", "reward.json": "symlink"}, "reward_file_not_regular"),
    ],
)
def test_a_reward_file_that_is_not_a_regular_readable_file_scores_a_platoon_zero(kinds, reason):
    out = verdict(run(reward_json='{"reward": 1}', kinds=kinds), contract())
    assert (out.status, out.rewards, out.reason) == ("scored", {"reward": 0.0}, reason)
    assert out.metadata["platoon_zero"] is True and out.metadata["reward_files"] == kinds


def test_the_verifier_may_declare_its_run_invalid():
    out = verdict(run('{"reward": 0, "invalid": true, "failure_kind": "flaky_network"}'), contract())
    assert (out.status, out.failure_kind) == ("invalid", "flaky_network")
    out = verdict(run('{"reward": 0, "invalid": 0.7}'), contract())
    assert (out.status, out.failure_kind) == ("invalid", "verifier_declared")
    out = verdict(run('{"reward": 0.5, "invalid": 0.2}'), contract())
    assert out.status == "scored" and out.rewards == {"reward": 0.5}


def test_reward_contract_single_and_listed_primaries():
    assert verdict(run('{"score": 1}'), contract()).failure_kind == "verifier_no_primary"
    out = verdict(run('{"correctness": 1, "style": 0.2}'), contract("correctness"))
    assert (out.primary, out.reward) == ("correctness", 1.0)
    listed = contract(["pass_at_1", "solved"])
    out = verdict(run('{"solved": 0.0, "other": 3}'), listed)
    assert (out.status, out.primary, out.reward) == ("scored", "solved", 0.0)
    assert (
        verdict(run('{"solved": 1}'), contract(["solved", "pass_at_1"])).primary == "solved"
    )  # order never matters
    both = verdict(run('{"solved": 1}', "1"), listed)
    assert (both.status, both.failure_kind) == ("invalid", "verifier_ambiguous_reward_files")
    two = verdict(run('{"solved": 1, "pass_at_1": 1}'), listed)
    assert (two.status, two.failure_kind) == ("invalid", "verifier_ambiguous_primary")
    none = verdict(run('{"other": 1}'), listed)
    assert (none.status, none.failure_kind) == ("error", "verifier_no_primary")


def test_reward_contract_components_and_range():
    table = contract({"primary": "reward", "components": ["reward", "style"], "range": [0, 1]})
    assert verdict(run('{"reward": 1, "style": 0}'), table).status == "scored"
    extra = verdict(run('{"reward": 1, "bonus": 9}'), table)
    assert (extra.status, extra.failure_kind) == ("invalid", "verifier_unexpected_keys")
    high = verdict(run('{"reward": 1.5}'), table)
    assert (high.status, high.failure_kind) == ("invalid", "verifier_out_of_range")


def test_reward_contract_check_hook(tmp_path, monkeypatch):
    (tmp_path / "hooks_for_harbor_test.py").write_text(
        textwrap.dedent(
            """
            from platoon.envs.service import Outcome

            def halve(rewards, verifier_dir, task):
                assert (verifier_dir / "reward.json").read_text().startswith("{")
                return Outcome("scored", {"reward": rewards["reward"] / 2})

            def keep(rewards, verifier_dir, task):
                return None

            def boom(rewards, verifier_dir, task):
                raise RuntimeError("no")

            def wrong(rewards, verifier_dir, task):
                return 1.0
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("hooks_for_harbor_test", None)
    reading = run('{"reward": 1}')
    assert verdict(reading, contract({"check": "hooks_for_harbor_test:halve"})).reward == 0.5
    assert verdict(reading, contract({"check": "hooks_for_harbor_test:keep"})).reward == 1.0
    raised = verdict(reading, contract({"check": "hooks_for_harbor_test:boom"}))
    assert raised.status == "error" and "raised RuntimeError" in (raised.reason or "")
    wrong = verdict(reading, contract({"check": "hooks_for_harbor_test:wrong"}))
    assert (wrong.status, wrong.failure_kind) == ("error", "verifier_contract")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "non-empty"),
        ([], "non-empty list"),
        (["a", "a"], "twice"),
        ({"primary": "a", "components": ["b"]}, "must include"),
        ({"range": [1, 0]}, "lo <= hi"),
        ({"check": "nomodule"}, "module:function"),
        ({"primry": "a"}, "unknown key"),
    ],
)
def test_bad_reward_contracts_are_config_errors(value, fragment):
    with pytest.raises(ConfigError, match=fragment):
        RewardContract.parse(value)


# --- the default classifiers (on unless `off`) -------------------------------------------------------------------

DEFAULT = parse_classifiers(None)


@pytest.mark.parametrize(
    ("stderr", "exit_code", "kind"),
    [
        ("curl: (6) Could not resolve host: astral.sh\n", 0, "verifier_network"),
        (
            "W: Failed to fetch http://deb.debian.org/x  Temporary failure resolving 'deb.debian.org'\n",
            0,
            "verifier_network",
        ),
        (
            "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>\n",
            0,
            "verifier_network",
        ),
        ("npm error code EAI_AGAIN\n", 0, "verifier_network"),
        (
            "ERROR: Could not find a version that satisfies the requirement pytest==8.4.1\n",
            0,
            "verifier_download",
        ),
        ("E: Unable to locate package python3-pytest\n", 0, "verifier_download"),
        ("/tests/test.sh: line 4: uvx: command not found\n", 0, "verifier_missing_tool"),
        ("/tests/test.sh: line 2: /usr/bin/python3: No such file or directory\n", 0, "verifier_missing_tool"),
        (
            "subprocess.TimeoutExpired: Command '['pytest']' timed out after 60 seconds\n",
            0,
            "verifier_grader_timeout",
        ),
        ("", 137, "verifier_signal"),
        ("", 143, "verifier_signal"),
        ("", 2, "verifier_exit_nonzero"),
    ],
)
def test_the_default_classifiers_name_the_broken_environment(stderr, exit_code, kind):
    out = verdict(run(reward_txt="0", stderr=stderr, exit_code=exit_code), contract(), classifiers=DEFAULT)
    assert (out.status, out.failure_kind, out.trainable) == ("invalid", kind, False)
    assert out.metadata["evidence"]["exit_code"] == exit_code


@pytest.mark.parametrize(
    ("log", "stderr", "exit_code"),
    [
        # the agent's code printed it, and the test runner showed it on stdout
        ("E  AssertionError: got 'curl: (6) Could not resolve host: x'\nNo module named pytest\n", "", 0),
        # a script or command the task asked the agent to provide is the agent's to make
        ("", "/tests/test.sh: line 3: /app/run.sh: No such file or directory\n", 0),
        ("", "/tests/test.sh: line 3: wordcount: command not found\n", 0),
        # a script of the agent's that the tests run chose its own tools
        ("", "/app/run.sh: line 1: uvx: command not found\n", 0),
        ("", "/usr/bin/env: 'node': No such file or directory\n", 0),
        # a crash may be the agent's program: not a signal from outside
        ("", "", 139),
    ],
)
def test_a_failed_agent_is_not_excused_by_the_default_classifiers(log, stderr, exit_code):
    # exit-nonzero is left out here: it trusts test.sh's exit code, not the agent (docs/harbor.md)
    rules = [c for c in DEFAULT if c.kind != "verifier_exit_nonzero"]
    out = verdict(
        run(reward_txt="0", log=log, stderr=stderr, exit_code=exit_code), contract(), classifiers=rules
    )
    assert (out.status, out.rewards) == ("scored", {"reward": 0.0})


def test_a_verifier_that_failed_without_a_reward_is_still_no_reward():
    out = verdict(run(exit_code=1), contract(), classifiers=DEFAULT)
    assert (out.status, out.failure_kind) == ("error", "verifier_no_reward")


def test_classifiers_are_on_by_default_and_a_config_turns_them_off_or_picks_them():
    assert parse_classifiers(None) == parse_classifiers("harbor-common") == DEFAULT
    assert {c.kind for c in DEFAULT} == {
        "verifier_network",
        "verifier_download",
        "verifier_missing_tool",
        "verifier_grader_timeout",
        "verifier_signal",
        "verifier_exit_nonzero",
    }
    assert parse_classifiers("off") == parse_classifiers([]) == ()
    picked = parse_classifiers(["network", {"pattern": "^FATAL", "kind": "grader_disk"}])
    assert [c.kind for c in picked] == ["verifier_network", "grader_disk"]
    offline = run(reward_txt="0", stderr="curl: (6) Could not resolve host: x\n")
    assert verdict(offline, contract(), classifiers=()).rewards == {"reward": 0.0}
    with pytest.raises(ConfigError, match=r"verifier_classifiers\[0\]: 'netwrok' is not a classifier"):
        parse_classifiers(["netwrok"])


def test_the_evidence_keeps_the_last_16_kib_of_the_output():
    log = "start\n" + "x" * 20_000 + "\nthe end\n"
    evidence = verdict(run(reward_txt="1", log=log), contract()).metadata["evidence"]
    assert evidence["output"].endswith("the end\n") and len(evidence["output"].encode()) == 16 * 1024
    assert (evidence["exit_code"], evidence["seconds"], evidence["mode"]) == (0, 1.5, "shared")


def test_custom_classifiers_and_bad_patterns():
    found = parse_classifiers([{"pattern": r"^FATAL: disk", "kind": "grader_disk"}])
    assert verdict(
        run(reward_txt="1", log="ok\nFATAL: disk full\n"), contract(), classifiers=found
    ).failure_kind == ("grader_disk")
    with pytest.raises(ConfigError, match="pattern"):
        parse_classifiers([{"pattern": "(", "kind": "x"}])


def test_the_reading_scripts_output_is_parsed_strictly():
    files = parse_read(
        "reward.json missing 0\nreward.txt regular 2\nMQo=\ntest-stdout.txt regular 0\n-\n"
        "test-stderr.txt missing 0\nstdout.txt missing 0\nstderr.txt symlink 0\n"
    )
    assert files["reward.txt"].data == b"1\n" and files["test-stdout.txt"].data == b""
    assert files["stderr.txt"].kind == "symlink"
    with pytest.raises(OutputError):
        parse_read("reward.json regular 2\n")
    with pytest.raises(OutputError):
        parse_read("garbage\n")


def test_platoon_zero_outcomes_are_valid_outcomes():
    out = verdict(run(kinds={"reward.txt": "symlink"}), contract())
    assert isinstance(out, Outcome) and out.trainable


def test_bash_output_rules():
    assert format_bash("", "", 0, False, 300) == "[no output]"
    assert format_bash("out\n", "", 0, False, 300) == "out\n"
    assert format_bash("out\n", "err\n", 2, False, 300) == "out\n\n[stderr]\nerr\n\n[exit code 2]"
    assert format_bash("", "err", 1, False, 300) == "\n[stderr]\nerr\n[exit code 1]"
    assert format_bash("partial", "", -9, True, 5) == "partial\n[command timed out after 5 s]"
    assert format_bash("", "", 3, False, 300) == "[no output]\n[exit code 3]"


def test_long_outputs_are_cut_in_the_middle():
    text = "a" * 20_000 + "b" * 20_000
    cut = cut_middle(text)
    assert len(cut) == 30_000
    assert cut.startswith("a" * 1000) and cut.endswith("b" * 1000)
    assert "characters cut" in cut
    assert cut_middle("short") == "short"
