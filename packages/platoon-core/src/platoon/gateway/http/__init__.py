"""The model gateway over HTTP: OpenAI Chat Completions, the experimental Responses and Anthropic
Messages dialects, the agents endpoint and the seams for the MCP plane and hosted inference, on starlette + uvicorn.

Light to import: starlette and uvicorn load when a server starts.
"""

from __future__ import annotations

from platoon.gateway.http.server import ChatBackend, GatewayServer, serving

__all__ = ["ChatBackend", "GatewayServer", "serving"]
