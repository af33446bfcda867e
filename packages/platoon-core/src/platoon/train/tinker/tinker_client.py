"""The calls a training start makes on its Tinker service: each with a refused key turned into the one-line
refusal (`call_service`), and the training client it trains (`training_client`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from platoon.gateway import tinker_sdk
from platoon.gateway.tinker_service import missing_client_config_error, refused_key_error
from platoon.train.tinker.heartbeat import say

if TYPE_CHECKING:
    from platoon.config.training import PlatoonTinkerRLTrainerConfig
    from platoon.train.tinker.checkpoints import ResumePoint

__all__ = ["call_service", "training_client"]


async def call_service[T](what: str, base_url: str | None, make: Callable[[], Awaitable[T]]) -> T:
    """Await `make()`; a 401/403 from the service becomes the one-line key refusal, a service without the route
    the installed SDK asks first the one-line refusal that names the SDK to install."""
    try:
        return await make()
    except Exception as exc:
        refused = refused_key_error(exc, base_url=base_url, what=what) or missing_client_config_error(
            exc, base_url=base_url
        )
        if refused is not None:
            raise refused from None
        raise


async def training_client(
    service: Any, config: PlatoonTinkerRLTrainerConfig, resume: ResumePoint | None, base_url: str | None
) -> Any:
    """Resume: from the state with its optimizer; else `checkpoint.load_checkpoint_path` (weights only, a fresh
    optimizer); else a new LoRA client."""
    train_cfg = config.train
    if resume is not None:
        path = resume.row.state_path
        assert path is not None  # a resume point is a row with a state_path
        say(f"resuming at step {resume.start_batch + 1} from {resume.row.name} ({path})")
        return await call_service(
            "a training client",
            base_url,
            lambda: tinker_sdk.call(service, "create_training_client_from_state_with_optimizer", path),
        )
    load = config.checkpoint.load_checkpoint_path
    if load is not None:
        return await call_service(
            "a training client",
            base_url,
            lambda: tinker_sdk.call(service, "create_training_client_from_state", load),
        )
    return await call_service(
        "a training client",
        base_url,
        lambda: tinker_sdk.call(
            service, "create_lora_training_client", base_model=train_cfg.model_name, rank=train_cfg.lora_rank
        ),
    )
