"""The critic: a linear value head on final hidden states, with or without its own trunk.

Two kinds (``CRITIC_KINDS``):

- ``"head"``: a ``[D]`` weight and a scalar bias reading the POLICY's final
  hidden states with the gradient stopped (a linear probe: the value loss
  trains only the head and never moves the policy). Costs one dot product per
  token on top of the policy forward.
- ``"model"``: a second decoder trunk (:class:`jagent.models.Params`, by
  default a copy of the policy, as RAGEN/verl initialise the critic from the
  same checkpoint) with its own head. Costs a second forward and backward.

Alignment: ``values[b, s]`` is the value of the context that generated token
``s`` (the state before token ``s``), read from the hidden state at position
``s - 1``; ``values[b, 0] = 0``. So ``values`` pairs with ``Batch.loss_mask``
and the log-probs token by token, the layout verl's critic uses
(``values = head(h)[:, -R-1:-1]`` over the response) and what
:func:`jagent.transforms.compute_gae` expects.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jagent import models
from jagent._src.types import Array
from jagent._src.types import ArrayLike
from jagent.train import _logprobs

CRITIC_KINDS = ("head", "model")


@struct.dataclass
class ValueHead:
  """A linear value readout ``v = h . w + b``."""
  w: Array  # shape=[D], dtype=float32
  b: Array  # shape=[], dtype=float32


@struct.dataclass
class CriticParams:
  """Critic parameters: a value head and an optional trunk of its own."""
  head: ValueHead
  trunk: models.Params | None  # None: the head reads the policy's (detached) hidden states


def init_critic(config: models.ModelConfig, key: jax.Array, *,
                kind: str = "head",
                policy_params: models.Params | None = None) -> CriticParams:
  """Initial critic parameters.

  The head starts at ``w = 0, b = 0`` (every value 0, so the first GAE
  advantages are the plain returns); its gradient is non-zero from the start.
  A ``"model"`` trunk is a copy of ``policy_params`` if given, else
  ``models.init(config, key)``. A LoRA policy's copy is a ``LoraParams``
  with a base of its own: the critic then trains its adapters and head only.

  Args:
    config: the policy's model config (D = ``config.embed_dim``).
    key: PRNG key (used only for a fresh ``"model"`` trunk).
    kind: ``"head"`` or ``"model"`` (see the module docstring).
    policy_params: the policy, to initialise a ``"model"`` trunk from.

  Returns:
    :class:`CriticParams` (``trunk`` None for ``"head"``).

  Raises:
    ValueError: for an unknown ``kind``.
  """
  if kind not in CRITIC_KINDS:
    raise ValueError(f"critic kind must be one of {CRITIC_KINDS}; got {kind!r}.")
  head = ValueHead(w=jnp.zeros((config.embed_dim,), jnp.float32),
                   b=jnp.zeros((), jnp.float32))
  trunk = None
  if kind == "model":
    if policy_params is not None:
      trunk = jax.tree.map(jnp.copy, policy_params)
    else:
      trunk = models.init(config, key)
  return CriticParams(head=head, trunk=trunk)


def values_from_hidden(head: ValueHead, h_bsd: Array) -> Array:
  """float32 ``[B, S]`` values aligned with tokens: ``v[:, s] = head(h[:, s-1])``.

  Args:
    head: the :class:`ValueHead`.
    h_bsd: ``[B, S, D]`` final hidden states.

  Returns:
    float32 ``[B, S]``, 0 at ``s = 0``.
  """
  h = h_bsd[:, :-1].astype(jnp.float32)
  v = jnp.einsum("bsd,d->bs", h, head.w) + head.b
  return jnp.pad(v, ((0, 0), (1, 0)))


def critic_values(critic: CriticParams, tokens: ArrayLike, *,
                  config: models.ModelConfig,
                  policy_hidden: Array | None = None,
                  positions: ArrayLike | None = None,
                  attention_mask: ArrayLike | None = None) -> Array:
  """Values ``[B, S]`` of the contexts that generated each token.

  Args:
    critic: :class:`CriticParams`.
    tokens: int32 ``[B, S]``.
    config: the model config (policy's; also the ``"model"`` trunk's).
    policy_hidden: ``[B, S, D]`` policy hidden states; required for a
      ``"head"`` critic (gradient stopped here), ignored otherwise.
    positions: optional int32 ``[B, S]`` RoPE positions (default 0..S-1).
    attention_mask: optional bool ``[B, S]`` key validity.

  Returns:
    float32 ``[B, S]``; ``values[b, s]`` is V(tokens[b, :s]), 0 at s = 0.

  Raises:
    ValueError: a head critic without ``policy_hidden``.
  """
  tokens = jnp.asarray(tokens, jnp.int32)
  if critic.trunk is None:
    if policy_hidden is None:
      raise ValueError("a 'head' critic reads the policy's hidden states: pass "
                       "policy_hidden.")
    h = jax.lax.stop_gradient(policy_hidden)
  else:
    pos = _logprobs.default_positions(tokens) if positions is None else positions
    h, _ = models.hidden_states(critic.trunk, tokens, pos, config=config,
                                attention_mask=attention_mask)
  return values_from_hidden(critic.head, h)
