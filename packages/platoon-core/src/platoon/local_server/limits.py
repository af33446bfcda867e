"""The local server's request-body cap, below both the package (which starts the server) and its app."""

from __future__ import annotations

#: the largest request body the server reads; the SDK sends forward_backward in chunks of about 5 MB (15 MB of JSON)
DEFAULT_MAX_BODY_BYTES = 64 << 20
