"""The collection file `run_episode` writes is `json.dumps(collection, indent=2)` to the character, written by a
faster walk (`indented_json`); and episodes run at once on one policy keep their records apart."""

from __future__ import annotations

import asyncio
import enum
import json
import math
import random
from typing import Any

import pytest

from platoon.testing import ScriptedPolicy, make_gateway, run_episode
from platoon.testing.episode import COLLECTION_FILE, indented_json

BANDIT = {"service": "python://platoon.envs.bandit.env:BanditEnvironment", "harness": "platoon-bandit-answer"}


class Level(enum.IntEnum):
    LOW = 1


class Name(str):
    pass


SCALARS: list[Any] = [
    None, True, False, 0, -7, 2**70, Level.LOW, 0.1, -0.0, 1e100, 3.0, math.nan, math.inf, -math.inf,
    "", "plain", 'quote " and \\ backslash', "tab\tnew\nline", "héllo wörld", "日本語", "emoji 🚀", "\x00\x1f",
    Name("a str subclass"),
]  # fmt: skip
KEYS: list[Any] = ["k", "ü", "", 1, -2, 2.5, math.inf, True, False, None, Level.LOW, Name("sub")]


def _value(rng: random.Random, depth: int) -> Any:
    roll = rng.random()
    if depth > 4 or roll < 0.4:
        return rng.choice(SCALARS)
    if roll < 0.55:
        return {} if rng.random() < 0.5 else []
    if roll < 0.8:
        return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randint(1, 5))}
    items = [_value(rng, depth + 1) for _ in range(rng.randint(1, 5))]
    return tuple(items) if rng.random() < 0.3 else items


def test_indented_json_is_json_dumps_with_indent_2_to_the_character():
    rng = random.Random(3)
    for _ in range(500):
        value = _value(rng, 0)
        assert indented_json(value) == json.dumps(value, indent=2)


def test_indented_json_refuses_what_json_refuses():
    for bad in ({1, 2}, {"k": object()}, {(1, 2): "tuple key"}):
        with pytest.raises(TypeError):
            json.dumps(bad, indent=2)
        with pytest.raises(TypeError):
            indented_json(bad)


def test_the_episode_file_is_the_collection_indented(tmp_path):
    run = run_episode("train:0", **BANDIT, policy=["C"], output_dir=tmp_path / "episode")
    text = (tmp_path / "episode" / COLLECTION_FILE).read_text(encoding="utf-8")
    assert text == json.dumps(run.collection.to_dict(), indent=2) + "\n"


def test_episodes_at_once_on_one_policy_keep_their_records_apart(tmp_path):
    policy = ScriptedPolicy(lambda prompt: "C")
    gateway = make_gateway(policy)

    async def many() -> list[Any]:
        return await asyncio.gather(
            *(
                run_episode(f"train:{i}", **BANDIT, policy=gateway, output_dir=tmp_path / str(i))
                for i in range(4)
            )
        )

    runs = asyncio.run(many())
    assert [run.root.task.id for run in runs] == [f"train:{i}" for i in range(4)]
    call_ids = [set(run.interactions) for run in runs]
    assert all(ids for ids in call_ids)
    assert all(a.isdisjoint(b) for i, a in enumerate(call_ids) for b in call_ids[i + 1 :])
    assert len(policy.calls) == sum(len(ids) for ids in call_ids)
    for i, run in enumerate(runs):
        on_disk = json.loads((tmp_path / str(i) / COLLECTION_FILE).read_text(encoding="utf-8"))
        assert on_disk == json.loads(json.dumps(run.collection.to_dict()))
