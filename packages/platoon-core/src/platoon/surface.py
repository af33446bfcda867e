"""The declared plugin surface: the only core modules a plugin package may import.

Everything else in core may move or change between releases without notice; these keep their names. A plugin needing
a name from elsewhere gets it re-exported from one of these (or the module joins this list), never a deep import.
tests/core/test_plugin_surface.py fails on any other `platoon.*` import in a plugin package, and docs/extending.md
lists the same modules.
"""

from __future__ import annotations

#: module -> what a plugin uses it for
PLUGIN_SURFACE: dict[str, str] = {
    "platoon": "the public API: `Task`, `EnvironmentEntry`, `get_harness`, `hookimpl`, the `@harness` decorator",
    "platoon.hookspecs": "the hook specifications and the records hooks return (`SpecRunner`, `PrepareStep`, ...)",
    "platoon.errors": "the errors core reports (`ConfigError`, `ExtensionError`, ...)",
    "platoon.deprecations": "deprecating a plugin's own keys (`DeprecatedKey`) and printing a config's deprecations",
    "platoon.config": "loading a config, the site profile and cache root, the config models a plugin builds",
    "platoon.console": "printing like every command: `err` (stderr, `platoon: ` prefix), `out`, `table`, `new_app`",
    "platoon.prepare": "the environments `platoon prepare` reads and where their caches live",
    "platoon.envs.service": "the environment service contract (`EnvironmentService`, `EnvSession`, `Outcome`, `infra_from_exception`)",
    "platoon.envs.gate": "the gate that admits a session's calls (`Gate`, `EnvBusy`), the lease and view sessions build on",
    "platoon.harness.agent": "the harness contract: `AgentContext`, `AgentResult`, `Budget`",
    "platoon.harness.function": "the `harness` decorator that registers a function harness",
    "platoon.harness.spec": "TOML harness specs (`HarnessSpec`) and their errors",
    "platoon.harness.codeact": "the CodeAct prompt builder contract and its options",
    "platoon.gateway": "the model gateway a harness's agents call through, and its HTTP server",
    "platoon.sandbox": "the sandbox contract (`Sandbox`, `SandboxProvider`)",
    "platoon.sandbox_runs": "a run's sandboxes: the label that marks them, their providers, reaping them",
    "platoon.host_env": "which of the host's environment variables a child process inherits",
    "platoon.rollouts.records": "the run-directory records (`process.json`, the resolved config, atomic writes)",
    "platoon.rollouts.one_rollout": "one rollout of one task outside a run (a plugin's self-check)",
}
