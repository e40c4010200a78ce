"""Final losses: per-token loss terms summed and aggregated once.

A :class:`LossTerm` maps ``(ModelOutputs, Batch)`` to a per-token loss
``[B, S]`` and per-token diagnostics ``[B, S]``. :func:`make_loss` adds the
terms token by token and aggregates the sum with ONE mode over
``Batch.loss_mask`` (as verl does for policy, entropy and KL), returning
``LossOutput(loss_sum, denominator, metrics)``. A value term shares the mode;
with separate actor and critic parameters each still gets exactly its own
gradient. Use two objectives if they need different modes.

How much an episode weighs: with one row per episode, as the aggregation
mode says. With turn rows (``Batch.episode_turns`` set) each row is also
weighted by :func:`row_weights`: ``turn_weighting="episode"`` (default)
weighs row ``i`` by ``1 / episode_turns_i``, so an episode weighs the same
whatever its number of turns (``seq-mean-token-mean``: mean over its turn
rows, then over episodes; ``token-mean``: each episode's tokens count as its
mean tokens per turn); ``"turn"`` weighs every turn row 1 (an episode weighs
its number of turns). Rows with ``row_valid`` False weigh 0. The weights are
per row, so micro-batch sums stay exact.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jagent import losses
from jagent._src.types import Array
from jagent.losses import _checks
from jagent.transforms._batch import Batch
from jagent.transforms._batch import LossOutput
from jagent.transforms._batch import mask_of
from jagent.transforms._batch import ModelOutputs
from jagent.transforms._batch import require

TermFn = Callable[[ModelOutputs, Batch], tuple[Array, dict[str, Array]]]


class LossTerm(NamedTuple):
  """A named per-token loss term.

  Attributes:
    name: short name, used as the metric key ``loss/<name>``.
    fn: ``fn(outputs, batch) -> (loss [B, S], {metric: [B, S]})``.
  """
  name: str
  fn: TermFn

  def __call__(self, outputs: ModelOutputs, batch: Batch):
    return self.fn(outputs, batch)


def _check_outputs(outputs, batch, name):
  if not isinstance(outputs, ModelOutputs):
    raise ValueError(f"{name}: outputs must be ModelOutputs; got "
                     f"{type(outputs).__name__}.")
  _checks.check_same_shape(("Batch.loss_mask", "outputs.logprobs"),
                           (batch.loss_mask, outputs.logprobs))


def _old_logprobs(outputs, batch, name):
  if batch.old_logprobs is None:
    return jax.lax.stop_gradient(outputs.logprobs)
  require(batch, ("old_logprobs", "loss_mask"), name)
  return batch.old_logprobs


def _weighted(loss, batch, name):
  if batch.is_weights is None:
    return loss
  require(batch, ("is_weights", "loss_mask"), name)
  return loss * jax.lax.stop_gradient(jnp.asarray(batch.is_weights,
                                                  jnp.float32))


def _policy_metrics(outputs, old, out):
  log_ratio = jax.lax.stop_gradient(outputs.logprobs - old)
  return {"policy/clip_frac": out.clipped,
          "policy/dual_clip_frac": out.dual_clipped,
          "policy/approx_kl": -log_ratio,
          "policy/ratio": jax.lax.stop_gradient(out.ratio)}


def ppo_clip_term(eps_low: float = 0.2, eps_high: float = 0.2,
                  dual_clip: float | None = None) -> LossTerm:
  """PPO clipped surrogate term (:func:`jagent.losses.ppo_clip_loss`).

  Reads ``outputs.logprobs``, ``batch.advantages``, ``batch.old_logprobs``
  (None: on-policy) and ``batch.is_weights`` (optional TIS factor).

  Args:
    eps_low: lower clip range in [0, 1).
    eps_high: upper clip range >= 0 (clip-higher when > eps_low).
    dual_clip: dual-clip constant > 1, or None.

  Returns:
    a :class:`LossTerm` named ``policy``.

  Raises:
    ValueError: for bad hyperparameters (at construction) or missing fields.
  """
  _checks.check_in_range("eps_low", eps_low, 0.0, 1.0, hi_open=True)
  _checks.check_in_range("eps_high", eps_high, 0.0, float("inf"))
  if dual_clip is not None:
    _checks.check_in_range("dual_clip", dual_clip, 1.0, float("inf"),
                           lo_open=True)

  def fn(outputs, batch):
    require(batch, ("advantages", "loss_mask"), "ppo_clip_term")
    old = _old_logprobs(outputs, batch, "ppo_clip_term")
    out = losses.ppo_clip_loss(outputs.logprobs, old, batch.advantages,
                               eps_low, eps_high, dual_clip)
    return (_weighted(out.loss, batch, "ppo_clip_term"),
            _policy_metrics(outputs, old, out))

  return LossTerm("policy", fn)


def gspo_term(eps_low: float = 3e-4, eps_high: float = 4e-4) -> LossTerm:
  """GSPO sequence-ratio term (:func:`jagent.losses.gspo_loss` per row).

  Pair with ``aggregation="seq-mean-token-mean"``.

  Args:
    eps_low: lower clip range in [0, 1) (paper: 3e-4).
    eps_high: upper clip range >= 0 (paper: 4e-4).

  Returns:
    a :class:`LossTerm` named ``policy``.

  Raises:
    ValueError: for bad hyperparameters or missing fields.
  """
  _checks.check_in_range("eps_low", eps_low, 0.0, 1.0, hi_open=True)
  _checks.check_in_range("eps_high", eps_high, 0.0, float("inf"))
  per_row = jax.vmap(functools.partial(losses.gspo_loss, eps_low=eps_low,
                                       eps_high=eps_high))

  def fn(outputs, batch):
    require(batch, ("advantages", "loss_mask"), "gspo_term")
    old = _old_logprobs(outputs, batch, "gspo_term")
    out = per_row(outputs.logprobs, old, batch.advantages, mask_of(batch))
    return (_weighted(out.loss, batch, "gspo_term"),
            _policy_metrics(outputs, old, out))

  return LossTerm("policy", fn)


def pg_term() -> LossTerm:
  """Plain policy-gradient term ``-A log pi`` (times ``is_weights`` if set).

  Returns:
    a :class:`LossTerm` named ``policy``.
  """

  def fn(outputs, batch):
    require(batch, ("advantages", "loss_mask"), "pg_term")
    loss = losses.policy_gradient_loss(outputs.logprobs, batch.advantages)
    return _weighted(loss, batch, "pg_term"), {}

  return LossTerm("policy", fn)


def kl_term(coef: float = 0.001, estimator: str = "k3") -> LossTerm:
  """KL-to-reference loss term ``coef * kl(logprobs, ref_logprobs)``.

  Args:
    coef: coefficient >= 0 (verl ``kl_loss_coef``).
    estimator: a :data:`jagent.losses.KL_ESTIMATORS` name (verl
      ``low_var_kl`` = ``k3``).

  Returns:
    a :class:`LossTerm` named ``kl`` with metric ``kl/mean``.

  Raises:
    ValueError: for bad hyperparameters or a missing ``ref_logprobs``.
  """
  _checks.check_in_range("coef", coef, 0.0, float("inf"))
  if estimator not in losses.KL_ESTIMATORS:
    raise ValueError(f"estimator must be one of {losses.KL_ESTIMATORS}; got "
                     f"{estimator!r}.")

  def fn(outputs, batch):
    require(batch, ("ref_logprobs", "loss_mask"), "kl_term")
    kl = losses.kl_penalty(outputs.logprobs, batch.ref_logprobs, estimator)
    return coef * kl, {"kl/mean": jax.lax.stop_gradient(kl)}

  return LossTerm("kl", fn)


def entropy_term(coef: float = 0.001) -> LossTerm:
  """Entropy bonus term ``-coef * H`` (needs ``outputs.entropy``).

  Args:
    coef: coefficient >= 0 (RAGEN: 0.001).

  Returns:
    a :class:`LossTerm` named ``entropy`` with metric ``policy/entropy``.

  Raises:
    ValueError: for coef < 0 or ``outputs.entropy`` None.
  """
  _checks.check_in_range("coef", coef, 0.0, float("inf"))

  def fn(outputs, batch):
    if outputs.entropy is None:
      raise ValueError("entropy_term needs ModelOutputs.entropy, which is "
                       "None.")
    _checks.check_same_shape(("Batch.loss_mask", "outputs.entropy"),
                             (batch.loss_mask, outputs.entropy))
    ent = jnp.asarray(outputs.entropy, jnp.float32)
    return -coef * ent, {"policy/entropy": jax.lax.stop_gradient(ent)}

  return LossTerm("entropy", fn)


def value_term(coef: float = 1.0, clip: float | None = 0.5) -> LossTerm:
  """Clipped value-loss term (:func:`jagent.losses.clipped_value_loss`).

  Reads ``outputs.values``, ``batch.values`` (rollout-time values) and
  ``batch.returns``.

  Args:
    coef: coefficient >= 0.
    clip: value clip range > 0 (RAGEN/verl: 0.5) or None.

  Returns:
    a :class:`LossTerm` named ``value`` with metric ``value/clip_frac``.

  Raises:
    ValueError: for bad hyperparameters or missing values/returns.
  """
  _checks.check_in_range("coef", coef, 0.0, float("inf"))
  if clip is not None:
    _checks.check_in_range("clip", clip, 0.0, float("inf"), lo_open=True)

  def fn(outputs, batch):
    if outputs.values is None:
      raise ValueError("value_term needs ModelOutputs.values, which is None.")
    require(batch, ("values", "returns", "loss_mask"), "value_term")
    out = losses.clipped_value_loss(outputs.values, batch.values,
                                    batch.returns, clip)
    return coef * out.loss, {"value/clip_frac": out.clipped}

  return LossTerm("value", fn)


TURN_WEIGHTINGS = ("episode", "turn")
"""``make_loss(turn_weighting=...)`` choices (see the module docstring)."""


def row_weights(batch: Batch, turn_weighting: str = "episode") -> Array | None:
  """float32 ``[B]`` per-row loss weights of turn rows, or None.

  None (every row 1, the unweighted aggregation) when
  ``batch.episode_turns`` is None (one row per episode). Otherwise
  ``row_valid / episode_turns`` (``"episode"``) or ``row_valid``
  (``"turn"``).

  Args:
    batch: a :class:`Batch`.
    turn_weighting: one of :data:`TURN_WEIGHTINGS`.

  Returns:
    float32 ``[B]`` or None.

  Raises:
    ValueError: for an unknown ``turn_weighting``, or turn rows
      (``turns_per_episode > 1``) whose ``episode_turns`` is None (no stage
      ran on the whole batch to fill it).
  """
  if turn_weighting not in TURN_WEIGHTINGS:
    raise ValueError(f"turn_weighting must be one of {TURN_WEIGHTINGS}; got "
                     f"{turn_weighting!r}.")
  if batch.episode_turns is None:
    if batch.turns_per_episode > 1:
      raise ValueError("loss: Batch.episode_turns is None with "
                       f"turns_per_episode={batch.turns_per_episode}; fill it "
                       "(jagent.train.trajectory_batch or any advantage "
                       "stage does).")
    return None
  # No require(): a micro-batch's rows need not be whole episodes.
  w = jnp.ones(jnp.shape(batch.episode_turns), jnp.float32)
  if batch.row_valid is not None:
    _checks.check_same_shape(("Batch.row_valid", "Batch.episode_turns"),
                             (batch.row_valid, batch.episode_turns))
    w = jnp.asarray(batch.row_valid, jnp.float32)
  if turn_weighting == "episode":
    w = w / jnp.maximum(jnp.asarray(batch.episode_turns, jnp.float32), 1.0)
  return w


def _zero_masked(tree, m: Array):
  """``tree`` with its floating ``[B, S]`` leaves set to 0 where ``m`` is 0."""

  def zero(x):
    if (not hasattr(x, "shape") or tuple(x.shape) != tuple(m.shape)
        or not jnp.issubdtype(x.dtype, jnp.floating)):
      return x
    return jnp.where(m > 0, x, jnp.zeros((), x.dtype))

  return jax.tree.map(zero, tree)


def make_loss(*terms: LossTerm, aggregation: str = "token-mean",
              horizon: int | None = None, turn_weighting: str = "episode"):
  """Sums loss terms per token and aggregates them once.

  ``loss(outputs, batch)`` returns ``LossOutput(loss_sum, denominator,
  metrics)`` with metrics: ``loss/total`` and ``loss/<term>`` (each
  aggregated value), every term metric as a token mean over the mask, and
  ``loss/tokens`` (trained tokens in this call).

  Args:
    *terms: :class:`LossTerm` objects (names must be unique).
    aggregation: a :data:`jagent.losses.AGGREGATION_MODES` name.
    horizon: ``L`` of ``seq-mean-token-sum-norm`` (default: ``S``).
    turn_weighting: how turn rows weigh, ``"episode"`` (each episode the
      same) or ``"turn"`` (each turn row the same); see the module
      docstring. No effect with one row per episode.

  Returns:
    ``loss(outputs: ModelOutputs, batch: Batch) -> LossOutput``.

  Raises:
    ValueError: for no terms, duplicate names, an unknown aggregation or
      turn weighting.
  """
  if not terms:
    raise ValueError("make_loss needs at least one LossTerm.")
  names = [t.name for t in terms]
  if len(set(names)) != len(names) or not all(
      isinstance(t, LossTerm) for t in terms):
    raise ValueError(f"make_loss needs LossTerms with unique names; got "
                     f"{names}.")
  if aggregation not in losses.AGGREGATION_MODES:
    raise ValueError(f"aggregation must be one of {losses.AGGREGATION_MODES}; "
                     f"got {aggregation!r}.")
  if turn_weighting not in TURN_WEIGHTINGS:
    raise ValueError(f"turn_weighting must be one of {TURN_WEIGHTINGS}; got "
                     f"{turn_weighting!r}.")

  def loss(outputs: ModelOutputs, batch: Batch) -> LossOutput:
    require(batch, ("loss_mask",), "loss")
    _check_outputs(outputs, batch, "loss")
    m = mask_of(batch)
    # Zero what the mask drops before any term reads it: a NaN or inf there
    # (a peer's -inf padding log-probs, say) would otherwise reach the
    # gradient through the terms' own arithmetic, even masked afterwards.
    outputs, batch = _zero_masked((outputs, batch), m)
    agg = functools.partial(losses.aggregate, mode=aggregation,
                            horizon=horizon,
                            row_weights=row_weights(batch, turn_weighting))
    total = jnp.zeros(m.shape, jnp.float32)
    metrics = {}
    sg = jax.lax.stop_gradient
    for term in terms:
      per_token, term_metrics = term(outputs, batch)
      total = total + per_token
      part = agg(sg(per_token), m)
      metrics[f"loss/{term.name}"] = losses.safe_ratio(part.total,
                                                       part.denominator)
      for key, value in term_metrics.items():
        value = jnp.where(m > 0, jnp.asarray(value, jnp.float32), 0.0)
        metrics[key] = losses.safe_ratio(jnp.sum(value * m), jnp.sum(m))
    out = agg(total, m)
    denominator = sg(out.denominator)
    metrics["loss/total"] = losses.safe_ratio(sg(out.total), denominator)
    metrics["loss/tokens"] = jnp.sum(m)
    return LossOutput(out.total, denominator, metrics)

  return loss
