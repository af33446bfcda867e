"""The distributions as a user installs them: the meta package's extras, py.typed, entry points of the built-ins."""

from __future__ import annotations

from importlib import metadata
from importlib.resources import files

import pytest
from packaging.requirements import Requirement

PACKAGES = {
    "platoon-core": "platoon",
    "platoon-harnesses": "platoon_harnesses",
    "platoon-sandbox": "platoon_sandbox",
    "platoon-harbor": "platoon_harbor",
    "platoon-textcraft": "platoon_textcraft",
}


def _requirements(dist: str) -> list[Requirement]:
    return [Requirement(line) for line in metadata.requires(dist) or []]


def test_meta_package_depends_on_the_product_and_forwards_its_extras():
    requirements = _requirements("platoon")
    plain = {r.name for r in requirements if r.marker is None}
    assert plain == {"platoon-core", "platoon-harnesses", "platoon-sandbox", "platoon-harbor"}
    forwarded = {
        extra: {
            f"{r.name}[{','.join(sorted(r.extras))}]"
            for r in requirements
            if r.marker and r.marker.evaluate({"extra": extra})
        }
        for extra in ("tinker", "ors", "hpc", "local", "local-torch")
    }
    assert forwarded == {
        "tinker": {"platoon-core[tinker]"},
        "ors": {"platoon-core[ors]"},
        "hpc": {"platoon-sandbox[hpc]"},
        "local": {"platoon-core[local]"},
        "local-torch": {"platoon-core[local-torch]"},
    }
    assert metadata.version("platoon") == metadata.version("platoon-core") == "0.2.0"


def test_only_the_local_torch_extra_brings_torch_and_none_the_cookbook():
    tinker = {
        r.name for r in _requirements("platoon-core") if r.marker and r.marker.evaluate({"extra": "tinker"})
    }
    assert tinker == {"tinker", "transformers", "tokenizers", "numpy", "huggingface-hub"}
    local = {
        r.name for r in _requirements("platoon-core") if r.marker and r.marker.evaluate({"extra": "local"})
    }
    # the numpy engine, its safetensors checkpoints, the toy tokenizer; protobuf and zstandard: the local server
    # speaks SDK 0.25+'s protobuf wire (zstd-compressed bodies)
    assert local == {"numpy", "safetensors", "tokenizers", "protobuf", "zstandard"}
    local_torch = {
        r.name
        for r in _requirements("platoon-core")
        if r.marker and r.marker.evaluate({"extra": "local-torch"})
    }
    assert local_torch == local | {"torch", "transformers"}


@pytest.mark.parametrize(("dist", "module"), sorted(PACKAGES.items()))
def test_every_package_ships_type_information(dist, module):
    assert files(module).joinpath("py.typed").is_file()
    assert metadata.version(dist)


def test_core_builtins_are_declared_as_entry_points():
    declared = {(ep.group, ep.name) for ep in metadata.distribution("platoon-core").entry_points}
    assert {
        ("platoon.programs", "single"),
        ("platoon.programs", "gym"),
        ("platoon.reward_processors", "platoon-delegation"),
        ("console_scripts", "platoon"),
    } <= declared
    groups = {
        (ep.group, ep.name)
        for d in ("platoon-harbor", "platoon-sandbox", "platoon-harnesses")
        for ep in metadata.distribution(d).entry_points
    }
    assert {
        ("platoon.commands", "harbor"),
        ("platoon.commands", "sandbox"),
        ("platoon.commands", "toolchain"),
    } <= groups
