"""`platoon env list` names the remote forms; `platoon env show` says where a remote entry's sessions would go
(no server is reached)."""

from __future__ import annotations

import textwrap

import yaml

from platoon.cli import main

NAMED = textwrap.dedent(
    """
    import platoon as pt

    POOLED = pt.EnvironmentEntry(
        "remote-guess", service="ors+http:///GuessEnv?variant=guessenv&label=guess-pool", harness="platoon-react"
    )
    STATIC = pt.EnvironmentEntry(
        "static-guess", service="ors+https://a:1,b:2/GuessEnv", service_kwargs={"call_timeout_s": 30}
    )
    BROKEN = pt.EnvironmentEntry("broken", service="ors+http://a:1/GuessEnv?flavour=x")
    """
)


def test_env_list_names_the_remote_forms(capsys):
    assert main(["env", "list"]) == 0
    out = capsys.readouterr().out
    assert "ors+http://HOST:PORT[,...]/EnvName" in out
    assert "ors+http:///EnvName" in out
    assert "ors+https  " not in out  # ors+https is named in the ors+http row


def test_env_show_says_where_a_remote_entry_s_sessions_go(tmp_path, monkeypatch, capsys):
    (tmp_path / "remote_named_envs.py").write_text(NAMED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("OPENREWARD_SESSION_URLS_GUESS_POOL", "h1:8001,h2:8002")
    assert main(["env", "show", "remote_named_envs:POOLED"]) == 0
    shown = capsys.readouterr().out
    remote = yaml.safe_load(shown[shown.index("remote:") :])["remote"]
    assert remote == {
        "environment": "GuessEnv",
        "variant": "guessenv",
        "split": "train",
        "label": "guess-pool",
        "servers": ["http://h1:8001", "http://h2:8002"],
        "servers_from": "$OPENREWARD_SESSION_URLS_GUESS_POOL",
        "session_urls_variable": "OPENREWARD_SESSION_URLS_GUESS_POOL",
        "call_timeout_s": 600.0,
    }
    assert main(["env", "show", "remote_named_envs:STATIC"]) == 0
    shown = capsys.readouterr().out
    remote = yaml.safe_load(shown[shown.index("remote:") :])["remote"]
    assert (remote["servers"], remote["servers_from"], remote["call_timeout_s"]) == (
        ["https://a:1", "https://b:2"],
        "the service URI",
        30,
    )
    assert main(["env", "show", "remote_named_envs:BROKEN"]) == 78
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown query key 'flavour'" in err
