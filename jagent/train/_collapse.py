"""RAGEN-2's collapse diagnostics: reply entropy H(Z|X) and mutual information I(X;Z).

RAGEN-2 (``docs/reference_mutual_information_metrics.md`` and
``ragen/trainer/collapse_metrics.py`` in https://github.com/mll-lab-nu/RAGEN)
tells two collapses of an agent's replies apart:

* entropy collapse: the replies to one input stop varying, low ``H(Z|X)``;
* template collapse: the replies stop depending on their input, low
  ``I(X;Z)`` while ``H(Z|X)`` may stay high (the same diverse template for
  every state): the Echo Trap that reward std and entropy alone miss.

X is the context up to a reply (the ``<think>`` primer included), Z the
reply's content without its format (:func:`jagent.rollout._parse.content_mask`).
Both are estimated on ``n`` (prompt, reply) pairs of one rollout batch by
cross-scoring every reply under every prompt of the sample, under the
batch's empirical (uniform) prompt distribution.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jagent import models
from jagent._src import checks
from jagent._src.types import Array
from jagent._src.types import ArrayLike
from jagent.rollout import _parse
from jagent.rollout import _trajectory
from jagent.train import _logprobs


def collapse_estimates(cross_logprobs: ArrayLike, valid: ArrayLike) -> dict[str, Array]:
  r"""RAGEN-2's estimates of ``H(Z|X)`` and ``I(X;Z)`` from cross log-probabilities.

  With :math:`\ell_{ij}` the per-token mean log-probability of reply
  :math:`Z_i` given prompt :math:`X_j` and :math:`V` the valid pairs
  (:math:`m = |V|`), RAGEN-2's per-token estimators (``conditional_entropy_est``
  and ``mi_estimate``) are

  .. math::

    \hat H(Z|X) = -\frac1m \sum_{i \in V} \ell_{ii}, \qquad
    \hat I(X;Z) = \frac1m \sum_{i \in V} \Big[\ell_{ii}
      - \log \frac1m \sum_{j \in V} e^{\ell_{ij}}\Big]

  (the second term is :math:`\log p_{mix}(Z_i)` under the uniform mixture of
  the sample's prompts; a prompt that occurs k times weighs k, which is
  RAGEN's uniform over distinct prompts when each occurs equally often).
  ``I`` lies in ``[0, log(distinct prompts)]`` up to sampling noise: a
  small negative value reads as no input dependence.

  Args:
    cross_logprobs: float ``[n, n]``, entry ``[i, j]`` = :math:`\ell_{ij}`
      (nats per token).
    valid: bool ``[n]``, the pairs to use (rows and columns); entries of the
      others are ignored, even if not finite.

  Returns:
    float32 ``[]`` scalars: ``collapse/reply_entropy`` (:math:`\hat H(Z|X)`,
    NaN without a valid pair), ``collapse/mutual_info`` (:math:`\hat I(X;Z)`,
    NaN with fewer than 2) and ``collapse/replies`` (:math:`m`).

  Raises:
    ValueError: ``cross_logprobs`` not square or ``valid`` not ``[n]``.
  """
  ell = jnp.asarray(cross_logprobs, jnp.float32)
  v = jnp.asarray(valid, bool)
  if ell.ndim != 2 or ell.shape[0] != ell.shape[1] or v.shape != ell.shape[:1]:
    raise ValueError(f"collapse_estimates needs cross_logprobs [n, n] and valid [n]; got "
                     f"{ell.shape} and {v.shape}")
  m = jnp.sum(v.astype(jnp.float32))
  matched = jnp.where(v, jnp.diagonal(ell), 0.0)
  marginal = jax.nn.logsumexp(jnp.where(v[None, :], ell, -jnp.inf), axis=1) - jnp.log(
      jnp.maximum(m, 1.0))
  gap = jnp.where(v, matched - marginal, 0.0)
  nan = jnp.float32(jnp.nan)
  return {
      "collapse/reply_entropy": jnp.where(m > 0, -jnp.sum(matched) / jnp.maximum(m, 1.0), nan),
      "collapse/mutual_info": jnp.where(m > 1, jnp.sum(gap) / jnp.maximum(m, 1.0), nan),
      "collapse/replies": m,
  }


def _pick_rows(traj: _trajectory.Trajectory, key: jax.Array, n: int):
  """``(rows [n], picked [n], reply mask [R, S])``: the pairs' rows (see collapse_metrics)."""
  r = traj.tokens.shape[0]
  ep = jnp.asarray(traj.row_episode, jnp.int32)
  first = jnp.asarray(traj.row_turn, jnp.int32)
  # Each row's first turn's reply: the row's pair.
  reply = jnp.asarray(traj.loss_mask, bool) & (jnp.asarray(traj.turn_ids) == first[:, None])
  candidate = jnp.asarray(traj.row_valid, bool) & jnp.any(reply, axis=1)
  # The turns a row stands for: up to the next row's first turn, or to the
  # end of its episode; its weight is their share of the episode's turns.
  turns = jnp.asarray(traj.num_turns, jnp.int32)[ep]
  same = jnp.concatenate([ep[1:] == ep[:-1], jnp.zeros((1,), bool)])
  upto = jnp.where(same, jnp.concatenate([first[1:], jnp.zeros((1,), jnp.int32)]), turns)
  log_f32 = lambda x: jnp.log(jnp.maximum(x, 1).astype(jnp.float32))  # noqa: E731
  log_weight = log_f32(upto - first) - log_f32(turns)
  # Gumbel top-n: n rows without replacement, row r with probability
  # proportional to exp(log_weight[r]) at each draw.
  score = jnp.where(candidate, log_weight + jax.random.gumbel(key, (r,)), -jnp.inf)
  _, rows = jax.lax.top_k(score, n)
  return rows, candidate[rows], reply


def collapse_metrics(params: models.Params, traj: _trajectory.Trajectory, key: jax.Array, *,
                     config: models.ModelConfig, num_rows: int = 32,
                     temperature: float = 1.0, reply_tokens: int | None = None,
                     prompt_tokens: int | None = None,
                     token_table: tuple[ArrayLike, ArrayLike] | None = None,
                     think: bool = False) -> dict[str, Array]:
  r"""RAGEN-2's reply entropy and mutual information of a rollout batch under ``params``.

  Draws ``n = min(num_rows, R)`` (prompt, reply) pairs from ``traj``, scores
  each reply's content :math:`Z_i` after each drawn prompt :math:`X_j` with
  the policy at ``temperature`` (``log softmax(logits / T)``, the sampler's
  convention), giving :math:`\ell_{ij}` = the mean over :math:`Z_i`'s tokens
  of :math:`\log \pi_T(z_t | X_j, z_{<t})`, and returns
  :func:`collapse_estimates` of that ``[n, n]`` matrix (per token, RAGEN-2's
  ``mi_estimate`` / ``conditional_entropy_est``; the diagonal is the
  rollout's own log-probabilities) plus ``collapse/mutual_info_max``, the
  log of the number of distinct prompts among the valid pairs (the bound
  :math:`I \le \log N`).

  The pairs: each row's first reply (turn ``row_turn``, see
  :class:`jagent.rollout.Trajectory`), X = the row's context before it, Z =
  the reply; valid rows drawn without replacement with probability
  proportional to the share of its episode's turns the row stands for (its
  turns up to the next row's first turn, over ``num_turns``): each episode
  weighs the same whatever its length (RAGEN-2's trajectory-uniform
  sampling). So

  * with one row per episode (full history): each episode's FIRST turn, X =
    the opening prompt, Z = reply 1, episodes drawn uniformly. RAGEN-2's
    default (``collapse_first_turn_sample``): a group's episodes share that
    prompt, so X is the state alone, whereas a later turn's context holds
    the episode's own earlier replies, which a template-collapsed policy
    can echo (its Z would then look input-dependent), and the prefix to
    score stays one turn long.
  * with one row per turn (bounded history): every turn, with its own
    context, drawn with probability proportional to ``1 / num_turns`` of
    its episode.

  Z: the reply tokens whose bytes overlap the content
  (``content_span`` in ``jagent/rollout/_parse.py``) when ``token_table`` is given
  (the reasoning before ``</think>`` in think mode, else the answer inside
  ``<answer>..</answer>``; tags, end-of-turn token and text around them
  left out, as RAGEN-2 excludes ``<think>`` / ``</think>``), else every
  reply token. Pairs whose Z is empty are left out (``collapse/replies``
  counts the others).

  Cost: one forward of ``n`` rows of ``prompt_tokens`` tokens fills a KV
  cache of ``prompt_tokens + reply_tokens`` slots with each X, then ``n``
  forwards of ``n`` rows x ``reply_tokens + 1`` tokens score every reply
  after every prompt (``lax.map`` over the replies; the output projection
  only at Z's tokens). Static shapes, no host round trip: jit it (the
  keyword arguments static), e.g. inside :func:`jagent.train.rl_iteration`'s
  ``diagnostics``. The tiny config's 32 pairs (S = 318, first turns of
  ~60 tokens, replies of 6): ~0.3 s on 2 busy CPU cores, about half a rollout.

  Args:
    params: the policy that sampled ``traj``.
    traj: a rollout :class:`jagent.rollout.Trajectory` (R rows of S tokens).
    key: a typed PRNG key ``[]`` for the draw of the rows.
    config: the model config.
    num_rows: n, the pairs drawn (``n^2`` are scored); rows past R are not
      drawn.
    temperature: the rollout's sampling temperature (> 0).
    reply_tokens: W, a bound on reply length (the rollout's
      ``max_tokens_per_turn``); default S. A reply's tokens past W are not
      scored (in any column). Any played turn has ``prompt + W <= S``, so
      every reply fits after every prompt.
    prompt_tokens: P, a bound on the drawn prompts' length (X); default S.
      With one row per episode the first turn's prompt buffer
      (``TextEnv.first_width``) bounds X and makes the cost a turn's, not
      the conversation's. A pair whose X is longer is left out.
    token_table: ``Tokenizer.token_bytes()`` (uint8 ``[V, Wb]``, int32
      ``[V]``) to leave the format out of Z; None keeps every reply token.
    think: the reply format of :class:`jagent.rollout.ParseSpec` (with a
      ``token_table``).

  Returns:
    float32 ``[]`` scalars: ``collapse/reply_entropy``,
    ``collapse/mutual_info``, ``collapse/replies`` (see
    :func:`collapse_estimates`) and ``collapse/mutual_info_max`` (NaN
    without a valid pair). Nats per token.

  Raises:
    ValueError: ``num_rows``, ``reply_tokens`` or ``prompt_tokens`` not an
      int >= 1, or a bad ``temperature``.
  """
  temperature = _logprobs.check_temperature(temperature)
  for name, value in (("num_rows", num_rows), ("reply_tokens", reply_tokens),
                      ("prompt_tokens", prompt_tokens)):
    if value is not None:
      checks.check_int(f"collapse_metrics: {name}", value, 1)
  tokens = jnp.asarray(traj.tokens, jnp.int32)
  r, s = tokens.shape
  n = min(num_rows, r)
  w = s if reply_tokens is None else reply_tokens
  p = s if prompt_tokens is None else min(prompt_tokens, s)
  rows, picked, reply = _pick_rows(traj, key, n)
  toks = tokens[rows]  # [n, S]
  reply = reply[rows]
  start = jnp.argmax(reply, axis=1).astype(jnp.int32)  # X_i = toks[i, :start[i]]
  length = jnp.minimum(jnp.sum(reply, axis=1, dtype=jnp.int32), w)
  offs = jnp.arange(w, dtype=jnp.int32)[None, :]
  rep = jnp.take_along_axis(toks, start[:, None] + offs, axis=1, mode="fill", fill_value=0)
  if token_table is None:
    z = offs < length[:, None]
  else:
    z = _parse.content_mask(rep, length, jnp.asarray(token_table[0]),
                            jnp.asarray(token_table[1]), think=think)
  count = jnp.sum(z, axis=1)
  valid = picked & (count > 0) & (start <= p)

  # Every X but its last token into a KV cache; each reply is then fed after
  # X's last token, so position 0 of the fed tokens predicts the reply's
  # first token. A valid pair's tokens sit below P + W (and S: the rollout
  # starts a turn only when prompt + max_tokens_per_turn fit).
  head = jnp.clip(start - 1, 0, p - 1)
  cache = models.init_cache(config, n, min(p + w, s))
  pos = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32)[None], (n, p))
  _, cache = models.hidden_states(params, toks[:, :p], pos, cache, config=config,
                                  num_tokens=head)
  last = jnp.take_along_axis(toks, head[:, None], axis=1)  # [n, 1]
  fed_pos = head[:, None] + jnp.arange(w + 1, dtype=jnp.int32)[None, :]

  def score(reply_and_z):  # log p(Z_i | X_j) summed over Z_i's tokens, for every j
    rep_i, z_i = reply_and_z
    fed = jnp.concatenate([last, jnp.broadcast_to(rep_i[None], (n, w))], axis=1)
    mask = jnp.concatenate([jnp.zeros((n, 1), bool), jnp.broadcast_to(z_i[None], (n, w))],
                           axis=1)
    h, _ = models.hidden_states(params, fed, fed_pos, cache, config=config)
    lp = _logprobs.logprobs_from_hidden(params, h, fed, config=config, temperature=temperature,
                                        with_entropy=False, mask=mask).logprobs
    return jnp.sum(jnp.where(mask, lp, 0.0), axis=1)

  sums = jax.lax.map(score, (rep, z))  # [i, j]
  out = collapse_estimates(sums / jnp.maximum(count, 1)[:, None].astype(jnp.float32), valid)

  # Distinct prompts among the valid pairs: X_i == X_j token for token.
  x = toks[:, :p]
  before = jnp.arange(p)[None, :] < start[:, None]
  same = (start[:, None] == start[None, :]) & jnp.all(
      (x[:, None, :] == x[None, :, :]) | ~before[:, None, :], axis=2)
  copies = jnp.sum(same & valid[None, :], axis=1)
  distinct = jnp.round(jnp.sum(jnp.where(valid, 1.0 / jnp.maximum(copies, 1), 0.0)))
  out["collapse/mutual_info_max"] = jnp.where(distinct > 0, jnp.log(jnp.maximum(distinct, 1.0)),
                                              jnp.float32(jnp.nan))
  return out
