"""A bigram-table model with the `ModelBackend` interface: enough to test the server's protocol layer alone."""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any

import torch

from platoon.renderers.toy import TOY_TOKENIZER_DIR

VOCAB = 265


def _tokens(datum: dict[str, Any]) -> list[int]:
    return [t for chunk in datum["model_input"]["chunks"] for t in chunk["tokens"]]


class BigramBackend:
    """logits of the next token = table[previous token]; the local server's losses."""

    tokenizer_dir = str(TOY_TOKENIZER_DIR)

    def __init__(self, base_model: str, seed: int) -> None:
        self.base_model = base_model
        generator = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(VOCAB, VOCAB, generator=generator) * 0.1)
        self.optimizer: torch.optim.AdamW | None = None
        self.created_calls = 0

    @classmethod
    def create(
        cls, base_model: str, *, lora_rank: int | None = None, seed: int | None = None
    ) -> BigramBackend:
        if base_model not in ("platoon/toy", "other/toy"):
            raise ValueError(f"unknown base model {base_model!r}")
        return cls(base_model, seed=sum(map(ord, base_model)))

    def info(self) -> dict[str, Any]:
        return {"arch": "bigram", "model_name": self.base_model, "is_lora": False, "lora_rank": None}

    def _logprobs(self, datum: dict[str, Any]) -> torch.Tensor:
        tokens = torch.tensor(_tokens(datum))
        targets = torch.tensor(datum["loss_fn_inputs"]["target_tokens"]["data"])
        return torch.log_softmax(self.table[tokens], dim=-1).gather(-1, targets[:, None])[:, 0]

    def _loss(
        self, datum: dict[str, Any], loss_fn: str, config: dict[str, Any] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lp = self._logprobs(datum)
        inputs = datum["loss_fn_inputs"]
        if loss_fn == "cross_entropy":
            return -(lp * torch.tensor(inputs["weights"]["data"])).sum(), lp
        q = torch.tensor(inputs["logprobs"]["data"])
        adv = torch.tensor(inputs["advantages"]["data"])
        ratio = torch.exp(lp - q)
        lo = (config or {}).get("clip_low_threshold", 0.8)
        hi = (config or {}).get("clip_high_threshold", 1.2)
        if loss_fn == "importance_sampling":
            return -(ratio * adv).sum(), lp
        if loss_fn == "ppo":
            return -torch.minimum(ratio * adv, ratio.clamp(lo, hi) * adv).sum(), lp
        if loss_fn == "cispo":
            return -(ratio.clamp(lo, hi).detach() * lp * adv).sum(), lp
        raise ValueError(f"unknown loss {loss_fn!r}")

    def _run(
        self, data: list[dict[str, Any]], loss_fn: str, config: dict[str, Any] | None, backward: bool
    ) -> dict[str, Any]:
        for datum in data:
            for token in _tokens(datum):
                if not 0 <= token < VOCAB:
                    raise ValueError(f"token {token} is outside the vocabulary of {VOCAB}")
        total = torch.zeros(())
        outputs = []
        for datum in data:
            loss, lp = self._loss(datum, loss_fn, config)
            total = total + loss
            outputs.append({"logprobs": {"data": lp.tolist(), "dtype": "float32", "shape": [len(lp)]}})
        if backward:
            total.backward()
        return {
            "loss_fn_output_type": "ArrayRecord",
            "loss_fn_outputs": outputs,
            "metrics": {"loss:sum": float(total.detach())},
        }

    def forward(
        self, data: list[dict[str, Any]], loss_fn: str, loss_fn_config: dict[str, Any] | None
    ) -> dict[str, Any]:
        with torch.no_grad():
            return self._run(data, loss_fn, loss_fn_config, backward=False)

    def forward_backward(
        self, data: list[dict[str, Any]], loss_fn: str, loss_fn_config: dict[str, Any] | None
    ) -> dict[str, Any]:
        return self._run(data, loss_fn, loss_fn_config, backward=True)

    def optim_step(self, adam_params: dict[str, Any]) -> dict[str, Any]:
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW([self.table], lr=adam_params["learning_rate"])
        for group in self.optimizer.param_groups:
            group.update(
                lr=adam_params["learning_rate"],
                betas=(adam_params["beta1"], adam_params["beta2"]),
                eps=adam_params["eps"],
                weight_decay=adam_params["weight_decay"],
            )
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {"metrics": {"lr:mean": adam_params["learning_rate"]}}

    def sample(
        self,
        prompt_tokens: list[int],
        *,
        num_samples: int,
        sampling_params: dict[str, Any],
        prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> dict[str, Any]:
        generator = torch.Generator()
        seed = sampling_params.get("seed")
        generator.manual_seed(seed if seed is not None else torch.seed())
        stop = set(sampling_params.get("stop") or [])
        max_tokens = sampling_params.get("max_tokens") or 16
        temperature = sampling_params["temperature"]
        sequences: list[dict[str, Any]] = []
        with torch.no_grad():
            for _ in range(num_samples):
                tokens: list[int] = []
                logprobs: list[float] = []
                prev = prompt_tokens[-1]
                reason = "length"
                for _ in range(max_tokens):
                    dist = torch.log_softmax(self.table[prev] / temperature, dim=-1)
                    token = int(torch.multinomial(dist.exp(), 1, generator=generator))
                    tokens.append(token)
                    logprobs.append(float(dist[token]))
                    prev = token
                    if token in stop:
                        reason = "stop"
                        break
                sequences.append({"tokens": tokens, "logprobs": logprobs, "stop_reason": reason})
            out: dict[str, Any] = {"sequences": sequences, "prompt_logprobs": None}
            if prompt_logprobs:
                lps: list[float | None] = [None]
                for prev, token in itertools.pairwise(prompt_tokens):
                    lps.append(float(torch.log_softmax(self.table[prev], dim=-1)[token]))
                out["prompt_logprobs"] = lps
        assert all(math.isfinite(x) for s in sequences for x in s["logprobs"])
        return out

    def save(self, path: str, *, with_optimizer: bool) -> None:
        state: dict[str, Any] = {"table": self.table.detach().clone()}
        if with_optimizer and self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        torch.save(state, path)

    def load(self, path: str, *, with_optimizer: bool) -> None:
        state = torch.load(path)
        with torch.no_grad():
            self.table.copy_(state["table"])
        if with_optimizer and "optimizer" in state:
            self.optimizer = torch.optim.AdamW([self.table])
            self.optimizer.load_state_dict(state["optimizer"])

    def sampler(self) -> BigramBackend:
        clone = copy.copy(self)
        clone.table = torch.nn.Parameter(self.table.detach().clone())
        clone.optimizer = None
        return clone
