"""Each alias reproduces its algorithm's loss written out by hand (numpy)."""

import doctest

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import numpy as np

from jagent import losses
from jagent import transforms
from jagent.transforms import _aliases

# B = 4 rows in 2 groups of G = 2; S = 6 tokens: prompt, turn 0 (2 tokens),
# observation, turn 1 (2 tokens). Row 3 has one turn and was truncated.
_IDS = np.array([[-1, 0, 0, -1, 1, 1]] * 3 + [[-1, 0, 0, -1, -1, -1]])
_MASK = (_IDS >= 0).astype(np.float64)
_REWARDS = np.array([[0, 0, 0.5, 0, 0, 1.0], [0] * 6, [0, 0, -0.1, 0, 0, 2.0],
                     [0, 0, 1.0, 0, 0, 0]])
_FORMAT = np.array([[1, 0], [1, 1], [0, 1], [1, 1]], bool)
_ANCHORS = np.array([[1, 2], [1, 3], [5, 6], [5, 0]])
_TERMINATED = np.array([True, True, True, False])
_BOOT = np.array([0, 0, 0, 0.7])
_RNG = np.random.default_rng(0)
_OLD = -_RNG.uniform(0.5, 2.0, size=(4, 6))
_REF = _OLD + _RNG.normal(0, 0.2, size=(4, 6))
_NEW = _OLD + _RNG.normal(0, 0.3, size=(4, 6))  # several ratios get clipped
_VALUES = _RNG.normal(size=(4, 6))
_NEW_VALUES = _VALUES + _RNG.normal(0, 0.8, size=(4, 6))
_ENTROPY = _RNG.uniform(0, 2, size=(4, 6))


def _batch(rewards=_REWARDS, with_format=True):
  f32 = lambda x: np.asarray(x, np.float32)
  return transforms.Batch(
      loss_mask=f32(_MASK), rewards=f32(rewards), values=f32(_VALUES),
      old_logprobs=f32(_OLD), ref_logprobs=f32(_REF),
      turn_ids=_IDS.astype(np.int32), anchor_hashes=_ANCHORS.astype(np.int32),
      format_valid=_FORMAT if with_format else None,
      terminated=_TERMINATED, bootstrap_values=f32(_BOOT), group_size=2)


_OUTPUTS = transforms.ModelOutputs(np.float32(_NEW), np.float32(_NEW_VALUES),
                                   np.float32(_ENTROPY))


# ------------------------------------------------------- the hand-written math
def _ppo(a, eps_low, eps_high, c=3.0):
  rho = np.exp(np.clip(_NEW - _OLD, -20, 20))
  loss = np.maximum(-a * rho, -a * np.clip(rho, 1 - eps_low, 1 + eps_high))
  return np.where(a < 0, np.minimum(loss, -a * c), loss)


def _k3():
  d = _NEW - _REF
  return np.clip(np.exp(-d) + d - 1, -10, 10)


def _value_loss(returns):
  clipped = np.clip(_NEW_VALUES, _VALUES - 0.5, _VALUES + 0.5)
  return 0.5 * np.maximum((_NEW_VALUES - returns)**2, (clipped - returns)**2)


def _whiten(x, m):
  n = m.sum()
  mean = (x * m).sum() / n
  var = ((x - mean)**2 * m).sum() / (n - 1)
  return (x - mean) / np.sqrt(var + 1e-8) * m


def _gae_rows(rewards, m, gamma=1.0, lam=1.0):
  adv = np.zeros_like(rewards)
  for b in range(4):
    next_v = 0.0 if _TERMINATED[b] else _BOOT[b]
    next_a = 0.0
    for t in reversed(np.flatnonzero(m[b])):
      delta = rewards[b, t] + gamma * next_v - _VALUES[b, t]
      next_a = delta + gamma * lam * next_a
      adv[b, t] = next_a
      next_v = _VALUES[b, t]
  return adv, (adv + _VALUES) * m


def _group(scores, fn):
  return np.concatenate([fn(scores[i:i + 2]) for i in (0, 2)])


def _grpo_norm(s):
  return (s - s.mean()) / (s.std(ddof=1) + 1e-6)


def _token_mean(loss, m):
  return (loss * m).sum(), m.sum()


def _penalised():
  r = _REWARDS.copy()
  r[0, 5] -= 0.1
  r[2, 2] -= 0.1
  return r


def _hand_ppo():
  adv, ret = _gae_rows(_REWARDS, _MASK)
  loss = _ppo(_whiten(adv, _MASK), 0.2, 0.2) - 0.001 * _ENTROPY
  return _token_mean(loss + _value_loss(ret), _MASK)


def _hand_grpo():
  s = (_REWARDS * _MASK).sum(1)
  a = _group(s, _grpo_norm)[:, None] * _MASK
  loss = _ppo(a, 0.2, 0.2) + 0.001 * _k3() - 0.001 * _ENTROPY
  return _token_mean(loss, _MASK)


def _hand_dr_grpo():
  s = (_REWARDS * _MASK).sum(1)
  a = _group(s, lambda g: g - g.mean())[:, None] * _MASK
  return (_ppo(a, 0.2, 0.2) * _MASK).sum(), 4.0  # seq-mean-token-sum


def _hand_dapo():
  rewards = _REWARDS.copy()
  rewards[1] = rewards[0]  # group 0 now has reward std 0: dropped
  m = _MASK * np.array([0, 0, 1, 1])[:, None]
  s = (rewards * _MASK).sum(1)
  a = _group(s, _grpo_norm)[:, None] * m
  return _token_mean(_ppo(a, 0.2, 0.28), m)


def _hand_rloo():
  s = (_REWARDS * _MASK).sum(1)
  a = _group(s, lambda g: g - g[::-1])[:, None] * _MASK  # G=2: minus other
  return _token_mean(_ppo(a, 0.2, 0.2), _MASK)


def _hand_reinforce_pp():
  r = _REWARDS - 0.001 * (_OLD - _REF) * _MASK  # k1 KL in the reward
  ret = np.zeros_like(r)
  for b in range(4):
    g = 0.0
    for t in reversed(np.flatnonzero(_MASK[b])):
      g = r[b, t] + g
      ret[b, t] = g
  return _token_mean(_ppo(_whiten(ret, _MASK), 0.2, 0.2), _MASK)


def _hand_gigpo():
  s = (_REWARDS * _MASK).sum(1)
  episode = _group(s, _grpo_norm)
  turn_r = np.array([[0.5, 1.0], [0, 0], [-0.1, 2.0], [1.0, 0]])
  valid = np.array([[1, 1], [1, 1], [1, 1], [1, 0]], bool)
  ret = turn_r.copy()
  ret[:, 0] += 0.95 * np.where(valid[:, 1], turn_r[:, 1], 0)
  ret[~valid] = 0
  step = np.zeros((4, 2))
  for b in range(4):
    for t in range(2):
      if not valid[b, t]:
        continue
      g0 = 2 * (b // 2)
      members = [ret[j, u] for j in (g0, g0 + 1) for u in range(2)
                 if valid[j, u] and _ANCHORS[j, u] == _ANCHORS[b, t]]
      if len(members) > 1:
        members = np.array(members)
        step[b, t] = (ret[b, t] - members.mean()) / (members.std(ddof=1)
                                                     + 1e-6)
  turn_adv = episode[:, None] + step
  a = np.where(_IDS >= 0, turn_adv[np.arange(4)[:, None],
                                   np.clip(_IDS, 0, 1)], 0) * _MASK
  return _token_mean(_ppo(a, 0.2, 0.2) + 0.01 * _k3(), _MASK)


def _hand_starpo():
  adv, ret = _gae_rows(_penalised(), _MASK)
  loss = (_ppo(_whiten(adv, _MASK), 0.2, 0.2) + 0.001 * _k3()
          - 0.001 * _ENTROPY + _value_loss(ret))
  return _token_mean(loss, _MASK)


def _hand_starpo_s():
  r = _penalised()
  # Raw scores 1.4, 0 | 1.8, 1.0 -> stds .99 > .57: keep group 0 (top 25%
  # of 2 groups = 1 group).
  m = _MASK * np.array([1, 1, 0, 0])[:, None]
  adv, ret = _gae_rows(r, m)
  loss = (_ppo(_whiten(adv, m), 0.2, 0.28) - 0.001 * _ENTROPY
          + _value_loss(ret))
  return _token_mean(loss, m)


_CASES = (
    ("ppo", {}, _hand_ppo, {}),
    ("grpo", {}, _hand_grpo, {}),
    ("dr_grpo", {}, _hand_dr_grpo, {}),
    ("dapo", {}, _hand_dapo, {"rewards": "dapo"}),
    ("rloo", {}, _hand_rloo, {}),
    ("reinforce_pp", {}, _hand_reinforce_pp, {}),
    ("gigpo", {}, _hand_gigpo, {}),
    ("starpo", {}, _hand_starpo, {}),
    ("starpo_s", {}, _hand_starpo_s, {}),
)


class AliasTest(parameterized.TestCase):

  @parameterized.named_parameters(*[(c[0],) + c for c in _CASES])
  def test_alias_matches_hand_written_loss(self, name, kwargs, hand, batch_kw):
    obj = transforms.make(name, **kwargs)
    # StarPO's format penalty is the rollout's: it is in the rewards already.
    batch = _batch(rewards=_penalised() if name.startswith("starpo") else _REWARDS,
                   with_format=False)
    if batch_kw.get("rewards") == "dapo":
      rewards = _REWARDS.copy()
      rewards[1] = rewards[0]
      batch = batch.replace(rewards=np.float32(rewards))

    # The objective's filter is data; applied here as a stage, as by hand.
    update = transforms.with_filter_stage(obj)

    @jax.jit
    def run(batch, outputs):
      prepared, _ = update.update(batch, update.init(batch))
      return obj.loss(outputs, prepared), prepared.metrics

    out, metrics = run(batch, _OUTPUTS)
    total, denom = hand()
    np.testing.assert_allclose(out.loss_sum, total, rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(out.denominator, denom)
    if name == "starpo_s":
      self.assertEqual(float(metrics["filter/kept_ratio"]), 0.5)

  def test_registry(self):
    self.assertEqual(transforms.registered(), tuple(sorted(
        ["ppo", "grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "gigpo",
         "starpo", "starpo_s", "tree_grpo"])))
    with self.assertRaisesRegex(ValueError, "unknown objective"):
      transforms.make("a2c")
    with self.assertRaisesRegex(ValueError, "already registered"):
      transforms.register("ppo", transforms.ppo)
    with self.assertRaisesRegex(ValueError, "grpo.*gamma"):
      transforms.make("grpo", gamma=0.9)
    with self.assertRaisesRegex(TypeError, "positional"):
      transforms.ppo(0.9)
    self.assertIsInstance(transforms.make("grpo", eps_high=0.3),
                          transforms.Objective)

  def test_starpo_options(self):
    # GRPO-style StarPO has no critic; a custom advantage plugs in as a
    # Transform; advantage names are validated.
    obj = transforms.starpo(advantage="grpo")
    batch = _batch()

    @jax.jit
    def run(batch, outputs):
      prepared, _ = obj.update(batch, obj.init(batch))
      return obj.loss(outputs, prepared)

    out = run(batch, _OUTPUTS._replace(values=None))
    self.assertNotIn("loss/value", out.metrics)
    self.assertIn("loss/kl", out.metrics)
    with self.assertRaisesRegex(ValueError, "unknown advantage"):
      transforms.starpo_s(advantage="vtrace")
    with self.assertRaisesRegex(ValueError, "advantage_kwargs"):
      transforms.starpo_s(advantage=transforms.identity(),
                          advantage_kwargs={"gamma": 0.9})
    with self.assertRaisesRegex(ValueError, "FilterConfig.mode"):
      transforms.starpo_s(filter_config=losses.FilterConfig(mode="top"))
    with self.assertRaisesRegex(ValueError, "filter_config must be"):
      transforms.starpo_s(filter_config="top_fraction")
    self.assertIsInstance(transforms.make_advantage("gae", gamma=0.9),
                          transforms.Transform)

  def test_update_traces_once(self):
    obj = transforms.grpo()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def update(batch):
      return obj.update(batch, obj.init(batch))[0].advantages

    first = update(_batch(with_format=False))
    second = update(_batch(rewards=_REWARDS[::-1], with_format=False))
    self.assertFalse(np.allclose(first, second))

  def test_docstring_examples(self):
    result = doctest.testmod(_aliases, optionflags=doctest.ELLIPSIS)
    self.assertGreater(result.attempted, 0)
    self.assertEqual(result.failed, 0)


if __name__ == "__main__":
  absltest.main()
