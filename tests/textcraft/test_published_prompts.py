"""The RAO prompts as published (`prompts: rao`): fetched, checked by hash, parsed without being run, rendered token
for token, refused in one line when changed or missing, and never part of this repository.

CI fetches platoon-textcraft 0.1.0 once into `.cache/textcraft-published` (`.ci/run`, as it fetches the test
tokenizers); these tests read it there and download nothing.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from platoon_textcraft import published_prompts
from platoon_textcraft.env import TextCraftEnvironment, TextCraftSynthEnvironment
from platoon_textcraft.prompts import TextCraftPromptBuilder

ROOT = Path(__file__).resolve().parents[2]

#: sha256 of the first prompt (the messages of the first model call, as JSON) of each arm with the published texts:
#: (variant, world, agent) -> digest; a child's prompt has the subagent goal, context and its own step budget
FIRST_PROMPT_SHA256 = {
    ("linear", "synth", "root"): "7d4027002709c020f21f0371641c2b86e9adb6ce55f657fa443e768d44528555",
    ("recursive", "synth", "root"): "380f9195e7b772f6b589ddbaf05bd16849b80419187c4be57d2000fc92019358",
    ("depth_aware", "synth", "root"): "3b9fb19253db7641665044f91ff50e0e820f7d08f61c4e15a533d12613ee142a",
    ("linear", "minecraft", "root"): "ade998a405dae4fd62143bea4c7190948ac7befe9ef1472209429e45b2980ff5",
    ("recursive", "minecraft", "root"): "1db30f99b0ff48f291f397fc4de0918fc6eb06e8de7ce66fc8d29e67f9c7d7cc",
    ("depth_aware", "minecraft", "root"): "c8faeda1e680084f8938f0c0375381d8592b04e77bd15675af76b03978e709b0",
    ("recursive", "synth", "child"): "fd50b0a25260e39683cc298b47955932f381d7751380c0d61b413a0c82a2ac0d",
    ("depth_aware", "synth", "child"): "786143d1e0bb4c302ae71ca5a3dc49e3a88a7c4bd44476b224bb785c151b30c3",
    ("recursive", "minecraft", "child"): "a0bd19eb6cb44b7fd6b6a8ea4a1beecef2a485b57ce3f6ce70e51bdd4199a761",
    ("depth_aware", "minecraft", "child"): "c90a718a1a90f8ad9014168c46300abb6ed4c3caa9ec4f5269173ec009c4909a",
}

#: sha256 of a few distinctive lines of the published prompts.py, stripped (its source form), and of the same lines'
#: text (quotes and escaped newlines taken off): no file of this repository may hold any of them
DISTINCTIVE_LINE_SHA256 = frozenset(
    {
        "114e14c9aa7a8c34d2843d0ed9bf96560684176b0edc28fbd95234d6f29a9d44",
        "2afae2db11ab5d81aa307e6f8fcef521bfe0a9aa8f016e9de0ba08ec0932d98c",
        "716cc36857fc56d95545bbf89d745ac644fb5957e0367c5f5ae8f3ba08b30bf5",
        "72624e3ff19780d21a1d0a8906ba9ee39db1550d5278f6d10afae4836268789d",
        "8dffd5a7d8019d13950a3ab958f1212b92f0e0701637c4f332a5d2b2f0a13900",
        "a76637c1eaf1f2d488ea3a9d487a76478f7d523b22394a576e94464ddde817e4",
        "b3a917efb1f3f25388ca4f2c6ef7a31cb68c4fe597f1c2799cffa56a6eede1bf",
        "be37b8fb6462f5b876ff9b34a16dcc07e76f7908d79fc3b96dce921c7788ebbe",
        "c87a5693a42a9220cfe85541e49c7954682ddee3490f5c45918edc865e0e8f54",
        "d082c08585b2516082ed83d7de6da1494ccbb22dd9b29a3e9e4891c047ac61cb",
        "d0f905c560cff126896d9acfeca877a176a28315941212b4b6181740ddbb4331",
        "e9e11049855ca858aa5af7276450ee4b9a402f82dcd0aa0270f7070120d35800",
    }
)


@pytest.fixture
def fetched(fetched_published_prompts: Path) -> Path:
    return fetched_published_prompts


@pytest.fixture
def site_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`site_with(cache_root)`: a site profile whose cache is `cache_root` (the builder reads the prompts there)."""

    def make(cache_root: Path) -> Path:
        profile = tmp_path / "site.yaml"
        profile.write_text(f"cache: {cache_root}\n")
        monkeypatch.setenv("PLATOON_SITE", str(profile))
        return profile

    return make


def _copy_cache(fetched: Path, to: Path, *, with_wheel: bool = False) -> Path:
    source, target = published_prompts.location(fetched), published_prompts.location(to)
    target.mkdir(parents=True)
    shutil.copy(source / "prompts.py", target / "prompts.py")
    if with_wheel:
        shutil.copy(source / published_prompts.WHEEL, target / published_prompts.WHEEL)
    return target / "prompts.py"


def _first_prompt(variant: str, world: str, agent: str) -> list[dict[str, str]]:
    synth = world == "synth"
    builder = TextCraftPromptBuilder(variant=variant, synth=synth, prompts="rao")
    if agent == "root":
        environment = TextCraftSynthEnvironment if synth else TextCraftEnvironment
        goal, budget = environment.list_tasks("train-medium" if synth else "train")[0]["goal"], 200
    else:
        item = "m1_i2" if synth else "stick"
        goal, budget = builder.subagent_goal({item: 2}, "use what you hold"), 20
    state = builder.initial_state(builder.task_text(goal, budget), [])
    return builder.build_messages(state)


def _digest(messages: list[dict[str, str]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("arm", list(FIRST_PROMPT_SHA256), ids=lambda arm: "-".join(arm))
def test_each_arms_first_prompt_is_the_published_one_token_for_token(fetched, site_with, arm):
    site_with(fetched)
    assert _digest(_first_prompt(*arm)) == FIRST_PROMPT_SHA256[arm]


def test_the_system_prompt_and_action_space_are_the_published_texts_joined_as_0_1_0_joined_them(
    fetched, site_with
):
    site_with(fetched)
    texts = published_prompts.load_texts()
    recursive = TextCraftPromptBuilder(variant="recursive", synth=True, prompts="rao")
    assert recursive.system_prompt() == texts["RECURSIVE_INSTRUCTIONS"] + texts["CODEACT_REASONING"]
    assert recursive.action_space([]) == texts["SYNTH_ACTIONS"] + texts["SYNTH_SUBAGENT_ACTIONS"]
    plain = TextCraftPromptBuilder(variant="depth_aware", synth=False, include_reasoning=False, prompts="rao")
    assert plain.system_prompt() == texts["DEPTH_AWARE_INSTRUCTIONS"] + texts["CODEACT_PLAIN"]
    assert (
        plain.action_space([]) == texts["MINECRAFT_ACTIONS"] + texts["MINECRAFT_DEPTH_AWARE_SUBAGENT_ACTIONS"]
    )
    # the package's own wording stays the default, and differs
    assert TextCraftPromptBuilder(variant="recursive").system_prompt() != recursive.system_prompt()


def test_prompts_takes_platoon_or_rao_only():
    with pytest.raises(ValueError, match=r"prompts must be one of \('platoon', 'rao'\), got 'paper'"):
        TextCraftPromptBuilder(prompts="paper")


# ------------------------------------------------------------------------------------ checked, never run


def test_the_file_is_parsed_never_run(fetched, tmp_path, site_with):
    prompts = _copy_cache(fetched, tmp_path / "cache")
    marker = tmp_path / "ran"
    prompts.write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n" + prompts.read_text())
    site_with(tmp_path / "cache")
    texts = published_prompts.load_texts()
    assert len(texts) == len(published_prompts.TEXT_SHA256)
    TextCraftPromptBuilder(variant="recursive", prompts="rao").system_prompt()
    assert not marker.exists()


def test_a_changed_text_is_refused_in_one_line_with_exit_78(fetched, tmp_path, site_with):
    prompts = _copy_cache(fetched, tmp_path / "cache")
    source = prompts.read_text()
    assert source.count("Available Actions (python functions):") == 2  # the synthetic and the Minecraft list
    prompts.write_text(source.replace("Available Actions (python functions):", "Available actions:", 1))
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "platoon_textcraft.published_prompts",
            "check",
            "--cache",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 78
    [line] = check.stderr.splitlines()
    assert line.startswith(f"error: {prompts}: SYNTH_ACTIONS differs from the published text (sha256 ")
    assert line.endswith(f"fetch it again ({published_prompts.FETCH_COMMAND})")
    # a builder asking for them refuses likewise (a run's option check shows this line)
    site_with(tmp_path / "cache")
    with pytest.raises(published_prompts.PublishedPromptsError, match="SYNTH_ACTIONS differs"):
        TextCraftPromptBuilder(prompts="rao")


def test_a_missing_text_is_refused(fetched, tmp_path):
    prompts = _copy_cache(fetched, tmp_path / "cache")
    prompts.write_text(
        prompts.read_text().replace("MINECRAFT_SUBAGENT_ACTIONS = ", "MINECRAFT_SUBAGENT = ", 1)
    )
    with pytest.raises(
        published_prompts.PublishedPromptsError, match="it has no string MINECRAFT_SUBAGENT_ACTIONS"
    ):
        published_prompts.load_texts(tmp_path / "cache")


# ---------------------------------------------------------------------------------------------- fetching


def test_fetch_takes_a_downloaded_wheel_checks_it_and_then_is_current(fetched, tmp_path):
    wheel = published_prompts.location(fetched) / published_prompts.WHEEL
    status, where = published_prompts.fetch(tmp_path / "cache", wheel=wheel)
    assert (status, where) == ("done", published_prompts.location(tmp_path / "cache"))
    # only the wheel and its prompts.py are kept: nothing of the published package lands where Python imports from
    assert sorted(p.name for p in where.iterdir()) == sorted(["prompts.py", published_prompts.WHEEL])
    assert (
        hashlib.sha256((where / published_prompts.WHEEL).read_bytes()).hexdigest()
        == published_prompts.WHEEL_SHA256
    )
    assert published_prompts.fetch(tmp_path / "cache", wheel=wheel)[0] == "current"
    # a changed prompts.py is replaced by the published one on the next fetch
    (where / "prompts.py").write_text("LINEAR_INSTRUCTIONS = 'craft anything'\n")
    assert published_prompts.fetch(tmp_path / "cache", wheel=wheel)[0] == "done"
    assert published_prompts.load_texts(tmp_path / "cache").keys() == published_prompts.TEXT_SHA256.keys()


def _rezipped(wheel: Path, to: Path) -> Path:
    """The wheel with one word of its prompts.py changed (and nothing else)."""
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(to, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == published_prompts.MEMBER:
                data = data.replace(b"crafting game", b"building game", 1)
            target.writestr(item, data)
    return to


def test_a_wheel_that_is_not_the_published_one_is_refused_in_one_line(fetched, tmp_path):
    wheel = _rezipped(
        published_prompts.location(fetched) / published_prompts.WHEEL, tmp_path / published_prompts.WHEEL
    )
    fetch = subprocess.run(
        [
            sys.executable, "-m", "platoon_textcraft.published_prompts", "fetch",
            "--cache", str(tmp_path / "cache"), "--wheel", str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert fetch.returncode == 78
    [line] = fetch.stderr.splitlines()
    assert line.startswith(f"error: {wheel} has sha256 ")
    assert line.endswith(
        f"not the published platoon-textcraft 0.1.0 wheel's {published_prompts.WHEEL_SHA256}"
    )
    assert not (published_prompts.location(tmp_path / "cache") / "prompts.py").exists()


@pytest.fixture
def local_index(fetched, tmp_path) -> Iterator[str]:
    """A package index on localhost (a directory listing is a PEP 503 simple page) serving the fetched wheel."""
    project = tmp_path / "index" / "platoon-textcraft"
    project.mkdir(parents=True)
    shutil.copy(
        published_prompts.location(fetched) / published_prompts.WHEEL, project / published_prompts.WHEEL
    )

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path / "index"), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_downloads_from_the_configured_index(local_index, tmp_path, monkeypatch):
    monkeypatch.setenv("UV_DEFAULT_INDEX", local_index)
    for variable in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert published_prompts.fetch(tmp_path / "cache")[0] == "done"
    assert published_prompts.load_texts(tmp_path / "cache")["LINEAR_INSTRUCTIONS"]


def test_platoon_prepare_fetches_them_for_a_recipe_that_asks_and_a_dry_run_only_says_so(
    local_index, tmp_path, monkeypatch, capsys
):
    from platoon.cli import main

    monkeypatch.setenv("UV_DEFAULT_INDEX", local_index)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    recipe = [str(ROOT / "recipes" / "rao" / "recursive.yaml"), "train.model_name=platoon/toy"]
    where = published_prompts.location(tmp_path / "cache")
    assert main(["prepare", *recipe, "--dry-run"]) == 1
    assert (
        "environments[0] textcraft prompts: missing: would fetch platoon-textcraft 0.1.0"
        in capsys.readouterr().out
    )
    assert not where.exists()
    assert main(["prepare", *recipe]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"environments[0] textcraft prompts: done: platoon-textcraft 0.1.0 in {where}" in out
    assert out[-1].startswith("ready: 1 made now")
    assert main(["prepare", *recipe]) == 0
    assert (
        f"environments[0] textcraft prompts: current: platoon-textcraft 0.1.0 in {where}"
        in capsys.readouterr().out
    )


def test_an_index_without_the_wheel_says_so_with_exit_69(local_index, tmp_path):
    env = {**os.environ, "UV_DEFAULT_INDEX": local_index + "/nothing", "NO_PROXY": "127.0.0.1"}
    fetch = subprocess.run(
        [
            sys.executable,
            "-m",
            "platoon_textcraft.published_prompts",
            "fetch",
            "--cache",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert fetch.returncode == 69
    [line] = fetch.stderr.splitlines()
    assert line.startswith(f"error: could not download {published_prompts.WHEEL} from {local_index}/nothing/")


# ------------------------------------------------------------------------------------- not in this tree


def _normal_forms(line: str) -> set[str]:
    stripped = line.strip()
    text = stripped.replace("\\n", "").strip().strip(",").strip().strip("\"'").strip()
    return {stripped, text}


def _hashes(lines: Iterator[str]) -> set[str]:
    return {hashlib.sha256(form.encode()).hexdigest() for line in lines for form in _normal_forms(line)}


def test_no_file_of_the_repository_holds_the_published_text(fetched):
    # the detector finds every held line in the published file itself (so it can fail) ...
    published = (published_prompts.location(fetched) / "prompts.py").read_text()
    assert _hashes(iter(published.splitlines())) >= DISTINCTIVE_LINE_SHA256
    # ... and in no tracked or to-be-committed file of this tree
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    holding = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        try:
            text = path.read_text()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        if _hashes(iter(text.splitlines())) & DISTINCTIVE_LINE_SHA256:
            holding.append(name)
    assert holding == []


def test_the_file_is_read_once_per_version_on_disk(fetched, tmp_path, monkeypatch):
    prompts = _copy_cache(fetched, tmp_path / "cache")
    reads: list[str] = []
    real = published_prompts.texts_of
    monkeypatch.setattr(
        published_prompts, "texts_of", lambda code, *, name: reads.append(name) or real(code, name=name)
    )
    for _ in range(3):  # three rollouts building their prompt builders
        published_prompts.load_texts(tmp_path / "cache")
    assert reads == [str(prompts)]
    # a changed file (here also of another size) is read again, and refused
    prompts.write_text(prompts.read_text().replace("crafting game", "game", 1))
    with pytest.raises(published_prompts.PublishedPromptsError, match="differs from the published text"):
        published_prompts.load_texts(tmp_path / "cache")
    assert reads == [str(prompts), str(prompts)]
