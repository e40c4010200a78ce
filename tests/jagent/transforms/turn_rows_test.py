"""Turn rows (one row per turn): episode advantages, weighting, turn-level GAE."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses
from jagent import transforms

# 2 groups x 3 episodes, at most T = 3 turns, S = 4 tokens per row.
N, G, T, S = 2, 3, 3, 4
E, R = N * G, N * G * T
TURNS = np.array([1, 2, 3, 3, 1, 2])  # turns taken by each episode
# Per-turn rewards (on the turn's last reply token); 0 on turns not taken.
TURN_R = np.array([[1.0, 0, 0], [0.5, 0.0, 0], [0.0, 0.25, 1.0],
                   [0.0, 0.0, 0.0], [2.0, 0, 0], [1.0, -0.5, 0]], np.float32)
EPS = 1e-6


def _layout():
  """Row r = e * T + t; turn t's reply fills 1 or 2 positions at the end."""
  valid = (np.arange(T)[None] < TURNS[:, None]).reshape(R)
  mask = np.zeros((R, S), np.float32)
  rewards = np.zeros((R, S), np.float32)
  for r in range(R):
    e, t = divmod(r, T)
    if valid[r]:
      width = 1 + (e + t) % 2
      mask[r, S - width:] = 1.0
      rewards[r, S - 1] = TURN_R[e, t]
  return valid, mask, rewards


def _batch(**overrides):
  valid, mask, rewards = _layout()
  scores = TURN_R.sum(1)
  rng = np.random.default_rng(0)
  ep = np.arange(R) // T
  fields = dict(
      loss_mask=mask, rewards=rewards, scores=scores[ep],
      turn_ids=np.where(mask > 0, np.arange(R)[:, None] % T, -1).astype(
          np.int32),
      values=rng.normal(size=(R, S)).astype(np.float32),
      anchor_hashes=np.ones((R, 1), np.int32), row_valid=valid,
      episode_turns=TURNS[ep].astype(np.float32), group_size=G,
      turns_per_episode=T)
  fields.update(overrides)
  return transforms.Batch(**fields)


def _full_history(batch):
  """The same episodes as one row each (the history_turns = -1 layout)."""
  cat = lambda x: None if x is None else np.asarray(x).reshape(E, T * S)  # noqa: E731
  first = lambda x: None if x is None else np.asarray(x)[::T]  # noqa: E731
  return transforms.Batch(
      loss_mask=cat(batch.loss_mask), rewards=cat(batch.rewards),
      scores=first(batch.scores), values=cat(batch.values),
      turn_ids=cat(batch.turn_ids), terminated=first(batch.terminated),
      bootstrap_values=first(batch.bootstrap_values), group_size=G)


def _run(stage, batch):
  out, _ = jax.jit(stage.update)(batch, stage.init(batch))
  return out


def _np_group(scores, kind):
  out = []
  for s in scores.reshape(N, G):
    c = s - s.mean()
    if kind == "grpo":
      out.append(c / (s.std(ddof=1) + EPS))
    elif kind == "dr_grpo":
      out.append(c)
    else:
      out.append(c * G / (G - 1))
  return np.concatenate(out)


class TrajectoryAdvantagesTest(parameterized.TestCase):

  @parameterized.parameters("grpo", "dr_grpo", "rloo")
  def test_episode_advantage_on_every_turn_row(self, kind):
    batch = _batch()
    out = _run(transforms.make_advantage(kind), batch)
    adv_e = _np_group(TURN_R.sum(1), kind)  # over episodes, not rows
    want = np.repeat(adv_e, T)[:, None] * batch.loss_mask
    np.testing.assert_allclose(out.advantages, want, rtol=1e-5, atol=1e-6)
    # E.g. group 0 (scores 1, 0.5, 1.25): episode 2's three rows share one.
    self.assertEqual(len(set(np.asarray(out.advantages)[6:9, -1])), 1)

  def test_scores_from_rewards_when_none(self):
    got = _run(transforms.compute_grpo(), _batch(scores=None))
    want = _run(transforms.compute_grpo(), _batch())
    np.testing.assert_allclose(got.advantages, want.advantages, rtol=1e-6)

  @parameterized.parameters(
      (transforms.compute_reinforce_pp, dict(gamma=0.9)),
      (transforms.compute_reinforce_pp_baseline, {}),
      (transforms.compute_bilevel_gae, dict(gamma=0.9, lambda_=0.8,
                                            turn_gamma=0.7)))
  def test_token_recursions_equal_the_full_history_layout(self, factory, kw):
    batch = _batch(terminated=np.repeat([True, False] * 3, T),
                   bootstrap_values=np.repeat(np.arange(E, dtype=np.float32),
                                              T))
    stage = factory(**kw)
    got = _run(stage, batch)
    want = _run(stage, _full_history(batch))
    np.testing.assert_allclose(np.asarray(got.advantages).reshape(E, T * S),
                               want.advantages, rtol=1e-5, atol=1e-6)
    if want.returns is not None:
      np.testing.assert_allclose(np.asarray(got.returns).reshape(E, T * S),
                                 want.returns, rtol=1e-5, atol=1e-6)

  def test_filter_keeps_whole_episodes(self):
    out = _run(transforms.filter_rollouts("top_k", 1.0), _batch())
    # Group stds of episode scores: [1, .5, 1.25] vs [0, 2, .5]: group 1.
    np.testing.assert_array_equal(out.keep, np.arange(R) >= G * T)
    self.assertEqual(float(np.asarray(out.loss_mask)[:G * T].sum()), 0.0)

  def test_nonfinite_turn_drops_the_whole_episode(self):
    batch = _batch()
    rewards = np.array(batch.rewards)
    rewards[T * 2 + 1, -1] = np.nan  # episode 2, turn 1
    out = _run(transforms.compute_grpo(), batch.replace(rewards=rewards,
                                                        scores=None))
    self.assertEqual(float(out.metrics["rollout/nonfinite_episodes"]), 1.0)
    self.assertFalse(np.any(np.asarray(out.row_valid)[6:9]))
    np.testing.assert_array_equal(np.asarray(out.loss_mask)[6:9], 0.0)
    adv = np.asarray(out.advantages)
    self.assertTrue(np.all(np.isfinite(adv)))
    s = TURN_R.sum(1)[:2]  # group 0's two finite episodes
    want = (s - s.mean()) / (s.std(ddof=1) + EPS)
    np.testing.assert_allclose(adv[[0, 3], -1], want, rtol=1e-5)


class KlHorizonTest(absltest.TestCase):

  def test_adaptive_coefficient_counts_episodes_not_rows(self):
    # old - ref = 0.3 on every token: k1 KL 0.3 per row, target 0.1, so the
    # error clips to +0.2; beta <- 0.5 (1 + 0.2 n / 60) with n = E = 6
    # episodes (not R = 18 rows).
    lp = np.full((R, S), -1.0, np.float32)
    batch = _batch(old_logprobs=lp, ref_logprobs=lp - 0.3)
    stage = transforms.kl_reward_penalty(0.5, target=0.1, horizon=60.0)

    def coef(b):
      out, state = jax.jit(stage.update)(b, stage.init(b))
      self.assertAlmostEqual(float(out.metrics["kl_reward/kl"]), 0.3, places=5)
      return float(state.coef)

    self.assertAlmostEqual(coef(batch), 0.5 * (1 + 0.2 * E / 60), places=6)
    # The same episodes as one row each: the same update.
    full = _full_history(batch).replace(old_logprobs=lp.reshape(E, T * S),
                                        ref_logprobs=lp.reshape(E, T * S) - 0.3)
    self.assertAlmostEqual(coef(full), 0.5 * (1 + 0.2 * E / 60), places=6)
    # An episode dropped for a non-finite reward does not count.
    rewards = np.array(batch.rewards)
    rewards[T * 4, -1] = np.nan  # episode 4, turn 0
    self.assertAlmostEqual(coef(batch.replace(rewards=rewards)),
                           0.5 * (1 + 0.2 * (E - 1) / 60), places=6)


def _np_turn_gae(batch, gamma, lam):
  """Reference turn-level GAE: a loop over each episode's taken turns."""
  m = np.asarray(batch.loss_mask)
  v_all = np.asarray(batch.values)
  r_all = np.asarray(batch.rewards)
  term = np.asarray(batch.terminated)[::T]
  boot = np.asarray(batch.bootstrap_values)[::T]
  adv = np.zeros(R)
  ret = np.zeros(R)
  for e in range(E):
    rows = [e * T + t for t in range(T) if m[e * T + t].sum() > 0]
    next_v = 0.0 if term[e] else boot[e]
    next_a = 0.0
    for r in reversed(rows):
      first = int(np.argmax(m[r] > 0))
      v = v_all[r, first]
      delta = (r_all[r] * m[r]).sum() + gamma * next_v - v
      next_a = delta + gamma * lam * next_a
      adv[r], ret[r] = next_a, next_a + v
      next_v = v
  return adv[:, None] * m, ret[:, None] * m


class TurnLevelGaeTest(absltest.TestCase):

  def test_against_numpy_reference(self):
    batch = _batch(terminated=np.repeat([True, False, True, False, True,
                                         False], T),
                   bootstrap_values=np.repeat(
                       np.array([0, 0.7, 0, -0.3, 0, 1.5], np.float32), T))
    out = _run(transforms.compute_gae(gamma=0.9, lambda_=0.8, whiten=False),
               batch)
    adv, ret = _np_turn_gae(batch, 0.9, 0.8)
    np.testing.assert_allclose(out.advantages, adv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.returns, ret, rtol=1e-5, atol=1e-6)
    # Terminated vs truncated: only the bootstrap of the last turn differs.
    trunc = _run(transforms.compute_gae(1.0, 1.0, whiten=False),
                 batch.replace(terminated=np.zeros(R, bool)))
    term = _run(transforms.compute_gae(1.0, 1.0, whiten=False),
                batch.replace(terminated=np.ones(R, bool)))
    d = np.asarray(trunc.advantages - term.advantages)[:, -1]
    want = np.repeat(np.asarray(batch.bootstrap_values)[::T], T) * (
        np.asarray(batch.loss_mask)[:, -1])
    np.testing.assert_allclose(d, want, rtol=1e-5, atol=1e-6)

  def test_whitened_over_trained_tokens(self):
    batch = _batch()
    out = _run(transforms.compute_gae(), batch)
    m = np.asarray(batch.loss_mask) > 0
    a = np.asarray(out.advantages)[m]
    self.assertAlmostEqual(float(a.mean()), 0.0, places=5)
    np.testing.assert_array_equal(np.asarray(out.advantages)[~m], 0.0)


class GigpoTurnRowsTest(absltest.TestCase):

  def test_step_advantages_by_hand(self):
    # One group of 2 episodes, T = 2: episode 0 takes 2 turns (rewards 0,
    # 1), episode 1 one turn (reward 0.2). Anchors: e0t0 = e1t0 = 7, e0t1 =
    # 8; the untaken row e1t1 has anchor 7 and a stray reward, ignored.
    mask = np.zeros((4, 2), np.float32)
    mask[[0, 1, 2], 1] = 1.0
    rewards = np.zeros((4, 2), np.float32)
    rewards[1, 1], rewards[2, 1], rewards[3, 1] = 1.0, 0.2, 5.0
    batch = transforms.Batch(
        loss_mask=mask, rewards=rewards, scores=np.array([1, 1, .2, .2]),
        turn_ids=np.array([[-1, 0], [-1, 1], [-1, 0], [-1, -1]], np.int32),
        anchor_hashes=np.array([[7], [8], [7], [7]], np.int32),
        row_valid=np.array([True, True, True, False]), group_size=2,
        turns_per_episode=2)
    out = _run(transforms.compute_gigpo(step_gamma=0.5), batch)
    # Episode level: scores [1, .2] -> +-0.4 / std(ddof=1) 0.5657 = +-0.7071.
    # Step returns: e0t0 = 0 + 0.5 * 1 = 0.5, e0t1 = 1, e1t0 = 0.2; anchor 7
    # = {0.5, 0.2} -> +-0.7071, anchor 8 a singleton -> 0.
    a = 1 / np.sqrt(2)
    want = np.array([2 * a, a, -2 * a, 0.0])
    np.testing.assert_allclose(np.asarray(out.advantages)[:, 1], want,
                               rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.advantages)[:, 0], 0.0)
    # Episode turns were filled from row_valid; anchor sizes 2, 1, 2.
    np.testing.assert_array_equal(out.episode_turns, [2, 2, 1, 1])
    self.assertAlmostEqual(float(out.metrics["gigpo/anchor_group_size"]),
                           5 / 3, places=5)

  def test_anchor_hashes_must_be_one_per_row(self):
    with self.assertRaisesRegex(ValueError, "anchor_hashes"):
      _run(transforms.compute_gigpo(), _batch(
          anchor_hashes=np.ones((R, 2), np.int32)))


def _pg_loss(batch, aggregation, weighting):
  loss = transforms.make_loss(transforms.pg_term(), aggregation=aggregation,
                              turn_weighting=weighting)
  logp = -np.linspace(0.1, 2.0, R * S, dtype=np.float32).reshape(R, S)
  return loss, transforms.ModelOutputs(jnp.asarray(logp)), logp


class EpisodeWeightingTest(parameterized.TestCase):

  def test_by_hand(self):
    batch = _run(transforms.compute_grpo(), _batch())
    adv, m = np.asarray(batch.advantages), np.asarray(batch.loss_mask)
    valid = np.asarray(batch.row_valid)
    for weighting in ("episode", "turn"):
      loss, outputs, logp = _pg_loss(batch, "seq-mean-token-mean", weighting)
      out = loss(outputs, batch)
      per_tok = -adv * logp
      row_mean = [(per_tok[r] * m[r]).sum() / m[r].sum() for r in range(R)
                  if valid[r]]
      if weighting == "episode":  # mean over its turn rows, then episodes
        eps = [np.mean([(per_tok[r] * m[r]).sum() / m[r].sum()
                        for r in range(e * T, e * T + TURNS[e])])
               for e in range(E)]
        want = np.mean(eps)
        self.assertAlmostEqual(float(out.denominator), E, places=5)
      else:  # every turn row the same
        want = np.mean(row_mean)
        self.assertAlmostEqual(float(out.denominator), TURNS.sum(), places=5)
      self.assertAlmostEqual(float(out.loss_sum / out.denominator), want,
                             places=5)
    # token-mean, episode: each row's tokens weigh 1 / turns of its episode.
    loss, outputs, logp = _pg_loss(batch, "token-mean", "episode")
    out = loss(outputs, batch)
    w = 1.0 / np.repeat(TURNS, T)
    want = (w[:, None] * -adv * logp * m).sum() / (w[:, None] * m).sum()
    self.assertAlmostEqual(float(out.loss_sum / out.denominator), want,
                           places=5)

  @parameterized.product(aggregation=losses.AGGREGATION_MODES,
                         weighting=("episode", "turn"))
  def test_micro_batches_add_up_exactly(self, aggregation, weighting):
    batch = _run(transforms.compute_grpo(), _batch())
    loss, outputs, _ = _pg_loss(batch, aggregation, weighting)
    whole = loss(outputs, batch)
    # Shuffled rows in 3 micro-batches of 6 rows (episodes split apart), as
    # train_step sees them (group_size and turns_per_episode 1).
    perm = np.random.default_rng(1).permutation(R)
    rows = jax.tree.map(lambda x: x[perm], batch.replace(metrics={})).replace(
        group_size=1, turns_per_episode=1)
    logp = outputs.logprobs[perm]
    tot = den = 0.0
    for k in range(3):
      part = loss(transforms.ModelOutputs(logp[6 * k:6 * k + 6]),
                  rows.select_rows(6 * k, 6 * k + 6))
      tot, den = tot + part.loss_sum, den + part.denominator
    np.testing.assert_allclose(tot, whole.loss_sum, rtol=1e-5)
    np.testing.assert_allclose(den, whole.denominator, rtol=1e-6)

  def test_aliases_take_the_option(self):
    batch = _run(transforms.compute_grpo(), _batch())
    outputs = transforms.ModelOutputs(
        jnp.zeros((R, S)), entropy=jnp.zeros((R, S)))
    dens = [float(transforms.grpo(kl_coef=0.0, aggregation=
                                  "seq-mean-token-mean", turn_weighting=w)
                  .loss(outputs, batch).denominator)
            for w in ("episode", "turn")]
    np.testing.assert_allclose(dens, [E, TURNS.sum()], rtol=1e-6)

  def test_one_row_per_episode_is_unweighted_and_bad_names_raise(self):
    with self.assertRaisesRegex(ValueError, "turn_weighting"):
      transforms.make_loss(transforms.pg_term(), turn_weighting="step")
    b = transforms.Batch(loss_mask=np.ones((2, 3)), advantages=np.ones((2, 3)))
    self.assertIsNone(transforms.row_weights(b))
    with self.assertRaisesRegex(ValueError, "episode_turns"):
      transforms.row_weights(b.replace(turns_per_episode=2))


if __name__ == "__main__":
  absltest.main()
