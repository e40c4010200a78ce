"""Jit-compiled RL and SFT train steps with exact gradient accumulation.

One RL step (:func:`train_step`):

1. No-grad forward over the whole batch in ``M * K`` chunks (``lax.map``,
   ``M = num_minibatches``, ``K = num_microbatches``): ``old_logprobs``
   (current policy at ``config.temperature``), ``ref_logprobs`` (if the state
   has a reference policy), rollout-time ``values`` (if it has a critic) and
   the pre-update entropy. With ``TrainConfig.old_logprobs="sampler"`` the
   old log-probs are the batch's ``sampler_logprobs`` and, without critic and
   reference, this forward is skipped. Here and in the updates, log-probs
   and entropies are projected to the vocabulary only at the positions of
   the loss mask (0 elsewhere; nothing reads them there).
2. ``objective.update(batch, state.objective_state)``: advantages, returns,
   the filter's keep mask (dropped rows get ``loss_mask = 0``; they still
   cost compute: rows are not compacted), batch metrics.
3. ``ppo_epochs x num_minibatches`` optimizer updates (``lax.scan``). Each
   minibatch is split into ``K`` micro-batches; the minibatch's loss
   denominator is summed first (no model forward: the denominator depends on
   the batch only) and micro-batch ``i`` contributes
   ``grad(loss_sum_i) / denominator`` (:func:`accumulate_gradients`), so the
   result equals the full-minibatch gradient.
4. An update is applied only if the minibatch loss and both pre-clip
   gradient norms are finite and the denominator is > 0; otherwise
   parameters and optimizer states stay as they were and the skip is counted
   (``TrainState.skipped_nonfinite`` / ``skipped_empty``).

:func:`sft_step` makes one update of token-mean negative log-likelihood
through the same accumulation and skip code.

With a LoRA policy (or critic trunk), a :class:`jagent.models.LoraParams`,
both steps differentiate and update only the adapters
(``models.split_frozen``): the frozen base gets no gradient and no optimizer
state, and LoRA dropout draws its masks from the state's rng.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jagent import losses
from jagent import models
from jagent import transforms
from jagent._src.types import Array
from jagent._src.types import PyTree
from jagent.losses import _aggregation
from jagent.train import _critic
from jagent.train import _logprobs
from jagent.train import _optim
from jagent.train import _state

LossFn = Callable[[PyTree, Any], tuple[Array, dict[str, Array]]]
_TOKENS_KEY = "loss/tokens"


class AccumulatedGradients(NamedTuple):
  """What :func:`accumulate_gradients` returns.

  Attributes:
    grads: float32 pytree like ``params``: ``sum_i grad(loss_sum_i) /
      denominator`` (zeros when the denominator is 0).
    loss: float32 ``[]``, ``sum_i loss_sum_i / denominator`` (0 when the
      denominator is 0).
    metrics: dict of float32 ``[K]``, each micro-batch's metrics.
  """
  grads: PyTree
  loss: Array
  metrics: dict[str, Array]


def accumulate_gradients(loss_fn: LossFn, params: PyTree, micro_batches: PyTree,
                         denominator: Array) -> AccumulatedGradients:
  """Exact gradient accumulation over micro-batches with ``lax.scan``.

  For an unreduced loss ``L = sum_i loss_sum_i / D`` with ``D`` known up
  front (summed over the micro-batches, carrying no gradient), each
  micro-batch contributes ``grad(loss_sum_i / D)``; the sum equals the
  gradient of the whole batch's loss (see :class:`jagent.transforms.Objective`).
  Gradients accumulate in float32. One micro-batch is live at a time.

  Args:
    loss_fn: ``loss_fn(params, micro) -> (loss_sum [], metrics {str: []})``.
    params: the differentiated pytree.
    micro_batches: pytree whose leaves have a leading axis ``K`` (one entry
      per micro-batch).
    denominator: float32 ``[]``, the whole batch's denominator.

  Returns:
    :class:`AccumulatedGradients`.
  """
  den = jnp.asarray(denominator, jnp.float32)
  inv = jnp.where(den > 0, 1.0 / jnp.where(den > 0, den, 1.0), 0.0)

  def scaled(p, micro):
    loss_sum, metrics = loss_fn(p, micro)
    return loss_sum * inv, metrics

  grad_fn = jax.value_and_grad(scaled, has_aux=True)

  def body(carry, micro):
    g_acc, l_acc = carry
    (loss, metrics), g = grad_fn(params, micro)
    g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    return (g_acc, l_acc + loss), metrics

  zeros = jax.tree.map(lambda x: jnp.zeros(jnp.shape(x), jnp.float32), params)
  (grads, loss), metrics = jax.lax.scan(body, (zeros, jnp.float32(0.0)),
                                        micro_batches)
  return AccumulatedGradients(grads, loss, metrics)


def nll_loss(outputs: transforms.ModelOutputs,
             batch: transforms.Batch) -> transforms.LossOutput:
  """Behaviour-cloning loss: token-mean negative log-likelihood over the mask.

  ``loss_sum = -sum(m * logprobs)`` (log-probs where ``m == 0`` are never
  read), ``denominator = sum(m)``; same interface
  as :attr:`jagent.transforms.Objective.loss`, so it accumulates exactly.

  Args:
    outputs: :class:`jagent.transforms.ModelOutputs` (``logprobs`` [B, S]).
    batch: a :class:`jagent.transforms.Batch` with ``loss_mask`` [B, S].

  Returns:
    :class:`jagent.transforms.LossOutput` with metrics ``sft/nll`` (this
    call's token mean) and ``loss/tokens``.

  Raises:
    ValueError: if ``loss_mask`` is None or shapes differ.
  """
  if batch.loss_mask is None:
    raise ValueError("nll_loss needs Batch.loss_mask, which is None.")
  m = jnp.asarray(batch.loss_mask, jnp.float32)
  if m.shape != jnp.shape(outputs.logprobs):
    raise ValueError(f"nll_loss: loss_mask shape {m.shape} != logprobs shape "
                     f"{jnp.shape(outputs.logprobs)}.")
  # A select, not ``m * logprobs``: a -inf log-prob on a padded token would
  # make the total and the gradient NaN.
  total = -jnp.sum(_aggregation.masked(outputs.logprobs, m))
  den = jnp.sum(m)
  return transforms.LossOutput(total, den, {
      "sft/nll": losses.safe_ratio(jax.lax.stop_gradient(total), den),
      _TOKENS_KEY: den})


# ------------------------------------------------------- private functions
def _split(tree: PyTree, n: int) -> PyTree:
  """Leading axis ``B`` -> ``[n, B // n, ...]``, strided: chunk ``i`` holds rows
  ``i, i + n, i + 2n, ...``.

  Strided rather than contiguous so that with rows sharded in contiguous
  blocks over devices (``data x fsdp``), every minibatch and micro-batch
  keeps rows on every device (a contiguous chunk would live on ``1/n`` of
  them and the partitioner would gather it).
  """
  return jax.tree.map(
      lambda x: jnp.swapaxes(x.reshape((x.shape[0] // n, n) + x.shape[1:]), 0, 1), tree)


def _merge(tree: PyTree) -> PyTree:
  """Inverse of :func:`_split`."""
  return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:]), tree)


def _check_batch(batch: transforms.Batch, rows_divisor: int, what: str) -> None:
  if not isinstance(batch, transforms.Batch):
    raise ValueError(f"{what} needs a transforms.Batch; got "
                     f"{type(batch).__name__}.")
  for f in ("tokens", "loss_mask"):
    if getattr(batch, f) is None:
      raise ValueError(f"{what} needs Batch.{f}, which is None.")
  shape = tuple(np.shape(batch.tokens))
  if len(shape) != 2 or shape[1] < 2:
    raise ValueError(f"{what}: Batch.tokens must be [B, S] with S >= 2; got "
                     f"shape {shape}.")
  if tuple(np.shape(batch.loss_mask)) != shape:
    raise ValueError(f"{what}: Batch.loss_mask has shape "
                     f"{tuple(np.shape(batch.loss_mask))}, tokens {shape}.")
  if shape[0] % rows_divisor:
    raise ValueError(f"{what}: batch rows B={shape[0]} must be divisible by "
                     f"{rows_divisor} (num_minibatches * num_microbatches).")


def _forward(params, critic_params, tokens, mask, *, config, temperature,
             with_entropy=True, dropout_key=None) -> transforms.ModelOutputs:
  """Policy log-probs, entropy and (if a critic) values, one policy forward.

  Log-probs and entropies are computed where ``mask`` is nonzero only (0
  elsewhere): every loss, transform and metric of a step reads them under
  its loss mask, and ``mask`` is that mask (or, before the objective's
  transform, the batch's, of which the transform only drops positions).
  ``dropout_key``: the policy's LoRA dropout (None: off).
  """
  h, _ = models.hidden_states(params, tokens,
                              _logprobs.default_positions(tokens),
                              config=config, dropout_key=dropout_key)
  lp = _logprobs.logprobs_from_hidden(params, h, tokens, config=config,
                                      temperature=temperature,
                                      with_entropy=with_entropy, mask=mask)
  values = None
  if critic_params is not None:
    values = _critic.critic_values(critic_params, tokens, config=config,
                                   policy_hidden=h)
  return transforms.ModelOutputs(lp.logprobs, values, lp.entropy)


def _lora_dropout(params) -> bool:
  """Whether ``params`` is a LoRA policy with adapter dropout (static)."""
  return (isinstance(params, models.LoraParams) and params.adapters is not None
          and params.config.dropout > 0)


def _dropout_keys(key, n: int):
  """``n`` keys of LoRA dropout, apart from the epoch's shuffling key."""
  return jax.random.split(jax.random.fold_in(key, 1), n)


def _metric_mean(x, m):
  """Mean of metric ``x`` weighted by ``m >= 0``; NaN when ``sum(m) == 0``.

  A mean over nothing is not measured: a step whose filter kept no group
  has no entropy, loss or grad norm, and 0 would read as a collapsed policy.
  Values where ``m == 0`` are ignored (they may be NaN). A metric only:
  nothing differentiates it.
  """
  m = jnp.asarray(m, jnp.float32)
  total = jnp.sum(m)
  s = jnp.sum(jnp.where(m > 0, x, 0.0) * m)
  return jnp.where(total > 0, s / jnp.where(total > 0, total, 1.0), jnp.nan)


def _weighted(metrics: dict[str, Array]) -> dict[str, Array]:
  """Token-weighted mean of per-chunk metrics (any leading shape); NaN without tokens."""
  if _TOKENS_KEY not in metrics:
    return {k: jnp.mean(v) for k, v in metrics.items()}
  w = metrics[_TOKENS_KEY]
  out = {k: _metric_mean(v, w) for k, v in metrics.items() if k != _TOKENS_KEY}
  out[_TOKENS_KEY] = jnp.sum(w)
  return out


class _Nets(NamedTuple):
  params: PyTree
  opt_state: PyTree
  critic_params: PyTree
  critic_opt_state: PyTree
  num_updates: Array
  skipped_nonfinite: Array
  skipped_empty: Array


def _update(nets: _Nets, acc: AccumulatedGradients, denominator: Array, *,
            config: _state.TrainConfig):
  """Applies (or skips) one optimizer update; returns (nets, metrics)."""
  g_actor, g_critic = acc.grads
  gn_actor = optax.tree.norm(g_actor)
  gn_critic = (optax.tree.norm(g_critic) if nets.critic_params is not None
               else jnp.float32(0.0))
  finite = (jnp.isfinite(acc.loss) & jnp.isfinite(gn_actor)
            & jnp.isfinite(gn_critic))
  nonempty = denominator > 0
  apply = finite & nonempty

  def step(tx, params, opt_state, grads):
    updates, new_opt = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jnp.where(apply, new, old)  # noqa: E731
    return jax.tree.map(keep, new_params, params), jax.tree.map(
        keep, new_opt, opt_state)

  lr = _optim.current_learning_rate(nets.opt_state, config.actor_optimizer)
  params, opt_state = step(_optim.make_optimizer(config.actor_optimizer),
                           nets.params, nets.opt_state, g_actor)
  critic_params, critic_opt_state = nets.critic_params, nets.critic_opt_state
  metrics = {"train/grad_norm": gn_actor, "train/lr": lr}
  if critic_params is not None:
    metrics["train/critic_lr"] = _optim.current_learning_rate(
        critic_opt_state, config.critic_optimizer)
    metrics["train/critic_grad_norm"] = gn_critic
    critic_params, critic_opt_state = step(
        _optim.make_optimizer(config.critic_optimizer), critic_params,
        critic_opt_state, g_critic)
  i32 = lambda b: b.astype(jnp.int32)  # noqa: E731
  nets = _Nets(params, opt_state, critic_params, critic_opt_state,
               nets.num_updates + i32(apply),
               nets.skipped_nonfinite + i32(nonempty & ~finite),
               nets.skipped_empty + i32(~nonempty))
  metrics.update({"train/applied": apply.astype(jnp.float32),
                  "train/nonfinite": (nonempty & ~finite).astype(jnp.float32),
                  "train/empty": (~nonempty).astype(jnp.float32),
                  "loss/minibatch": acc.loss})
  return nets, metrics


def _reduce_updates(per_update: dict[str, Array]) -> dict[str, Array]:
  """Per-update metrics [E, M] (update metrics) -> float32 scalars."""
  applied = per_update["train/applied"]
  nonempty = 1.0 - per_update["train/empty"]
  gn = per_update["train/grad_norm"]
  measured = jnp.isfinite(gn) & (nonempty > 0)  # empty updates have no gradient
  out = {
      "train/updates_applied": jnp.sum(applied),
      "train/updates_nonfinite": jnp.sum(per_update["train/nonfinite"]),
      "train/updates_empty": jnp.sum(per_update["train/empty"]),
      "train/grad_norm": _metric_mean(gn, measured),
      "train/grad_norm_max": jnp.where(jnp.any(measured),
                                       jnp.max(jnp.where(measured, gn, 0.0)), jnp.nan),
      "train/lr": per_update["train/lr"].reshape(-1)[-1],
      "loss/total": _metric_mean(per_update["loss/minibatch"], nonempty),
  }
  if "train/critic_grad_norm" in per_update:
    gn = per_update["train/critic_grad_norm"]
    out["train/critic_grad_norm"] = _metric_mean(gn, jnp.isfinite(gn) & (nonempty > 0))
    out["train/critic_lr"] = per_update["train/critic_lr"].reshape(-1)[-1]
  return out


# --------------------------------------------------------------- RL step
def _train_step(state: _state.TrainState, batch: transforms.Batch, *,
                objective: transforms.Objective,
                config: _state.TrainConfig):
  c = config
  m_mb, k_mb = c.num_minibatches, c.num_microbatches
  _check_batch(batch, m_mb * k_mb, "train_step")
  if not isinstance(objective, transforms.Objective):
    raise ValueError(f"objective must be a transforms.Objective; got "
                     f"{type(objective).__name__}.")
  tokens = jnp.asarray(batch.tokens, jnp.int32)
  b = tokens.shape[0]
  batch = batch.replace(tokens=tokens)
  mask0 = jnp.asarray(batch.loss_mask, jnp.float32)
  has_critic = state.critic_params is not None
  has_ref = state.ref_params is not None
  ref_params = _state.reference_params(state)
  # LoRA: only the adapters are differentiated and optimized; the frozen
  # bases ride along in the closure (empty lists without LoRA).
  policy_train, policy_frozen = models.split_frozen(state.params)
  critic_train, critic_frozen = models.split_frozen(state.critic_params)
  dropout = _lora_dropout(state.params)

  # 1. Rollout-time quantities, no gradient, one micro-batch-sized chunk at a
  # time (the same shapes as the gradient pass, so on-policy ratios are 1).
  def no_grad(chunk_and_mask):
    chunk, chunk_mask = chunk_and_mask
    out = _forward(state.params, state.critic_params, chunk, chunk_mask, config=c.model,
                   temperature=c.temperature)
    res = {"old": out.logprobs, "entropy": out.entropy}
    if has_critic:
      res["values"] = out.values
    if has_ref:
      h_ref, _ = models.hidden_states(ref_params, chunk,
                                      _logprobs.default_positions(chunk), config=c.model)
      res["ref"] = _logprobs.logprobs_from_hidden(
          ref_params, h_ref, chunk, config=c.model, temperature=c.temperature,
          with_entropy=False, mask=chunk_mask).logprobs
    return res

  from_sampler = c.old_logprobs == "sampler"
  if from_sampler and batch.sampler_logprobs is None:
    raise ValueError("train_step: TrainConfig.old_logprobs='sampler' needs "
                     "Batch.sampler_logprobs, which is None.")
  metrics = {}
  pre = None  # skipped when nothing needs the no-grad forward
  if not from_sampler or has_critic or has_ref:
    pre = jax.lax.stop_gradient(_merge(jax.lax.map(
        no_grad, (_split(tokens, m_mb * k_mb), _split(mask0, m_mb * k_mb)))))
    metrics["actor/entropy"] = _metric_mean(pre["entropy"], mask0)
  batch = batch.replace(old_logprobs=jnp.asarray(batch.sampler_logprobs, jnp.float32)
                        if from_sampler else pre["old"])
  if has_critic:
    batch = batch.replace(values=pre["values"])
  if has_ref:
    batch = batch.replace(ref_logprobs=pre["ref"])
  if pre is not None and batch.sampler_logprobs is not None:
    diff = _aggregation.masked(jnp.abs(pre["old"] - jnp.asarray(
        batch.sampler_logprobs, jnp.float32)), mask0)
    metrics["rollout/logprob_diff_mean"] = _metric_mean(diff, mask0)
    metrics["rollout/logprob_diff_max"] = jnp.where(jnp.any(mask0 > 0), jnp.max(diff),
                                                    jnp.nan)
  if has_ref:
    metrics["actor/ref_kl_k1"] = _metric_mean(batch.old_logprobs - pre["ref"], mask0)

  # 2. The objective's batch transform (advantages, filter, batch metrics).
  batch, obj_state = objective.update(batch, state.objective_state)
  metrics.update(batch.metrics)
  # The losses never read group_size or turns_per_episode (turn rows carry
  # their per-row weights); 1 lets micro-batches split groups and episodes.
  rows = batch.replace(metrics={}, group_size=1, turns_per_episode=1)
  mask = jnp.asarray(rows.loss_mask, jnp.float32)
  metrics["train/trained_tokens"] = jnp.sum(mask)
  if has_critic:
    metrics["critic/values_mean"] = _metric_mean(batch.values, mask)
    if batch.returns is not None:
      metrics["critic/returns_mean"] = _metric_mean(batch.returns, mask)

  def micro_loss(trainable, micro_and_key):
    micro, key = micro_and_key
    params = models.join_frozen(trainable[0], policy_frozen)
    critic_params = models.join_frozen(trainable[1], critic_frozen)
    out = _forward(params, critic_params, micro.tokens, micro.loss_mask, config=c.model,
                   temperature=c.temperature, dropout_key=key)
    loss = objective.loss(out, micro)
    if pre is None:  # the entropy diagnostic, from this forward instead
      return loss.loss_sum, {**loss.metrics, "actor/entropy": _metric_mean(
          jax.lax.stop_gradient(out.entropy), micro.loss_mask)}
    return loss.loss_sum, loss.metrics

  def denominator(micro):
    zeros = jnp.zeros(micro.loss_mask.shape, jnp.float32)
    dummy = transforms.ModelOutputs(zeros, zeros if has_critic else None,
                                    zeros)
    return objective.loss(dummy, micro).denominator

  def minibatch(nets: _Nets, mb_and_key):
    mb, key = mb_and_key
    micro = _split(mb, k_mb)
    den = jnp.sum(jax.lax.stop_gradient(jax.vmap(denominator)(micro)))
    keys = None if key is None else _dropout_keys(key, k_mb)
    acc = accumulate_gradients(micro_loss, (nets.params, nets.critic_params),
                               (micro, keys), den)
    nets, upd = _update(nets, acc, den, config=c)
    return nets, (upd, acc.metrics)

  def epoch(nets, key):
    eb = rows
    if c.shuffle_minibatches:
      perm = jax.random.permutation(key, b)
      eb = jax.tree.map(lambda x: x[perm], rows)
    keys = _dropout_keys(key, m_mb) if dropout else None
    return jax.lax.scan(minibatch, nets, (_split(eb, m_mb), keys))

  key, sub = jax.random.split(_state.state_key(state))
  nets = _Nets(policy_train, state.opt_state, critic_train,
               state.critic_opt_state, state.num_updates,
               state.skipped_nonfinite, state.skipped_empty)
  nets, (per_update, per_micro) = jax.lax.scan(
      epoch, nets, jax.random.split(sub, c.ppo_epochs))
  metrics.update(_reduce_updates(per_update))
  loss_metrics = _weighted(per_micro)  # [E, M, K] leaves, token-weighted
  loss_metrics.pop("loss/total", None)  # exact value from the minibatches
  loss_metrics.pop(_TOKENS_KEY, None)  # see train/trained_tokens
  metrics.update(loss_metrics)
  first = _weighted(jax.tree.map(lambda v: v[0, 0], per_micro))
  for k in ("policy/ratio", "policy/clip_frac"):
    if k in first:
      metrics[f"first_minibatch/{k}"] = first[k]
  metrics["train/skipped_nonfinite_total"] = nets.skipped_nonfinite
  metrics["train/skipped_empty_total"] = nets.skipped_empty
  new_state = state.replace(
      step=state.step + 1, params=models.join_frozen(nets.params, policy_frozen),
      opt_state=nets.opt_state,
      critic_params=models.join_frozen(nets.critic_params, critic_frozen),
      critic_opt_state=nets.critic_opt_state, objective_state=obj_state, rng=jax.random.key_data(key),
      num_updates=nets.num_updates, skipped_nonfinite=nets.skipped_nonfinite,
      skipped_empty=nets.skipped_empty)
  return new_state, {k: jnp.asarray(v, jnp.float32).reshape(())
                     for k, v in metrics.items()}


@functools.partial(jax.jit, static_argnames=("objective", "config"))
def train_step(state: _state.TrainState, batch: transforms.Batch, *,
               objective: transforms.Objective,
               config: _state.TrainConfig
               ) -> tuple[_state.TrainState, dict[str, Array]]:
  """One RL step: rollout-time forward, objective transform, PPO updates.

  See the module docstring for the stages. ``batch`` holds the rollout:
  ``tokens`` ``[B, S]`` (token ``s`` at RoPE position ``s``, right padding),
  ``loss_mask`` on the sampled tokens, rewards/scores and whatever the
  objective reads; ``old_logprobs`` is recomputed (or, with
  ``config.old_logprobs="sampler"``, taken from ``sampler_logprobs``), ``values`` (with a
  critic) and ``ref_logprobs`` (with a reference) are filled in. Compiled once
  per (state structure, batch shapes, objective, config): build the objective
  once and reuse the same object.

  Args:
    state: the :class:`TrainState` (a critic and a reference policy are used
      iff ``state.critic_params`` / ``state.ref_params`` are not None).
    batch: a :class:`jagent.transforms.Batch`; ``B`` divisible by
      ``num_minibatches * num_microbatches``.
    objective: a :class:`jagent.transforms.Objective` (static).
    config: the :class:`TrainConfig` (static).

  Returns:
    ``(state, metrics)``: the new state (``step + 1``) and a dict of float32
    scalars: the objective's batch metrics (``filter/*``, ``advantages/*``,
    ...), loss metrics (``loss/*``, ``policy/*``, ``kl/*``, ``value/*``;
    token-weighted over all micro-batches of all updates, ``loss/total``
    the mean minibatch loss), ``actor/entropy`` (pre-update, over the
    original mask), ``train/grad_norm`` (pre-clip, mean over updates),
    ``train/grad_norm_max``, ``train/lr``, ``train/updates_applied``,
    ``train/updates_nonfinite``, ``train/updates_empty``, the running skip
    counts ``train/skipped_*_total``, ``first_minibatch/policy/ratio`` and
    ``.../clip_frac`` (exactly on-policy: ratio 1, clip fraction 0), with a
    critic ``train/critic_grad_norm``, ``critic/*``; with sampler log-probs
    ``rollout/logprob_diff_mean|max`` (sampler vs trainer). A mean or max
    over nothing is NaN, not 0: on a batch without a trained token (every
    loss-mask entry 0, e.g. a filter that kept no group) the entropy, the
    loss metrics, the grad norms, ``loss/total`` and the log-prob and critic
    means are NaN (``train/updates_applied`` is then 0); the counts,
    ``train/trained_tokens`` and the learning rates stay finite.

  Raises:
    ValueError: (at trace time) missing tokens/loss_mask, bad shapes, B not
      divisible, or whatever the objective raises for missing fields.
  """
  return _train_step(state, batch, objective=objective, config=config)


# -------------------------------------------------------------- SFT step
def sft_update(state: _state.TrainState, batch: transforms.Batch, *,
               config: _state.TrainConfig) -> tuple[_state.TrainState, dict[str, Array]]:
  """:func:`sft_step` as a pure, unjitted function: jit, scan or vmap it.

  The same update, arguments, metrics and errors as :func:`sft_step`, but
  ``config`` is an ordinary argument, so its optimizer's learning rate may be
  a traced float32 scalar (a learning-rate sweep under ``vmap``, as
  :func:`jagent.train.rl_iteration` allows for RL).
  """
  c = config
  k_mb = c.num_microbatches
  _check_batch(batch, k_mb, "sft_step")
  rows = transforms.Batch(tokens=jnp.asarray(batch.tokens, jnp.int32),
                          loss_mask=jnp.asarray(batch.loss_mask, jnp.float32))
  micro = _split(rows, k_mb)
  den = jnp.sum(rows.loss_mask)
  # LoRA: the adapters alone are differentiated and optimized.
  policy_train, policy_frozen = models.split_frozen(state.params)
  keys = None
  if _lora_dropout(state.params):
    keys = _dropout_keys(jax.random.fold_in(_state.state_key(state), state.step), k_mb)

  def micro_loss(trainable, mb_and_key):
    mb, key = mb_and_key
    params = models.join_frozen(trainable[0], policy_frozen)
    h, _ = models.hidden_states(params, mb.tokens, _logprobs.default_positions(mb.tokens),
                                config=c.model, dropout_key=key)
    lp = _logprobs.logprobs_from_hidden(params, h, mb.tokens, config=c.model,
                                        temperature=1.0, with_entropy=False,
                                        mask=mb.loss_mask)  # the positions nll_loss reads
    out = nll_loss(transforms.ModelOutputs(lp.logprobs), mb)
    return out.loss_sum, out.metrics

  acc = accumulate_gradients(micro_loss, (policy_train, None), (micro, keys), den)
  nets = _Nets(policy_train, state.opt_state, None, None, state.num_updates,
               state.skipped_nonfinite, state.skipped_empty)
  nets, upd = _update(nets, acc, den, config=c)
  metrics = {"sft/nll": acc.loss, "train/grad_norm": upd["train/grad_norm"],
             "train/lr": upd["train/lr"], "train/applied": upd["train/applied"],
             "sft/tokens": den,
             "train/skipped_nonfinite_total": nets.skipped_nonfinite}
  new_state = state.replace(
      step=state.step + 1, params=models.join_frozen(nets.params, policy_frozen),
      opt_state=nets.opt_state, num_updates=nets.num_updates, skipped_nonfinite=nets.skipped_nonfinite,
      skipped_empty=nets.skipped_empty)
  return new_state, {k: jnp.asarray(v, jnp.float32).reshape(())
                     for k, v in metrics.items()}


@functools.partial(jax.jit, static_argnames=("config",))
def sft_step(state: _state.TrainState, batch: transforms.Batch, *,
             config: _state.TrainConfig
             ) -> tuple[_state.TrainState, dict[str, Array]]:
  """One supervised (behaviour-cloning) update of the policy.

  Minimises :func:`nll_loss` (token-mean NLL of ``batch.tokens`` over
  ``batch.loss_mask``, temperature 1) with the actor optimizer, accumulating
  ``config.num_microbatches`` micro-batches exactly; non-finite or empty
  updates are skipped and counted as in :func:`train_step`. The critic and
  the reference policy are untouched. RAGEN's SFT baseline on BFS
  demonstrations trains the same way.

  Args:
    state: the :class:`TrainState`.
    batch: :class:`jagent.transforms.Batch` with ``tokens`` and
      ``loss_mask`` ``[B, S]``; ``B`` divisible by ``num_microbatches``.
    config: the :class:`TrainConfig` (static; ``ppo_epochs`` and
      ``num_minibatches`` are not used).

  Returns:
    ``(state, metrics)`` with float32 scalars ``sft/nll`` (before the
    update), ``sft/tokens``, ``train/grad_norm`` (pre-clip), ``train/lr``,
    ``train/applied`` and ``train/skipped_nonfinite_total``.

  Raises:
    ValueError: missing fields, bad shapes, or B not divisible.
  """
  return sft_update(state, batch, config=config)
