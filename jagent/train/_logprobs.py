"""Per-token log-probabilities and entropies of a policy, for the losses.

Alignment (the convention of :class:`jagent.transforms.Batch`): position ``s``
of the outputs belongs to token ``s`` of the input, i.e. to the distribution
that produced it, which is the model's prediction after tokens ``< s``. So a
``loss_mask`` that is 1 on the sampled tokens selects exactly their
log-probabilities; position 0 (no context) is 0.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jagent import losses
from jagent import models
from jagent._src.types import Array
from jagent._src.types import ArrayLike
from jagent.models import _lora
from jagent.models import _transformer


class LogprobsOutput(NamedTuple):
  """What :func:`token_logprobs` returns.

  Attributes:
    logprobs: float32 ``[B, S]``, ``log pi_T(tokens[b, s] | tokens[b, :s])``;
      0 at ``s = 0``.
    entropy: float32 ``[B, S]`` entropy (nats) of the tempered distribution
      that produced token ``s`` (0 at ``s = 0``), or None when not requested.
  """
  logprobs: Array
  entropy: Array | None = None


def check_temperature(temperature: float) -> float:
  """Returns ``temperature`` as a float; ValueError unless finite and > 0."""
  t = float(temperature)
  if not (t > 0 and math.isfinite(t)):
    raise ValueError(f"temperature must be a positive finite float; got "
                     f"{temperature!r}.")
  return t


def default_positions(tokens: Array) -> Array:
  """int32 ``[B, S]`` RoPE positions ``0 .. S-1`` (slot = position)."""
  b, s = tokens.shape
  return jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32)[None], (b, s))


# Positions per row in one chunk of the masked output projection (see
# logprobs_from_hidden): a chunk projects [B, _MASKED_CHUNK, D] -> [B, _MASKED_CHUNK, V].
_MASKED_CHUNK = 32


def _head(params, h, nxt, config, temperature, with_entropy):
  """float32 ``(log-probs [...], entropies [...] or None)`` of tokens ``nxt``."""
  z = _transformer.output_logits(params, h, config)  # [..., V]
  if temperature != 1.0:
    z = z / jnp.float32(temperature)
  lse = jax.nn.logsumexp(z, axis=-1)
  target = jnp.take_along_axis(z, nxt[..., None], axis=-1)[..., 0]
  return target - lse, losses.entropy_from_logits(z) if with_entropy else None


def _project(head, h, nxt, config, temperature, with_entropy):
  """:func:`_head` with a zero entropy when none is requested."""
  lp, ent = _head(head, h, nxt, config, temperature, with_entropy)
  return lp, jnp.zeros_like(lp) if ent is None else ent


def _each_chunk(max_count, chunk, fn, skipped, xs, init=None):
  """``lax.scan`` over ``xs``'s chunks; chunk ``i`` runs ``fn`` when ``i * chunk <
  max_count``, else returns ``skipped`` (lax.cond: skipped chunks cost nothing)."""
  def body(carry, x):
    i, *rest = x
    return jax.lax.cond(i * chunk < max_count, fn, skipped, carry, *rest)
  num_chunks = jax.tree.leaves(xs)[0].shape[0]
  return jax.lax.scan(body, init, (jnp.arange(num_chunks, dtype=jnp.int32), *xs))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _chunked_head(head, h, nxt, max_count, config, temperature, with_entropy, chunk):
  """``(log-probs, entropies)`` ``[C, B, chunk]`` of the chunks ``h [C, B, chunk, D]``.

  Chunks from ``max_count`` positions on are skipped (0). A custom VJP
  recomputes each chunk's logits in the backward pass from the chunk's
  hidden states and the projection weights ``head``, accumulating the
  weights' gradient in the loop: the residuals are ``h`` and ``head`` once.
  (``jax.checkpoint`` inside the scan's ``lax.cond`` would save ``head`` once
  per chunk: a [C, V, D] stack, 46 GiB for Qwen2.5-0.5B at 2,904 tokens.)
  """
  return _chunked_head_fwd(head, h, nxt, max_count, config, temperature, with_entropy,
                           chunk)[0]


def _chunked_head_fwd(head, h, nxt, max_count, config, temperature, with_entropy, chunk):
  def run(carry, hc, nc):
    return carry, _project(head, hc, nc, config, temperature, with_entropy)

  def skip(carry, hc, nc):
    del hc
    zeros = jnp.zeros(nc.shape, jnp.float32)
    return carry, (zeros, zeros)

  _, out = _each_chunk(max_count, chunk, run, skip, (h, nxt))
  return out, (head, h, nxt, max_count)


def _chunked_head_bwd(config, temperature, with_entropy, chunk, residuals, cotangents):
  head, h, nxt, max_count = residuals
  g_lp, g_ent = cotangents

  def run(d_head, hc, nc, glc, gec):
    _, vjp = jax.vjp(
        lambda hd, x: _project(hd, x, nc, config, temperature, with_entropy), head, hc)
    dhd, dhc = vjp((glc, gec))
    return jax.tree.map(jnp.add, d_head, dhd), dhc

  def skip(d_head, hc, nc, glc, gec):
    del nc, glc, gec
    return d_head, jnp.zeros_like(hc)

  zeros = jax.tree.map(jnp.zeros_like, head)
  d_head, d_h = _each_chunk(max_count, chunk, run, skip, (h, nxt, g_lp, g_ent), zeros)
  return d_head, d_h, None, None


_chunked_head.defvjp(_chunked_head_fwd, _chunked_head_bwd)


def _masked_head(params, h_bnd, next_bn, selected_bn, config, temperature, with_entropy):
  """:func:`_head` at the selected positions only (0 elsewhere).

  Each row's selected positions are gathered first (``jnp.nonzero`` per row,
  in order) and projected in chunks of ``_MASKED_CHUNK`` positions per row
  by a ``lax.scan`` that skips (``lax.cond``) the chunks past the largest
  per-row count, so the cost follows ``B x`` the most selected positions of
  a row, not ``B x N``. The batch axis is never flattened, so a batch
  sharded over rows stays sharded (each device projects its own rows). The
  backward pass recomputes each chunk (:func:`_chunked_head`), so no
  [B, N, V] residual is kept. Under ``vmap`` the skipped chunks are computed
  too (same values).
  """
  b, n, d = h_bnd.shape
  chunk = min(_MASKED_CHUNK, n)
  num_chunks = -(-n // chunk)
  max_count = jnp.max(jnp.sum(selected_bn.astype(jnp.int32), axis=1))
  idx = jax.vmap(lambda sel: jnp.nonzero(sel, size=num_chunks * chunk, fill_value=n)[0])(
      selected_bn).astype(jnp.int32)  # [B, C * chunk]; n past the selected
  h = jnp.take_along_axis(h_bnd, idx[..., None], axis=1, mode="fill", fill_value=0)
  nxt = jnp.take_along_axis(next_bn, idx, axis=1, mode="fill", fill_value=0)
  h = jnp.moveaxis(h.reshape(b, num_chunks, chunk, d), 1, 0)  # [C, B, chunk, D]
  nxt = jnp.moveaxis(nxt.reshape(b, num_chunks, chunk), 1, 0)
  # Only the output projection's weights (embed / lm_head; never LoRA's)
  # enter the loop.
  lp, ent = _chunked_head(_lora.base_of(params).replace(layers=()), h, nxt, max_count, config,
                          temperature, with_entropy, chunk)

  def scatter(vals):  # [C, B, chunk] -> [B, N]; index n (the fill) is dropped
    vals = jnp.moveaxis(vals, 0, 1).reshape(b, num_chunks * chunk)
    return jax.vmap(lambda i, v: jnp.zeros((n,), jnp.float32).at[i].set(v, mode="drop"))(
        idx, vals)

  return scatter(lp), scatter(ent) if with_entropy else None


def logprobs_from_hidden(params: models.Params, h_bsd: Array, tokens: Array, *,
                         config: models.ModelConfig, temperature: float,
                         with_entropy: bool,
                         mask: ArrayLike | None = None) -> LogprobsOutput:
  """Log-probs (and entropies) of ``tokens`` from the trunk's hidden states.

  Projects ``h[:, :-1]`` (the positions that predict tokens ``1..S-1``) to
  float32 logits ``[B, S-1, V]``, divides by the temperature and reads
  ``z[token] - logsumexp(z)`` (no full log-softmax array is kept beyond the
  logits themselves), then pads position 0 with 0.

  With ``mask``, only the positions ``s >= 1`` where ``mask[b, s] != 0`` are
  projected (the others are 0): what a loss over ``mask`` reads, at the
  cost of ``B x`` the most masked positions of a row (rounded up to a chunk
  of 32) rather than all ``B x (S-1)`` (an RL batch trains a few reply
  tokens per prompt-heavy row); rows are never mixed, so a row-sharded batch
  stays sharded. The values there are those of
  the full projection up to float rounding, and so are the gradients.

  Args:
    params: policy parameters (for the output projection).
    h_bsd: ``[B, S, D]`` from :func:`jagent.models.hidden_states`.
    tokens: int32 ``[B, S]``.
    config: the model config.
    temperature: the logits temperature (> 0).
    with_entropy: also return per-position entropies.
    mask: optional ``[B, S]`` (any dtype): the positions needed.

  Returns:
    :class:`LogprobsOutput`.
  """
  pad = ((0, 0), (1, 0))
  if mask is None:
    lp, entropy = _head(params, h_bsd[:, :-1], tokens[:, 1:], config, temperature,
                        with_entropy)
  else:
    lp, entropy = _masked_head(params, h_bsd[:, :-1], tokens[:, 1:],
                               jnp.asarray(mask)[:, 1:] != 0, config, temperature,
                               with_entropy)
  logprobs = jnp.pad(lp, pad)
  if entropy is not None:
    entropy = jnp.pad(entropy, pad)
  return LogprobsOutput(logprobs, entropy)


def token_logprobs(params: models.Params, tokens: ArrayLike, *,
                   config: models.ModelConfig, temperature: float = 1.0,
                   attention_mask: ArrayLike | None = None,
                   positions: ArrayLike | None = None,
                   with_entropy: bool = False) -> LogprobsOutput:
  r"""Per-token log-probs of ``tokens`` under the policy, one causal forward.

  :math:`\log\pi_T(x_s \mid x_{<s}) = z_{s-1}[x_s] / T - \log\sum_v
  e^{z_{s-1}[v] / T}` where :math:`z_{s-1}` are the logits after token
  :math:`s-1`; 0 at :math:`s = 0`. This is the sampler's convention
  (:func:`jagent.models.generate` reports ``log softmax(logits / T)`` before
  top-k/top-p), so with the rollout's temperature the PPO ratio is exactly 1
  on-policy. No KV cache; tokens are laid out with token ``s`` at RoPE
  position ``s`` (right padding needs no mask: causal attention never reads
  it).

  Memory: the float32 logits ``[B, S-1, V]`` are materialised (fine for small
  models and micro-batches; at large vocabularies split the batch, as
  :func:`jagent.train.train_step` does with micro-batches).

  Args:
    params: policy parameters.
    tokens: int32 ``[B, S]`` token ids.
    config: the model config (static under jit).
    temperature: logits temperature > 0 (the rollout's sampling temperature).
    attention_mask: optional bool ``[B, S]`` key validity (left padding).
    positions: optional int32 ``[B, S]`` RoPE positions (default
      ``0 .. S-1``; left-padded rows need their own).
    with_entropy: also return entropies ``[B, S]``.

  Returns:
    :class:`LogprobsOutput` of float32 ``[B, S]`` arrays.

  Raises:
    ValueError: ``tokens`` not rank 2 or ``S < 2``, or a bad temperature.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from jagent import models, train
    >>> cfg = models.get_config("tiny")
    >>> params = models.init(cfg, jax.random.key(0))
    >>> out = train.token_logprobs(params, jnp.array([[5, 7, 9]]), config=cfg)
    >>> out.logprobs.shape, float(out.logprobs[0, 0])
    ((1, 3), 0.0)
  """
  temperature = check_temperature(temperature)
  tokens = jnp.asarray(tokens, jnp.int32)
  if tokens.ndim != 2 or tokens.shape[1] < 2:
    raise ValueError(f"token_logprobs needs tokens [B, S] with S >= 2; got "
                     f"shape {tokens.shape}.")
  pos = default_positions(tokens) if positions is None else positions
  h, _ = models.hidden_states(params, tokens, pos, config=config,
                              attention_mask=attention_mask)
  return logprobs_from_hidden(params, h, tokens, config=config,
                              temperature=temperature,
                              with_entropy=with_entropy)
