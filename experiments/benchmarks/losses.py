r"""Share of the RL objective in a tiny-model train step, side by side.

    python -m experiments.benchmarks.losses [--batch=64] [--group_size=8] \
        [--seq_len=256] [--turns=5] [--repeats=5] \
        [--algorithms=ppo,grpo,starpo_s,gigpo]

One synthetic multi-turn batch for the ``tiny`` model config (``--batch``
trajectories in groups of ``--group_size``, ``--seq_len`` tokens: a prompt,
then up to ``--turns`` turns of environment tokens (untrained) and assistant
tokens (trained); per-turn rewards on each turn's last trained token, old /
sampler / reference log-probs, rollout values, turn ids, per-turn anchor hashes
and format flags, some truncated rows with bootstrap values). For each
algorithm (a ``jagent.transforms`` registry name, default hyperparameters),
three jitted functions are timed, interleaved round by round, best of
``--repeats`` after a warm-up compile:

- ``baseline``: a train step with a trivial loss: forward of the model over
  ``[B, S]``, log-probs of the taken tokens, ``-sum(logp * mask) / sum(mask)``
  (plus ``sum(values * mask) / sum(mask)`` when the algorithm has a critic),
  grad, ``optax.adamw`` update.
- ``full``: the same step with the real objective: ``Objective.update`` on the
  batch (advantages, filters, shaping; outside the gradient, once per step)
  then ``Objective.loss`` inside the gradient, with the per-token entropy
  computed from the logits only when the objective has an entropy term.
- ``objective``: the objective alone on precomputed model outputs:
  ``Objective.update`` + ``Objective.loss`` + its gradient w.r.t. the
  log-probs (and values). ``update`` is ``Objective.update`` alone.

Each call is timed on two clocks: wall time, and the process CPU time (all
threads), which a machine shared with other jobs disturbs less. The baseline
is timed again, interleaved, for every algorithm (its compiled step is shared
by the algorithms with the same critic flag) so that both see the same load
on a shared machine. Shares, per clock:
``share_diff = (full - baseline) / full`` (includes the entropy over the
vocabulary, a model-side cost that only the objective asks for; noisy, a
difference of two timings) and ``share_alone = objective / full``. Goal:
below 5%.

``apply`` returns logits only, so algorithms with a critic (``ppo``,
``starpo``, ``starpo_s``: GAE) use a stand-in value head, a linear map of the
logits ``[B, S, V] -> [B, S]``, in both the baseline and the full step.

Prints a table, then one JSON line per algorithm. Speed is measured here,
never in tests.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any, Callable, Sequence

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jagent import losses
from jagent import models
from jagent import transforms

_BATCH = flags.DEFINE_integer("batch", 64, "B, trajectories per batch.")
_GROUP = flags.DEFINE_integer("group_size", 8, "G, rollouts per initial state.")
_SEQ = flags.DEFINE_integer("seq_len", 256, "S, tokens per trajectory.")
_TURNS = flags.DEFINE_integer("turns", 5, "T, maximum assistant turns per row.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed rounds; the best is kept.")
_MODEL = flags.DEFINE_string("model", "tiny", "jagent.models named config.")
_ALGOS = flags.DEFINE_list("algorithms", ["ppo", "grpo", "starpo_s", "gigpo"],
                           "jagent.transforms registry names to time.")
_LAYERS = flags.DEFINE_integer("num_layers", 0,
                               "Override of the config's layer count (0: keep).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the synthetic batch.")


# ----------------------------------------------------------------- the batch
def make_rollouts(batch: int, group_size: int, seq_len: int, turns: int,
                  vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
  """A synthetic multi-turn rollout batch on the host (no model fields).

  Row layout: a prompt of ``max(1, S // 8)`` tokens, then per turn
  environment tokens (turns after the first) and assistant tokens, then
  padding (id 0). Lengths scale with ``S``; a row stops after a random number
  of turns (terminated, with reward 1 on success and -0.1 per turn) or at
  ``turns`` (truncated, with a bootstrap value).

  Args:
    batch: B, a multiple of ``group_size``.
    group_size: G.
    seq_len: S >= 4.
    turns: T >= 1.
    vocab_size: V > 3 (ids 0-2 are left to padding and specials).
    seed: numpy seed.

  Returns:
    numpy arrays: ``tokens`` int32 ``[B, S]``, ``loss_mask`` float32 ``[B, S]``,
    ``rewards`` float32 ``[B, S]``, ``turn_ids`` int32 ``[B, S]`` (-1 off
    turns), ``anchor_hashes`` int32 ``[B, T]``, ``format_valid`` bool
    ``[B, T]``, ``terminated`` bool ``[B]``, ``bootstrap_values`` float32
    ``[B]``, ``values`` float32 ``[B, S]``.
  """
  rng = np.random.default_rng(seed)
  b, s, t = batch, seq_len, turns
  tokens = rng.integers(3, vocab_size, size=(b, s)).astype(np.int32)
  mask = np.zeros((b, s), np.float32)
  rewards = np.zeros((b, s), np.float32)
  turn_ids = np.full((b, s), -1, np.int32)
  terminated = np.ones((b,), bool)
  prompt = max(1, s // 8)
  obs_lo, obs_hi = max(1, s // 64), max(2, s // 20)
  resp_lo, resp_hi = max(1, s // 32), max(2, s // 8)
  for row in range(b):
    n_turns = int(rng.integers(1, t + 1))
    success = bool(rng.random() < 0.4)
    pos = prompt
    last = -1
    for turn in range(n_turns):
      if turn:
        pos += int(rng.integers(obs_lo, obs_hi + 1))
      n = min(int(rng.integers(resp_lo, resp_hi + 1)), s - pos)
      if n <= 0:
        break
      mask[row, pos:pos + n] = 1.0
      turn_ids[row, pos:pos + n] = turn
      rewards[row, pos + n - 1] = -0.1
      last = pos + n - 1
      pos += n
    if last >= 0:
      rewards[row, last] += 1.0 if success else 0.0
    terminated[row] = success or n_turns < t
    tokens[row, pos:] = 0
  # Turn 0 of every row in a group acts from the group's initial state; later
  # turns from one of a few states, so anchor groups of several sizes occur.
  groups = np.repeat(np.arange(b // group_size), group_size)
  anchors = rng.integers(0, 3, size=(b, t)) + 10 * np.arange(t)[None, :]
  anchors[:, 0] = 0
  anchors = (anchors + 1000 * groups[:, None]).astype(np.int32)
  return {
      "tokens": tokens,
      "loss_mask": mask,
      "rewards": rewards,
      "turn_ids": turn_ids,
      "anchor_hashes": anchors,
      "format_valid": rng.random((b, t)) < 0.9,
      "terminated": terminated,
      "bootstrap_values": rng.normal(0.0, 0.5, (b,)).astype(np.float32),
      "values": rng.normal(0.0, 0.5, (b, s)).astype(np.float32),
  }


# ------------------------------------------------------------------ the model
def token_logprobs(logits_bsv: jax.Array, tokens_bs: jax.Array) -> jax.Array:
  """float32 ``[B, S]``: position s holds log pi(tokens[s] | tokens[:s]).

  Position 0 (no context) is 0; it is never trained (it is prompt).
  """
  logp = jax.nn.log_softmax(logits_bsv[:, :-1].astype(jnp.float32), axis=-1)
  taken = jnp.take_along_axis(logp, tokens_bs[:, 1:, None], axis=-1)[..., 0]
  return jnp.pad(taken, ((0, 0), (1, 0)))


def token_entropy(logits_bsv: jax.Array) -> jax.Array:
  """float32 ``[B, S]``: entropy of the distribution that sampled token s."""
  ent = losses.entropy_from_logits(logits_bsv[:, :-1])
  return jnp.pad(ent, ((0, 0), (1, 0)))


def init_params(config: models.ModelConfig, key: jax.Array) -> dict[str, Any]:
  """Model params plus the stand-in value head (a linear map of the logits)."""
  return {"model": models.init(config, key),
          "value_w": jnp.zeros((config.vocab_size,), jnp.float32),
          "value_b": jnp.zeros((), jnp.float32)}


def model_outputs(params, tokens_bs, config, critic: bool, entropy: bool
                  ) -> transforms.ModelOutputs:
  """Forward pass: log-probs, values (if ``critic``), entropy (if asked)."""
  b, s = tokens_bs.shape
  positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32)[None, :], (b, s))
  logits, _ = models.apply(params["model"], tokens_bs, positions, config=config)
  values = None
  if critic:
    values = jnp.einsum("bsv,v->bs", logits, params["value_w"]) + params["value_b"]
  return transforms.ModelOutputs(
      token_logprobs(logits, tokens_bs), values,
      token_entropy(logits) if entropy else None)


# ------------------------------------------------------------------- timing
CLOCKS = ("wall", "cpu")


def best_ms(fns: dict[str, Callable[[], Any]], repeats: int
            ) -> dict[str, dict[str, float]]:
  """Best milliseconds of each ``fn`` over ``repeats`` interleaved rounds.

  Each function is called once first (compile and warm-up); every round then
  times each function once, so slow drifts of a shared machine hit all alike.

  Returns:
    ``{name: {"wall": ms, "cpu": ms}}``: best wall time
    (``time.perf_counter``) and best process CPU time (``time.process_time``,
    all threads) per call.
  """
  for fn in fns.values():
    jax.block_until_ready(fn())
  best = {name: dict.fromkeys(CLOCKS, float("inf")) for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      t0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(fn())
      t1, c1 = time.perf_counter(), time.process_time()
      best[name]["wall"] = min(best[name]["wall"], (t1 - t0) * 1e3)
      best[name]["cpu"] = min(best[name]["cpu"], (c1 - c0) * 1e3)
  return best


class Steps:
  """The jitted model-side functions, shared by algorithms with equal needs.

  Args:
    config: the model config (static).
    tx: the optax optimizer.
  """

  def __init__(self, config: models.ModelConfig, tx: optax.GradientTransformation):
    self.config = config
    self.tx = tx
    self._outputs = {}
    self._baselines = {}

  def outputs(self, critic: bool, entropy: bool) -> Callable[..., Any]:
    """jit ``(params, tokens) -> ModelOutputs``."""
    key = (critic, entropy)
    if key not in self._outputs:
      self._outputs[key] = jax.jit(functools.partial(
          model_outputs, config=self.config, critic=critic, entropy=entropy))
    return self._outputs[key]

  def apply_grads(self, params, opt_state, grads):
    """One optimizer update: ``(params, opt_state)``."""
    updates, opt_state = self.tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def baseline(self, critic: bool) -> Callable[..., Any]:
    """jit ``(params, opt_state, batch) -> (params, opt_state, loss)``.

    The trivial loss ``-sum(logp * mask) / sum(mask)`` (``+ sum(values *
    mask) / sum(mask)`` with a critic).
    """
    if critic in self._baselines:
      return self._baselines[critic]
    config = self.config

    def baseline_step(params, opt_state, batch):
      def loss_fn(p):
        out = model_outputs(p, batch.tokens, config, critic, False)
        m = batch.loss_mask
        loss = -jnp.sum(out.logprobs * m)
        if critic:
          loss = loss + jnp.sum(out.values * m)
        return loss / jnp.maximum(jnp.sum(m), 1.0)
      loss, grads = jax.value_and_grad(loss_fn)(params)
      params, opt_state = self.apply_grads(params, opt_state, grads)
      return params, opt_state, loss

    self._baselines[critic] = jax.jit(baseline_step)
    return self._baselines[critic]


def bench_algorithm(name: str, steps: Steps, params, batch,
                    repeats: int) -> dict[str, Any]:
  """Times baseline / full / objective-alone / update-alone for one algorithm.

  Args:
    name: a ``jagent.transforms`` registry name (default hyperparameters).
    steps: the shared model-side steps (compiled once per critic flag).
    params: model and value-head parameters.
    batch: the rollout :class:`jagent.transforms.Batch`.
    repeats: timed rounds.

  Returns:
    ``{"algorithm", "critic", "entropy", "loss", "kept_ratio",
    "<part>_<clock>_ms", "share_diff_<clock>", "share_alone_<clock>"}`` for
    parts baseline / full / objective / update and clocks wall / cpu.
  """
  config = steps.config
  obj = transforms.make(name)
  critic, entropy = obj.needs.critic, obj.needs.entropy  # declared by the alias
  # The filter is data: timed as a stage of the update.
  update = transforms.with_filter_stage(obj)
  obj = obj._replace(init=update.init, update=update.update)
  obj_state = obj.init(batch)
  opt_state = steps.tx.init(params)
  outs = steps.outputs(critic, entropy)(params, batch.tokens)
  baseline_step = steps.baseline(critic)

  @jax.jit
  def full_step(params, opt_state, obj_state, batch):
    batch, obj_state = obj.update(batch, obj_state)

    def loss_fn(p):
      out = obj.loss(model_outputs(p, batch.tokens, config, critic, entropy),
                     batch)
      return out.loss_sum / jnp.maximum(out.denominator, 1.0), out.metrics
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    params, opt_state = steps.apply_grads(params, opt_state, grads)
    return params, opt_state, obj_state, loss, {**batch.metrics, **metrics}

  @jax.jit
  def objective_alone(obj_state, batch, outs):
    batch, obj_state = obj.update(batch, obj_state)

    def loss_fn(logp, values):
      out = obj.loss(transforms.ModelOutputs(logp, values, outs.entropy), batch)
      return out.loss_sum / jnp.maximum(out.denominator, 1.0)
    loss, grads = jax.value_and_grad(loss_fn, argnums=(0, 1))(outs.logprobs,
                                                              outs.values)
    return obj_state, loss, grads

  update_alone = jax.jit(obj.update)

  times = best_ms({
      "baseline": lambda: baseline_step(params, opt_state, batch),
      "full": lambda: full_step(params, opt_state, obj_state, batch),
      "objective": lambda: objective_alone(obj_state, batch, outs),
      "update": lambda: update_alone(batch, obj_state),
  }, repeats)
  _, _, _, loss, metrics = full_step(params, opt_state, obj_state, batch)
  result = {"algorithm": name, "critic": critic, "entropy": entropy,
            "loss": float(loss),
            "kept_ratio": float(metrics.get("filter/kept_ratio", 1.0))}
  for clock in CLOCKS:
    for part in ("baseline", "full", "objective", "update"):
      result[f"{part}_{clock}_ms"] = times[part][clock]
    full = times["full"][clock]
    result[f"share_diff_{clock}"] = (full - times["baseline"][clock]) / full
    result[f"share_alone_{clock}"] = times["objective"][clock] / full
  return result


def check_args(batch: int, group_size: int, seq_len: int, turns: int,
               repeats: int, algorithms: Sequence[str], num_layers: int = 0
               ) -> None:
  """Raises ValueError naming the first bad argument (before any compile)."""
  if num_layers < 0:
    raise ValueError(f"--num_layers={num_layers}: must be >= 0.")
  for name, value, minimum in (("batch", batch, 1), ("group_size", group_size, 1),
                               ("seq_len", seq_len, 4), ("turns", turns, 1),
                               ("repeats", repeats, 1)):
    if value < minimum:
      raise ValueError(f"--{name}={value}: must be >= {minimum}.")
  if batch % group_size:
    raise ValueError(f"--group_size={group_size} must divide --batch={batch}.")
  if not algorithms:
    raise ValueError("--algorithms is empty.")
  for a in algorithms:
    if a not in transforms.registered():
      raise ValueError(f"--algorithms: unknown {a!r}; registered: "
                       f"{transforms.registered()}.")


def run(*, batch: int, group_size: int, seq_len: int, turns: int, repeats: int,
        algorithms: Sequence[str], model: str = "tiny", num_layers: int = 0,
        seed: int = 0) -> list[dict[str, Any]]:
  """Runs the benchmark, prints a table and one JSON line per algorithm.

  Args:
    batch: B.
    group_size: G, dividing B.
    seq_len: S.
    turns: T.
    repeats: timed rounds (best kept).
    algorithms: registry names.
    model: named model config.
    num_layers: if > 0, replaces the config's layer count (smoke tests).
    seed: seed of the batch and the parameters.

  Returns:
    the per-algorithm result dicts (also printed as JSON lines).

  Raises:
    ValueError: for bad arguments.
  """
  check_args(batch, group_size, seq_len, turns, repeats, algorithms, num_layers)
  config = models.get_config(model)
  if num_layers:
    config = config.replace(num_layers=num_layers)
  host = make_rollouts(batch, group_size, seq_len, turns, config.vocab_size, seed)
  params = init_params(config, jax.random.key(seed))
  tokens = jnp.asarray(host["tokens"])
  steps = Steps(config, optax.adamw(1e-4))
  logp = steps.outputs(False, False)(params, tokens).logprobs
  noise = np.random.default_rng(seed + 1).normal(size=(2, batch, seq_len))
  rollout = transforms.Batch(
      tokens=tokens,
      loss_mask=jnp.asarray(host["loss_mask"]),
      sampler_logprobs=logp + jnp.asarray(0.01 * noise[0], jnp.float32),
      old_logprobs=logp,
      ref_logprobs=logp + jnp.asarray(0.05 * noise[1], jnp.float32),
      values=jnp.asarray(host["values"]),
      rewards=jnp.asarray(host["rewards"]),
      terminated=jnp.asarray(host["terminated"]),
      bootstrap_values=jnp.asarray(host["bootstrap_values"]),
      turn_ids=jnp.asarray(host["turn_ids"]),
      anchor_hashes=jnp.asarray(host["anchor_hashes"]),
      format_valid=jnp.asarray(host["format_valid"]),
      group_size=group_size)
  results = []
  for name in algorithms:
    r = bench_algorithm(name, steps, params, rollout, repeats)
    r.update(model=model, layers=config.num_layers, B=batch, G=group_size,
             S=seq_len, T=turns, repeats=repeats, backend=jax.default_backend(),
             trained_tokens=int(host["loss_mask"].sum()))
    results.append(r)

  print(f"model={model} layers={config.num_layers} B={batch} G={group_size} "
        f"S={seq_len} T={turns} backend={jax.default_backend()} best of {repeats}; "
        f"ms per step (wall / cpu), shares in %")
  header = (f"{'algorithm':<10} {'critic':>6} {'baseline ms':>15} {'full ms':>15} "
            f"{'objective ms':>13} {'update ms':>11} {'(full-base)/full':>17} "
            f"{'objective/full':>15}")
  print(header)
  print("-" * len(header))

  def pair(r, key, fmt, scale=1.0):
    return "/".join(format(scale * r[key.format(c)], fmt) for c in CLOCKS)

  for r in results:
    print(f"{r['algorithm']:<10} {str(r['critic']):>6} "
          f"{pair(r, 'baseline_{}_ms', '.0f'):>15} {pair(r, 'full_{}_ms', '.0f'):>15} "
          f"{pair(r, 'objective_{}_ms', '.2f'):>13} {pair(r, 'update_{}_ms', '.2f'):>11} "
          f"{pair(r, 'share_diff_{}', '.1f', 100):>17} "
          f"{pair(r, 'share_alone_{}', '.2f', 100):>15}")
  for r in results:
    print(json.dumps(r, sort_keys=True))
  return results


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
  run(batch=_BATCH.value, group_size=_GROUP.value, seq_len=_SEQ.value,
      turns=_TURNS.value, repeats=_REPEATS.value, algorithms=_ALGOS.value,
      model=_MODEL.value, num_layers=_LAYERS.value, seed=_SEED.value)


if __name__ == "__main__":
  app.run(main)
