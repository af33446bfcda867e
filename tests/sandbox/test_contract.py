"""The provider contract: a spec refuses what no provider could honour, before any start."""

from __future__ import annotations

import pytest

from platoon.sandbox import ExecResult, Mount, SandboxSpec


def test_a_spec_defaults_to_a_local_image_on_the_host_network_in_app():
    spec = SandboxSpec()
    assert (spec.image, spec.workdir, spec.network, spec.mounts, spec.upstreams) == (
        "local",
        "/app",
        "host",
        (),
        {},
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"network": "bridge"}, "network must be one of host, none, public, allowlist"),
        (
            {"network": "public", "allowed_hosts": ["pypi.org"]},
            "allowed_hosts is for network: allowlist only",
        ),
        ({"pids_limit": 0}, "pids_limit must be a positive integer"),
        ({"storage_mb": -5}, "storage_mb must be a positive integer"),
        ({"workdir": "app"}, "workdir must be an absolute path"),
        ({"mounts": [Mount("/data", "data")]}, "mount target must be an absolute path"),
        ({"upstreams": {"model": "ftp://x"}}, r"must be unix:///abs/path\.sock or http\(s\)://host:port"),
        (
            {"network": "none", "upstreams": {"model": "http://127.0.0.1:9"}},
            "reaches only Unix-socket upstreams",
        ),
        (
            {"network": "public", "upstreams": {"judge": "http://127.0.0.1:9"}},
            "on the host's loopback .* a network: public sandbox cannot reach it",
        ),
        (
            {"network": "allowlist", "upstreams": {"judge": "https://localhost:8443/v1"}},
            "on the host's loopback .* a network: allowlist sandbox cannot reach it",
        ),
    ],
)
def test_a_spec_no_provider_could_honour_is_refused_when_made(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SandboxSpec(**kwargs)


def test_a_public_spec_keeps_its_unix_socket_and_outside_tcp_upstreams():
    spec = SandboxSpec(
        network="public", upstreams={"model": "unix:///run/gw/gw.sock", "judge": "https://judge.example:443"}
    )
    assert spec.upstreams == {"model": "unix:///run/gw/gw.sock", "judge": "https://judge.example:443"}


def test_a_no_network_spec_keeps_its_unix_socket_upstreams():
    spec = SandboxSpec(network="none", upstreams={"model": "unix:///run/gw/gw.sock"})
    assert spec.upstreams == {"model": "unix:///run/gw/gw.sock"}


def test_a_result_is_ok_only_when_it_exited_zero_in_time():
    assert ExecResult(0, "", "").ok
    assert not ExecResult(1, "", "").ok
    assert not ExecResult(0, "", "", timed_out=True).ok
