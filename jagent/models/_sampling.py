"""Batched autoregressive generation: prefill + bounded decode loop, one jit.

``generate`` prefills each row's prompt into the KV cache (rows have their own
lengths; slot = position), then runs a ``lax.while_loop`` of single-token
decode steps, bounded by ``max_new_tokens``, that stops as soon as every row
has stopped (EOS id or a stop token sequence) and fed its last token. Rows that
stop early keep running as masked no-ops. Shapes are static: one compile per
(model config, sampling config, batch, prompt width, cache size).

Log-probability convention (what RL needs): ``logprobs[b, n]`` is
``log softmax(logits / T)[token]``, the policy at temperature T *before* top-k /
top-p truncation (T = 1 for greedy). A full forward pass over the final
sequences reproduces it exactly, which is what a policy-gradient loss
recomputes. ``sampling_logprobs`` is the log-probability under the distribution
actually sampled from (tempered, truncated to top-k / top-p and renormalized;
0 for greedy); it equals ``logprobs`` when no truncation is active.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jagent._src.errors import FieldError
from jagent._src import checks
from jagent.models import _config
from jagent.models import _lora
from jagent.models import _transformer


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to pick tokens (static: part of the compiled program).

  Attributes:
    max_new_tokens: N, the most tokens generated per row (loop bound).
    temperature: T > 0 divides the logits; ignored when ``greedy``.
    top_k: keep the k most likely tokens (0 = off).
    top_p: nucleus sampling (Holtzman et al., https://arxiv.org/abs/1904.09751):
      keep the smallest most-likely set whose mass reaches ``top_p`` (1 = off);
      applied after top-k, on the renormalized top-k distribution.
    greedy: take the argmax (temperature, top_k, top_p ignored).
    eos_ids: token ids that end a row (the id is kept in the output).
    stop_sequences: token id sequences that end a row when the generated
      tokens end with one (kept in the output).
    stop_strings: texts that end a row as soon as the decoded reply contains
      one (the token completing it is kept). Matched on UTF-8 bytes, so they
      stop a row whatever tokens spelled them; :func:`generate` then needs the
      tokenizer's ``token_table``.
    merge_lora: with :class:`jagent.models.LoraParams`, fold the adapters
      into the weights once per :func:`generate` call
      (:func:`jagent.models.merge_lora`) rather than apply them at every
      step. Same tokens up to float rounding; on XLA:CPU merged decoding of
      the tiny configs was faster (figures: ``jagent.models._lora``'s
      docstring), at the cost of a merged copy of the adapted weights while
      sampling. Ignored for plain ``Params``.
    prefill_chunk: C > 0: prefill a prompt longer than C tokens in chunks
      of C tokens (a ``lax.scan`` of cached forwards), so the prefill's
      activations are those of ``B x C`` tokens, not ``B x P`` (the MLP's
      ``[B x P, 2F]`` dominated RAGEN's 3B rollout: docs/scaling.md). 0 (the
      default): the whole prompt in one forward. Same logits up to float
      rounding (causal attention over the cache either way).

  Raises:
    jagent.FieldError: (a ValueError) from ``__post_init__``, naming the invalid field.
  """

  max_new_tokens: int = 32
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  greedy: bool = False
  eos_ids: tuple[int, ...] = ()
  stop_sequences: tuple[tuple[int, ...], ...] = ()
  stop_strings: tuple[str, ...] = ()
  merge_lora: bool = True
  prefill_chunk: int = 0

  def __post_init__(self):
    def bad(field, why, advice=None):
      raise FieldError("SamplingConfig", field, getattr(self, field), why, advice)

    checks.check_int("max_new_tokens", self.max_new_tokens, 1, why="must be a positive int",
                     owner="SamplingConfig")
    checks.check_int("prefill_chunk", self.prefill_chunk, 0,
                     why="must be an int >= 0 (0 = the whole prompt at once)",
                     owner="SamplingConfig")
    if not (self.temperature > 0 and math.isfinite(self.temperature)):
      bad("temperature", "must be a positive finite float", "use greedy=True for argmax")
    checks.check_int("top_k", self.top_k, 0, why="must be an int >= 0 (0 = off)",
                     owner="SamplingConfig")
    if not 0 < self.top_p <= 1:
      bad("top_p", "must be in (0, 1]")
    object.__setattr__(self, "eos_ids", tuple(int(i) for i in self.eos_ids))
    object.__setattr__(self, "stop_sequences",
                       tuple(tuple(int(i) for i in s) for s in self.stop_sequences))
    if any(len(s) == 0 for s in self.stop_sequences):
      bad("stop_sequences", "must not contain an empty sequence")
    if isinstance(self.stop_strings, str) or not all(
        isinstance(s, str) and s for s in self.stop_strings):
      bad("stop_strings", "must be a tuple of non-empty strings")
    object.__setattr__(self, "stop_strings", tuple(self.stop_strings))


class GenerateOutput(NamedTuple):
  """What :func:`generate` returns."""
  tokens: jax.Array  # shape=[B, N], dtype=int32; pad_id after each row's length
  logprobs: jax.Array  # shape=[B, N], dtype=float32; log pi_T(token), 0 after length
  sampling_logprobs: jax.Array  # shape=[B, N], dtype=float32; under the truncated dist.
  lengths: jax.Array  # shape=[B], dtype=int32; generated tokens per row (incl. stop)
  stopped: jax.Array  # shape=[B], dtype=bool; ended on EOS / stop sequence / string
  eos: jax.Array  # shape=[B], dtype=bool; the last token is one of ``eos_ids``
  cache: _transformer.KVCache  # holds prompt and every generated token


def _categorical(key: jax.Array, logits: jax.Array, block: int = 128) -> jax.Array:
  """int32 [B]: one draw per row from softmax(logits [B, V]) by inverse CDF.

  Entries at -inf have zero mass and are never drawn. See
  :func:`_categorical_weights`.
  """
  return _categorical_weights(key, jax.nn.softmax(logits.astype(jnp.float32), axis=-1), block)


def _cumsum(x: jax.Array) -> jax.Array:
  """Cumulative sum over the last axis of float32 [B, n] (n small), as a matmul."""
  n = x.shape[-1]
  return jnp.dot(x, jnp.asarray(np.triu(np.ones((n, n), np.float32))),
                 precision=jax.lax.Precision.HIGHEST)


def _categorical_weights(key: jax.Array, probs: jax.Array, block: int = 128) -> jax.Array:
  """int32 [B]: one draw per row with probabilities proportional to ``probs``.

  ``probs`` is float32 [B, V], nonnegative, not necessarily normalized (e.g.
  ``exp(logits - max)``, which spares the division of a softmax). One uniform
  per row (``jax.random.categorical`` draws B x V Gumbel variates, which
  dominated decode time at V = 8k on CPU), located in two levels: first the
  block of ``block`` ids whose cumulative mass crosses it, then the id inside
  that block (XLA's CPU cumsum over a long axis is slow). Both cumulative
  sums are products with an upper-triangular matrix of ones: XLA:CPU lowers
  ``cumsum`` to a slower ``reduce_window`` (measured in docs/results.md,
  "Model kernels on XLA:CPU").
  Zero entries are never drawn.
  """
  b, v = probs.shape
  pad = (-v) % block
  blocks = jnp.pad(probs, ((0, 0), (0, pad))).reshape(b, -1, block)  # [B, nb, bs]
  nb = blocks.shape[1]
  mass = jnp.sum(blocks, axis=-1)  # [B, nb]
  cdf = _cumsum(mass)
  u = _row_uniforms(key, b) * cdf[:, -1:]
  blk = jnp.minimum(jnp.sum((cdf <= u).astype(jnp.int32), axis=-1), nb - 1)  # [B]
  before = jnp.take_along_axis(cdf - mass, blk[:, None], axis=-1)  # [B, 1]
  inner = jnp.take_along_axis(blocks, blk[:, None, None], axis=1)[:, 0]  # [B, bs]
  icdf = _cumsum(inner)
  j = jnp.sum((icdf <= u - before).astype(jnp.int32), axis=-1)
  # Rounding could point past the block's last nonzero entry: clamp onto it.
  last = jnp.max(jnp.where(inner > 0, jnp.arange(block)[None, :], 0), axis=-1)
  return (blk * block + jnp.minimum(j, last)).astype(jnp.int32)


def _row_uniforms(key: jax.Array, b: int) -> jax.Array:
  """float32 [B, 1] uniforms in [0, 1): from one key [], or one per row from keys [B].

  With per-row keys row b's draw depends on its own key only, whatever the
  batch holds beside it (tree rollouts fork rows and must reproduce them).
  """
  if jnp.ndim(key) == 0:
    return jax.random.uniform(key, (b, 1), jnp.float32)
  return jax.vmap(lambda k: jax.random.uniform(k, (1,), jnp.float32))(key)


def fold_in(key: jax.Array, i) -> jax.Array:
  """``jax.random.fold_in`` of one key [] or of each of the keys [B]."""
  if jnp.ndim(key) == 0:
    return jax.random.fold_in(key, i)
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(key, i)


def _argmax(x: jax.Array) -> jax.Array:
  """int32 [B]: ``jnp.argmax(x, axis=-1)`` of float [B, V] (first maximum; first NaN).

  As two vectorized reductions (the maximum, then the first index holding
  it): XLA:CPU's fused value-and-index reduction of ``argmax`` is slower
  (measured in docs/results.md, "Model kernels on XLA:CPU").
  """
  v = x.shape[-1]
  hit = (x == jnp.max(x, axis=-1, keepdims=True)) | jnp.isnan(x)
  ids = jnp.arange(v, dtype=jnp.int32)[None, :]
  return jnp.min(jnp.where(hit, ids, v), axis=-1).astype(jnp.int32)


def _pick(x: jax.Array, tok: jax.Array) -> jax.Array:
  """float [B]: ``x[b, tok[b]]``."""
  return jnp.take_along_axis(x, tok[:, None], axis=-1)[:, 0]


def sample_logits(logits: jax.Array, key: jax.Array, sampling: SamplingConfig
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Samples one token per row.

  Args:
    logits: float [B, V].
    key: a PRNG key [], or one per row [B] (row b then draws from its own).
    sampling: temperature / top-k / top-p / greedy settings.

  Returns:
    ``(tokens, logprobs, sampling_logprobs)``: int32 [B]; float32 [B]
    ``log softmax(logits / T)[token]`` (T = 1 when greedy); float32 [B] under
    the truncated renormalized distribution (0 when greedy).
  """
  logits = logits.astype(jnp.float32)
  # log_softmax(x)[tok] = (x[tok] - max) - log(sum(exp(x - max))), as
  # jax.nn.log_softmax computes it, for the picked token only.
  if sampling.greedy:
    tok = _argmax(logits)
    shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
    lp = _pick(shifted, tok) - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
    return tok, lp, jnp.zeros_like(lp)
  scaled = logits / sampling.temperature
  shifted = scaled - jnp.max(scaled, axis=-1, keepdims=True)
  weights = jnp.exp(shifted)  # unnormalized tempered probabilities
  log_z = jnp.log(jnp.sum(weights, axis=-1))
  v = logits.shape[-1]
  lp_of = lambda tok: _pick(shifted, tok) - log_z  # noqa: E731
  if not sampling.top_k and sampling.top_p == 1:  # plain tempered sampling
    tok = _categorical_weights(key, weights)
    return tok, lp_of(tok), lp_of(tok)
  if sampling.top_k:
    tok, slp = _truncated(key, scaled, min(sampling.top_k, v), sampling.top_p, None)
  elif v <= _NUCLEUS_PREFIX:
    tok, slp = _truncated(key, scaled, v, sampling.top_p, log_z)
  else:
    # Nucleus alone: sort only the _NUCLEUS_PREFIX most likely ids when the
    # nucleus of every row lies among them (a trained policy's usually
    # does); otherwise the whole vocabulary (a full sort is far slower on
    # XLA:CPU: docs/results.md, "Model kernels on XLA:CPU"). Same kept set
    # either way.
    head = jnp.exp(jax.lax.top_k(shifted, _NUCLEUS_PREFIX)[0] - log_z[:, None])
    fits = jnp.all(jnp.sum(head, axis=-1) >= sampling.top_p)
    tok, slp = jax.lax.cond(
        fits, lambda: _truncated(key, scaled, _NUCLEUS_PREFIX, sampling.top_p, log_z),
        lambda: _truncated(key, scaled, v, sampling.top_p, log_z))
  return tok, lp_of(tok), slp


# Ids sorted first when only top-p truncates (see sample_logits).
_NUCLEUS_PREFIX = 64


def _truncated(key, scaled, k, top_p, log_z):
  """Draws from the top-``k`` ids of ``scaled`` [B, V], then the top-p nucleus.

  Args:
    key: PRNG key.
    scaled: float32 [B, V] tempered logits.
    k: ids kept by top-k (static).
    top_p: nucleus mass (1 = off), of the top-k distribution renormalized.
    log_z: None (renormalize over the top k), or float32 [B] ``log sum exp``
      of ``scaled - max(scaled)``: the nucleus of the whole distribution,
      of which the top k must hold it.

  Returns:
    ``(tokens int32 [B], sampling log-probs float32 [B])``.
  """
  vals, idx = jax.lax.top_k(scaled, k)  # [B, k], descending
  if top_p < 1:
    if log_z is None:
      probs = jax.nn.softmax(vals, axis=-1)
    else:
      probs = jnp.exp(vals - jnp.max(scaled, axis=-1, keepdims=True) - log_z[:, None])
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    vals = jnp.where(mass_before < top_p, vals, -jnp.inf)
  choice = _categorical(key, vals)
  tok = jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)
  return tok, _pick(jax.nn.log_softmax(vals), choice)


def _stops(gen, n, tok, sampling: SamplingConfig):
  """bool [B]: the row's generated tokens (tok just written at n - 1) end a row."""
  hit = _is_eos(tok, sampling)
  for seq in sampling.stop_sequences:
    m = len(seq)
    idx = n[:, None] - m + jnp.arange(m, dtype=jnp.int32)[None]  # [B, m]
    got = jnp.take_along_axis(gen, jnp.clip(idx, 0, gen.shape[1] - 1), axis=1)
    hit = hit | ((n >= m) & jnp.all(got == jnp.asarray(seq, jnp.int32)[None], axis=1))
  return hit


def _is_eos(tok, sampling: SamplingConfig):
  """bool [B]: ``tok`` is one of the EOS ids."""
  hit = jnp.zeros(tok.shape, bool)
  for e in sampling.eos_ids:
    hit = hit | (tok == e)
  return hit


def _string_stops(tail, tok, token_table, sampling: SamplingConfig):
  """Appends the bytes of ``tok`` to each row's byte tail; finds stop strings.

  Args:
    tail: uint8 [B, K - 1], the last K - 1 reply bytes (K = longest stop
      string), left-padded with zeros at the start of a reply.
    tok: int32 [B] the tokens just sampled.
    token_table: ``(table uint8 [V, W], lengths int32 [V])``.
    sampling: the config holding ``stop_strings``.

  Returns:
    ``(hit bool [B], new_tail uint8 [B, K - 1])``: ``hit`` when a stop string
    ends inside the new token's bytes.
  """
  table, table_len = token_table
  b = tok.shape[0]
  w = table.shape[1]
  k1 = tail.shape[1]
  new = jnp.asarray(table)[tok]  # [B, W]
  n_new = jnp.asarray(table_len)[tok]  # [B]
  window = jnp.concatenate([tail, new], axis=1)  # [B, K - 1 + W], valid K - 1 + n_new
  valid = k1 + n_new
  hit = jnp.zeros((b,), bool)
  ends = np.arange(k1 + 1, k1 + w + 1)  # candidate exclusive end indices in the window
  for text in sampling.stop_strings:
    pat = np.frombuffer(text.encode("utf-8"), np.uint8)
    m = pat.shape[0]
    idx = np.clip(ends[:, None] - m + np.arange(m)[None], 0, k1 + w - 1)  # [W, m]
    match = jnp.all(window[:, idx] == jnp.asarray(pat)[None, None], axis=2)  # [B, W]
    ok = (ends[None] <= valid[:, None]) & (ends[None] >= m)
    hit = hit | jnp.any(match & ok, axis=1)
  idx = valid[:, None] - k1 + jnp.arange(k1, dtype=jnp.int32)[None]  # last K - 1 valid bytes
  new_tail = jnp.take_along_axis(window, jnp.clip(idx, 0, k1 + w - 1), axis=1)
  return hit, new_tail


def prefill(params, prompt: jax.Array, prompt_lengths: jax.Array,
            cache: _transformer.KVCache, *, config: _config.ModelConfig,
            chunk: int = 0) -> tuple[jax.Array, _transformer.KVCache]:
  """Prefills row b's ``prompt[b, :prompt_lengths[b]]`` at slots ``cache.lengths[b] + t``.

  In one cached forward (``chunk`` 0, or a prompt of at most ``chunk``
  tokens) or in chunks of ``chunk`` tokens, a ``lax.scan`` of cached
  forwards (:attr:`SamplingConfig.prefill_chunk`): the same logits and
  cache up to float rounding, with the activations of ``B x chunk`` tokens
  at a time.

  Args:
    params: ``Params`` or ``LoraParams``.
    prompt: int32 [B, P], right-padded.
    prompt_lengths: int32 [B], valid tokens per row (0 allowed).
    cache: the KV cache (slots past S are dropped).
    config: the model config.
    chunk: C >= 0, tokens per chunk (0: one forward).

  Returns:
    ``(logits, cache)``: float32 logits [B, V] after each row's last prompt
    token (token 0 for an empty prompt) and the cache, ``lengths`` grown by
    ``prompt_lengths``.
  """
  b, p = prompt.shape
  last = jnp.maximum(prompt_lengths - 1, 0)
  if not chunk or p <= chunk:
    positions = cache.lengths[:, None] + jnp.arange(p, dtype=jnp.int32)[None]
    return _transformer.apply(params, prompt, positions, cache, config=config,
                              num_tokens=prompt_lengths, logits_at=last)
  n = -(-p // chunk)
  padded = jnp.pad(prompt, ((0, 0), (0, n * chunk - p)), constant_values=config.pad_id)
  chunks = jnp.moveaxis(padded.reshape(b, n, chunk), 1, 0)  # [n, B, C]
  starts = jnp.arange(n, dtype=jnp.int32) * chunk

  def body(carry, xs):
    cache, logits = carry
    tokens, start = xs
    positions = cache.lengths[:, None] + jnp.arange(chunk, dtype=jnp.int32)[None]
    z, cache = _transformer.apply(
        params, tokens, positions, cache, config=config,
        num_tokens=jnp.clip(prompt_lengths - start, 0, chunk),
        logits_at=jnp.clip(last - start, 0, chunk - 1))
    here = (last >= start) & (last < start + chunk)
    return (cache, jnp.where(here[:, None], z, logits)), None

  zeros = jnp.zeros((b, config.vocab_size), jnp.float32)
  (cache, logits), _ = jax.lax.scan(body, (cache, zeros), (chunks, starts))
  return logits, cache


@functools.partial(jax.jit, static_argnames=("config", "sampling", "cache_size"),
                   donate_argnames=("cache",))
def generate(
    params: _transformer.Params,
    prompt: jax.typing.ArrayLike,
    prompt_lengths: jax.typing.ArrayLike,
    key: jax.Array,
    cache: _transformer.KVCache | None = None,
    *,
    config: _config.ModelConfig,
    sampling: SamplingConfig,
    cache_size: int | None = None,
    active: jax.typing.ArrayLike | None = None,
    token_table: tuple[jax.typing.ArrayLike, jax.typing.ArrayLike] | None = None,
) -> GenerateOutput:
  """Generates up to ``sampling.max_new_tokens`` tokens per row, in one program.

  Row b's prompt ``prompt[b, :prompt_lengths[b]]`` is prefilled at slots
  ``cache.lengths[b] + t`` (slot = RoPE position), so a later turn passes the
  cache back with only its new tokens. Then each decode step feeds the last
  sampled token of every row that has not stopped and samples the next.

  Args:
    params: model parameters (``Params`` or ``LoraParams``).
    prompt: int32 [B, P] new tokens per row, right-padded.
    prompt_lengths: int32 [B] valid prompt tokens per row (>= 1 on active rows;
      0 is allowed on inactive rows).
    key: PRNG key [] (ignored by greedy decoding), or typed keys [B], one
      per row: row b's tokens then depend only on its own key, prompt and
      cache (tree rollouts rely on this to fork rows reproducibly).
    cache: optional KVCache from an earlier call or :func:`init_cache`
      (donated); it needs ``lengths + prompt_lengths + N <= S`` slots (writes
      past S are dropped). Default: an empty cache of ``cache_size`` slots.
      A cache in per-layer form (:func:`jagent.models.per_layer_form`) is
      returned in that form; a stacked one stacked.
    config: model config (static).
    sampling: SamplingConfig (static).
    cache_size: slots of the default cache (static; default P + N).
    active: optional bool [B]; inactive rows (e.g. finished episodes)
      generate nothing (length 0) but still get their prompt prefilled.
    token_table: ``Tokenizer.token_bytes()`` (uint8 [V, W], int32 [V]);
      required when ``sampling.stop_strings`` is set.

  Returns:
    GenerateOutput: tokens/logprobs [B, N], lengths [B], stopped [B] and the
    cache holding each row's prompt and all its generated tokens
    (``cache.lengths`` grows by ``prompt_lengths + lengths``).
    See the module docstring for the log-probability convention.

  Raises:
    ValueError: ``stop_strings`` without a ``token_table``.
  """
  c, sp = config, sampling
  if sp.stop_strings and token_table is None:
    raise ValueError(f"SamplingConfig.stop_strings={sp.stop_strings!r} needs the "
                     "tokenizer's token_table (Tokenizer.token_bytes()).")
  if sp.merge_lora and _lora.is_lora(params):
    # Once per call (SamplingConfig.merge_lora), at least in the compute dtype.
    params = _lora.merge_lora(params, min_dtype=c.jnp_dtype)
  prompt = jnp.asarray(prompt, jnp.int32)
  prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
  b, p = prompt.shape
  n_max = sp.max_new_tokens
  active = jnp.ones((b,), bool) if active is None else jnp.asarray(active, bool)
  if cache is None:
    cache = _transformer.init_cache(c, b, cache_size or p + n_max)
  split_in = isinstance(cache.k, tuple)
  logits, cache = prefill(params, prompt, prompt_lengths, cache, config=c,
                          chunk=sp.prefill_chunk)
  tok, lp, slp = sample_logits(logits, fold_in(key, 0), sp)
  tok = jnp.where(active, tok, c.pad_id)
  gen = jnp.full((b, n_max), c.pad_id, jnp.int32).at[:, 0].set(tok)
  lps = jnp.zeros((b, n_max), jnp.float32).at[:, 0].set(jnp.where(active, lp, 0.0))
  slps = jnp.zeros((b, n_max), jnp.float32).at[:, 0].set(jnp.where(active, slp, 0.0))
  n = active.astype(jnp.int32)
  stopped = active & _stops(gen, n, tok, sp)
  tail = jnp.zeros((b, max([len(t.encode("utf-8")) for t in sp.stop_strings] + [1]) - 1),
                   jnp.uint8)
  if sp.stop_strings:
    hit, tail = _string_stops(tail, tok, token_table, sp)
    stopped = stopped | (active & hit)
  done = ~active | stopped | (n >= n_max)
  pending = active
  rows = jnp.arange(b)

  def cond(state):
    i, *_, pending, _, _ = state
    return (i < n_max) & jnp.any(pending)

  def body(state):
    i, tok, gen, lps, slps, n, stopped, done, pending, tail, cache = state
    logits, cache = _transformer.apply(
        params, tok[:, None], cache.lengths[:, None], cache, config=c,
        num_tokens=pending.astype(jnp.int32))
    new, lp, slp = sample_logits(logits[:, 0], fold_in(key, i + 1), sp)
    live = ~done
    col = jnp.where(live, n, n_max)  # out of range -> dropped
    gen = gen.at[rows, col].set(new, mode="drop")
    lps = lps.at[rows, col].set(lp, mode="drop")
    slps = slps.at[rows, col].set(slp, mode="drop")
    n = n + live.astype(jnp.int32)
    hit = _stops(gen, n, new, sp)
    if sp.stop_strings:
      shit, new_tail = _string_stops(tail, new, token_table, sp)
      hit = hit | shit
      tail = jnp.where(live[:, None], new_tail, tail)
    hit = live & hit
    stopped = stopped | hit
    done = done | hit | (n >= n_max)
    tok = jnp.where(live, new, tok)
    return i + 1, tok, gen, lps, slps, n, stopped, done, live, tail, cache

  # The loop's own copy of the weights and cache (per_layer_form: one buffer
  # per layer on short CPU stacks); apply reads params from the closure. A
  # cache passed in per layer goes back per layer: a rollout splits it once.
  params, cache = _transformer.per_layer_form(params, cache)
  state = (jnp.int32(0), tok, gen, lps, slps, n, stopped, done, pending, tail, cache)
  _, _, gen, lps, slps, n, stopped, _, _, _, cache = jax.lax.while_loop(cond, body, state)
  if not split_in:
    cache = _transformer.stacked_cache(cache)
  last = jnp.take_along_axis(gen, jnp.maximum(n - 1, 0)[:, None], axis=1)[:, 0]
  eos = (n > 0) & _is_eos(last, sp)
  return GenerateOutput(tokens=gen, logprobs=lps, sampling_logprobs=slps, lengths=n,
                        stopped=stopped, eos=eos, cache=cache)
