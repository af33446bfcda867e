"""What the gateway's HTTP server and its dialect modules share: the wire's JSON bytes and the disconnect error.

It sits below both, so the dialects never import the server (the server imports the dialects for its routes).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ClientGone", "dumps"]


class ClientGone(Exception):
    """The client disconnected before the reply was ready: the call was cancelled and nothing recorded."""


def dumps(value: Any) -> bytes:
    """Compact JSON bytes (the wire format of every reply and event)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
