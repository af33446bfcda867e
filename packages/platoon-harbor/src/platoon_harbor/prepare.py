"""What `platoon prepare` makes for a `service: harbor` entry, and the run-start check that refuses a
run whose images are not built: core reaches both through the `service.prepare` and
`service.problems` seams (`platoon.hookspecs`), which platoon_harbor.plugin implements.

Steps, in order: `dataset` (fetch into the lock through platoon_harbor.datasets; a directory-backed entry has
nothing to fetch), `images` (build the keys the image map lacks with the provider's builder) and `check` (the
dataset check of platoon_harbor.check for tasks without a verdict). Each step is skipped when its work is already
done, so a second prepare only reads: the lock, the map, one `docker images` listing and the check file.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from platoon.envs.service import EnvNotPrepared
from platoon.errors import ConfigError
from platoon.hookspecs import PrepareStep
from platoon_harbor import check, check_file, datasets, images
from platoon_harbor.cache import harbor_cache
from platoon_harbor.service import HarborService
from platoon_harbor.tasks import discover_tasks, task_dirs_ids

# `harbor_cache` moved to platoon_harbor.cache; `prepare.harbor_cache` stays for the harbor commands.
__all__ = ["EntryImages", "entry_images", "harbor_cache", "image_problems", "prepare_steps", "run_problems"]


def _directory_backed(options: Mapping[str, Any]) -> bool:
    return not options.get("dataset") and not options.get("lock")


def entry_tasks(options: Mapping[str, Any], cache: Path, *, config: str | None = None) -> dict[str, Path]:
    """Task id -> directory of an entry: its `dataset_dir`/`task_dirs` in place, else the fetched dataset's lock
    (raising core's `EnvNotPrepared` naming `platoon prepare` when it is not fetched)."""
    if options.get("task_dirs"):
        return task_dirs_ids(options["task_dirs"])
    if options.get("dataset_dir") and _directory_backed(options):
        return discover_tasks(os.path.expanduser(str(options["dataset_dir"])))
    if _directory_backed(options):
        raise ConfigError("service_kwargs: a harbor entry needs dataset_dir, task_dirs, dataset or lock")

    return dict(datasets.resolve_dataset(options, cache, config=config).tasks)


@dataclass
class EntryImages:
    """An entry's image needs: provider, map (None: a directory-backed entry without `image_map`), plans."""

    provider: str
    image_map: images.ImageMap | None
    plans: list[images.ImagePlan]
    keys: dict[str, images.KeyPlan]

    @property
    def refused(self) -> list[images.ImagePlan]:
        return [plan for plan in self.plans if plan.problem is not None]


def entry_images(
    options: Mapping[str, Any],
    cache: Path,
    *,
    config: str | None = None,
    tasks: Mapping[str, Path] | None = None,
) -> EntryImages:
    """Plan every task of the entry and find its image map: `image_map` (deprecated override), else for a fetched
    dataset `<harbor cache>/images/<provider>.json`; a directory-backed entry has no default map (its tasks run
    their `docker_image` or `default_image`)."""
    provider = str(options.get("provider") or "docker")
    found = tasks if tasks is not None else entry_tasks(options, cache, config=config)
    plans, keys = images.plan_tasks(images.task_source(path, task_id) for task_id, path in found.items())
    if options.get("image_map"):
        path: Path | None = Path(os.path.abspath(os.path.expanduser(str(options["image_map"]))))
    elif _directory_backed(options):
        path = None
    else:
        path = images.default_map_path(cache, provider)
    return EntryImages(provider, images.ImageMap(path) if path is not None else None, plans, keys)


def _say(line: str) -> None:
    print(f"platoon: {line}", file=sys.stderr, flush=True)


def dataset_step(
    options: Mapping[str, Any], cache: Path, *, dry_run: bool, config: str | None
) -> PrepareStep:
    if _directory_backed(options):
        where = options.get("dataset_dir") or "task_dirs"
        return PrepareStep("dataset", "none", f"{where} is read in place (nothing to fetch)")

    settings = datasets.FetchSettings.from_kwargs(options, cache=cache, config=config)
    problem = datasets.lock_problem(settings)
    if problem is None and settings.dataset.kind == "hf":
        return PrepareStep("dataset", "current", str(settings.lock_path))
    if dry_run:
        return PrepareStep("dataset", "missing", problem or f"{settings.dataset.text} would be re-fetched")
    try:
        result = datasets.fetch(settings, say=_say)
    except (datasets.FetchError, ConfigError) as exc:
        return PrepareStep("dataset", "failed", str(exc).replace("\n", " "))
    summary = result.summary()
    status = "done" if result.fetched and problem is not None else "current"
    return PrepareStep(
        "dataset", status, f"{summary['lock']} ({summary['runnable']}/{summary['tasks']} runnable)"
    )


def images_step(options: Mapping[str, Any], cache: Path, *, dry_run: bool, config: str | None) -> PrepareStep:
    try:
        needs = entry_images(options, cache, config=config)
    except Exception as exc:  # a dataset that cannot be read: the dataset step already said why
        return PrepareStep("images", "failed", f"{type(exc).__name__}: {exc}".replace("\n", " "))
    refused = f", {len(needs.refused)} task(s) refused ({needs.refused[0].problem})" if needs.refused else ""
    if not needs.keys:
        return PrepareStep("images", "none", f"no task builds an image{refused}")
    if needs.image_map is None:
        return PrepareStep(
            "images",
            "none",
            f"{len(needs.keys)} Dockerfile image(s), but a directory-backed entry without image_map runs each "
            f"task's docker_image or default_image{refused}",
        )
    builder = images.DEFAULT_BUILDERS.get(needs.provider)
    command = f"platoon harbor images build {config or 'CONFIG'} --builder docker --push REPO/NAME"
    if builder is None:
        return PrepareStep(
            "images",
            "failed",
            f"the {needs.provider} provider has no image builder: build and push with {command}",
        )
    try:
        present = images.present_keys(needs.image_map.read(), needs.keys)
    except images.ImageError as exc:
        return PrepareStep("images", "failed", str(exc))
    missing = [plan for key, plan in needs.keys.items() if key not in present]
    where = f"{needs.image_map.path}"
    if not missing:
        return PrepareStep("images", "current", f"{len(needs.keys)} image(s) in {where}{refused}")
    if dry_run:
        return PrepareStep(
            "images", "missing", f"{len(missing)} of {len(needs.keys)} image(s) would be built{refused}"
        )

    def progress(number: int, total: int, plan: images.KeyPlan, what: str) -> None:
        _say(f"images: {what} {number}/{total} {plan.key[:19]} ({plan.kind}, e.g. task {plan.tasks[0]})")

    try:
        results = images.build_keys(missing, needs.image_map, builder=builder, progress=progress)
    except images.ImageError as exc:
        return PrepareStep("images", "failed", str(exc))
    failed = [r for r in results if r.status == "failed"]
    built = sum(1 for r in results if r.status == "built")
    if failed:
        return PrepareStep(
            "images", "failed", f"{len(failed)} of {len(missing)} build(s) failed: {failed[0].detail}"
        )
    return PrepareStep(
        "images", "done", f"{built} built, {len(needs.keys) - built} already in {where}{refused}"
    )


def checked_tasks(options: Mapping[str, Any]) -> tuple[dict[str, Path], bool]:
    """The tasks the dataset check covers: those the entry's service lists, quarantined or not; and whether the
    dataset is fetched (its tasks' digests are in their cache paths)."""
    service = HarborService(**{**options, "harbor_check": "off"})
    return service._discover(), service.options.fetched


def check_state_of(options: Mapping[str, Any], cache: Path, *, config: str | None) -> check_file.CheckState:
    """What the entry's check file says about its current tasks."""
    tasks, fetched = checked_tasks(options)
    path = check_file.check_path(options, cache, config=config)
    return check_file.check_state(path, check_file.task_digests(tasks, fetched=fetched))


def check_step(options: Mapping[str, Any], cache: Path, *, dry_run: bool, config: str | None) -> PrepareStep:
    """The dataset check of the tasks without a verdict for their current content (`platoon harbor check`
    re-checks them all)."""
    if check_file.check_mode(options, config) == "off":
        return PrepareStep("check", "none", "harbor_check: off")
    try:
        state = check_state_of(options, cache, config=config)
    except (ConfigError, ValueError, OSError) as exc:
        return PrepareStep("check", "failed", str(exc).replace("\n", " "))
    if state.checked:
        return PrepareStep("check", "current", check_file.summary(state.records, state.path))
    if dry_run:
        return PrepareStep("check", "missing", f"{len(state.unchecked)} task(s) would be checked")
    unchecked = set(state.unchecked)

    def progress(verdict: check.TaskVerdict, number: int, total: int) -> None:
        _say(f"check: {number}/{total} {verdict.task}: {verdict.verdict}")

    try:
        verdicts = asyncio.run(check.check_entry(options, only=unchecked.__contains__, progress=progress))
    except (ConfigError, ValueError, OSError) as exc:
        return PrepareStep("check", "failed", str(exc).replace("\n", " "))
    records = {**state.records, **{v.task: v.record() for v in verdicts}}
    check_file.write_verdicts(state.path, check_file.dataset_label(options), records)
    for verdict in verdicts:
        if verdict.reason is not None:
            _say(f"check: {verdict.task} quarantined: {verdict.reason}")
    return PrepareStep("check", "done", check_file.summary(records, state.path))


def prepare_steps(
    options: Mapping[str, Any], cache_root: str | None, *, dry_run: bool, config: str | None
) -> Iterator[PrepareStep]:
    """The entry's `dataset`, `images` and `check` steps, each yielded when it is done (core prints it at once)."""
    cache = harbor_cache(options, cache_root)
    dataset = dataset_step(options, cache, dry_run=dry_run, config=config)
    yield dataset
    if dataset.status == "failed" or (dry_run and dataset.status == "missing"):
        yield PrepareStep("images", "missing" if dry_run else "failed", "waits for the dataset")
        return
    built = images_step(options, cache, dry_run=dry_run, config=config)
    yield built
    if built.status == "failed" or (dry_run and built.status == "missing"):
        yield PrepareStep("check", "missing" if dry_run else "failed", "waits for the images")
        return
    yield check_step(options, cache, dry_run=dry_run, config=config)


def run_problems(options: Mapping[str, Any], cache_root: str | None, *, config: str | None) -> list[str]:
    """Why a run of this entry cannot start on this site: the dataset not fetched, Dockerfile tasks whose keys the
    image map lacks, or (`harbor_check: required`) tasks the dataset check has no verdict for. Never builds, never
    fetches, never checks; one `docker images` call at most."""
    cache = harbor_cache(options, cache_root)
    try:
        needs = entry_images(options, cache, config=config)
    except EnvNotPrepared as exc:
        return [exc.message]
    problems = image_problems(needs)
    if check_file.check_mode(options, config) == "required":
        state = check_state_of(options, cache, config=config)
        if not state.checked:
            problems.append(
                f"the dataset check has no verdict for {len(state.unchecked)} task(s) (e.g. {state.unchecked[0]}; "
                f"check file {state.path}): run `platoon harbor check {config or 'CONFIG'}`, or set "
                "service_kwargs.harbor_check: warn to run unchecked tasks"
            )
    return problems


def image_problems(needs: EntryImages) -> list[str]:
    if needs.image_map is None or not needs.keys:
        return []
    try:
        present = images.present_keys(needs.image_map.read(), needs.keys)
    except images.ImageError as exc:
        return [str(exc)]
    missing = [plan for key, plan in needs.keys.items() if key not in present]
    if not missing:
        return []
    tasks = sorted(task for plan in missing for task in plan.tasks)
    shown = ", ".join(tasks[:5]) + (f" and {len(tasks) - 5} more" if len(tasks) > 5 else "")
    return [
        f"{len(missing)} task image(s) of the {needs.provider} provider are not built "
        f"(map {needs.image_map.path}): tasks {shown}"
    ]
