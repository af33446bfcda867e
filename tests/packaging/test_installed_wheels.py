"""The built wheels installed into fresh virtual environments, as a user installs them: bare platoon-core, and
platoon-core damaged by the earlier, unrelated `platoon` line that writes the same `platoon/` folder.

The third-party dependencies come from uv's cache through the lock (`uv export --format pylock.toml`), so these
tests run offline; the wheels under test are this checkout's, built once per session.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

EARLIER_LINE_FILES = {
    # paths the earlier line's wheel shares with platoon-core (its real 0.2.1 shares 38 of them), and its own cli.py
    "platoon/__init__.py": '"""The earlier, unrelated platoon line."""\n',
    "platoon/deprecations.py": "",
    "platoon/cli.py": "def main():\n    print('the earlier line')\n    return 0\n",
}


def _uv() -> str:
    uv = shutil.which("uv")
    assert uv, "the packaging tests install with uv: put uv on PATH (pip install uv)"
    return uv


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [_uv(), "build", "--all-packages", "--wheel", "--quiet", "--out-dir", str(out)], cwd=ROOT, check=True
    )
    return {path.name.split("-")[0].replace("_", "-"): path for path in out.glob("*.whl")}


@pytest.fixture(scope="session")
def locked_dependencies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """pylock files of the third-party dependencies of the bare core and of the meta package (no extras)."""
    out = tmp_path_factory.mktemp("locks")
    locks = {}
    for package in ("platoon-core", "platoon"):
        lock = out / f"pylock.{package.replace('-', '_')}.toml"
        export = [
            "export",
            "--frozen",
            "--quiet",
            "--format",
            "pylock.toml",
            "--package",
            package,
            "--no-dev",
        ]
        subprocess.run(
            [_uv(), *export, "--no-emit-workspace", "--output-file", str(lock)],
            cwd=ROOT,
            check=True,
        )
        locks[package] = lock
    return locks


def _venv(path: Path, dependencies: Path, *, with_pip: bool = False) -> Path:
    """A fresh venv holding the locked third-party dependencies; with pip where the test installs as pip does."""
    if with_pip:
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    else:
        subprocess.run([_uv(), "venv", "--quiet", "--python", sys.executable, str(path)], check=True)
    python = path / "bin" / "python"
    subprocess.run(
        [_uv(), "pip", "install", "--quiet", "--offline", "--python", str(python), "-r", str(dependencies)],
        check=True,
    )
    return python


def _run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False, env=env)


def _pip(python: Path, *args: str | Path) -> None:
    result = _run(python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", *args)
    assert result.returncode == 0, result.stderr


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _wheel_of(directory: Path, name: str, version: str, files: dict[str, str], metadata: str = "") -> Path:
    """A wheel of `name` `version` holding `files`, with `metadata` lines added to its METADATA."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{metadata}",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: the tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    return path


def _earlier_line_wheel(directory: Path, version: str = "0.2.1") -> Path:
    """A wheel shaped like the registry's earlier `platoon` line: files in platoon/ and a `platoon` script."""
    script = {
        f"platoon-{version}.dist-info/entry_points.txt": "[console_scripts]\nplatoon = platoon.cli:main\n"
    }
    return _wheel_of(directory, "platoon", version, {**EARLIER_LINE_FILES, **script})


def test_bare_core_from_its_wheel_starts_lightly_and_names_the_extras_it_lacks(
    tmp_path, wheels, locked_dependencies
):
    python = _venv(tmp_path / "venv", locked_dependencies["platoon-core"])
    installed = _run(
        _uv(),
        "pip",
        "install",
        "--quiet",
        "--offline",
        "--no-deps",
        "--python",
        python,
        wheels["platoon-core"],
    )
    assert installed.returncode == 0, installed.stderr
    platoon = python.parent / "platoon"
    for argv in (["--help"], ["extensions", "list"]):
        result = _run(platoon, *argv)
        assert result.returncode == 0, result.stderr
    assert "platoon-core" in _run(platoon, "extensions", "list").stdout
    # `import platoon` reads no distribution metadata until the version is asked for
    imported = _run(python, "-X", "importtime", "-c", "import platoon")
    assert imported.returncode == 0 and "platoon" in imported.stderr
    assert "importlib.metadata" not in imported.stderr
    assert _run(python, "-c", "import platoon; print(platoon.__version__)").stdout.strip() == "0.2.0"
    # the toy tokenizer needs `tokenizers`, which only an extra brings
    result = _run(
        python,
        "-c",
        "from platoon.renderers.toy import toy_tokenizer\ntry:\n    toy_tokenizer()\n"
        "except ImportError as exc:\n    print(exc)",
    )
    assert result.stdout.strip() == (
        "the toy tokenizer needs the tokenizers package, which is not installed: pip install 'platoon-core[tinker]'"
    )


def test_installing_over_the_earlier_line_with_pip_leaves_a_command_that_says_how_to_repair_it(
    tmp_path, wheels, locked_dependencies
):
    python = _venv(tmp_path / "venv", locked_dependencies["platoon"], with_pip=True)
    platoon = python.parent / "platoon"
    _pip(python, _earlier_line_wheel(tmp_path))
    # pip installs platoon-core, then replaces the earlier `platoon` with the meta package: uninstalling the earlier
    # line deletes the files the two share, platoon-core's among them
    _pip(python, *wheels.values())
    site = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    )
    assert not (site / "platoon/deprecations.py").exists()

    # the root help page needs none of the missing files; a command that does names the damage
    line = _one_line_error(_run(platoon, "extensions", "list"))
    assert line.startswith("platoon: platoon-core 0.2.0 is missing ")
    assert "platoon/deprecations.py" in line and "pip install --force-reinstall --no-deps" in line
    assert _one_line_error(_run(python, "-m", "platoon", "extensions", "list")) == line

    # the repair the line names works
    _pip(python, "--force-reinstall", wheels["platoon-core"])
    assert _run(platoon, "--help").returncode == 0


def test_the_earlier_line_beside_core_is_named_by_the_command_and_by_import(
    tmp_path, wheels, locked_dependencies
):
    python = _venv(tmp_path / "venv", locked_dependencies["platoon"], with_pip=True)
    _pip(python, _earlier_line_wheel(tmp_path))
    # platoon-core alone over the earlier line: both now own platoon/, platoon-core's files on top
    _pip(python, wheels["platoon-core"])
    line = _one_line_error(_run(python.parent / "platoon", "--version"))
    assert line.startswith("platoon: the platoon/ package folder also holds files of platoon 0.2.1, ")
    assert "run `pip uninstall platoon`, then reinstall platoon-core 0.2.0" in line
    imported = _run(python, "-c", "import platoon")
    assert imported.returncode == 0 and imported.stderr.strip() == line


def test_a_file_of_core_deleted_after_install_is_named_by_the_command_and_by_the_api(
    tmp_path, wheels, locked_dependencies
):
    python = _venv(tmp_path / "venv", locked_dependencies["platoon-core"])
    installed = _run(
        _uv(),
        "pip",
        "install",
        "--quiet",
        "--offline",
        "--no-deps",
        "--python",
        python,
        wheels["platoon-core"],
    )
    assert installed.returncode == 0, installed.stderr
    site = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    )
    (site / "platoon/deprecations.py").unlink()
    shutil.rmtree(site / "platoon/__pycache__", ignore_errors=True)

    line = _one_line_error(_run(python.parent / "platoon", "extensions", "list"))
    assert line.startswith(
        "platoon: platoon-core 0.2.0 is missing 1 of its files (platoon/deprecations.py), "
    )
    api = _run(
        python,
        "-c",
        "import platoon\ntry:\n    platoon.PlatoonDeprecationWarning\n"
        "except ImportError as exc:\n    print(exc)",
    )
    assert api.stdout.strip() == line


def test_an_extension_that_requires_platoon_replacing_this_project_is_named_with_the_command_that_restores_it(
    tmp_path, wheels, locked_dependencies
):
    """An extension written against the registry's `platoon` (`platoon>=0.3`): pip takes that project's 0.4.0 for
    it, replacing this project's meta package and writing over platoon-core's files. The next command says so,
    naming the wheels platoon-core came from, and the command it names restores this project."""
    python = _venv(tmp_path / "venv", locked_dependencies["platoon"], with_pip=True)
    _pip(python, *wheels.values())
    index = tmp_path / "index"
    index.mkdir()
    _earlier_line_wheel(index, "0.4.0")
    _wheel_of(index, "acme_ext", "1.0", {"acme_ext/__init__.py": ""}, "Requires-Dist: platoon>=0.3\n")
    installed = _run(
        python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", index, "acme-ext"
    )
    assert installed.returncode == 0, installed.stderr
    version = "from importlib.metadata import version; print(version('platoon'))"
    assert _run(python, "-c", version).stdout.strip() == "0.4.0"  # pip replaced the meta package

    platoon = python.parent / "platoon"
    line = _one_line_error(_run(platoon, "--help"))
    assert line.startswith(
        "platoon: an installer replaced this project with platoon 0.4.0, an unrelated project of the same name"
    ), line
    restore = line.split("restore platoon 0.2.0: ", 1)[1]
    assert restore == (
        f"pip uninstall -y platoon && pip install --force-reinstall --no-deps {wheels['platoon-core']} "
        f"{wheels['platoon']}"
    )
    assert _one_line_error(_run(python, "-m", "platoon", "extensions", "list")) == line

    # the named command, run as a user would, restores this project
    repaired = _run("bash", "-c", f"export PATH={python.parent}:$PATH PIP_NO_INDEX=1; {restore}")
    assert repaired.returncode == 0, repaired.stderr
    assert _run(platoon, "--help").returncode == 0
    assert _run(python, "-c", "import platoon; print(platoon.__version__)").stdout.strip() == "0.2.0"


def test_the_textcraft_readme_installs_it_with_its_platoon_extra_as_written(tmp_path, wheels):
    """packages/platoon-textcraft/README.md's pip command, run as written against the built wheels (its `uv build`
    line is the session's build): the extra brings this project's platoon-core and harnesses, never the registry's
    unrelated `platoon`, and the named environments load."""
    readme = (ROOT / "packages/platoon-textcraft/README.md").read_text(encoding="utf-8")
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.startswith("uv build --all-packages ")
    install = block.split("\n", 1)[1]
    assert install.startswith('pip install "./dist/platoon_textcraft-0.2.0-py3-none-any.whl[platoon]"')
    lock = tmp_path / "pylock.toml"
    export = ["export", "--frozen", "--quiet", "--format", "pylock.toml", "--package", "platoon-textcraft"]
    subprocess.run(
        [_uv(), *export, "--extra", "platoon", "--no-dev", "--no-emit-workspace", "--output-file", str(lock)],
        cwd=ROOT,
        check=True,
    )
    python = _venv(tmp_path / "venv", lock, with_pip=True)
    (tmp_path / "dist").symlink_to(wheels["platoon-core"].parent)
    offline = f"export PATH={python.parent}:$PATH PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS=\n"
    installed = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", offline + install],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
    )
    assert installed.returncode == 0, installed.stderr
    listed = _run(python.parent / "platoon", "env", "list")
    assert listed.returncode == 0, listed.stderr
    assert "textcraft-synth" in listed.stdout and "platoon-textcraft" in listed.stdout
    shown = _run(python.parent / "platoon", "env", "show", "textcraft-synth")
    assert shown.returncode == 0 and "platoon-codeact" in shown.stdout, (shown.stdout, shown.stderr)
