"""The RAO prompts as published: the texts of `platoon-textcraft` 0.1.0's `prompts.py`, obtained, never shipped.

Reproducing the RAO paper's TextCraft experiments needs the prompts its agents were trained with. This repository
carries no other project's text, so it carries a way to obtain them: `fetch` downloads the published wheel from the
package index (or takes one already downloaded), checks its sha256, and keeps it with its `prompts.py` under the
site cache (`<cache>/textcraft/published-0.1.0/`). `load_texts` reads the texts from that file **without executing
it**: the file is parsed and the string constants are taken by name, as is the CodeAct paragraph that the 0.1.0
builder's `build_system_prompt` appended to them. Every text's sha256 is pinned here; a text that differs is
refused in one line.

    python -m platoon_textcraft.published_prompts fetch [--cache DIR] [--wheel FILE] [--index-url URL]
    python -m platoon_textcraft.published_prompts check [--cache DIR]

`platoon prepare CONFIG` runs `fetch` for a config whose TextCraft prompt builder asks for `prompts: rao`. Exit
codes: 0 done, 78 a text or the wheel is not the published one (or is not fetched, for `check`), 69 the index could
not be reached.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import os
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from platoon.config import default_cache_root as platoon_default
from platoon.config import load_site

__all__ = [
    "TEXT_SHA256",
    "PublishedPromptsError",
    "PublishedPromptsMissing",
    "fetch",
    "load_texts",
    "location",
]

DISTRIBUTION = "platoon-textcraft"
VERSION = "0.1.0"
WHEEL = "platoon_textcraft-0.1.0-py3-none-any.whl"
WHEEL_SHA256 = "18a70652d0c47a3343edfe0a09a1597f23244f58bb3ac229ef8388a99b8a150a"
MEMBER = "platoon_textcraft/prompts.py"
DEFAULT_INDEX = "https://pypi.org/simple"

#: the module-level string constants taken by name, and the two CodeAct paragraphs (`CODEACT_REASONING`: the
#: `include_reasoning` branch of `TextCraftPromptBuilder.build_system_prompt`, `CODEACT_PLAIN`: the other), each
#: with the sha256 of its UTF-8 text
TEXT_SHA256: Mapping[str, str] = {
    "LINEAR_INSTRUCTIONS": "c322f5a5f4ade35d51db20766ce63c17391f57e6fb08b76f593f1d56ddce2ba5",
    "RECURSIVE_INSTRUCTIONS": "5181133586996edf6962a532f8477e84632c37bed424e63ba84d901b49517eb1",
    "DEPTH_AWARE_INSTRUCTIONS": "30eceb66df1acc932d1eca8b882bd7277f2bb2e237f1f2321ed468f258f6e902",
    "SYNTH_ACTIONS": "930502de6f9daa06df3de234bc2c1e4edad0e35b17342011abe58f963219fa3b",
    "SYNTH_SUBAGENT_ACTIONS": "a0b810635c29b6c4d0e31aeb9a8e74c7545f4dde8747b556cbc32eb976d5e216",
    "SYNTH_DEPTH_AWARE_SUBAGENT_ACTIONS": "12eea7715ee8c572bb16ba91f01d8c5d45a21e26524434b9db406781209f6751",
    "MINECRAFT_ACTIONS": "0ebd820cf93f48f40ddd7d320c5635298027cb9998d5af4576cd3e20f3ebab8d",
    "MINECRAFT_SUBAGENT_ACTIONS": "3b6ff30932c6c5e448e7d8a1adba4f717ef2e37cac8e1ea15d761d388e3bae79",
    "MINECRAFT_DEPTH_AWARE_SUBAGENT_ACTIONS": "1d51462774b0795dd30afe471835b81182d75532f54a488cc81cb5bb92082c6a",
    "CODEACT_REASONING": "d276255868aecee327ef23228c041c50ee57f6b1c4aeab2cb461229e708c4d88",
    "CODEACT_PLAIN": "5945d183df36c33f5a3c1099397e44d38cdb3a3885b353372cac0113ca26415c",
}

FETCH_COMMAND = "python -m platoon_textcraft.published_prompts fetch"
EXIT_REFUSED = 78  # EX_CONFIG: what is on disk is not the published text
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: the index could not be reached


#: (path, mtime, size) of a prompts.py already read -> its checked texts
_READ: dict[tuple[str, int, int], dict[str, str]] = {}


class PublishedPromptsError(ValueError):
    """The published prompts (or the wheel holding them) are not what was published; the message is one line."""


class PublishedPromptsMissing(PublishedPromptsError):
    """The published prompts were never fetched on this site; the message names the command that fetches them."""


class IndexUnavailable(Exception):
    """The package index could not be reached or does not list the wheel."""


def default_cache_root() -> Path:
    """The site profile's cache root (else platoon's default, `~/.cache/platoon`)."""
    profile = load_site()
    return profile.cache_root if profile is not None else platoon_default()


def location(cache_root: str | os.PathLike[str] | None = None) -> Path:
    """`<cache root>/textcraft/published-0.1.0`: where the wheel and its `prompts.py` are kept."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    return root / "textcraft" / f"published-{VERSION}"


# ------------------------------------------------------------------------------------------------ reading


def load_texts(cache_root: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The eleven published texts by name, read from the fetched `prompts.py` (parsed, never run), each checked
    against its pinned sha256."""
    path = location(cache_root) / "prompts.py"
    if not path.is_file():
        where = "" if cache_root is None else f" --cache {cache_root}"
        raise PublishedPromptsMissing(
            f"the RAO prompts (platoon-textcraft {VERSION}'s prompts.py) are not fetched on this site "
            f"(no {path}): run `platoon prepare CONFIG` for this config, or `{FETCH_COMMAND}{where}`"
        )
    # Every rollout builds its prompt builder, and so asks again: the file is parsed and checked once per version of
    # it on disk (a fetch that replaces it changes its size or time, and is read anew).
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    texts = _READ.get(key)
    if texts is None:
        texts = _READ[key] = texts_of(path.read_bytes(), name=str(path))
    return dict(texts)


def texts_of(code: bytes, *, name: str = "prompts.py") -> dict[str, str]:
    """The pinned texts found in a `prompts.py`'s source (`name` says where it came from), checked; one line names
    the first that differs."""
    try:
        tree = ast.parse(code, filename=name)
    except SyntaxError as exc:
        raise PublishedPromptsError(
            f"{name} is not the published file: it does not parse ({exc.msg})"
        ) from None
    found = _module_constants(tree)
    found.update(_codeact_paragraphs(tree))
    for text_name, pinned in TEXT_SHA256.items():
        text = found.get(text_name)
        if text is None:
            raise PublishedPromptsError(
                f"{name} is not the published file: it has no string {text_name}; fetch it again ({FETCH_COMMAND})"
            )
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest != pinned:
            raise PublishedPromptsError(
                f"{name}: {text_name} differs from the published text (sha256 {digest[:16]}..., published "
                f"{pinned[:16]}...); fetch it again ({FETCH_COMMAND})"
            )
    return {text_name: found[text_name] for text_name in TEXT_SHA256}


def _string(node: ast.expr) -> str | None:
    """A string literal's value (implicitly joined literals are one), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _module_constants(tree: ast.Module) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in TEXT_SHA256:
            text = _string(value)
            if text is not None:
                out[target.id] = text
    return out


def _codeact_paragraphs(tree: ast.Module) -> dict[str, str]:
    """The literals `build_system_prompt` appends to the instructions: `return base_instructions + "..."` in the
    `if include_reasoning:` branch (CODEACT_REASONING) and in its `else` (CODEACT_PLAIN)."""
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == "TextCraftPromptBuilder"):
            continue
        for method in cls.body:
            if not (isinstance(method, ast.FunctionDef) and method.name == "build_system_prompt"):
                continue
            for node in ast.walk(method):
                if (
                    isinstance(node, ast.If)
                    and isinstance(node.test, ast.Name)
                    and node.test.id == "include_reasoning"
                ):
                    reasoning, plain = _appended(node.body), _appended(node.orelse)
                    if reasoning is not None and plain is not None:
                        return {"CODEACT_REASONING": reasoning, "CODEACT_PLAIN": plain}
    return {}


def _appended(branch: Sequence[ast.stmt]) -> str | None:
    for statement in branch:
        if isinstance(statement, ast.Return) and isinstance(statement.value, ast.BinOp):
            return _string(statement.value.right)
    return None


# ----------------------------------------------------------------------------------------------- fetching


def index_url() -> str:
    """The package index to download from: uv's, else pip's configured index, else PyPI."""
    for variable in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        value = os.environ.get(variable, "").strip()
        if value:
            return value
    return DEFAULT_INDEX


def fetch(
    cache_root: str | os.PathLike[str] | None = None,
    *,
    wheel: str | os.PathLike[str] | None = None,
    index: str | None = None,
) -> tuple[str, Path]:
    """Make the published prompts present under the cache: ("current", dir) when they already are, else
    ("done", dir) after downloading the wheel (or taking `wheel`), checking its sha256 and extracting
    `prompts.py`, whose texts are checked before the file is put in place."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = location(root)
    try:
        load_texts(root)
        return "current", target
    except PublishedPromptsError:
        pass  # never fetched, or changed since: the published file is put in place
    data = Path(wheel).read_bytes() if wheel is not None else _download(index or index_url())
    digest = hashlib.sha256(data).hexdigest()
    if digest != WHEEL_SHA256:
        origin = str(wheel) if wheel is not None else WHEEL
        raise PublishedPromptsError(
            f"{origin} has sha256 {digest}, not the published {DISTRIBUTION} {VERSION} wheel's {WHEEL_SHA256}"
        )
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        source = archive.read(MEMBER)
    texts_of(source, name=f"{WHEEL}:{MEMBER}")
    target.mkdir(parents=True, exist_ok=True)
    for name, content in ((WHEEL, data), ("prompts.py", source)):
        # Written beside and renamed into place: an interrupted fetch never leaves half a file behind.
        with tempfile.NamedTemporaryFile(dir=target, delete=False, prefix=f".{name}.") as handle:
            handle.write(content)
        os.chmod(handle.name, 0o644)  # as any other cached file (a temporary file starts private)
        os.replace(handle.name, target / name)
    return "done", target


def _download(index: str) -> bytes:
    """The wheel's bytes, found through the index's simple API (PEP 691 JSON, else its HTML page)."""
    import re
    from urllib.parse import urljoin

    import httpx

    page = f"{index.rstrip('/')}/{DISTRIBUTION}/"
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    try:
        with httpx.Client(follow_redirects=True, timeout=60.0, trust_env=True) as client:
            listing = client.get(page, headers={"Accept": accept})
            listing.raise_for_status()
            url: str | None = None
            if "json" in listing.headers.get("content-type", ""):
                for entry in listing.json().get("files", []):
                    if entry.get("filename") == WHEEL:
                        url = urljoin(str(listing.url), entry["url"])
            else:
                for href in re.findall(r'href="([^"]+)"', listing.text):
                    if href.split("#", 1)[0].rsplit("/", 1)[-1] == WHEEL:
                        url = urljoin(str(listing.url), href)
            if url is None:
                raise IndexUnavailable(f"{page} does not list {WHEEL}")
            answer = client.get(url)
            answer.raise_for_status()
            return answer.content
    except httpx.HTTPStatusError as exc:
        answer = exc.response
        raise IndexUnavailable(
            f"could not download {WHEEL} from {page}: {answer.request.url} answered {answer.status_code} "
            f"{answer.reason_phrase}"
        ) from None
    except httpx.HTTPError as exc:
        reason = (str(exc).splitlines() or [""])[0]
        raise IndexUnavailable(
            f"could not download {WHEEL} from {page}: {type(exc).__name__}: {reason}"
        ) from None


# ----------------------------------------------------------------------------------------------- command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m platoon_textcraft.published_prompts",
        description=f"Fetch or check the RAO prompts as published in {DISTRIBUTION} {VERSION}.",
    )
    parser.add_argument("action", choices=("fetch", "check"))
    parser.add_argument(
        "--cache", help="the cache root (default: the site profile's cache, else ~/.cache/platoon)"
    )
    parser.add_argument("--wheel", help=f"take this already downloaded {WHEEL} instead of downloading it")
    parser.add_argument(
        "--index-url", help=f"the package index (default: $UV_DEFAULT_INDEX, else {DEFAULT_INDEX})"
    )
    args = parser.parse_args(argv)
    try:
        if args.action == "check":
            texts = load_texts(args.cache)
            print(f"current: {len(texts)} texts of {DISTRIBUTION} {VERSION} in {location(args.cache)}")
        else:
            status, where = fetch(args.cache, wheel=args.wheel, index=args.index_url)
            print(f"{status}: {DISTRIBUTION} {VERSION}'s prompts.py in {where}")
    except PublishedPromptsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except IndexUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except OSError as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_REFUSED if args.wheel else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
