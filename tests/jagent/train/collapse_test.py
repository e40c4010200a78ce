"""RAGEN-2's collapse diagnostics: jagent.train.collapse_metrics / collapse_estimates.

The evidence: the estimator equals an independent numpy computation (hand-made
matrices, and cross scores re-derived by full forwards of every
[prompt_j | reply_i] with ``train.token_logprobs``); a policy built to ignore
its input (every attention output zeroed: each position sees its own token
only) scores I(X;Z) = 0 at a high H(Z|X), while the same policy with its
attention on scores I(X;Z) well above 0; both trajectory layouts; and the
format (tags, end of turn) left out of Z by bytes, for a tokenizer with tag
tokens and for one that splits and merges them.
"""

import functools
import pathlib
import re

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jagent import models
from jagent import rollout
from jagent import tokenizers
from jagent import train
from jagent.rollout import _parse

# Untied output head: its scale sets the entropy, the attention the input dependence.
CFG = models.ModelConfig(vocab_size=32, embed_dim=16, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=8, mlp_dim=32, tie_embeddings=False)
N, G, P, L = 8, 4, 6, 3  # 8 prompts x 4 replies of 3 tokens; prompts of 6 tokens
B = N * G
S = P + L + 4  # room for a second turn: a 2-token prompt and a 2-token reply
HF_DIR = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "hf_tokenizer"


def _policy(attention: bool) -> models.Params:
  """Hand-set params: zero queries (uniform attention over the context), large
  values and output; ``attention=False`` zeroes the attention output, so the
  reply's distribution ignores everything but the tokens before it."""
  p = models.init(CFG, jax.random.key(0))
  k = jax.random.split(jax.random.key(1), 4)
  lay = jax.tree.map(lambda x: x[:1], p.layers)  # the first layer only
  lay = lay.replace(wq=jnp.zeros_like(lay.wq), wv=jax.random.normal(k[0], lay.wv.shape),
                    wo=jax.random.normal(k[1], lay.wo.shape) * float(attention))
  return p.replace(embed=jax.random.normal(k[2], p.embed.shape), layers=lay,
                   lm_head=0.3 * jax.random.normal(k[3], p.lm_head.shape))


def _prompts() -> np.ndarray:
  """int32 [B, P]: prompt j of group j = [1, s, s, s, s, 2] with s = 3 + j (the
  same last token, as an assistant header)."""
  x = np.array([[1, 3 + j, 3 + j, 3 + j, 3 + j, 2] for j in range(N)], np.int32)
  return np.repeat(x, G, axis=0)


def _z(*shape):
  return jnp.zeros(shape, jnp.int32)


def _full_trajectory(params, key, second_turn: bool = False) -> rollout.Trajectory:
  """One row per episode: prompt, a reply sampled from ``params`` (turn 0),
  optionally a second turn ([2, 5] then 2 random tokens, turn 1)."""
  x = _prompts()
  out = models.generate(params, jnp.asarray(x), jnp.full((B,), P), key, config=CFG,
                        sampling=models.SamplingConfig(max_new_tokens=L), cache_size=P + L)
  tokens = np.zeros((B, S), np.int32)
  tokens[:, :P], tokens[:, P:P + L] = x, np.asarray(out.tokens)
  turn = np.full((B, S), -1, np.int32)
  turn[:, P:P + L] = 0
  logprobs = np.zeros((B, S), np.float32)
  logprobs[:, P:P + L] = np.asarray(out.logprobs)
  if second_turn:
    tokens[:, P + L:P + L + 2] = [2, 5]
    tokens[:, P + L + 2:] = np.random.default_rng(0).integers(1, CFG.vocab_size, (B, 2))
    turn[:, P + L + 2:] = 1
  t = 2 if second_turn else 1
  return rollout.Trajectory(
      tokens=jnp.asarray(tokens), loss_mask=jnp.asarray(turn >= 0),
      logprobs=jnp.asarray(logprobs), turn_ids=jnp.asarray(turn),
      token_rewards=jnp.zeros((B, S)), length=jnp.full((B,), S if second_turn else P + L),
      turn_rewards=jnp.zeros((B, t)), scores=jnp.zeros((B,)),
      num_turns=jnp.full((B,), t, jnp.int32), reply_lengths=_z(B, t),
      format_valid=jnp.ones((B, t), bool), num_pieces=_z(B, t), num_valid=_z(B, t),
      num_executed=_z(B, t), num_effective=_z(B, t), anchor_hashes=_z(B, t),
      num_actions=_z(B), success=jnp.zeros((B,), bool), terminated=jnp.zeros((B,), bool),
      truncated=jnp.zeros((B,), bool), end_reason=_z(B), overflow=jnp.zeros((B,), bool),
      group_ids=jnp.arange(B) // G, **rollout.Trajectory.one_row_per_episode(B), group_size=G)


def _turn_rows(full: rollout.Trajectory) -> rollout.Trajectory:
  """The bounded-history layout (R = B * 2) of a two-turn ``full``: row (b, 0)
  = [prompt | reply 1]; row (b, 1) = the whole conversation with reply 2
  trained, taken by the even episodes only (the odd ones end after turn 1)."""
  tokens = np.asarray(full.tokens)
  turn = np.asarray(full.turn_ids)
  taken = np.arange(B) % 2 == 0
  rows = np.zeros((B, 2, S), np.int32)
  rows[:, 0, :P + L] = tokens[:, :P + L]
  rows[:, 1] = np.where(taken[:, None], tokens, 0)
  mask = np.zeros((B, 2, S), bool)
  mask[:, 0] = turn == 0
  mask[:, 1] = (turn == 1) & taken[:, None]
  valid = np.stack([np.ones(B, bool), taken], axis=1)
  num_turns = 1 + taken.astype(np.int32)
  r = 2 * B
  flat = lambda a: jnp.asarray(a.reshape((r,) + a.shape[2:]))  # noqa: E731
  return full.replace(
      tokens=flat(rows), loss_mask=flat(mask), logprobs=jnp.zeros((r, S)),
      turn_ids=flat(np.where(mask, np.arange(2)[None, :, None], -1)),
      token_rewards=jnp.zeros((r, S)), length=flat(np.where(valid, S, 0)),
      row_valid=flat(valid), row_episode=jnp.arange(r, dtype=jnp.int32) // 2,
      row_turn=jnp.arange(r, dtype=jnp.int32) % 2, num_turns=jnp.asarray(num_turns),
      history_turns=1)


@functools.lru_cache(maxsize=None)
def _jitted(kwargs: tuple):
  return jax.jit(lambda p, t, k: train.collapse_metrics(p, t, k, config=CFG, **dict(kwargs)))


# One compile per shape (eager ops would compile one by one).
_estimates = jax.jit(train.collapse_estimates)
_content_mask = jax.jit(_parse.content_mask, static_argnames="think")


def _metrics(params, traj, key=0, **kw):
  kw.setdefault("num_rows", 64)
  out = _jitted(tuple(sorted(kw.items())))(params, traj, jax.random.key(key))
  return {k: float(v) for k, v in jax.device_get(out).items()}


def _pairs(traj):
  """(X, reply, Z mask) of every valid row's trained reply (turn 0 in the full layout)."""
  tokens, mask = np.asarray(traj.tokens), np.asarray(traj.loss_mask)
  if traj.history_turns < 0:
    mask = mask & (np.asarray(traj.turn_ids) == 0)
    rows = range(tokens.shape[0])
  else:
    rows = np.flatnonzero(np.asarray(traj.row_valid))
  out = []
  for r in rows:
    where = np.flatnonzero(mask[r])
    out.append((tokens[r, :where[0]], tokens[r, where], np.ones(len(where), bool)))
  return out


def _reference_cross(params, pairs, *, config=CFG, temperature=1.0) -> np.ndarray:
  """float64 [n, n]: mean log p(Z_i | X_j) over Z_i, by full forwards of [X_j | reply_i]."""
  n = len(pairs)
  width = max(len(x) for x, _, _ in pairs) + max(len(r) for _, r, _ in pairs)
  seqs = np.zeros((n * n, width), np.int32)
  mask = np.zeros((n * n, width), bool)
  for i, (_, reply, z) in enumerate(pairs):
    for j, (x, _, _) in enumerate(pairs):
      seqs[i * n + j, :len(x) + len(reply)] = np.concatenate([x, reply])
      mask[i * n + j, len(x):len(x) + len(reply)] = z
  lp = np.asarray(train.token_logprobs(params, seqs, config=config, temperature=temperature)
                  .logprobs, np.float64)
  return ((lp * mask).sum(1) / mask.sum(1)).reshape(n, n)


def _numpy_estimates(ell: np.ndarray) -> tuple[float, float]:
  """(H(Z|X), I(X;Z)) of RAGEN-2's per-token estimators, written out in numpy."""
  ell = np.asarray(ell, np.float64)
  matched = np.diag(ell)
  marginal = np.log(np.mean(np.exp(ell), axis=1))
  return float(-matched.mean()), float(np.mean(matched - marginal))


class EstimatesTest(absltest.TestCase):

  def test_two_by_two_by_hand(self):
    # p(Z_0|X_0) = .5, p(Z_0|X_1) = .25; p(Z_1|X_0) = .1, p(Z_1|X_1) = .4.
    ell = np.log([[0.5, 0.25], [0.1, 0.4]])
    out = _estimates(ell, [True, True])
    want_h = -(np.log(0.5) + np.log(0.4)) / 2
    want_i = (np.log(0.5 / 0.375) + np.log(0.4 / 0.25)) / 2
    self.assertAlmostEqual(float(out["collapse/reply_entropy"]), want_h, places=6)
    self.assertAlmostEqual(float(out["collapse/mutual_info"]), want_i, places=6)
    self.assertEqual(float(out["collapse/replies"]), 2.0)

  def test_invalid_pairs_are_left_out_even_if_not_finite(self):
    rng = np.random.default_rng(0)
    ell = np.log(rng.uniform(0.01, 1.0, (5, 5)))
    valid = np.array([True, False, True, True, False])
    bad = ell.copy()
    bad[1, :] = bad[:, 4] = np.nan
    bad[4, 0] = -np.inf
    out = _estimates(bad, valid)
    want_h, want_i = _numpy_estimates(ell[np.ix_(valid, valid)])
    self.assertAlmostEqual(float(out["collapse/reply_entropy"]), want_h, places=5)
    self.assertAlmostEqual(float(out["collapse/mutual_info"]), want_i, places=5)
    self.assertEqual(float(out["collapse/replies"]), 3.0)
    # Columns equal in every row: the replies ignore the prompt, I = 0.
    flat = np.repeat(ell[:, :1], 5, axis=1)
    self.assertAlmostEqual(float(_estimates(flat, np.ones(5, bool))
                                 ["collapse/mutual_info"]), 0.0, places=6)

  def test_too_few_pairs_give_nan_and_bad_shapes_raise(self):
    one = _estimates(np.zeros((3, 3)), [False, True, False])
    self.assertEqual(float(one["collapse/reply_entropy"]), 0.0)
    self.assertTrue(np.isnan(one["collapse/mutual_info"]))
    none = _estimates(np.zeros((2, 2)), [False, False])
    self.assertTrue(np.isnan(none["collapse/reply_entropy"]))
    with self.assertRaisesRegex(ValueError, r"\[n, n\]"):
      _estimates(np.zeros((2, 3)), [True, True])


class CollapseMetricsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = {a: _policy(a) for a in (False, True)}
    cls.full = {a: _full_trajectory(cls.params[a], jax.random.key(2), second_turn=True)
                for a in (False, True)}

  def test_template_collapse_is_told_apart_from_input_dependence(self):
    flat = _metrics(self.params[False], self.full[False])
    driven = _metrics(self.params[True], self.full[True])
    for m in (flat, driven):
      self.assertEqual(m["collapse/replies"], B)
      self.assertAlmostEqual(m["collapse/mutual_info_max"], np.log(N), places=5)
    # The collapsed policy: diverse replies (high H) that ignore the prompt.
    self.assertLess(abs(flat["collapse/mutual_info"]), 1e-5, flat)
    self.assertGreater(flat["collapse/reply_entropy"], 1.5, flat)
    # Attention on: the replies carry information about the prompt.
    self.assertGreater(driven["collapse/mutual_info"], 0.3, driven)
    self.assertLessEqual(driven["collapse/mutual_info"], np.log(N) + 1e-5)
    self.assertGreater(driven["collapse/reply_entropy"], 1.0, driven)
    # H's matched terms are the rollout's own log-probabilities.
    for a, m in ((False, flat), (True, driven)):
      lp = np.asarray(self.full[a].logprobs)[np.asarray(self.full[a].turn_ids) == 0]
      self.assertAlmostEqual(m["collapse/reply_entropy"], -lp.mean(), places=4)

  def test_matches_full_forwards_and_numpy(self):
    # The first turns only (the reference's pairs), at another temperature,
    # with X and the reply bounded by their lengths.
    params, traj = self.params[True], self.full[True]
    want_h, want_i = _numpy_estimates(_reference_cross(params, _pairs(traj), temperature=0.7))
    got = _metrics(params, traj, temperature=0.7, prompt_tokens=P, reply_tokens=L)
    self.assertAlmostEqual(got["collapse/reply_entropy"], want_h, places=4)
    self.assertAlmostEqual(got["collapse/mutual_info"], want_i, places=4)
    # A bound below the prompts leaves every pair out.
    short = _metrics(params, traj, prompt_tokens=P - 1)
    self.assertEqual(short["collapse/replies"], 0.0)
    self.assertTrue(np.isnan(short["collapse/mutual_info"]))

  def test_full_layout_scores_first_turns_only(self):
    params = self.params[True]
    want = _metrics(params, _full_trajectory(params, jax.random.key(2)))
    got = _metrics(params, self.full[True])
    self.assertEqual(got, want)

  def test_turn_rows_score_each_row_in_its_own_context(self):
    params = self.params[True]
    traj = _turn_rows(self.full[True])
    pairs = _pairs(traj)
    self.assertLen(pairs, B + B // 2)
    want_h, want_i = _numpy_estimates(_reference_cross(params, pairs))
    got = _metrics(params, traj, num_rows=2 * B)  # every row: the valid ones are scored
    self.assertEqual(got["collapse/replies"], len(pairs))
    self.assertAlmostEqual(got["collapse/reply_entropy"], want_h, places=4)
    self.assertAlmostEqual(got["collapse/mutual_info"], want_i, places=4)
    # Every second-turn context is its own prompt; the first turns share N.
    self.assertAlmostEqual(got["collapse/mutual_info_max"], np.log(N + B // 2), places=5)
    # Fewer rows than valid ones: a draw of valid rows only, other keys other draws.
    draws = [_metrics(params, traj, key=k, num_rows=16) for k in (0, 1)]
    for m in draws:
      self.assertEqual(m["collapse/replies"], 16.0)
      self.assertTrue(np.isfinite(m["collapse/mutual_info"]))
    self.assertNotEqual(draws[0]["collapse/mutual_info"], draws[1]["collapse/mutual_info"])

  def test_bad_arguments_raise(self):
    for kw in (dict(num_rows=0), dict(reply_tokens=0), dict(prompt_tokens=1.5),
               dict(temperature=0.0)):
      with self.subTest(**kw), self.assertRaises(ValueError):
        train.collapse_metrics(self.params[True], self.full[True], jax.random.key(0),
                               config=CFG, **kw)


def _host_content(pieces: list[bytes], think: bool) -> list[bool]:
  """Which tokens overlap the stripped content: Python's re on the joined bytes."""
  text = b"".join(pieces)
  m = (re.match(rb"(.*?)</think>", text, re.DOTALL) if think
       else re.search(rb"<answer>(.*?)</answer>", text, re.DOTALL))
  out = [False] * len(pieces)
  if m is None or not m.group(1).strip():
    return out
  lead = len(m.group(1)) - len(m.group(1).lstrip())
  start = m.start(1) + lead
  end = start + len(m.group(1).strip())
  pos = 0
  for k, piece in enumerate(pieces):
    out[k] = bool(piece) and pos < end and pos + len(piece) > start
    pos += len(piece)
  return out


class ContentMaskTest(absltest.TestCase):

  def test_matches_the_host_rule(self):
    replies = {
        False: ["<answer>Up</answer>", "<answer> Up || Left </answer>x", "Up</answer>",
                "<answer>Up", "<answer></answer>", "I go <answer>Down</answer><answer>Up</answer>",
                "<answer>\n</answer>"],
        True: [" The box is left.</think> <answer>Left</answer>", "</think><answer>Up</answer>",
               "no closing tag <answer>Up</answer>", "a</think>b</think>"],
    }
    for name, tok in (("tiny", tokenizers.load_tiny_tokenizer()),
                      ("hf", tokenizers.HFTokenizer(str(HF_DIR)))):
      table, lengths = tok.token_bytes()
      for think, texts in replies.items():
        ids = [tok.encode(t) + [tok.eos_id] for t in texts]
        n = max(map(len, ids)) + 2
        arr = np.zeros((len(ids), n), np.int32)
        for i, row in enumerate(ids):
          arr[i, :len(row)] = row
        got = np.asarray(_content_mask(jnp.asarray(arr), jnp.asarray([len(r) for r in ids]),
                                             table, lengths, think=think))
        for i, row in enumerate(ids):
          want = _host_content([bytes(table[t, :lengths[t]]) for t in row], think)
          with self.subTest(tokenizer=name, text=texts[i]):
            self.assertEqual(got[i, :len(row)].tolist(), want)
            self.assertFalse(got[i, len(row):].any())
    # The tiny tokenizer's tags are tokens: Z is exactly the action.
    tok = tokenizers.load_tiny_tokenizer()
    ids = tok.encode("<answer>Up</answer>") + [tok.eos_id]
    got = _content_mask(jnp.asarray([ids]), jnp.asarray([len(ids)]),
                              *tok.token_bytes(), think=False)
    self.assertEqual(np.asarray(got)[0].tolist(), [False, True, False, False])

  def test_collapse_metrics_score_the_content_only(self):
    tok = tokenizers.load_tiny_tokenizer()
    cfg = CFG.replace(vocab_size=tok.vocab_size)
    params = models.init(cfg, jax.random.key(3))
    prompts = [tok.encode(f"<|im_start|>user\n{s}<|im_end|>\n<|im_start|>assistant\n")
               for s in ("#P_O#", "#_PO#", "#O_P#")]
    answers = ["<answer>Up</answer>", "<answer>Left</answer>", "<answer>Up || Down</answer>"]
    replies = [tok.encode(a) + [tok.eos_id] for a in answers]
    s = max(map(len, prompts)) + max(map(len, replies))
    b = len(prompts)
    tokens = np.zeros((b, s), np.int32)
    mask = np.zeros((b, s), bool)
    for i, (x, r) in enumerate(zip(prompts, replies)):
      tokens[i, :len(x) + len(r)] = x + r
      mask[i, len(x):len(x) + len(r)] = True
    traj = rollout.Trajectory(
        tokens=jnp.asarray(tokens), loss_mask=jnp.asarray(mask), logprobs=jnp.zeros((b, s)),
        turn_ids=jnp.asarray(np.where(mask, 0, -1)), token_rewards=jnp.zeros((b, s)),
        length=jnp.full((b,), s), turn_rewards=jnp.zeros((b, 1)), scores=jnp.zeros((b,)),
        num_turns=jnp.ones((b,), jnp.int32), reply_lengths=_z(b, 1),
        format_valid=jnp.ones((b, 1), bool), num_pieces=_z(b, 1), num_valid=_z(b, 1),
        num_executed=_z(b, 1), num_effective=_z(b, 1), anchor_hashes=_z(b, 1),
        num_actions=_z(b), success=jnp.zeros((b,), bool), terminated=jnp.zeros((b,), bool),
        truncated=jnp.zeros((b,), bool), end_reason=_z(b), overflow=jnp.zeros((b,), bool),
        group_ids=jnp.arange(b), **rollout.Trajectory.one_row_per_episode(b), group_size=1)
    table = tok.token_bytes()
    got = jax.jit(lambda p, t: train.collapse_metrics(
        p, t, jax.random.key(0), config=cfg, num_rows=b, token_table=table))(params, traj)
    # Reference: full forwards, only the tokens between the answer tags scored.
    pairs = []
    for x, r in zip(prompts, replies):
      pieces = [bytes(table[0][t, :table[1][t]]) for t in r]
      pairs.append((np.asarray(x), np.asarray(r), np.asarray(_host_content(pieces, False))))
    self.assertEqual([int(z.sum()) for _, _, z in pairs], [1, 1, 3])
    want_h, want_i = _numpy_estimates(_reference_cross(params, pairs, config=cfg))
    self.assertAlmostEqual(float(got["collapse/reply_entropy"]), want_h, places=4)
    self.assertAlmostEqual(float(got["collapse/mutual_info"]), want_i, places=4)


if __name__ == "__main__":
  absltest.main()
