"""The wheels and sdists `uv build --all-packages` makes, read as a registry or an installer reads them: license
metadata, what each archive carries, dependency ranges, and every import a package makes being declared."""

from __future__ import annotations

import ast
import email
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "platoon": None,
    "platoon-core": "platoon",
    "platoon-harnesses": "platoon_harnesses",
    "platoon-sandbox": "platoon_sandbox",
    "platoon-harbor": "platoon_harbor",
    "platoon-textcraft": "platoon_textcraft",
}


@pytest.fixture(scope="session")
def dist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every package built once per session, exactly as the README and CI build them."""
    uv = shutil.which("uv")
    assert uv, "the packaging tests build with uv: put uv on PATH (pip install uv)"
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([uv, "build", "--all-packages", "--quiet", "--out-dir", str(out)], cwd=ROOT, check=True)
    return out


def _archive_stem(name: str, dist_dir: Path) -> str:
    [wheel] = dist_dir.glob(f"{name.replace('-', '_')}-*.whl")
    return wheel.name.split("-py3-")[0]


def _wheel(name: str, dist_dir: Path) -> zipfile.ZipFile:
    return zipfile.ZipFile(dist_dir / f"{_archive_stem(name, dist_dir)}-py3-none-any.whl")


def _wheel_metadata(name: str, dist_dir: Path) -> email.message.Message:
    with _wheel(name, dist_dir) as wheel:
        return email.message_from_bytes(wheel.read(f"{_archive_stem(name, dist_dir)}.dist-info/METADATA"))


def _sdist_members(name: str, dist_dir: Path) -> list[str]:
    with tarfile.open(dist_dir / f"{_archive_stem(name, dist_dir)}.tar.gz") as sdist:
        return [member.name.split("/", 1)[1] for member in sdist.getmembers() if "/" in member.name]


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_every_wheel_and_sdist_carries_the_mit_license_and_the_project_metadata(name, dist_dir):
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "MIT License" in license_text and "the platoon authors" in license_text
    meta = _wheel_metadata(name, dist_dir)
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    with _wheel(name, dist_dir) as wheel:
        shipped = wheel.read(f"{_archive_stem(name, dist_dir)}.dist-info/licenses/LICENSE").decode()
    assert shipped == license_text
    assert "LICENSE" in _sdist_members(name, dist_dir)
    assert meta["Author"] == "the platoon authors"
    urls = dict(line.split(", ", 1) for line in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    assert (
        len({url.split("/tree/")[0].split("/blob/")[0].removesuffix("/issues") for url in urls.values()}) == 1
    )
    assert "Programming Language :: Python :: 3.12" in meta.get_all("Classifier")
    assert meta["Keywords"] and "reinforcement-learning" in meta["Keywords"]
    # the readme is the long description: it says what the package is and how to install it
    assert "## Install" in meta.get_payload() or "install" in meta.get_payload().lower()


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_each_package_license_is_the_repository_license(name):
    # The backend reads license files relative to the package folder, so each package keeps a copy.
    assert (ROOT / "packages" / name / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_sdists_carry_the_package_and_no_repository_files(name, dist_dir):
    members = _sdist_members(name, dist_dir)
    assert not [m for m in members if Path(m).name in {".gitignore", ".python-version", "uv.lock"}]
    assert {"PKG-INFO", "pyproject.toml", "README.md", "LICENSE"} <= set(members)


def test_the_core_wheel_ships_the_package_and_no_build_code(dist_dir):
    with _wheel("platoon-core", dist_dir) as wheel:
        names = [n for n in wheel.namelist() if not n.endswith("/") and ".dist-info/" not in n]
    assert names and all(n.startswith("platoon/") for n in names)
    assert not [n for n in names if Path(n).name in {"build.py", "setup.py", "hatch_build.py"}]
    data = sorted(n for n in names if not n.endswith(".py"))
    assert all(n.endswith((".j2", ".json", "py.typed")) for n in data), data
    assert "platoon/renderers/toy_tokenizer/tokenizer.json" in data


def test_the_harnesses_wheel_ships_each_toml_spec_beside_the_files_it_names(dist_dir):
    """The built-in specs load from the installed package: each `.toml` and its assets are in the wheel."""
    source = ROOT / "packages/platoon-harnesses/src"
    specs = sorted(source.glob("platoon_harnesses/specs/*/*.toml"))
    assert specs, "platoon-harnesses ships no TOML spec"
    with _wheel("platoon-harnesses", dist_dir) as wheel:
        names = set(wheel.namelist())
        for spec in specs:
            assets = tomllib.loads(spec.read_text(encoding="utf-8"))["launch"].get("assets", {})
            for shipped in [spec, *(spec.parent / asset for asset in assets.values())]:
                name = shipped.relative_to(source).as_posix()
                assert name in names, name
                assert wheel.read(name) == shipped.read_bytes(), name
    assert "platoon_harnesses/specs/platoon-bash/platoon_bash.py" in names


def test_the_toy_tokenizer_build_script_reproduces_the_shipped_files(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts/build_toy_tokenizer.py"), str(tmp_path)], check=True)
    shipped = ROOT / "packages/platoon-core/src/platoon/renderers/toy_tokenizer"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name


def test_the_textcraft_wheel_ships_its_data_and_leaves_its_configs_to_the_repository(dist_dir):
    # The configs (packages/platoon-textcraft/configs) and tests are in the repository only
    configs = {path.name for path in (ROOT / "packages/platoon-textcraft/configs").glob("*.yaml")}
    assert configs
    with _wheel("platoon-textcraft", dist_dir) as wheel:
        names = [n for n in wheel.namelist() if ".dist-info/" not in n]
    assert "platoon_textcraft/data/SHA256SUMS" in names
    assert not [n for n in names if "configs/" in n or Path(n).name in configs]


def test_the_meta_package_ships_no_modules_and_keeps_the_command(dist_dir):
    with _wheel("platoon", dist_dir) as wheel:
        assert not [n for n in wheel.namelist() if ".dist-info/" not in n]
        entry_points = wheel.read(f"{_archive_stem('platoon', dist_dir)}.dist-info/entry_points.txt").decode()
    assert "platoon = platoon.cli:main" in entry_points


def test_third_party_requirements_are_ranges_the_lock_satisfies(dist_dir):
    lock = tomllib.loads((ROOT / "uv.lock").read_text(encoding="utf-8"))
    locked = {canonicalize_name(p["name"]): p["version"] for p in lock["package"] if "version" in p}
    for name in PACKAGES:
        for line in _wheel_metadata(name, dist_dir).get_all("Requires-Dist") or []:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) in PACKAGES:
                continue  # siblings move together and may pin each other exactly
            operators = {spec.operator for spec in requirement.specifier}
            assert not operators & {"==", "==="}, f"{name} pins {line}: give a compatible range"
            version = locked.get(canonicalize_name(requirement.name))
            if version is not None:  # what CI tests is inside the range
                assert requirement.specifier.contains(version, prereleases=True), (name, line, version)


def test_the_sdk_extras_take_the_tested_versions_as_lower_bounds(dist_dir):
    requires = [
        Requirement(line) for line in _wheel_metadata("platoon-core", dist_dir).get_all("Requires-Dist")
    ]
    bounds = {r.name: str(r.specifier) for r in requires if r.name in {"tinker", "openreward"}}
    assert bounds == {"tinker": "<0.39,>=0.16.1", "openreward": "<0.2,>=0.1.167"}


def _imported_top_levels(source_dir: Path) -> set[str]:
    found: set[str] = set()
    for path in source_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


#: imports a package may make without declaring their distribution, and why
UNDECLARED_ON_PURPOSE = {
    "pytest": "platoon.testing's pytest plugin runs only inside pytest",
    "wandb": "optional W&B logging: without it, stats.wandb is refused in one line naming `pip install wandb`",
    "pydantic_core": "pydantic pins the pydantic-core it is built on; platoon reads its error and sentinel types",
    "openai": "platoon.testing.conformance drives the HTTP dialects with the real client; without it those cells are n/a",
    "anthropic": "platoon.testing.conformance drives Anthropic Messages with the real client; without it those are n/a",
    "openhands": "the openhands spec's run_openhands.py runs under its toolchain's interpreter, which has the SDK",
}

#: module -> its distribution, for what the dev environment leaves out on purpose (torch is installed only in the
#: torch-engine group's environment), so that no installed metadata names its provider there
NOT_IN_DEV_ENVIRONMENT = {"torch": "torch"}


@pytest.mark.parametrize(("name", "module"), [(n, m) for n, m in sorted(PACKAGES.items()) if m])
def test_every_module_a_package_imports_is_declared(name, module, dist_dir):
    """A package's own imports (at module level or inside functions) come from the standard library, the
    package itself, or a distribution its wheel declares (extras included: those imports are behind the extra)."""
    own_dir = ROOT / "packages" / name / "src" / module
    declared = {canonicalize_name(name)} | {
        canonicalize_name(Requirement(line).name)
        for line in _wheel_metadata(name, dist_dir).get_all("Requires-Dist") or []
    }
    # editable installs of the workspace's own packages map no module to their distribution
    providers = {**metadata.packages_distributions(), **{m: [n] for n, m in PACKAGES.items() if m}}
    undeclared = {}
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for top in sorted(_imported_top_levels(own_dir) - stdlib - set(UNDECLARED_ON_PURPOSE)):
        found = providers.get(top) or ([NOT_IN_DEV_ENVIRONMENT[top]] if top in NOT_IN_DEV_ENVIRONMENT else [])
        dists = {canonicalize_name(d) for d in found}
        if not dists & declared:
            undeclared[top] = sorted(dists) or ["(no installed distribution)"]
    assert undeclared == {}


def test_plain_uv_build_at_the_root_refuses_with_the_command_that_builds_the_packages(tmp_path):
    uv = shutil.which("uv")
    assert uv
    result = subprocess.run(
        [uv, "build", "--out-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "uv build --all-packages" in result.stderr
    assert "Traceback" not in result.stderr
    assert [p.name for p in tmp_path.iterdir()] in ([], [".gitignore"])  # uv marks its output folder ignored
    assert not list(ROOT.glob("*.egg-info"))


def test_the_readme_install_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = readme[readme.index("## Install") : readme.index("## The main job")]
    ci = (
        (ROOT / ".ci/packaging")
        .read_text(encoding="utf-8")
        .replace('"$version"', "0.2.0")
        .replace("$version", "0.2.0")
    )
    assert "bash .ci/packaging" in (ROOT / ".ci/run").read_text(encoding="utf-8")
    for fragment in (
        "uv build --all-packages",
        'install "./dist/platoon-0.2.0-py3-none-any.whl[tinker,ors]" ./dist/platoon_*-0.2.0-py3-none-any.whl',
        "pip install ./dist/platoon_core-0.2.0-py3-none-any.whl",
        '"platoon[tinker,ors] @ $git_url#subdirectory=packages/platoon"',
        '"platoon-harbor @ $git_url#subdirectory=packages/platoon-harbor"',
    ):
        assert fragment in install, fragment
        assert fragment.replace("install ", "").replace("pip ", "") in ci, fragment
    assert "uv add" in install and "uv add" in ci
