r"""The Tunix side of ``experiments.benchmarks.peer_rl`` (runs in the peer virtualenv).

    <peer venv>/bin/python -m experiments.benchmarks.peer_rl_tunix SPEC.json RESULT.json

Not imported by jagent: it needs ``google-tunix`` (0.1.7), which pins
``safetensors<0.8`` and so lives in its own virtualenv
(``python -m experiments.benchmarks.peer_rl --setup``). The spec, written
by ``peer_rl``, holds the model config, the Hugging Face checkpoint of the
policy's initial weights (written by ``jagent.models.save_hf_checkpoint``),
the prompt, the rollout sizes and the levels of every iteration (the
reset keys of our generator, one per group). This module plays them with
Tunix's agentic GRPO: ``tunix.rl.agentic.agentic_grpo_learner.GRPOLearner``
on an ``RLCluster`` with the ``"vanilla"`` rollout engine (Tunix's JAX
sampler), its rollout orchestrator and trajectory collect engine, a
``BaseTaskEnv`` and a ``ConversationAgentBase`` written here for the game.

What the adapter writes (Tunix has no Sokoban or our prompt):

- ``GameEnv`` (a ``BaseTaskEnv``): resets to the level of its reset key
  and steps it with :class:`jagent.rollout.JaxEnvAsHost` (our environment,
  jit-compiled, one row); each turn plays the reply's parsed actions
  (``jagent.rollout.reference_parse``, RAGEN's regex) like
  ``jagent.rollout.host_rollout``: rewards summed, the format penalty when
  the reply does not parse, the episode done when the game ends or the
  action budget is spent; ``max_steps`` is the turn limit;
- ``GameAgent`` (a ``ConversationAgentBase``): the system message and the
  user texts of :class:`jagent.rollout.Conversation` (the same prompt
  text, checked against our rendering of turn 1); the reply text goes to
  the environment;
- ``ChatML``: Tunix's chat-parser interface over
  :func:`jagent.tokenizers.chatml_template`, and ``Tokenizer``: Tunix's
  tokenizer interface over our tiny SentencePiece model (its raw model has
  no EOS id; ours is ``<|im_end|>``);
- two changes to the sampler calls (``GRPOLearner._model_call``): each call
  samples with its own seed (with the default ``seed=None`` Tunix's vanilla
  sampler seeds every call with ``PRNGKey(0)``, so the G rollouts of a
  group would all reply alike: no advantage, no learning) and at most the
  per-turn reply budget (the collect engine otherwise allows every reply
  the episode's whole remaining response budget).

Timing: the learner trains ``warmup + iterations`` global steps on the
spec's levels; each step is one RL iteration (rollout of the batch's N x G
episodes, rewards and GRPO advantages per group, one actor update;
``off_policy_steps=0``, so the next rollout starts after the update). The
result records, per step, the wall seconds from the end of the previous
update to the end of this one (the first from the start of ``train``:
compile and warm-up), the seconds of ``RLCluster.update_actor`` and of
the per-group advantage computation (it overlaps the other groups'
rollouts), the env turns, the generated tokens, the peak RSS and the
initial state text of every level (the caller checks them against ours).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
import threading
import time
from typing import Any

import jax
import numpy as np
import optax

from tunix.models.qwen2 import model as qwen2_model
from tunix.models.qwen2 import params as qwen2_params
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.agentic import agentic_grpo_learner
from tunix.rl.agentic.agents import agent_types
from tunix.rl.agentic.agents import base_agent
from tunix.rl.agentic.environments import base_environment
from tunix.rl.rollout import base_rollout

import envs_jax
from jagent import rollout as jrollout
from jagent import tokenizers
from experiments.benchmarks import rss


class Tokenizer:
  """Tunix's tokenizer interface (encode, decode, bos/eos/pad ids) over ours."""

  def __init__(self, tok: tokenizers.Tokenizer):
    self.tok = tok

  def encode(self, text: str, **kwargs) -> list[int]:
    del kwargs
    return list(self.tok.encode(text))

  def decode(self, ids, **kwargs) -> str:
    del kwargs
    return self.tok.decode([int(i) for i in ids])

  def bos_id(self):
    return None  # the tiny tokenizer has no BOS; Tunix's sampler then adds none

  def eos_id(self) -> int:
    return int(self.tok.eos_id)

  def pad_id(self) -> int:
    return int(self.tok.pad_id or 0)


class ChatML:
  """Tunix's chat-parser interface rendering :func:`jagent.tokenizers.chatml_template`."""

  assistant_token = "<|im_start|>assistant\n"

  def parse(self, messages, add_generation_prompt: bool = False,
            is_first_msg: bool = False) -> str:
    del is_first_msg
    return tokenizers.chatml_template(messages, add_generation_prompt=add_generation_prompt)


class Counters:
  """Per-iteration counts written from the rollout threads (thread-safe)."""

  def __init__(self):
    self.lock = threading.Lock()
    self.turns: dict[int, int] = {}
    self.tokens: dict[int, int] = {}
    self.advantage_s: dict[int, float] = {}
    self.levels: dict[tuple[int, int], str] = {}

  def add(self, table: str, it: int, value) -> None:
    with self.lock:
      d = getattr(self, table)
      d[it] = d.get(it, 0) + value


def build(spec: dict[str, Any]):
  """The game's agent and env classes, the tokenizer and the conversation of ``spec``."""
  tok = tokenizers.load_tiny_tokenizer()
  env, env_params = envs_jax.make(spec["env"])
  p = spec["prompt"]
  prompt = jrollout.PromptConfig(
      system=p["system"], instructions=p["instructions"], first_turn=p["first_turn"],
      next_turn=p["next_turn"], think=p["think"],
      max_actions_per_turn=p["max_actions_per_turn"], chat_template="chatml")
  instructions = (p["instructions"] if p["instructions"] is not None
                  else jrollout.default_instructions(env))
  conv = jrollout.Conversation(tok, prompt, instructions, tuple(env.action_names),
                               int(getattr(env, "max_answer_bytes", 128)))
  spec_parse = conv.parse_spec()
  r = spec["rollout"]
  max_turns, budget = r["max_turns"], r["max_actions_per_traj"]
  format_penalty = r["format_penalty"]
  num_groups = r["num_groups"]
  counters = Counters()
  gen = conv.generation_prompt

  def user_first(state: str) -> str:
    return conv.first_text(state, budget)[len(conv.first_prefix):-len(gen) or None]

  def user_next(state: str, turn: int, left: int, reward: float) -> str:
    return conv.next_text(state, turn, left, reward, False)[len(conv.after_reply):
                                                            -len(gen) or None]

  class GameEnv(base_environment.BaseTaskEnv):
    """One episode of our game on one level (see the module docstring)."""

    def __init__(self, single_example, **kwargs):
      super().__init__(task=single_example, max_steps=max_turns, **kwargs)
      self.host = jrollout.JaxEnvAsHost(env, env_params)
      self.key = jax.random.key(0)
      self.actions = 0

    def _iteration(self) -> int:
      return int(self.extra_kwargs["group_id"]) // num_groups

    def _initial_observation(self):
      data = np.asarray(self.task["reset_key"], np.uint32).reshape(-1)
      state = self.host.reset(jax.random.wrap_key_data(data))
      self.actions = 0
      gid = int(self.extra_kwargs["group_id"])
      with counters.lock:
        counters.levels[(gid // num_groups, gid % num_groups)] = state
      return {"prompts": "", "state": state, "turn": 1, "left": budget, "reward": 0.0}

    def _step_impl(self, action) -> base_environment.EnvStepResult:
      parsed = action.action if isinstance(action, agent_types.Action) else action
      reward = np.float32(0.0 if parsed["format_valid"] else format_penalty)
      done = False
      for name in parsed["actions"]:
        if done or self.actions >= budget:
          break
        self.key, sub = jax.random.split(self.key)
        out = self.host.step(name, sub)
        reward = np.float32(reward + np.float32(out.reward))
        done = out.terminated or out.truncated
        self.actions += 1
      done = done or self.actions >= budget
      counters.add("turns", self._iteration(), 1)
      obs = {"state": self.host._text(self.host.render_ids),  # pylint: disable=protected-access
             "turn": self.step_count + 1, "left": budget - self.actions,
             "reward": float(reward)}
      return base_environment.EnvStepResult(observation=obs, reward=float(reward), done=done,
                                            info={})

  class GameAgent(base_agent.ConversationAgentBase):
    """Our system message and user texts; replies parsed by ``reference_parse``."""

    def __init__(self, system_prompt=None, **kwargs):
      del system_prompt, kwargs
      super().__init__(system_prompt=p["system"])
      self.cur_step = None

    def _observation_to_messages(self, observation, reward, done, info) -> None:
      del reward, done, info
      o = observation
      text = (user_first(o["state"]) if o["turn"] == 1
              else user_next(o["state"], o["turn"], o["left"], o["reward"]))
      self._messages.append({"role": "user", "content": text})

    def update_from_env(self, observation, reward, done, info=None, **kwargs):
      super().update_from_env(observation, reward, done, info, **kwargs)
      self.cur_step = agent_types.Step(observation=observation)

    def update_from_model(self, response: str, **kwargs) -> agent_types.Action:
      del kwargs
      parsed = jrollout.reference_parse(response.encode("utf-8"), spec_parse)
      names = [spec_parse.action_names[a] for a in parsed["actions"]]
      act = {"actions": names, "format_valid": bool(parsed["format_valid"])}
      self._messages.append({"role": "assistant", "content": response})
      self._trajectory.steps.append(self.cur_step)
      self.cur_step.model_response = response
      self.cur_step.action = act
      self.step += 1
      return agent_types.Action(action=act)

  # The prompt text equals ours: turn 1 rendered through the agent's messages.
  probe = GameAgent()
  probe.update_from_env({"state": "#_P\n", "turn": 1, "left": budget, "reward": 0.0}, 0.0,
                        False)
  rendered = ChatML().parse(probe.chat_completions, add_generation_prompt=True)
  if rendered != conv.first_text("#_P\n", budget):
    raise AssertionError(f"turn-1 prompt differs from jagent's: {rendered!r}")
  return GameEnv, GameAgent, Tokenizer(tok), counters


def run(spec: dict[str, Any]) -> dict[str, Any]:
  """Trains ``warmup + iterations`` GRPO steps on the spec's levels; returns the timings."""
  t_setup = time.perf_counter()
  GameEnv, GameAgent, tok, counters = build(spec)
  m = spec["model"]
  config = qwen2_model.ModelConfig(
      num_layers=m["num_layers"], vocab_size=m["vocab_size"], embed_dim=m["embed_dim"],
      hidden_dim=m["mlp_dim"], num_heads=m["num_heads"], head_dim=m["head_dim"],
      num_kv_heads=m["num_kv_heads"], rope_theta=int(m["rope_theta"]),
      norm_eps=m["norm_eps"], use_tied_embedding=m["tie_embeddings"])
  # One device; Auto axes as in Tunix's examples (jax.make_mesh's default,
  # Explicit, fails in Tunix's embedding lookup).
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), devices=jax.devices()[:1],
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  actor = qwen2_params.create_model_from_safe_tensors(spec["checkpoint"], config, mesh)
  r, t = spec["rollout"], spec["train"]
  n, g = r["num_groups"], r["group_size"]
  steps = spec["warmup"] + spec["iterations"]
  budget = r["max_tokens_per_turn"]
  cluster_config = rl_cluster_lib.ClusterConfig(
      role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.REFERENCE: mesh,
                    rl_cluster_lib.Role.ROLLOUT: mesh},
      rollout_engine="vanilla", offload_to_cpu=False,
      training_config=rl_cluster_lib.RLTrainingConfig(
          actor_optimizer=optax.chain(optax.clip_by_global_norm(t["max_grad_norm"]),
                                      optax.adam(t["learning_rate"])),
          eval_every_n_steps=10**9, max_steps=steps, mini_batch_size=n,
          train_micro_batch_size=n),
      # Tunix requires max_tokens_to_generate == max_response_length (the
      # episode's response budget); generate() below cuts each call to the
      # per-turn reply budget.
      rollout_config=base_rollout.RolloutConfig(
          max_tokens_to_generate=spec["context_size"],
          max_prompt_length=spec["max_prompt_length"],
          kv_cache_size=spec["max_prompt_length"] + budget, temperature=r["temperature"],
          top_p=1.0, top_k=None, return_logprobs=True, eos_tokens=[tok.eos_id()]))
  cluster = rl_cluster_lib.RLCluster(actor=actor, reference=None, tokenizer=tok,
                                     cluster_config=cluster_config)
  grpo = agentic_grpo_learner.GRPOConfig(
      num_generations=g, num_iterations=1, beta=0.0, epsilon=t["clip_eps"],
      loss_agg_mode="sequence-mean-token-mean", max_response_length=spec["context_size"],
      max_concurrency=spec["max_concurrency"], system_prompt=spec["prompt"]["system"])

  seeds = itertools.count(1)
  rollout = cluster.rollout
  plain_generate = rollout.generate

  longest = [0]

  def generate(prompts, rollout_config, **kwargs):
    # Own seed per call; at most the per-turn reply budget (module docstring).
    rc = dataclasses.replace(rollout_config, seed=next(seeds),
                             max_tokens_to_generate=min(budget,
                                                        rollout_config.max_tokens_to_generate))
    out = plain_generate(prompts, rc, **kwargs)
    prompt_ids = np.asarray(out.left_padded_prompt_tokens)
    longest[0] = max(longest[0], int((prompt_ids != tok.pad_id()).sum(axis=-1).max()))
    return out

  rollout.generate = generate

  class TimedLearner(agentic_grpo_learner.GRPOLearner):

    def _batch_to_train_example(self, batch_results, mode):
      t0 = time.perf_counter()
      out = super()._batch_to_train_example(batch_results, mode)
      it = int(batch_results[0].group_id) // n
      counters.add("advantage_s", it, time.perf_counter() - t0)
      counters.add("tokens", it, int(sum(np.asarray(x.completion_mask).sum() for x in out)))
      return out

  # No reward_fns: the "agentic-sequence-level" reward manager then rewards
  # each episode with its environment rewards summed (trajectory_reward).
  learner = TimedLearner(rl_cluster=cluster, algo_config=grpo, reward_fns=None,
                         chat_parser=ChatML(), agent_class=GameAgent, env_class=GameEnv)
  updates = []
  plain_update = cluster.update_actor

  def update_actor(*args, **kwargs):
    t0 = time.perf_counter()
    out = plain_update(*args, **kwargs)
    updates.append((t0, time.perf_counter()))
    return out

  cluster.update_actor = update_actor
  batches = [{"prompts": [""] * n, "reset_key": [list(k) for k in keys]}
             for keys in spec["levels"]]
  setup_s = time.perf_counter() - t_setup
  t0 = time.perf_counter()
  learner.train(batches)
  if len(updates) != steps:
    raise RuntimeError(f"Tunix ran {len(updates)} updates, expected {steps}")
  ends = [t0] + [e for _, e in updates]
  iters = []
  for k in range(steps):
    iters.append(dict(
        seconds=ends[k + 1] - ends[k], update_s=updates[k][1] - updates[k][0],
        rollout_advantage_s=updates[k][0] - ends[k],
        advantage_s=counters.advantage_s.get(k, 0.0), env_turns=counters.turns.get(k, 0),
        tokens=counters.tokens.get(k, 0)))
  return dict(
      tunix_version=_version("google-tunix"), jax_version=jax.__version__,
      setup_s=setup_s, iterations=iters, longest_prompt=longest[0],
      max_prompt_length=spec["max_prompt_length"],
      levels=[[counters.levels.get((k, j)) for j in range(n)] for k in range(steps)],
      peak_rss_mb=rss.peak_rss_mb())


def _version(dist: str) -> str:
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  try:
    return metadata.version(dist)
  except metadata.PackageNotFoundError:
    return "unknown"


def main(argv: list[str]) -> None:
  if len(argv) != 3:
    raise SystemExit(f"usage: {argv[0]} SPEC.json RESULT.json")
  with open(argv[1]) as f:
    spec = json.load(f)
  result = run(spec)
  with open(argv[2] + ".tmp", "w") as f:
    json.dump(result, f)
  os.replace(argv[2] + ".tmp", argv[2])


if __name__ == "__main__":
  main(sys.argv)
