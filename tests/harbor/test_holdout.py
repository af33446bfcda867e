"""The hold-out: whole groups, strata, exact rounding, groups joined through shared inputs, the
same split in two processes, and identity.json refusing a resume that changes it (78)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from platoon.errors import ConfigError
from platoon.rollouts.records import read_identity, settle_identity
from platoon_harbor.holdout import HoldoutRule, eval_problem, holdout_split


def rows(
    n: int, *, group: Any = lambda i: f"g{i}", stratum: Any = None, refused: tuple[int, ...] = ()
) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        index = {"repo": group(i)}
        if stratum is not None:
            index["lang"] = stratum(i)
        out.append(
            {
                "name": f"t{i:02d}",
                "index": index,
                "refused": "gpus: asks for a GPU" if i in refused else None,
                "input_files": {"environment/data.txt": f"sha256:{i:064x}"},
            }
        )
    return out


def test_the_target_is_exact_on_the_decimal_and_groups_are_whole() -> None:
    # 0.3 x 10 is 3.0000000000000004 in binary floating point: ceil would give 4; the decimal gives 3.
    split = holdout_split(rows(10), {"fraction": 0.3, "group_by": "repo"})
    assert len(split.eval) == 3 and len(split.train) == 7
    # Groups of 2: a target of ceil(0.3 x 10) = 3 holds out one group and skips any that would overflow.
    paired = holdout_split(rows(10, group=lambda i: f"g{i // 2}"), {"fraction": 0.3, "group_by": "repo"})
    assert len(paired.held_out) == 2
    groups = {int(t[1:]) // 2 for t in paired.eval}
    assert len(groups) == 1 and set(paired.eval) == {f"t{2 * g:02d}" for g in groups} | {
        f"t{2 * g + 1:02d}" for g in groups
    }
    assert sorted(paired.eval + paired.train) == [f"t{i:02d}" for i in range(10)]


def test_strata_each_get_their_ceiling_and_a_group_is_held_in_all_its_strata_or_none() -> None:
    split = holdout_split(
        rows(12, stratum=lambda i: "py" if i < 8 else "go"),
        {"fraction": "0.25", "group_by": "repo", "stratify_by": "lang"},
    )
    assert split.strata["py"]["held_out"] == 2 and split.strata["go"]["held_out"] == 1
    # One group across both strata holding 2 py + 2 go tasks fits only where both targets allow.
    cross = rows(
        12, stratum=lambda i: "py" if i < 8 else "go", group=lambda i: "big" if i in (0, 1, 8, 9) else f"g{i}"
    )
    split = holdout_split(cross, {"fraction": "0.25", "group_by": "repo", "stratify_by": "lang"})
    assert not {"t00", "t08"} & set(split.held_out)  # 2 go tasks exceed go's target of 1
    assert split.strata["py"]["held_out"] <= 2 and split.strata["go"]["held_out"] <= 1


def test_shared_inputs_join_groups_and_ignore_inputs_separates_them() -> None:
    joined = rows(6)
    for row in joined[:3]:
        row["input_files"] = {"environment/data.txt": "sha256:" + "e" * 64}
    split = holdout_split(joined, {"fraction": 0.5, "group_by": "repo"})
    assert split.joined["merged"] == 1
    held = set(split.held_out)
    assert {"t00", "t01", "t02"} <= held or not {"t00", "t01", "t02"} & held
    apart = holdout_split(
        joined, {"fraction": 0.5, "group_by": "repo", "ignore_inputs": ["environment/*.txt"]}
    )
    assert apart.joined["merged"] == 0
    with pytest.raises(ConfigError, match="matches no input file"):
        holdout_split(joined, {"fraction": 0.5, "group_by": "repo", "ignore_inputs": ["nothing/*"]})
    old = rows(3)
    del old[1]["input_files"]
    with pytest.raises(ConfigError, match="no input files"):
        holdout_split(old, {"fraction": 0.5, "group_by": "repo"})


def test_refused_tasks_sit_in_the_walk_but_in_neither_list_and_rules_are_checked() -> None:
    split = holdout_split(rows(10, refused=(3, 4)), {"fraction": 0.5, "group_by": "repo"})
    assert not {"t03", "t04"} & (set(split.eval) | set(split.train))
    assert len(split.eval) + len(split.train) == 8
    missing = rows(2)
    del missing[0]["index"]["repo"]
    with pytest.raises(ConfigError, match="none of the group_by fields"):
        holdout_split(missing, {"fraction": 0.5, "group_by": ["repo"]})
    for bad in (
        {"fraction": 1, "group_by": "r"},
        {"fraction": 0.1},
        {"fraction": 0.1, "group_by": "r", "x": 1},
    ):
        with pytest.raises(ConfigError):
            HoldoutRule.parse(bad)
    empty = holdout_split(rows(4, refused=(0, 1, 2, 3)), {"fraction": 0.5, "group_by": "repo"})
    assert eval_problem(empty) is not None


_CHILD = """
import json, sys
from platoon_harbor.holdout import holdout_split
rows = json.loads(sys.stdin.read())
split = holdout_split(rows, {"fraction": 0.2, "group_by": "repo", "stratify_by": "lang", "seed": 7})
print(json.dumps({"eval": split.eval, "train": split.train, "digest": split.eval_digest}))
"""


def test_the_split_is_the_same_in_two_processes() -> None:
    data = json.dumps(rows(40, group=lambda i: f"g{i % 13}", stratum=lambda i: ["py", "go", "rs"][i % 3]))
    results = []
    for seed in ("1", "2"):  # two "machines": other hash seeds, other processes
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input=data,
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=60,
        )
        results.append(json.loads(done.stdout))
    assert results[0] == results[1] and results[0]["eval"]


def test_identity_records_the_split_and_a_resume_that_changes_it_is_refused(tmp_path: Path) -> None:
    before = holdout_split(
        rows(20), {"fraction": 0.25, "group_by": "repo"}, dataset={"dataset": "hf://o/n@x"}
    )
    settle_identity(tmp_path, "m", "r", {"hb": before.record()}, resuming=False)
    identity = read_identity(tmp_path)
    assert identity is not None
    assert identity.environments["hb"]["eval"] == before.eval
    assert identity.environments["hb"]["eval_digest"] == before.eval_digest
    assert identity.environments["hb"]["holdout"]["fraction"] == "0.25"
    # The same rule resumes; another seed moves tasks between the sides and is refused with 78.
    settle_identity(tmp_path, "m", "r", {"hb": before.record()}, resuming=True)
    after = holdout_split(rows(20), {"fraction": 0.25, "group_by": "repo", "seed": 1})
    assert set(after.eval) != set(before.eval)
    with pytest.raises(ConfigError) as caught:
        settle_identity(
            tmp_path, "m", "r", {"hb": after.record()}, resuming=True, training={"hb": after.train}
        )
    assert caught.value.exit_code == 78 and "held out would now train" in str(caught.value)
