"""A bigram-table model with the `ModelBackend` interface: enough to test the server's protocol layer alone."""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any

import numpy as np

from platoon.local_server import losses
from platoon.local_server.qwen3_numpy import AdamW
from platoon.renderers.toy import TOY_TOKENIZER_DIR

VOCAB = 265


def _tokens(datum: dict[str, Any]) -> list[int]:
    return [t for chunk in datum["model_input"]["chunks"] for t in chunk["tokens"]]


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class BigramBackend:
    """logits of the next token = table[previous token]; the local server's losses, in numpy."""

    tokenizer_dir = str(TOY_TOKENIZER_DIR)

    def __init__(self, base_model: str, seed: int) -> None:
        self.base_model = base_model
        rng = np.random.default_rng(seed)
        self.table = (rng.standard_normal((VOCAB, VOCAB)) * 0.1).astype(np.float32)
        self.grad = np.zeros_like(self.table)
        self.optimizer: AdamW | None = None
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

    def _run(
        self, data: list[dict[str, Any]], loss_fn: str, config: dict[str, Any] | None, backward: bool
    ) -> dict[str, Any]:
        for datum in data:
            for token in _tokens(datum):
                if not 0 <= token < VOCAB:
                    raise ValueError(f"token {token} is outside the vocabulary of {VOCAB}")
        loss_of = losses.get_loss(loss_fn)
        total = 0.0
        outputs = []
        for datum in data:
            tokens = np.asarray(_tokens(datum))
            inputs = {
                key: np.asarray(value["data"], dtype=np.int64 if key == "target_tokens" else np.float32)
                for key, value in datum["loss_fn_inputs"].items()
            }
            targets = inputs["target_tokens"]
            log_probs = _log_softmax(self.table[tokens])
            lp = log_probs[np.arange(len(tokens)), targets]
            loss, grad = loss_of(lp, inputs, {k: v for k, v in (config or {}).items() if v is not None})
            total += float(loss.sum())
            if backward:
                # d lp / d table[prev] = onehot(target) - softmax(table[prev])
                rows = -np.exp(log_probs) * grad[:, None]
                rows[np.arange(len(tokens)), targets] += grad
                np.add.at(self.grad, tokens, rows)
            outputs.append({"logprobs": {"data": lp.tolist(), "dtype": "float32", "shape": [len(lp)]}})
        return {
            "loss_fn_output_type": "ArrayRecord",
            "loss_fn_outputs": outputs,
            "metrics": {"loss:sum": total},
        }

    def forward(
        self, data: list[dict[str, Any]], loss_fn: str, loss_fn_config: dict[str, Any] | None
    ) -> dict[str, Any]:
        return self._run(data, loss_fn, loss_fn_config, backward=False)

    def forward_backward(
        self, data: list[dict[str, Any]], loss_fn: str, loss_fn_config: dict[str, Any] | None
    ) -> dict[str, Any]:
        return self._run(data, loss_fn, loss_fn_config, backward=True)

    def optim_step(self, adam_params: dict[str, Any]) -> dict[str, Any]:
        if self.optimizer is None:
            self.optimizer = AdamW()
        self.optimizer.step(
            {"table": self.table},
            {"table": self.grad},
            lr=adam_params["learning_rate"],
            beta1=adam_params["beta1"],
            beta2=adam_params["beta2"],
            eps=adam_params["eps"],
            weight_decay=adam_params["weight_decay"],
        )
        self.grad.fill(0.0)
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
        rng = np.random.default_rng(sampling_params.get("seed"))
        stop = set(sampling_params.get("stop") or [])
        max_tokens = sampling_params.get("max_tokens") or 16
        temperature = sampling_params["temperature"]
        sequences: list[dict[str, Any]] = []
        for _ in range(num_samples):
            tokens: list[int] = []
            logprobs: list[float] = []
            prev = prompt_tokens[-1]
            reason = "length"
            for _ in range(max_tokens):
                dist = _log_softmax(self.table[prev] / temperature)
                probs = np.exp(dist.astype(np.float64))
                token = int(rng.choice(VOCAB, p=probs / probs.sum()))
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
                lps.append(float(_log_softmax(self.table[prev])[token]))
            out["prompt_logprobs"] = lps
        assert all(math.isfinite(x) for s in sequences for x in s["logprobs"])
        return out

    def save(self, path: str, *, with_optimizer: bool) -> None:
        state = {"table": self.table}
        if with_optimizer and self.optimizer is not None:
            state |= {f"optimizer.{key}": value for key, value in self.optimizer.state_dict().items()}
        with open(path, "wb") as file:
            np.savez(file, **state)

    def load(self, path: str, *, with_optimizer: bool) -> None:
        with np.load(path) as state:
            self.table[...] = state["table"]
            saved = {key.removeprefix("optimizer."): state[key] for key in state.files if key != "table"}
        if with_optimizer and saved:
            self.optimizer = AdamW()
            self.optimizer.load_state_dict(saved)

    def sampler(self) -> BigramBackend:
        clone = copy.copy(self)
        clone.table = self.table.copy()
        clone.grad = np.zeros_like(self.table)
        clone.optimizer = None
        return clone
