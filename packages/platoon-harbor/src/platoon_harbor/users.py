"""Task users: a task may name the user its agent and its verifier run as. The sandbox's
commands then run as that user, and platoon's own steps in it (making the log directories, resetting and reading
the verifier's files, collecting artifacts) run as root through a view of the sandbox that `as_user` makes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["as_user", "give"]


def as_user(sandbox: Any, user: str | None) -> Any:
    """`sandbox`, or a view of it whose commands run as `user` (root: "0") when one is given. Only a provider with
    `run_as_user` takes `exec(..., user=...)`; Harbor asks for it only in sandboxes started with a user."""
    return sandbox if user is None else _AsUser(sandbox, user)


class _AsUser:
    def __init__(self, sandbox: Any, user: str) -> None:
        self._sandbox = sandbox
        self._user = user

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sandbox, name)

    async def exec(self, cmd: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("user", self._user)
        return await self._sandbox.exec(cmd, **kwargs)


# Run as root: give user $1 the directories after `--` of $2 (always) and those after it only when empty (a workdir
# the image left empty, often made by the engine itself); a non-empty one stays as the image has it.
_GIVE = r"""
user=$1; always=$2; shift 2
for d in "$@"; do
  if [ "$always" -gt 0 ]; then
    always=$((always - 1))
  else
    for f in "$d"/* "$d"/.[!.]* "$d"/..?*; do
      if [ -e "$f" ] || [ -L "$f" ]; then continue 2; fi
    done
  fi
  chown "$user" "$d" || exit 1
done
"""


async def give(sandbox: Any, user: str | None, paths: Sequence[str], if_empty: Sequence[str] = ()) -> None:
    """Give `user` the directories platoon made for its commands (`paths`), and those of `if_empty` that are empty.
    `sandbox` runs commands as root (an `as_user(..., "0")` view); nothing happens without a user."""
    if user is None or not (paths or if_empty):
        return
    argv = ["sh", "-c", _GIVE, "platoon-give", user, str(len(paths)), *paths, *if_empty]
    result = await sandbox.exec(argv, timeout_s=60, cwd="/")
    if result.exit_code != 0:
        said = (result.stderr or result.stdout).strip()[:300]
        raise RuntimeError(f"giving {', '.join([*paths, *if_empty])} to user {user} failed: {said}")
