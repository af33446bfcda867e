"""What the container providers (docker, singularity, enroot) run inside a sandbox through its exec to tell the
sandbox's own processes from the commands' (`kill_processes` ends only the latter): the scripts, and the record of
the own processes they list right after start.

The own processes (an init, a keep-alive, a runtime's helpers) are recorded by pid and start time, so a pid reused
later by a command is not spared; the forwarders of the sandbox's routes are spared the same way.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

__all__ = ["KILL_ALL", "LIST_OWN", "OwnProcesses"]

# The scripts below run inside the sandbox under /bin/sh (busybox or Debian). Both list and kill skip the script's
# own ancestors that live inside the sandbox's PID namespace (a runtime's exec helper may): they belong to this
# exec, not to a command. They fork nothing before their first kill pass: a sandbox at its pids limit (a fork bomb)
# has no process to spare for a subshell.

# Sets `anc` to this exec's ancestors inside the namespace as " pid pid ... " (a shell function, pasted into both
# scripts; it sets a variable rather than printing, since `$(...)` would fork).
ANCESTORS = r"""
ancestors() {
  anc=" "; p=$$
  while [ "$p" -gt 1 ] 2>/dev/null; do
    read -r s 2>/dev/null < "/proc/$p/stat" || break
    s=${s##*) }; set -- $s; p=$2
    anc="$anc$p "
  done
}
"""

# Lists the sandbox's own processes (pid:starttime, one a line) except this script, its children and ancestors,
# then the PID namespace of this script (to refuse kill_processes in a sandbox sharing the caller's namespace).
LIST_OWN = (
    ANCESTORS
    + r"""
me=$$; ancestors; skip=$anc
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [ "$p" = "$me" ] && continue
  case "$skip" in *" $p "*) continue ;; esac
  read -r s 2>/dev/null < "$d/stat" || continue
  s=${s##*) }
  set -- $s
  [ "$2" = "$me" ] && continue
  echo "$p:${20}"
done
echo "ns:$(readlink /proc/self/ns/pid)"
"""
)

# Freezes every process, SIGKILLs all but the recorded ones ($1: pid:starttime ...) and this exec's ancestors in
# passes, continues the survivors; exit 1 when something else survives. Builtins only while processes are frozen.
KILL_ALL = (
    ANCESTORS
    + r"""
keep=" $1 "; me=$$; ancestors; skip=$anc
kill -s STOP -1 2>/dev/null
pass=0; left=1
while [ $pass -lt 50 ]; do
  pass=$((pass + 1)); left=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$me" ] && continue
    case "$skip" in *" $p "*) continue ;; esac
    read -r s 2>/dev/null < "$d/stat" || continue
    s=${s##*) }
    set -- $s
    [ "$1" = Z ] && continue
    case "$keep" in *" $p:${20} "*) continue ;; esac
    kill -9 "$p" 2>/dev/null
    left=1
  done
  [ $left = 0 ] && break
  # A SIGKILLed process is gone only once it is scheduled again: on a loaded machine that takes a moment.
  [ $pass -gt 2 ] && { sleep 0.1 2>/dev/null || sleep 1; }
done
kill -s CONT -1 2>/dev/null
[ $left = 0 ]
"""
)


@dataclass
class OwnProcesses:
    """The sandbox's own processes as `LIST_OWN` printed them (`pid:starttime`), and whether the sandbox shares
    this process's PID namespace (then its processes cannot be told apart from the caller's)."""

    listed: list[str] = field(default_factory=list)
    shares_pid_ns: bool = False

    @classmethod
    def parse(cls, stdout: str) -> OwnProcesses:
        own = cls()
        for line in stdout.splitlines():
            if line.startswith("ns:"):
                with contextlib.suppress(OSError):
                    own.shares_pid_ns = line[3:] == os.readlink("/proc/self/ns/pid")
            elif line.strip():
                own.listed.append(line.strip())
        return own

    def kill_refusal(self, sandbox: str) -> str | None:
        """Why `kill_processes` must refuse in this sandbox, or None."""
        if self.shares_pid_ns:
            return (
                f"sandbox {sandbox} shares this process's PID namespace: its processes cannot be told apart"
            )
        if not self.listed:
            return f"the own processes of sandbox {sandbox} were not recorded at start"
        return None

    def keep(self, *more: str) -> str:
        """`KILL_ALL`'s argument: these and `more` (the forwarders), space-separated."""
        return " ".join([*self.listed, *more])
