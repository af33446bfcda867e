"""transformers' Qwen3 decoder in numpy: forward, a hand-written backward, KV-cache decoding and AdamW.

The local server's numpy engine trains its toy model with this module, so the default environment needs no torch.
It computes what `transformers.Qwen3ForCausalLM` computes (the head tied to the embedding or its own, RMSNorm, q/k
norms per head before RoPE, grouped-query causal attention, SwiGLU, no biases) with the same weight names and shapes, so a state dict
moves between the two unchanged. Everything is float32 (float64 only for gradient checks), every matrix product
goes through BLAS via `@` with BLAS's own thread count, tokens are never looped over in Python, and heads are
batched. Attention runs a block of query rows at a time and keeps only each row's logsumexp for the backward,
which recomputes the probabilities, so a long sequence costs bounded memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]

#: transformers' `Qwen3Config` defaults for what the local model's shape leaves out
DEFAULT_RMS_NORM_EPS = 1e-6
DEFAULT_ROPE_THETA = 10000.0
#: `Qwen3Config.initializer_range`: the standard deviation of initial embedding and linear weights
INITIALIZER_RANGE = 0.02

#: the output head's weight; transformers' `state_dict()` of a tied model lists the embedding's tensor under it too
HEAD = "lm_head.weight"
EMBEDDING = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"


class ShapeLike(Protocol):
    """What `Qwen3Dims.from_shape` reads: the fields of the local server's `ModelShape`."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def max_position_embeddings(self) -> int: ...


@dataclass(frozen=True)
class Qwen3Dims:
    """The sizes and constants of a Qwen3 model, as in `Qwen3Config`.

    `pad_token_id` is the embedding's `padding_idx` in transformers: that row starts at zero and gets no gradient
    from the input lookup (a tied head still trains it). None: no such row. `tie_word_embeddings` False gives the
    model its own output head, `lm_head.weight` (Qwen3 from 8B up; the toy model and the small ones tie it).
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = DEFAULT_RMS_NORM_EPS
    rope_theta: float = DEFAULT_ROPE_THETA
    max_position_embeddings: int = 32768
    pad_token_id: int | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"pad_token_id {self.pad_token_id} is outside the vocabulary of {self.vocab_size}"
            )

    @classmethod
    def from_shape(cls, shape: ShapeLike, vocab_size: int, pad_token_id: int | None = None) -> Qwen3Dims:
        """The dims of a `ModelShape` (or any object with its fields) with `Qwen3Config`'s default eps and theta."""
        return cls(
            vocab_size=vocab_size,
            hidden_size=shape.hidden_size,
            num_hidden_layers=shape.num_hidden_layers,
            num_attention_heads=shape.num_attention_heads,
            num_key_value_heads=shape.num_key_value_heads,
            head_dim=shape.head_dim,
            intermediate_size=shape.intermediate_size,
            max_position_embeddings=shape.max_position_embeddings,
            pad_token_id=pad_token_id,
        )

    @property
    def head(self) -> str:
        """The name of the weight the output head multiplies by: the embedding's when tied."""
        return EMBEDDING if self.tie_word_embeddings else HEAD

    @property
    def groups(self) -> int:
        """Query heads per key-value head."""
        return self.num_attention_heads // self.num_key_value_heads


def weight_shapes(dims: Qwen3Dims) -> dict[str, tuple[int, ...]]:
    """Every weight's name and shape, in the order of `Qwen3ForCausalLM.state_dict()` (`lm_head.weight` only
    when the head is untied)."""
    hidden, head = dims.hidden_size, dims.head_dim
    shapes: dict[str, tuple[int, ...]] = {EMBEDDING: (dims.vocab_size, hidden)}
    for i in range(dims.num_hidden_layers):
        prefix = f"model.layers.{i}."
        shapes |= {
            prefix + "self_attn.q_proj.weight": (dims.num_attention_heads * head, hidden),
            prefix + "self_attn.k_proj.weight": (dims.num_key_value_heads * head, hidden),
            prefix + "self_attn.v_proj.weight": (dims.num_key_value_heads * head, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, dims.num_attention_heads * head),
            prefix + "self_attn.q_norm.weight": (head,),
            prefix + "self_attn.k_norm.weight": (head,),
            prefix + "mlp.gate_proj.weight": (dims.intermediate_size, hidden),
            prefix + "mlp.up_proj.weight": (dims.intermediate_size, hidden),
            prefix + "mlp.down_proj.weight": (hidden, dims.intermediate_size),
            prefix + "input_layernorm.weight": (hidden,),
            prefix + "post_attention_layernorm.weight": (hidden,),
        }
    shapes[FINAL_NORM] = (hidden,)
    if not dims.tie_word_embeddings:
        shapes[HEAD] = (dims.vocab_size, hidden)
    return shapes


def initial_weights(dims: Qwen3Dims, seed: int) -> dict[str, Array]:
    """Fresh float32 weights as transformers initialises them: normal(0, 0.02) matrices, norms of ones.

    Drawn from `np.random.default_rng(seed)` in `weight_shapes` order: the same seed gives the same weights,
    whatever else uses numpy's generators.
    """
    rng = np.random.default_rng(seed)
    weights: dict[str, Array] = {}
    for name, shape in weight_shapes(dims).items():
        if len(shape) == 1:
            weights[name] = np.ones(shape, dtype=np.float32)
        else:
            weights[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(INITIALIZER_RANGE)
    if dims.pad_token_id is not None:
        weights[EMBEDDING][dims.pad_token_id] = 0.0
    return weights


# -- building blocks ---------------------------------------------------------------------------------------------


def _rms_norm(x: Array, weight: Array, eps: float) -> tuple[Array, Array, Array]:
    """`weight * x / rms(x)` over the last axis, with the normalised x and 1/rms kept for the backward."""
    inv_rms = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(eps))
    normed = x * inv_rms
    return weight * normed, normed, inv_rms


def _rms_norm_backward(grad: Array, weight: Array, normed: Array, inv_rms: Array) -> tuple[Array, Array]:
    """The input's and the weight's gradients of `_rms_norm`."""
    weight_grad = (grad * normed).reshape(-1, grad.shape[-1]).sum(axis=0)
    scaled = grad * weight
    return inv_rms * (scaled - normed * np.mean(scaled * normed, axis=-1, keepdims=True)), weight_grad


def _rope(x: Array, cos: Array, sin: Array) -> Array:
    """transformers' `x * cos + rotate_half(x) * sin`; x is (..., L, heads, head_dim), cos and sin (L, head_dim/2)."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[..., :half] = first * cos - second * sin
    out[..., half:] = second * cos + first * sin
    return out


def _rope_backward(grad: Array, cos: Array, sin: Array) -> Array:
    """The transpose of `_rope`'s rotation."""
    half = grad.shape[-1] // 2
    first, second = grad[..., :half], grad[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(grad)
    out[..., :half] = first * cos + second * sin
    out[..., half:] = second * cos - first * sin
    return out


def _sigmoid(x: Array) -> Array:
    # exp overflows to inf for very negative x, which still gives the right limit 0
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


@dataclass
class _LayerTape:
    """What one decoder layer's backward needs from its forward (rows are batch*length positions)."""

    qkv_weight: Array
    gate_up_weight: Array
    normed_in: Array
    in_hat: Array
    in_inv: Array
    q_hat: Array
    q_inv: Array
    k_hat: Array
    k_inv: Array
    queries: Array
    keys: Array
    values: Array
    heads_out: Array
    logsumexp: Array
    attended: Array
    normed_mid: Array
    mid_hat: Array
    mid_inv: Array
    gate_sigmoid: Array
    activated: Array
    up: Array
    product: Array


@dataclass
class _Tape:
    batch: int
    length: int
    tokens: Array
    cos: Array
    sin: Array
    layers: list[_LayerTape]
    final_normed: Array
    final_hat: Array
    final_inv: Array


class KVCache:
    """Keys (after norm and RoPE) and values of every decoded position, per layer: (batch, kv heads, capacity,
    head_dim) arrays filled up to `length`. Capacity doubles when full, so appending is amortised O(1).
    """

    def __init__(self, keys: list[Array], values: list[Array], length: int) -> None:
        self.keys = keys
        self.values = values
        self.length = length

    @classmethod
    def empty(cls, dims: Qwen3Dims, batch: int, capacity: int, dtype: npt.DTypeLike) -> KVCache:
        shape = (batch, dims.num_key_value_heads, capacity, dims.head_dim)
        return cls(
            [np.zeros(shape, dtype=dtype) for _ in range(dims.num_hidden_layers)],
            [np.zeros(shape, dtype=dtype) for _ in range(dims.num_hidden_layers)],
            0,
        )

    @property
    def batch_size(self) -> int:
        return int(self.keys[0].shape[0])

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[2])

    def repeat(self, n: int) -> KVCache:
        """A new cache with every row repeated `n` times in place (row r becomes rows r*n .. r*n+n-1)."""
        if n < 1:
            raise ValueError(f"repeat needs n >= 1, got {n}")
        return KVCache(
            [np.repeat(k, n, axis=0) for k in self.keys],
            [np.repeat(v, n, axis=0) for v in self.values],
            self.length,
        )

    def reserve(self, extra: int) -> None:
        """Room for `extra` more positions, growing the arrays geometrically when they are full."""
        needed = self.length + extra
        if needed <= self.capacity:
            return
        capacity = max(needed, 2 * self.capacity)
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                grown = np.zeros((*old.shape[:2], capacity, old.shape[3]), dtype=old.dtype)
                grown[:, :, : self.length] = old[:, :, : self.length]
                store[i] = grown


class Qwen3Numpy:
    """A Qwen3ForCausalLM over a dict of numpy weights, with gradients.

    `weights` holds the caller's arrays (converted only where the dtype differs), so an optimizer that updates them
    in place updates the model (training needs them writable). `dtype` float64 is for gradient checks; the server
    uses float32. Not thread-safe: gradients accumulate in place, so a caller serialises its calls.
    """

    #: the most memory one block of attention scores takes; longer sequences are attended a block of queries at a
    #: time (a training batch of the toy model's usual lengths is one block)
    attention_block_bytes = 4 << 20

    def __init__(
        self, dims: Qwen3Dims, weights: Mapping[str, Any], *, dtype: npt.DTypeLike = np.float32
    ) -> None:
        self.dims = dims
        self.dtype = np.dtype(dtype)
        self.weights = checked_weights(dims, weights, self.dtype)
        self.grads: dict[str, Array] = {name: np.zeros_like(w) for name, w in self.weights.items()}
        # RoPE's inverse frequencies, computed as transformers computes them (in the model's dtype)
        self._inv_freq = (
            1.0 / (dims.rope_theta ** (np.arange(0, dims.head_dim, 2, dtype=self.dtype) / dims.head_dim))
        ).astype(self.dtype)

    def zero_grad(self) -> None:
        """Reset every gradient to zero (in place)."""
        for grad in self.grads.values():
            grad.fill(0.0)

    # -- training -----------------------------------------------------------------------------------------------

    def logprobs(
        self, sequences: Sequence[Sequence[int]], targets: Sequence[Sequence[int] | Array]
    ) -> list[Array]:
        """Per sequence, the log-probability of its target token at every position; no gradient is kept."""
        tokens, target_batch, lengths = self._batch(sequences, targets)
        hidden, _ = self._forward(tokens, tape=False)
        logits = hidden @ self.weights[self.dims.head].T
        picked, _ = _target_logprobs(logits, target_batch.reshape(-1), keep_probs=False)
        rows = picked.reshape(tokens.shape)
        return [rows[i, :n].copy() for i, n in enumerate(lengths)]

    def logprobs_backward(
        self,
        sequences: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int] | Array],
        loss_grad: Callable[[list[Array]], Sequence[Array]],
    ) -> list[Array]:
        """As `logprobs`; then `loss_grad(logprobs)` gives d(loss)/d(logprobs) per sequence (same shapes), and
        the loss's gradient is added into `grads` (gradients accumulate until `zero_grad`, as torch's do).
        """
        tokens, target_batch, lengths = self._batch(sequences, targets)
        hidden, tape = self._forward(tokens, tape=True)
        assert tape is not None
        head = self.weights[self.dims.head]
        logits = hidden @ head.T
        flat_targets = target_batch.reshape(-1)
        picked, probs = _target_logprobs(logits, flat_targets, keep_probs=True)
        del logits
        rows = picked.reshape(tokens.shape)
        logprobs = [rows[i, :n].copy() for i, n in enumerate(lengths)]

        upstream = list(loss_grad([lp.copy() for lp in logprobs]))
        if len(upstream) != len(lengths):
            raise ValueError(f"loss_grad returned {len(upstream)} gradients for {len(lengths)} sequences")
        grad_rows = np.zeros(tokens.shape, dtype=self.dtype)
        for i, (grad, n) in enumerate(zip(upstream, lengths, strict=True)):
            grad = np.asarray(grad, dtype=self.dtype)
            if grad.shape != (n,):
                raise ValueError(f"loss_grad's gradient {i} has shape {grad.shape}, expected ({n},)")
            grad_rows[i, :n] = grad
        # d logprob(target) / d logits = onehot(target) - softmax
        grad_picked = grad_rows.reshape(-1)
        assert probs is not None
        grad_logits = probs
        grad_logits *= -grad_picked[:, None]
        grad_logits[np.arange(flat_targets.size), flat_targets] += grad_picked
        self.grads[self.dims.head] += grad_logits.T @ tape.final_normed
        grad_hidden = grad_logits @ head
        del grad_logits, probs
        self._backward(grad_hidden, tape)
        return logprobs

    def _batch(
        self, sequences: Sequence[Sequence[int]], targets: Sequence[Sequence[int] | Array]
    ) -> tuple[Array, Array, list[int]]:
        """Right-padded (batch, length) token and target arrays: under causal attention a position never sees the
        padding after it, so every row's results equal its unpadded ones.
        """
        if not sequences:
            raise ValueError("no sequences")
        if len(targets) != len(sequences):
            raise ValueError(f"{len(targets)} target rows for {len(sequences)} sequences")
        lengths = [len(tokens) for tokens in sequences]
        if min(lengths) < 1:
            raise ValueError(f"sequence {lengths.index(0)} is empty")
        length = max(lengths)
        if length > self.dims.max_position_embeddings:
            raise ValueError(f"{length} tokens, over the context of {self.dims.max_position_embeddings}")
        tokens = np.zeros((len(sequences), length), dtype=np.int64)
        target_batch = np.zeros((len(sequences), length), dtype=np.int64)
        for row, (seq, target) in enumerate(zip(sequences, targets, strict=True)):
            target = np.asarray(target)
            if target.shape != (len(seq),):
                raise ValueError(f"targets {row} have shape {target.shape}, expected ({len(seq)},)")
            tokens[row, : len(seq)] = seq
            target_batch[row, : len(seq)] = target
        self._check_ids(tokens)
        self._check_ids(target_batch)
        return tokens, target_batch, lengths

    def _check_ids(self, ids: Array) -> None:
        # numpy would wrap a negative id around instead of failing
        if ids.size and (ids.min() < 0 or ids.max() >= self.dims.vocab_size):
            raise ValueError(f"a token id is outside the vocabulary of {self.dims.vocab_size}")

    def _rotary(self, start: int, length: int) -> tuple[Array, Array]:
        """cos and sin of positions start .. start+length-1, (length, head_dim/2), as transformers computes them."""
        positions = np.arange(start, start + length, dtype=self.dtype)
        angles = positions[:, None] * self._inv_freq[None, :]
        return np.cos(angles), np.sin(angles)

    def _forward(self, tokens: Array, *, tape: bool) -> tuple[Array, _Tape | None]:
        """The final-normed hidden states (batch*length, hidden) of a batch without cache, and its tape."""
        batch, length = tokens.shape
        dims = self.dims
        cos, sin = self._rotary(0, length)
        flat = tokens.reshape(-1)
        x = self.weights[EMBEDDING][flat]
        layer_tapes: list[_LayerTape] = []
        for i in range(dims.num_hidden_layers):
            x, layer_tape = self._layer(i, x, batch, length, (cos, sin), None, tape)
            if layer_tape is not None:
                layer_tapes.append(layer_tape)
        out, final_hat, final_inv = _rms_norm(x, self.weights[FINAL_NORM], dims.rms_norm_eps)
        if not tape:
            return out, None
        return out, _Tape(batch, length, flat, cos, sin, layer_tapes, out, final_hat, final_inv)

    def _layer(
        self,
        index: int,
        x: Array,
        batch: int,
        length: int,
        rotary: tuple[Array, Array],
        cache: KVCache | None,
        tape: bool,
    ) -> tuple[Array, _LayerTape | None]:
        """One decoder layer on (batch*length, hidden) rows; with a cache, the new keys and values are appended
        at `cache.length` and attention reads every cached position."""
        dims, w = self.dims, self.weights
        prefix = f"model.layers.{index}."
        heads, kv_heads, head_dim, groups = (
            dims.num_attention_heads,
            dims.num_key_value_heads,
            dims.head_dim,
            dims.groups,
        )
        eps = dims.rms_norm_eps
        cos, sin = rotary
        # One matrix product for q, k and v (and one for gate and up): fewer, larger BLAS calls.
        qkv_weight = np.concatenate(
            [w[prefix + f"self_attn.{name}_proj.weight"] for name in ("q", "k", "v")], axis=0
        )
        gate_up_weight = np.concatenate(
            [w[prefix + "mlp.gate_proj.weight"], w[prefix + "mlp.up_proj.weight"]], axis=0
        )
        q_width, kv_width = heads * head_dim, kv_heads * head_dim

        normed_in, in_hat, in_inv = _rms_norm(x, w[prefix + "input_layernorm.weight"], eps)
        qkv = normed_in @ qkv_weight.T
        q = qkv[:, :q_width].reshape(batch, length, heads, head_dim)
        k = qkv[:, q_width : q_width + kv_width].reshape(batch, length, kv_heads, head_dim)
        v = qkv[:, q_width + kv_width :].reshape(batch, length, kv_heads, head_dim)
        q, q_hat, q_inv = _rms_norm(q, w[prefix + "self_attn.q_norm.weight"], eps)
        k, k_hat, k_inv = _rms_norm(k, w[prefix + "self_attn.k_norm.weight"], eps)
        q = _rope(q, cos, sin)
        k = _rope(k, cos, sin)
        # Query head h reads key-value head h // groups: lay queries out as (batch, kv head, length*groups,
        # head_dim), row p*groups + j the query of position p in the group's head j, so one batched matmul per kv
        # head covers its whole group and a block of rows is a block of positions.
        queries = (
            q.reshape(batch, length, kv_heads, groups, head_dim)
            .transpose(0, 2, 1, 3, 4)
            .reshape(batch, kv_heads, length * groups, head_dim)
        )
        new_keys = np.ascontiguousarray(k.transpose(0, 2, 1, 3))
        new_values = np.ascontiguousarray(v.transpose(0, 2, 1, 3))
        start = 0
        if cache is not None:
            start = cache.length
            cache.keys[index][:, :, start : start + length] = new_keys
            cache.values[index][:, :, start : start + length] = new_values
            keys = cache.keys[index][:, :, : start + length]
            values = cache.values[index][:, :, : start + length]
        else:
            keys, values = new_keys, new_values

        heads_out, logsumexp = self._attention(queries, keys, values, start)
        attended = (
            heads_out.reshape(batch, kv_heads, length, groups, head_dim)
            .transpose(0, 2, 1, 3, 4)
            .reshape(batch * length, heads * head_dim)
        )
        x = x + attended @ w[prefix + "self_attn.o_proj.weight"].T

        normed_mid, mid_hat, mid_inv = _rms_norm(x, w[prefix + "post_attention_layernorm.weight"], eps)
        gate_up = normed_mid @ gate_up_weight.T
        gate, up = gate_up[:, : dims.intermediate_size], gate_up[:, dims.intermediate_size :]
        gate_sigmoid = _sigmoid(gate)
        activated = gate * gate_sigmoid
        product = activated * up
        x += product @ w[prefix + "mlp.down_proj.weight"].T
        if not tape:
            return x, None
        return x, _LayerTape(
            qkv_weight=qkv_weight,
            gate_up_weight=gate_up_weight,
            normed_in=normed_in,
            in_hat=in_hat,
            in_inv=in_inv,
            q_hat=q_hat,
            q_inv=q_inv,
            k_hat=k_hat,
            k_inv=k_inv,
            queries=queries,
            keys=keys,
            values=values,
            heads_out=heads_out,
            logsumexp=logsumexp,
            attended=attended,
            normed_mid=normed_mid,
            mid_hat=mid_hat,
            mid_inv=mid_inv,
            gate_sigmoid=gate_sigmoid,
            activated=activated,
            up=up,
            product=product,
        )

    def _row_blocks(self, queries: Array, keys: Array) -> range:
        """Starts of the blocks of query rows whose scores fit `attention_block_bytes` (at least one row)."""
        batch, kv_heads, rows, _ = queries.shape
        row_bytes = batch * kv_heads * keys.shape[2] * queries.itemsize
        return range(0, rows, max(1, self.attention_block_bytes // row_bytes))

    def _scores(self, queries: Array, keys: Array, start: int, first: int, stop: int) -> Array:
        """Scaled, causally masked scores of query rows first..stop-1 against the keys the last of them sees (the
        result's width): row r is the query of position start + r // groups, which sees the keys up to it (-inf
        beyond, a softmax weight of exactly 0)."""
        groups = self.dims.groups
        lowest, highest = start + first // groups, start + (stop - 1) // groups
        scale = queries.dtype.type(self.dims.head_dim**-0.5)
        scores = (queries[:, :, first:stop] * scale) @ keys[:, :, : highest + 1].swapaxes(-1, -2)
        if highest > lowest:  # only the keys lowest+1 .. highest are hidden from some row
            positions = start + np.arange(first, stop) // groups
            future = np.arange(lowest, highest + 1)[None, :] > positions[:, None]
            scores[..., lowest:] += np.where(future, -np.inf, 0.0).astype(scores.dtype)
        return scores

    def _attention(self, queries: Array, keys: Array, values: Array, start: int) -> tuple[Array, Array]:
        """Causal softmax attention of (batch, kv heads, rows, head_dim) queries over keys and values, a block of
        rows at a time (memory stays bounded for long sequences); returns the outputs and each row's logsumexp,
        from which the backward recomputes the probabilities instead of keeping them."""
        out = np.empty_like(queries)
        logsumexp = np.empty(queries.shape[:3], dtype=queries.dtype)
        blocks = self._row_blocks(queries, keys)
        for first in blocks:
            stop = min(first + blocks.step, queries.shape[2])
            scores = self._scores(queries, keys, start, first, stop)
            top = scores.max(axis=-1, keepdims=True)
            scores -= top
            weights = np.exp(scores, out=scores)
            total = weights.sum(axis=-1, keepdims=True)
            # normalise the (rows, head_dim) output rather than the (rows, keys) weights: fewer elements
            out[:, :, first:stop] = (weights @ values[:, :, : weights.shape[-1]]) / total
            logsumexp[:, :, first:stop] = (top + np.log(total))[..., 0]
        return out, logsumexp

    def _attention_backward(self, grad_out: Array, t: _LayerTape) -> tuple[Array, Array, Array]:
        """The gradients of `_attention`'s queries, keys and values (training runs start at position 0)."""
        queries, keys, values = t.queries, t.keys, t.values
        # softmax backward: dS = P * (dP - rowsum(dP * P)), and rowsum(dP * P) = rowsum(grad_out * out)
        row_dots = np.einsum("...i,...i->...", grad_out, t.heads_out)
        grad_queries = np.empty_like(queries)
        grad_keys = np.zeros_like(keys)
        grad_values = np.zeros_like(values)
        scale = queries.dtype.type(self.dims.head_dim**-0.5)
        blocks = self._row_blocks(queries, keys)
        for first in blocks:
            stop = min(first + blocks.step, queries.shape[2])
            probs = self._scores(queries, keys, 0, first, stop)
            seen = probs.shape[-1]
            probs -= t.logsumexp[:, :, first:stop, None]
            np.exp(probs, out=probs)
            grad_block = grad_out[:, :, first:stop]
            grad_values[:, :, :seen] += probs.swapaxes(-1, -2) @ grad_block
            grad_scores = grad_block @ values[:, :, :seen].swapaxes(-1, -2)
            grad_scores -= row_dots[:, :, first:stop, None]
            grad_scores *= probs
            grad_scores *= scale
            grad_queries[:, :, first:stop] = grad_scores @ keys[:, :, :seen]
            grad_keys[:, :, :seen] += grad_scores.swapaxes(-1, -2) @ queries[:, :, first:stop]
        return grad_queries, grad_keys, grad_values

    def _backward(self, grad_hidden: Array, tape: _Tape) -> None:
        """Backpropagate d(loss)/d(final hidden) through the model, adding into `grads`."""
        dims, w, g = self.dims, self.weights, self.grads
        grad_x, norm_grad = _rms_norm_backward(grad_hidden, w[FINAL_NORM], tape.final_hat, tape.final_inv)
        g[FINAL_NORM] += norm_grad
        for index in reversed(range(dims.num_hidden_layers)):
            grad_x = self._layer_backward(index, grad_x, tape, tape.layers[index])
        if dims.pad_token_id is not None:
            # transformers' padding_idx: the lookup never trains that row
            grad_x[tape.tokens == dims.pad_token_id] = 0.0
        np.add.at(g[EMBEDDING], tape.tokens, grad_x)

    def _layer_backward(self, index: int, grad_x: Array, tape: _Tape, t: _LayerTape) -> Array:
        """One layer's backward: the gradient of its input rows from that of its output rows (`grad_x` is
        consumed)."""
        dims, w, g = self.dims, self.weights, self.grads
        prefix = f"model.layers.{index}."
        batch, length = tape.batch, tape.length
        heads, kv_heads, head_dim, groups = (
            dims.num_attention_heads,
            dims.num_key_value_heads,
            dims.head_dim,
            dims.groups,
        )
        intermediate = dims.intermediate_size

        # MLP: x_out = x_mid + down(silu(gate) * up)
        g[prefix + "mlp.down_proj.weight"] += grad_x.T @ t.product
        grad_product = grad_x @ w[prefix + "mlp.down_proj.weight"]
        grad_gate_up = np.empty((grad_product.shape[0], 2 * intermediate), dtype=grad_product.dtype)
        np.multiply(grad_product, t.activated, out=grad_gate_up[:, intermediate:])
        # silu'(gate) = sigmoid + silu * (1 - sigmoid)
        silu_slope = 1.0 - t.gate_sigmoid
        silu_slope *= t.activated
        silu_slope += t.gate_sigmoid
        silu_slope *= t.up
        np.multiply(grad_product, silu_slope, out=grad_gate_up[:, :intermediate])
        del grad_product, silu_slope
        gate_up_grad = grad_gate_up.T @ t.normed_mid
        g[prefix + "mlp.gate_proj.weight"] += gate_up_grad[:intermediate]
        g[prefix + "mlp.up_proj.weight"] += gate_up_grad[intermediate:]
        grad_mid, norm_grad = _rms_norm_backward(
            grad_gate_up @ t.gate_up_weight,
            w[prefix + "post_attention_layernorm.weight"],
            t.mid_hat,
            t.mid_inv,
        )
        g[prefix + "post_attention_layernorm.weight"] += norm_grad
        grad_x += grad_mid

        # attention: x_mid = x_in + o_proj(softmax(q k^T * scale + causal mask) v)
        g[prefix + "self_attn.o_proj.weight"] += grad_x.T @ t.attended
        grad_heads = (
            (grad_x @ w[prefix + "self_attn.o_proj.weight"])
            .reshape(batch, length, kv_heads, groups, head_dim)
            .transpose(0, 2, 1, 3, 4)
            .reshape(batch, kv_heads, length * groups, head_dim)
        )
        grad_queries, grad_keys, grad_values = self._attention_backward(grad_heads, t)
        del grad_heads

        grad_q = _rope_backward(
            grad_queries.reshape(batch, kv_heads, length, groups, head_dim)
            .transpose(0, 2, 1, 3, 4)
            .reshape(batch, length, heads, head_dim),
            tape.cos,
            tape.sin,
        )
        grad_k = _rope_backward(grad_keys.transpose(0, 2, 1, 3), tape.cos, tape.sin)
        grad_q, q_norm_grad = _rms_norm_backward(
            grad_q, w[prefix + "self_attn.q_norm.weight"], t.q_hat, t.q_inv
        )
        grad_k, k_norm_grad = _rms_norm_backward(
            grad_k, w[prefix + "self_attn.k_norm.weight"], t.k_hat, t.k_inv
        )
        g[prefix + "self_attn.q_norm.weight"] += q_norm_grad
        g[prefix + "self_attn.k_norm.weight"] += k_norm_grad
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        grad_qkv = np.empty((batch * length, q_width + 2 * kv_width), dtype=grad_x.dtype)
        grad_qkv[:, :q_width] = grad_q.reshape(batch * length, q_width)
        grad_qkv[:, q_width : q_width + kv_width] = grad_k.reshape(batch * length, kv_width)
        grad_qkv[:, q_width + kv_width :] = grad_values.transpose(0, 2, 1, 3).reshape(
            batch * length, kv_width
        )
        qkv_grad = grad_qkv.T @ t.normed_in
        g[prefix + "self_attn.q_proj.weight"] += qkv_grad[:q_width]
        g[prefix + "self_attn.k_proj.weight"] += qkv_grad[q_width : q_width + kv_width]
        g[prefix + "self_attn.v_proj.weight"] += qkv_grad[q_width + kv_width :]
        grad_in, norm_grad = _rms_norm_backward(
            grad_qkv @ t.qkv_weight, w[prefix + "input_layernorm.weight"], t.in_hat, t.in_inv
        )
        g[prefix + "input_layernorm.weight"] += norm_grad
        grad_x += grad_in
        return grad_x

    # -- decoding -----------------------------------------------------------------------------------------------

    def prefill(self, tokens: Sequence[int]) -> tuple[Array, KVCache]:
        """The logits (L, vocab) at every prompt position and a batch-1 cache holding the prompt."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        if ids.shape[1] == 0:
            raise ValueError("the prompt is empty")
        cache = KVCache.empty(self.dims, 1, max(64, 1 << ids.shape[1].bit_length()), self.dtype)
        return self._cached(ids, cache)[0], cache

    def step(self, cache: KVCache, tokens: Array | Sequence[int]) -> Array:
        """Append one token per row (shape (B,), B the cache's batch) to `cache` IN PLACE and return the logits
        (B, vocab) for the position after it."""
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.shape != (cache.batch_size,):
            raise ValueError(
                f"step needs {cache.batch_size} tokens (the cache's batch), got shape {ids.shape}"
            )
        return self._cached(ids[:, None], cache)[:, 0]

    def _cached(self, ids: Array, cache: KVCache) -> Array:
        batch, length = ids.shape
        if cache.length + length > self.dims.max_position_embeddings:
            raise ValueError(
                f"{cache.length + length} positions, over the context of {self.dims.max_position_embeddings}"
            )
        self._check_ids(ids)
        cache.reserve(length)
        cos, sin = self._rotary(cache.length, length)
        x = self.weights[EMBEDDING][ids.reshape(-1)]
        for i in range(self.dims.num_hidden_layers):
            x, _ = self._layer(i, x, batch, length, (cos, sin), cache, False)
        cache.length += length
        hidden, _, _ = _rms_norm(x, self.weights[FINAL_NORM], self.dims.rms_norm_eps)
        logits: Array = (hidden @ self.weights[self.dims.head].T).reshape(batch, length, -1)
        return logits


def _target_logprobs(logits: Array, targets: Array, *, keep_probs: bool) -> tuple[Array, Array | None]:
    """logit(target) - logsumexp(logits) per row, and the softmax when asked for (in `logits`' memory, which
    is overwritten either way)."""
    picked = logits[np.arange(targets.size), targets]
    top = logits.max(axis=-1, keepdims=True)
    exps = np.exp(np.subtract(logits, top, out=logits), out=logits)
    sums = exps.sum(axis=-1, keepdims=True)
    picked = picked - (top + np.log(sums))[:, 0]
    if not keep_probs:
        return picked, None
    exps /= sums
    return picked, exps


def checked_weights(dims: Qwen3Dims, weights: Mapping[str, Any], dtype: np.dtype[Any]) -> dict[str, Array]:
    """The weights as arrays of `dtype` (no copy when they already are), in `weight_shapes` order; a missing,
    unexpected or misshapen key is a ValueError naming it. Beside a tied head, `lm_head.weight` may be given if it
    equals the embedding (as transformers' `state_dict()` lists it).
    """
    shapes = weight_shapes(dims)
    checked: dict[str, Array] = {}
    for name, shape in shapes.items():
        if name not in weights:
            raise ValueError(f"weight {name!r} is missing")
        array = np.asarray(weights[name], dtype=dtype)
        if array.shape != shape:
            raise ValueError(f"weight {name!r} has shape {array.shape}, expected {shape}")
        checked[name] = array
    for name in weights:
        if name in shapes:
            continue
        if name == HEAD:  # and tied
            head = np.asarray(weights[name], dtype=dtype)
            if head.shape != shapes[EMBEDDING] or not np.array_equal(head, checked[EMBEDDING]):
                raise ValueError(
                    f"weight {HEAD!r} differs from {EMBEDDING!r}: this model ties the head to the embedding"
                )
        else:
            raise ValueError(f"weight {name!r} is not a weight of this model")
    return checked


# -- optimizer ---------------------------------------------------------------------------------------------------


class AdamW:
    """`torch.optim.AdamW` (defaults: no amsgrad) over a dict of numpy weights, updating them in place.

    The step count is shared by all weights (torch keeps one per parameter; they agree when every weight has a
    gradient at every step, as here).
    """

    def __init__(self) -> None:
        self.step_count = 0
        self.exp_avg: dict[str, Array] = {}
        self.exp_avg_sq: dict[str, Array] = {}

    def step(
        self,
        weights: Mapping[str, Array],
        grads: Mapping[str, Array],
        *,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        weight_decay: float,
    ) -> None:
        """One step: decay `p -= lr * weight_decay * p`, then the bias-corrected Adam update
        `p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)`."""
        self.step_count += 1
        t = self.step_count
        step_size = lr / (1 - beta1**t)
        bias_correction2_sqrt = math.sqrt(1 - beta2**t)
        for name, param in weights.items():
            grad = grads[name]
            exp_avg = self.exp_avg.setdefault(name, np.zeros_like(param))
            exp_avg_sq = self.exp_avg_sq.setdefault(name, np.zeros_like(param))
            if weight_decay != 0:
                param *= param.dtype.type(1 - lr * weight_decay)
            exp_avg += param.dtype.type(1 - beta1) * (grad - exp_avg)
            exp_avg_sq *= param.dtype.type(beta2)
            exp_avg_sq += param.dtype.type(1 - beta2) * grad * grad
            denom = np.sqrt(exp_avg_sq)
            denom /= param.dtype.type(bias_correction2_sqrt)
            denom += param.dtype.type(eps)
            param -= param.dtype.type(step_size) * (exp_avg / denom)

    def state_dict(self) -> dict[str, Array]:
        """Flat arrays for a safetensors file: `step`, `<name>.exp_avg`, `<name>.exp_avg_sq`."""
        state: dict[str, Array] = {"step": np.array(self.step_count, dtype=np.int64)}
        for name in self.exp_avg:
            state[f"{name}.exp_avg"] = self.exp_avg[name]
            state[f"{name}.exp_avg_sq"] = self.exp_avg_sq[name]
        return state

    def load_state_dict(self, state: Mapping[str, Array]) -> None:
        """Restore what `state_dict` gave (the arrays are copied)."""
        if "step" not in state:
            raise ValueError("the optimizer state has no 'step'")
        exp_avg: dict[str, Array] = {}
        exp_avg_sq: dict[str, Array] = {}
        for key, value in state.items():
            if key == "step":
                continue
            name, _, kind = key.rpartition(".")
            if kind == "exp_avg":
                exp_avg[name] = np.array(value, copy=True)
            elif kind == "exp_avg_sq":
                exp_avg_sq[name] = np.array(value, copy=True)
            else:
                raise ValueError(f"unknown optimizer state key {key!r}")
        if exp_avg.keys() != exp_avg_sq.keys():
            raise ValueError("the optimizer state's exp_avg and exp_avg_sq name different weights")
        self.step_count = int(np.asarray(state["step"]))
        self.exp_avg, self.exp_avg_sq = exp_avg, exp_avg_sq


def global_grad_norm(grads: Mapping[str, Array]) -> float:
    """The L2 norm of all gradients together (accumulated in float64)."""
    total = sum(
        float(np.vdot(g.astype(np.float64).ravel(), g.astype(np.float64).ravel())) for g in grads.values()
    )
    return math.sqrt(total)


def clip_grads(grads: Mapping[str, Array], max_norm: float) -> float:
    """Scale the gradients in place as `torch.nn.utils.clip_grad_norm_` does (by max_norm / (norm + 1e-6),
    at most 1); returns the norm before clipping."""
    norm = global_grad_norm(grads)
    coefficient = min(max_norm / (norm + 1e-6), 1.0) if math.isfinite(norm) else float("nan")
    for grad in grads.values():
        grad *= grad.dtype.type(coefficient)
    return norm
