"""Exported TextCraft-Synth tasks through `service: harbor` with the Docker engine:
`platoon-oracle` scores 1 and `platoon-noop` 0, each task in its own image, graded by its separate verifier image
that replays the action log with the verifier's own copies. Here, not in tests/textcraft, because it needs
platoon-harbor and platoon-harnesses beside platoon-textcraft.

The engine has no registry and no network, so the exported Dockerfiles' base (python:3.12-slim by digest) and their
apt step (tmux) cannot be built here: the test swaps the base for `platoon-test/python:bookworm` (Debian's python3,
built by `.ci/docker-engine start`) and drops tmux, keeping everything else of both Dockerfiles, then builds the
images with platoon-harbor's docker builder as `platoon harbor images build` does.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from platoon.testing import run_episode
from platoon_harbor import datasets, images

LOCAL_BASE = "platoon-test/python:bookworm"
OFFLINE_RUN = (
    "RUN printf '#!/bin/sh\\nexec python3 -I /app/textcraft/textcraft_game.py \"$@\"\\n' > /usr/local/bin/textcraft"
    " && chmod 0755 /usr/local/bin/textcraft"
)


@pytest.mark.slow
def test_exported_tasks_score_1_with_the_oracle_and_0_with_noop_in_docker(
    tmp_path: Path, env_name: str
) -> None:
    dataset = tmp_path / "textcraft-synth"
    # platoon-textcraft is not a dependency of the `platoon` distribution whose tests these are: the full suite has
    # it, the package-alone run deselects this slow test, and collecting the module must not need it.
    from platoon_textcraft.harbor.export import BASE_IMAGE, IMAGE_RUN, export_dataset

    tasks = export_dataset(dataset, splits=["train"], limit=3)  # medium, medium and hard tasks
    index = json.loads((dataset / "task-index.json").read_text())
    for task in tasks:  # the digest the export records is Harbor's content hash as platoon-harbor computes it
        assert index[task.name]["digest"] == "sha256:" + datasets.content_hash(dataset / task.path)
        for name in ("environment/Dockerfile", "tests/Dockerfile"):
            path = dataset / task.path / name
            text = path.read_text()
            assert f"FROM {BASE_IMAGE}\n" in text and IMAGE_RUN in text
            path.write_text(
                text.replace(f"FROM {BASE_IMAGE}", f"FROM {LOCAL_BASE}").replace(IMAGE_RUN, OFFLINE_RUN)
            )

    image_map = images.ImageMap(tmp_path / "images.json")
    _, keys = images.plan_tasks([dataset / task.path for task in tasks])
    assert len(keys) == 2 * len(tasks)  # each task's image and its verifier's (task.json differs per task)
    built = images.build_keys(list(keys.values()), image_map, builder="docker")
    try:
        assert [result.status for result in built] == ["built"] * len(keys), built
        kwargs = {
            "dataset_dir": str(dataset),
            "splits": "splits.json",
            "image_map": str(tmp_path / "images.json"),
            "name": env_name,
        }
        for harness, expected in (("platoon-oracle", 1.0), ("platoon-noop", 0.0)):
            for task in tasks:
                episode = run_episode(task.name, service="harbor", service_kwargs=kwargs, harness=harness)
                outcome = episode.outcome
                assert outcome is not None, task.name
                assert (outcome["status"], outcome["rewards"]) == ("scored", {"reward": expected}), (
                    harness,
                    task.name,
                    outcome,
                )
    finally:
        tags = [result.entry["image"] for result in built if result.entry]
        if tags:
            subprocess.run(
                [os.environ.get("PLATOON_DOCKER", "docker"), "rmi", "--force", *tags], capture_output=True
            )


@pytest.mark.slow  # not for its time: the package-alone run, which lacks platoon-textcraft, deselects slow tests
def test_an_exported_dataset_lists_its_own_splits_and_val_holds_no_training_task(tmp_path: Path) -> None:
    """TextCraft's val file names its tasks `textcraft.train.N` (ids given before the split): the export's
    `splits.json` keeps val to the val file's tasks, and the service lists it without a `splits:` option."""
    import asyncio

    from platoon.errors import ConfigError
    from platoon_harbor.service import HarborService
    from platoon_textcraft.harbor.export import export_dataset

    dataset = tmp_path / "textcraft"
    tasks = export_dataset(dataset, variant="original", limit=2)
    service = HarborService(dataset_dir=str(dataset))
    assert asyncio.run(service.list_splits()) == ["train", "val"]
    train = asyncio.run(service.list_tasks("train"))
    val = asyncio.run(service.list_tasks("val"))
    assert train == [t.name for t in tasks if t.split == "train"] and len(train) == 2
    assert val == [t.name for t in tasks if t.split == "val"] and len(val) == 2
    assert not set(train) & set(val)
    with pytest.raises(ConfigError, match=r"known splits: train, val$"):
        asyncio.run(service.list_tasks("test"))
