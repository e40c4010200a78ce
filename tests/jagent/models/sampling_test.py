"""Tests of the batched sampler: caching, log-probabilities, stopping, statistics."""

import dataclasses
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jagent import models
from tests.jagent.models import sharpen

CFG = models.get_config("tiny", vocab_size=48, embed_dim=32, num_layers=2, mlp_dim=64,
                        head_dim=8, eos_id=1, pad_id=0)
B, P, N = 4, 6, 12
W = 40  # cache slots, and the width of every full forward (one compile each)
GREEDY = models.SamplingConfig(max_new_tokens=N, greedy=True)
LENGTHS = np.array([6, 2, 4, 1], np.int32)


def _prompts():
  rng = np.random.default_rng(0)
  prompt = rng.integers(3, CFG.vocab_size, size=(B, P)).astype(np.int32)
  for b in range(B):
    prompt[b, LENGTHS[b]:] = 0
  return prompt


@jax.jit
def _full_logits(params, seqs):
  seqs = jnp.pad(seqs, ((0, 0), (0, W - seqs.shape[1])))
  pos = jnp.broadcast_to(jnp.arange(seqs.shape[1]), seqs.shape)
  return models.apply(params, seqs, pos, config=CFG)[0]


def _sequences(prompt, out, row):
  """Row's prompt plus its generated tokens, padded to W."""
  seq = np.concatenate([prompt[row, :LENGTHS[row]], out.tokens[row, :out.lengths[row]]])
  return np.pad(seq, (0, W - len(seq)))


class SamplingTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Larger weights than init() so the distribution is far from uniform.
    params = models.init(CFG, jax.random.key(0))
    cls.params = sharpen.sharpened(params, 8.0)
    cls.prompt = _prompts()

  def _generate(self, sampling, key=0):
    return models.generate(self.params, self.prompt, LENGTHS, jax.random.key(key),
                           config=CFG, sampling=sampling, cache_size=W)

  def test_cached_greedy_equals_full_recomputation(self):
    out = self._generate(GREEDY)
    np.testing.assert_array_equal(out.lengths, N)
    # Recompute step by step without a cache: argmax of a full forward.
    seqs = np.zeros((B, W), np.int32)
    for b in range(B):
      seqs[b, :LENGTHS[b]] = self.prompt[b, :LENGTHS[b]]
    for i in range(N):
      logits = np.asarray(_full_logits(self.params, seqs))
      for b in range(B):
        seqs[b, LENGTHS[b] + i] = logits[b, LENGTHS[b] + i - 1].argmax()
    for b in range(B):
      np.testing.assert_array_equal(out.tokens[b], seqs[b, LENGTHS[b]:LENGTHS[b] + N])
    np.testing.assert_array_equal(out.cache.lengths, LENGTHS + N)

  @parameterized.named_parameters(
      ("temperature", models.SamplingConfig(max_new_tokens=N, temperature=0.7)),
      ("top_k_top_p", models.SamplingConfig(max_new_tokens=N, temperature=1.3, top_k=5,
                                            top_p=0.8)),
      ("greedy", GREEDY))
  def test_logprobs_equal_full_forward(self, sampling):
    out = self._generate(sampling, key=3)
    seqs = np.stack([_sequences(self.prompt, out, b) for b in range(B)])
    logits = np.asarray(_full_logits(self.params, seqs), np.float64)
    temp = 1.0 if sampling.greedy else sampling.temperature
    logp = jax.nn.log_softmax(logits / temp, axis=-1)
    for b in range(B):
      n = int(out.lengths[b])
      idx = LENGTHS[b] - 1 + np.arange(n)
      want = np.asarray(logp)[b, idx, seqs[b, idx + 1]]
      np.testing.assert_allclose(out.logprobs[b, :n], want, atol=1e-5)
      np.testing.assert_array_equal(out.logprobs[b, n:], 0.0)
    if sampling.top_k or sampling.top_p < 1:
      # Truncation renormalizes: the sampled token's probability can only grow.
      self.assertTrue(np.all(out.sampling_logprobs >= out.logprobs - 1e-6))
    elif not sampling.greedy:
      np.testing.assert_allclose(out.sampling_logprobs, out.logprobs, atol=1e-6)

  def test_eos_and_stop_sequences_end_rows(self):
    ref = self._generate(GREEDY)
    toks = np.asarray(ref.tokens)
    eos = int(toks[0, 4])
    seq = tuple(int(t) for t in toks[2, 6:8])
    out = self._generate(models.SamplingConfig(max_new_tokens=N, greedy=True, eos_ids=(eos,),
                                               stop_sequences=(seq,)))
    for b in range(B):
      row = list(toks[b])
      want = N
      for i in range(N):
        if row[i] == eos or (i >= 1 and tuple(row[i - 1:i + 1]) == seq):
          want = i + 1
          break
      self.assertEqual(int(out.lengths[b]), want, f"row {b}")
      np.testing.assert_array_equal(out.tokens[b, :want], toks[b, :want])
      np.testing.assert_array_equal(out.tokens[b, want:], CFG.pad_id)
      self.assertEqual(bool(out.stopped[b]), want < N or row[N - 1] == eos)
    self.assertLessEqual(int(out.lengths[0]), 5)
    self.assertLessEqual(int(out.lengths[2]), 8)
    np.testing.assert_array_equal(out.cache.lengths, LENGTHS + out.lengths)

  def test_stop_strings_end_rows_on_bytes(self):
    # A byte table where each id spells a few letters, so strings span tokens.
    rng = np.random.default_rng(1)
    words = [bytes(int(c) for c in rng.choice(list(b"abc"), size=int(rng.integers(0, 4))))
             for _ in range(CFG.vocab_size)]
    table = np.zeros((CFG.vocab_size, 3), np.uint8)
    for i, w in enumerate(words):
      table[i, :len(w)] = list(w)
    lens = np.array([len(w) for w in words], np.int32)
    ref = self._generate(GREEDY)
    toks = np.asarray(ref.tokens)
    text1 = b"".join(words[t] for t in toks[1])
    stop = (text1[len(text1) // 2 - 2:len(text1) // 2 + 2] or b"ab").decode()
    sampling = models.SamplingConfig(max_new_tokens=N, greedy=True, stop_strings=(stop, "cc"))
    out = models.generate(self.params, self.prompt, LENGTHS, jax.random.key(0), config=CFG,
                          sampling=sampling, cache_size=W, token_table=(table, lens))
    for b in range(B):
      want, found = N, False
      for i in range(N):  # first token after which the decoded reply contains a stop
        text = b"".join(words[t] for t in toks[b, :i + 1])
        if stop.encode() in text or b"cc" in text:
          want, found = i + 1, True
          break
      self.assertEqual(int(out.lengths[b]), want, f"row {b}")
      self.assertEqual(bool(out.stopped[b]), found)
      np.testing.assert_array_equal(out.tokens[b, :want], toks[b, :want])
    self.assertLess(int(out.lengths[1]), N)
    with self.assertRaisesRegex(ValueError, "token_table"):
      models.generate(self.params, self.prompt, LENGTHS, jax.random.key(0), config=CFG,
                      sampling=sampling, cache_size=W)

  def test_inactive_rows_generate_nothing(self):
    ref = self._generate(GREEDY)
    active = np.array([True, False, True, False])
    out = models.generate(self.params, self.prompt, LENGTHS, jax.random.key(0), config=CFG,
                          sampling=GREEDY, cache_size=W, active=active)
    np.testing.assert_array_equal(out.lengths, np.where(active, N, 0))
    np.testing.assert_array_equal(out.tokens[active], ref.tokens[active])
    np.testing.assert_array_equal(out.tokens[~active], CFG.pad_id)
    np.testing.assert_array_equal(out.logprobs[~active], 0.0)
    np.testing.assert_array_equal(out.cache.lengths, LENGTHS + out.lengths)
    self.assertFalse(np.any(out.stopped[~active]))

  def test_second_turn_prefills_only_new_tokens(self):
    first = self._generate(GREEDY)
    obs = np.zeros((B, P), np.int32)  # 3 new tokens per row, right-padded
    obs[:, :3] = [5, 7, 9]
    # Copied before the call below donates it.
    _, per_layer = models.per_layer_form(self.params, jax.tree.map(jnp.copy, first.cache))
    self.assertIsInstance(per_layer.k, tuple)
    second = models.generate(self.params, obs, np.full((B,), 3), jax.random.key(0),
                             first.cache, config=CFG, sampling=GREEDY)
    np.testing.assert_array_equal(second.cache.lengths, LENGTHS + 2 * N + 3)
    # Reference: greedy by full recomputation over the whole history.
    hist = [list(self.prompt[b, :LENGTHS[b]]) + list(first.tokens[b]) + [5, 7, 9]
            for b in range(B)]
    for i in range(N):
      seqs = np.stack([np.pad(h, (0, W - len(h))) for h in hist])
      logits = np.asarray(_full_logits(self.params, seqs))
      for b in range(B):
        hist[b].append(int(logits[b, len(hist[b]) - 1].argmax()))
    np.testing.assert_array_equal(second.tokens, [h[-N:] for h in hist])
    # A cache passed in per layer (as a rollout carries it) comes back per
    # layer, with the same tokens, log-probs and contents.
    split = models.generate(self.params, obs, np.full((B,), 3), jax.random.key(0),
                            per_layer, config=CFG, sampling=GREEDY)
    self.assertIsInstance(split.cache.k, tuple)
    self.assertLen(split.cache.k, CFG.num_layers)
    np.testing.assert_array_equal(split.tokens, second.tokens)
    np.testing.assert_allclose(split.logprobs, second.logprobs, atol=1e-6)
    back = models.stacked_cache(split.cache)
    np.testing.assert_allclose(back.k, second.cache.k, atol=1e-6)
    np.testing.assert_allclose(back.v, second.cache.v, atol=1e-6)
    np.testing.assert_array_equal(back.lengths, second.cache.lengths)
    # Splitting what is already split changes nothing.
    again_params, again = models.per_layer_form(self.params, per_layer)
    self.assertIs(again.k, per_layer.k)
    self.assertIs(models.per_layer_form(again_params, per_layer)[0].layers,
                  again_params.layers)

  def test_chunked_prefill_equals_one_forward(self):
    # Chunks of 4 and 5 tokens over prompts of 6, 2, 4 and 1 tokens (a row
    # ending on a chunk's last token, rows inside the first chunk), and a
    # second turn of 7 tokens prefilled into the first turn's cache.
    obs = np.zeros((B, 7), np.int32)
    obs[:, :7] = [5, 7, 9, 11, 13, 15, 17]
    sampling = models.SamplingConfig(max_new_tokens=N, temperature=1.0)
    want = [self._generate(sampling, key=3)]
    want.append(models.generate(self.params, obs, np.full((B,), 7), jax.random.key(4),
                                want[0].cache, config=CFG, sampling=sampling))
    for chunk in (4, 5):
      sp = dataclasses.replace(sampling, prefill_chunk=chunk)
      got = [self._generate(sp, key=3)]
      got.append(models.generate(self.params, obs, np.full((B,), 7), jax.random.key(4),
                                 got[0].cache, config=CFG, sampling=sp))
      for g, w in zip(got, want):
        np.testing.assert_array_equal(g.tokens, w.tokens)
        np.testing.assert_array_equal(g.lengths, w.lengths)
        # float rounding of the attention over key blocks: stated tolerance 1e-5.
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
      np.testing.assert_array_equal(got[1].cache.lengths, want[1].cache.lengths)
    self.assertLess(float(np.min(want[1].logprobs)), -0.5)  # not a near-greedy policy

  def test_one_trace_per_configuration(self):
    sp = models.SamplingConfig(max_new_tokens=3, temperature=0.9, top_k=4)
    fn = jax.jit(chex.assert_max_traces(models.generate.__wrapped__, n=1),
                 static_argnames=("config", "sampling", "cache_size"))
    for seed in range(3):  # new values, same shapes: no retrace
      prompt = np.asarray(self.prompt) + seed
      fn(self.params, prompt, LENGTHS - (seed % 2), jax.random.key(seed), config=CFG,
         sampling=sp)

  @parameterized.named_parameters(
      ("top_k", 3, 1.0, 1.0), ("top_p", 0, 0.7, 1.0), ("top_k_top_p_temp", 4, 0.75, 1.7),
      ("temperature", 0, 1.0, 0.5))
  def test_sampling_frequencies_match_truncated_distribution(self, top_k, top_p, temp):
    logits = jnp.array([2.0, 0.5, 1.5, -1.0, 1.0, 0.0, 1.2, -0.5])
    sp = models.SamplingConfig(temperature=temp, top_k=top_k, top_p=top_p)
    n = 20_000
    draw = jax.jit(jax.vmap(lambda k: models.sample_logits(logits[None], k, sp)[0][0]))
    counts = np.bincount(np.asarray(draw(jax.random.split(jax.random.key(1), n))),
                         minlength=8)
    # Expected: tempered softmax, keep top-k, then the smallest top set with mass >= top_p.
    p = np.exp(np.asarray(logits, np.float64) / temp)
    p /= p.sum()
    order = np.argsort(-p)
    keep = np.zeros(8, bool)
    keep[order[:top_k or 8]] = True
    q = np.where(keep, p, 0)
    q /= q.sum()
    mass = 0.0
    for i in order:
      if keep[i] and mass >= top_p:
        keep[i] = False
      mass += q[i]
    q = np.where(keep, q, 0)
    q /= q.sum()
    # Tolerance: 5 binomial standard deviations per token; excluded tokens never drawn.
    sd = np.sqrt(q * (1 - q) / n)
    np.testing.assert_array_equal(counts[~keep], 0)
    self.assertTrue(np.all(np.abs(counts / n - q) <= 5 * sd + 1e-12),
                    f"{counts / n} vs {q}")

  @parameterized.named_parameters(("nucleus_in_prefix", 6.0), ("nucleus_past_prefix", 0.3))
  def test_top_p_over_a_large_vocabulary(self, spread):
    # V = 100 > the 64 ids sorted first: a peaked distribution's nucleus lies
    # among them, a flat one's (~75 ids) does not (the whole vocabulary is
    # sorted); frequencies follow the nucleus either way.
    logits = jnp.asarray(np.random.default_rng(5).normal(size=100) * spread, jnp.float32)
    sp = models.SamplingConfig(temperature=1.0, top_p=0.8)
    n = 20_000
    draw = jax.jit(jax.vmap(lambda k: models.sample_logits(logits[None], k, sp)[0][0]))
    counts = np.bincount(np.asarray(draw(jax.random.split(jax.random.key(2), n))),
                         minlength=100)
    p = np.exp(np.asarray(logits, np.float64) - np.max(logits))
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    keep = np.zeros(100, bool)
    keep[order[before < 0.8]] = True
    self.assertEqual(keep.sum() <= 64, spread > 1)  # which path the case takes
    q = np.where(keep, p, 0) / np.sum(p[keep])
    sd = np.sqrt(q * (1 - q) / n)
    np.testing.assert_array_equal(counts[~keep], 0)
    self.assertTrue(np.all(np.abs(counts / n - q) <= 5 * sd + 1e-12))

  @parameterized.parameters(
      ("temperature", 0.0), ("top_p", 0.0), ("top_k", -1), ("max_new_tokens", 0),
      ("stop_sequences", ((),)),
      ("stop_strings", ("",)),
      ("stop_strings", "</answer>"), ("prefill_chunk", -1), ("prefill_chunk", True))
  def test_invalid_sampling_config(self, field, value):
    with self.assertRaisesRegex(ValueError, f"SamplingConfig.{field}="):
      models.SamplingConfig(**{field: value})


if __name__ == "__main__":
  absltest.main()
