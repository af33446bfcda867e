"""`platoon harbor images plan|build|verify|alias CONFIG|LOCK`: the build keys of a config's Harbor
entries (or of a lock's tasks), built once per site into the provider's image map.

CONFIG: every `service: harbor` entry, each with its own map (`image_map`, else `<harbor cache>/images/<provider>
.json` for a fetched dataset; a directory-backed entry needs `--image-map`). LOCK: a dataset lock file, its tasks
under `--cache` (default: the directory above the lock's `locks/`), the provider given by `--provider`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from platoon.console import err, out
from platoon.errors import EX_USAGE, ConfigError

Target = Annotated[str, typer.Argument(metavar="CONFIG|LOCK", help="A run config or a dataset lock file.")]
ImageMapOption = Annotated[
    str | None,
    typer.Option("--image-map", help="The image map (default: <harbor cache>/images/<provider>.json)."),
]
CacheOption = Annotated[str | None, typer.Option("--cache", help="The Harbor cache (default: the site's).")]
ProviderOption = Annotated[
    str | None, typer.Option("--provider", help="The sandbox provider (default: the entry's, else docker).")
]


@dataclass
class ImageTarget:
    """One set of tasks and the map their images go to."""

    label: str
    config: str | None
    needs: object  # platoon_harbor.prepare.EntryImages


def _is_lock(path: Path) -> bool:
    if path.suffix != ".json" or not path.is_file():
        return False
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "tasks" in data and "version" in data


def _targets(
    target: str, image_map: str | None, cache: str | None, provider: str | None
) -> Iterator[ImageTarget]:
    from platoon_harbor import prepare

    path = Path(target)
    if _is_lock(path):
        from platoon_harbor.datasets import read_lock

        lock = read_lock(path)
        root = Path(cache) if cache else path.absolute().parent.parent
        tasks = {t["name"]: root / t["path"] for t in lock["tasks"] if not t.get("refused")}
        options = {"lock": str(path), "provider": provider or "docker"}
        if image_map:
            options["image_map"] = image_map
        yield ImageTarget(path.name, None, prepare.entry_images(options, root, tasks=tasks))
        return
    from platoon.prepare import cache_root_of, entry_label, load_environments

    loaded, entries = load_environments(target, [])
    found = False
    for index, entry in enumerate(entries):
        if entry.service != "harbor":
            continue
        found = True
        options = dict(entry.service_kwargs or {})
        if provider:
            options["provider"] = provider
        if image_map:
            options["image_map"] = image_map
        if cache:
            options["cache"] = cache
        harbor_cache = prepare.harbor_cache(options, cache_root_of(loaded))
        yield ImageTarget(
            entry_label(entry, index), target, prepare.entry_images(options, harbor_cache, config=target)
        )
    if not found:
        raise ConfigError(f"{target}: no environment entry has service: harbor")


#: how many characters of a key the tables print (`sha256:` and 12 hex digits); `--key` takes this form back
SHOWN_KEY_CHARS = 19


def _shown(key: str) -> str:
    return key[:SHOWN_KEY_CHARS]


def _resolve_keys(given: list[str], known: Iterable[str]) -> list[str]:
    """The full build keys `--key` values name: a full key, or a unique prefix of one as `plan` prints it (with or
    without `sha256:`). Raises ValueError naming the value that matches no key or several."""
    known = list(known)
    chosen: list[str] = []
    for value in given:
        text = value.strip().lower()
        prefix = text if text.startswith("sha256:") else f"sha256:{text}"
        matches = [k for k in known if k == prefix] or [k for k in known if k.startswith(prefix)]
        if len(prefix) == len("sha256:") or not matches:
            raise ValueError(f"--key {value} is not a build key of these tasks (`images plan` lists them)")
        if len(matches) > 1:
            shown = ", ".join(_shown(k) for k in matches[:3])
            raise ValueError(f"--key {value} matches {len(matches)} build keys ({shown}): give more of it")
        if matches[0] not in chosen:
            chosen.append(matches[0])
    return chosen


def _present(needs: object) -> set[str]:
    from platoon_harbor.prepare import EntryImages

    assert isinstance(needs, EntryImages)
    if needs.image_map is None:
        return set()
    from platoon_harbor import images

    return images.present_keys(needs.image_map.read(), needs.keys)


def plan(
    target: Target,
    image_map: ImageMapOption = None,
    cache: CacheOption = None,
    provider: ProviderOption = None,
    json_output: Annotated[
        bool, typer.Option("--json-output", help="One JSON object instead of a table.")
    ] = False,
) -> int:
    """The build keys: key prefix, role, kind, task count, bases, in map, example task; and a summary."""
    from platoon_harbor.prepare import EntryImages

    rows: list[dict[str, object]] = []
    summaries: list[dict[str, object]] = []
    for found in _targets(target, image_map, cache, provider):
        needs = found.needs
        assert isinstance(needs, EntryImages)
        present = _present(needs)
        for key, key_plan in needs.keys.items():
            rows.append(
                {
                    "environment": found.label,
                    "key": key,
                    "role": key_plan.example.task.role,
                    "kind": key_plan.kind,
                    "tasks": len(key_plan.tasks),
                    "bases": list(key_plan.bases),
                    "in_map": key in present if needs.image_map is not None else None,
                    "example_task": key_plan.tasks[0],
                }
            )
        kinds = [p.kind for p in needs.plans]
        summaries.append(
            {
                "environment": found.label,
                "map": str(needs.image_map.path) if needs.image_map is not None else None,
                "provider": needs.provider,
                "tasks": len(needs.plans),
                "keys": len(needs.keys),
                "shared": sum(1 for k in needs.keys.values() if k.kind == "shared"),
                "in_map": len(present),
                "prebuilt": kinds.count("prebuilt"),
                "none": kinds.count("none"),
                "refused": len(needs.refused),
            }
        )
    if json_output:
        out(json.dumps({"keys": rows, "summary": summaries}, indent=2))
        return 0
    header = ("key", "role", "kind", "tasks", "bases", "in map", "example task")
    table = [header] + [
        (
            _shown(str(r["key"])),
            str(r["role"]),
            str(r["kind"]),
            str(r["tasks"]),
            ",".join(r["bases"]),  # type: ignore[arg-type]
            {True: "yes", False: "no", None: "-"}[r["in_map"]],  # type: ignore[index]
            str(r["example_task"]),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        out("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    for s in summaries:
        out(
            f"{s['environment']}: {s['keys']} key(s) ({s['shared']} shared) for {s['tasks']} task(s), "
            f"{s['in_map']} in the map {s['map'] or '(none: a directory-backed entry)'}; "
            f"{s['prebuilt']} prebuilt, {s['none']} without an image, {s['refused']} refused"
        )
    return 0


def _shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/", 1))
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected i/n, e.g. 0/4") from None
    if count < 1 or not 0 <= index < count:
        raise typer.BadParameter(f"{text!r}: expected 0 <= i < n")
    return index, count


def build(
    target: Target,
    image_map: ImageMapOption = None,
    cache: CacheOption = None,
    provider: ProviderOption = None,
    builder: Annotated[
        str | None, typer.Option("--builder", help="oci | def | docker (default: the provider's).")
    ] = None,
    shard: Annotated[str, typer.Option("--shard", help="i/n: build the keys at positions i mod n.")] = "0/1",
    out_dir: Annotated[str | None, typer.Option("--out", help="Where image files go (oci and def).")] = None,
    key: Annotated[
        list[str] | None,
        typer.Option("--key", help="Build these keys, as `plan` prints them or in full (forcing a rebuild)."),
    ] = None,
    scratch: Annotated[
        str | None, typer.Option("--scratch", help="Build scratch (default: node scratch).")
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per build.")] = 3600.0,
    push: Annotated[str | None, typer.Option("--push", help="REPO/NAME to push docker images to.")] = None,
) -> int:
    """Build the keys the map lacks (or the given keys, forcing a rebuild); exit 1 if any failed."""
    from platoon_harbor import images
    from platoon_harbor.prepare import EntryImages

    index, count = _shard(shard)
    if push:
        err("--push: pushing to a registry is not available in this build (no registry is reachable here)")
        return EX_USAGE
    if out_dir and builder not in ("oci", "def"):
        err("--out applies to the oci and def builders only")
        return EX_USAGE
    failed = 0
    for found in _targets(target, image_map, cache, provider):
        needs = found.needs
        assert isinstance(needs, EntryImages)
        if needs.image_map is None:
            err(f"{found.label}: a directory-backed entry has no default image map: pass --image-map")
            return EX_USAGE
        chosen = builder or images.DEFAULT_BUILDERS.get(needs.provider)
        if chosen is None:
            err(
                f"{found.label}: the {needs.provider} provider has no builder: use --builder docker --push REPO/NAME"
            )
            return 1
        ordered = list(needs.keys)  # sorted: shards agree on positions everywhere
        try:
            forced = _resolve_keys(key or [], ordered)
        except ValueError as exc:
            err(f"{found.label}: {exc}")
            return EX_USAGE
        present = set() if forced else _present(needs)
        wanted = [
            needs.keys[k]
            for n, k in enumerate(ordered)
            if n % count == index and (k in forced if forced else k not in present)
        ]

        def progress(number: int, total: int, plan: images.KeyPlan, what: str) -> None:
            err(
                f"images: {what} {number}/{total} {_shown(plan.key)} ({plan.kind}, e.g. task {plan.tasks[0]})"
            )

        try:
            results = images.build_keys(
                wanted,
                needs.image_map,
                builder=chosen,
                force=bool(forced),
                scratch=Path(scratch) if scratch else None,
                timeout=timeout,
                progress=progress,
            )
        except images.ImageError as exc:
            err(str(exc))
            return 1
        for result in results:
            out(f"{_shown(result.key)}  {result.status}  {result.detail}")
        failed += sum(1 for r in results if r.status == "failed")
        built = sum(1 for r in results if r.status == "built")
        err(
            f"{found.label}: {built} built, {len(needs.keys) - len(wanted)} already in {needs.image_map.path}"
        )
    return 1 if failed else 0


def verify(
    target: Target,
    image_map: ImageMapOption = None,
    cache: CacheOption = None,
    provider: ProviderOption = None,
) -> int:
    """Each needed key is in the map and its image is what the map records; exit 1 on a missing key or a mismatch."""
    from platoon_harbor import images
    from platoon_harbor.prepare import EntryImages

    bad = 0
    for found in _targets(target, image_map, cache, provider):
        needs = found.needs
        assert isinstance(needs, EntryImages)
        if needs.image_map is None:
            err(f"{found.label}: a directory-backed entry has no default image map: pass --image-map")
            return EX_USAGE
        entries = needs.image_map.read()
        engine: dict[str, str] | None = None
        for key, key_plan in needs.keys.items():
            entry = entries.get(key)
            if entry is None:
                out(f"{_shown(key)}  missing  (tasks {', '.join(key_plan.tasks[:3])})")
                bad += 1
            elif entry.get("builder") == "docker":
                engine = engine if engine is not None else images.engine_images()
                now = engine.get(str(entry["image"]))
                if now != entry.get("sha256"):
                    out(
                        f"{_shown(key)}  mismatch  {entry['image']} is {now or 'gone'}, the map records {entry['sha256']}"
                    )
                    bad += 1
                else:
                    out(f"{_shown(key)}  ok  {entry['image']}")
            elif not entry.get("sha256"):
                err(
                    f"{_shown(key)}: {entry.get('image')} ({entry.get('builder')}) not checked: no recorded hash"
                )
            else:
                image = Path(str(entry["image"]))
                image = image if image.is_absolute() else needs.image_map.path.parent / image
                ok = image.is_file() and images.file_sha256(image) == entry["sha256"]
                out(f"{_shown(key)}  {'ok' if ok else 'mismatch'}  {image}")
                bad += 0 if ok else 1
    return 1 if bad else 0


def alias(
    target: Target,
    image: Annotated[str, typer.Option("--image", help="The existing image the keys point at (e.g. local).")],
    image_map: ImageMapOption = None,
    cache: CacheOption = None,
    provider: ProviderOption = None,
    key: Annotated[
        list[str] | None,
        typer.Option(
            "--key", help="Alias these keys, as `plan` prints them or in full (default: the missing ones)."
        ),
    ] = None,
) -> int:
    """Point the missing keys (or the given keys) at an existing image, with builder `alias`."""
    from platoon_harbor import images
    from platoon_harbor.prepare import EntryImages

    for found in _targets(target, image_map, cache, provider):
        needs = found.needs
        assert isinstance(needs, EntryImages)
        if needs.image_map is None:
            err(f"{found.label}: a directory-backed entry has no default image map: pass --image-map")
            return EX_USAGE
        try:
            given = _resolve_keys(key or [], needs.keys)
        except ValueError as exc:
            err(f"{found.label}: {exc}")
            return EX_USAGE
        present = needs.image_map.read()
        chosen = given or [k for k in needs.keys if k not in present]
        changes = {k: images.alias_entry(image, needs.keys[k].example) for k in chosen}
        if changes:
            needs.image_map.update(changes)
        for k in chosen:
            out(f"{_shown(k)}  alias  {image}")
        err(f"{found.label}: {len(chosen)} key(s) now point at {image} in {needs.image_map.path}")
    return 0


def register(app: typer.Typer) -> None:
    """Mount the four commands on the `images` group."""
    app.command("plan")(plan)
    app.command("build")(build)
    app.command("verify")(verify)
    app.command("alias")(alias)
