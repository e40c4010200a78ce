r"""The TRL side of ``experiments.benchmarks.peer_rl`` (runs in the TRL virtualenv).

    <trl venv>/bin/python -m experiments.benchmarks.peer_rl_trl SPEC.json RESULT.json

Not imported by jagent, and it imports nothing of jagent's; of this
repository only ``experiments.benchmarks.rss``, which needs the standard
library alone (the TRL virtualenv has PyTorch, not JAX):
``python -m experiments.benchmarks.peer_rl --setup`` creates it with pinned
``torch`` (CPU), ``trl`` and ``transformers`` (``peer_rl.TRL_REQUIREMENTS``). The spec, written by
``peer_rl``, holds:

- ``checkpoint``: a Hugging Face directory with the policy's initial weights
  (``jagent.models.save_hf_checkpoint``, float32) and our tokenizer's
  ``tokenizer.json`` / ``tokenizer_config.json`` (``Tokenizer.hf_files``);
  loaded with ``AutoModelForCausalLM`` and ``AutoTokenizer``;
- per iteration, the N prompt texts (jagent's turn-1 text of each level,
  chat markup included) and the token ids jagent gives them: this side
  checks that ``AutoTokenizer`` encodes every prompt to the same ids;
- per level, the reward of each answer (the arm names, lower-cased): the
  caller stepped our environment from the level's reset key with each
  action (for Bandit the payout is drawn at reset, so it is a function of
  the level and the arm: both sides use the same sampled payouts);
- the parse rules (RAGEN's ``<answer>`` regex, the separator, the actions
  per turn, the format penalty) and the sizes.

This side trains with ``trl.GRPOTrainer``: one optimizer step per
iteration on N prompts x G completions (``per_device_train_batch_size =
N x G``, ``num_generations = G``, ``gradient_accumulation_steps = 1``,
``num_iterations = 1``), the prompts in the spec's order
(``shuffle_dataset=False``), ``beta = 0`` (no KL, no reference model),
``loss_type="grpo"`` (per-sequence token mean, then the mean over
sequences: jagent's seq-mean-token-mean), ``epsilon = 0.2``,
``scale_rewards="group"``, temperature 1 with no top-k / top-p, a constant
learning rate, Adam (``adamw_torch`` with weight decay 0) and gradients
clipped at the spec's norm. The reward function parses each completion
with the rules above (written here in Python, as ``jagent.rollout.
reference_parse`` states them; the caller re-parses every completion with
``reference_parse`` itself and checks the rewards).

Timing: a ``TrainerCallback`` records each step from ``on_step_begin`` to
``on_step_end`` (the generation, rewards and advantages happen inside the
step, in ``GRPOTrainer._prepare_inputs``); ``_generate_and_score_completions``
is timed on its own (``rollout_s``: generation, reward, advantages; the
rest of the step is ``update_s``: the forward and backward pass and the
optimizer step). The result records, per step, those seconds, the seconds
since the previous step ended (the trainer's own bookkeeping included),
the generated tokens, the completions' ids and rewards; plus the versions,
the setup seconds and the peak RSS.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

from experiments.benchmarks import rss  # standard library only


def parse_reward(reply: str, rewards: dict[str, float], rules: dict[str, Any]) -> float:
  """The episode reward of one single-turn reply (jagent's rules, see module docstring).

  The format penalty when the reply does not parse to valid actions
  (``reference_parse``'s ``format_valid``), plus the reward of each parsed
  action up to the episode's action budget (Bandit: one pull, then done).
  """
  data = reply.encode("utf-8")
  m = re.search(rb"<answer>(.*?)</answer>", data, re.DOTALL)
  content = m.group(1).strip() if m else b""
  actions, invalid = [], 0
  if m:
    pieces = [p.strip() for p in content.split(rules["separator"].encode())]
    for p in [p for p in pieces if p][:rules["max_actions_per_turn"]]:
      name = p.lower().decode("utf-8", "replace")
      if name in rewards:
        actions.append(name)
      else:
        invalid += 1
  valid = bool(actions) and invalid == 0
  total = 0.0 if valid else float(rules["format_penalty"])
  for name in actions[:rules["max_actions_per_traj"]]:
    total += float(rewards[name])
  return total


def run(spec: dict[str, Any]) -> dict[str, Any]:
  """Trains ``warmup + iterations`` GRPO steps on the spec's prompts; returns the timings."""
  t_setup = time.perf_counter()
  import datasets  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import trl  # pylint: disable=g-import-not-at-top

  r, t = spec["rollout"], spec["train"]
  n, g = r["num_groups"], r["group_size"]
  steps = spec["warmup"] + spec["iterations"]
  tok = transformers.AutoTokenizer.from_pretrained(spec["checkpoint"])
  for step_prompts, step_ids in zip(spec["prompts"], spec["prompt_ids"]):
    for text, ids in zip(step_prompts, step_ids):
      got = tok(text, add_special_tokens=False)["input_ids"]
      if got != ids:
        raise AssertionError(f"AutoTokenizer encodes a prompt unlike jagent: {got} != {ids}")
  model = transformers.AutoModelForCausalLM.from_pretrained(spec["checkpoint"],
                                                            dtype=torch.float32)
  rows = [dict(prompt=text, level=f"{k}:{j}", arm_rewards=json.dumps(rw))
          for k, (texts, rws) in enumerate(zip(spec["prompts"], spec["arm_rewards"]))
          for j, (text, rw) in enumerate(zip(texts, rws))]
  dataset = datasets.Dataset.from_list(rows)
  rules = spec["rules"]
  records: list[dict[str, Any]] = [dict() for _ in range(steps)]
  state = dict(step=0)

  def reward_fn(prompts, completions, completion_ids, arm_rewards, **kwargs):
    del prompts, kwargs
    out = [parse_reward(c, json.loads(rw), rules) for c, rw in zip(completions, arm_rewards)]
    rec = records[state["step"]]
    rec.setdefault("completion_ids", []).extend([list(map(int, c)) for c in completion_ids])
    rec.setdefault("rewards", []).extend(out)
    return out

  class TimedTrainer(trl.GRPOTrainer):

    def _generate_and_score_completions(self, inputs):
      t0 = time.perf_counter()
      out = super()._generate_and_score_completions(inputs)
      rec = records[state["step"]]
      rec["rollout_s"] = rec.get("rollout_s", 0.0) + time.perf_counter() - t0
      rec["tokens"] = rec.get("tokens", 0) + int(out["completion_mask"].sum())
      rec["levels"] = rec.get("levels", []) + [x["level"] for x in inputs]
      return out

  class Clock(transformers.TrainerCallback):

    def __init__(self):
      self.last_end = None
      self.begin = None

    def on_step_begin(self, args, st, control, **kwargs):
      self.begin = time.perf_counter()

    def on_step_end(self, args, st, control, **kwargs):
      end = time.perf_counter()
      rec = records[state["step"]]
      rec["seconds"] = end - self.begin
      rec["since_previous_s"] = end - (self.last_end if self.last_end is not None
                                       else self.begin)
      rec["update_s"] = rec["seconds"] - rec.get("rollout_s", 0.0)
      self.last_end = end
      state["step"] += 1

  config = trl.GRPOConfig(
      output_dir=spec["output_dir"], max_steps=steps, per_device_train_batch_size=n * g,
      gradient_accumulation_steps=1, num_generations=g, num_iterations=1,
      shuffle_dataset=False, max_completion_length=r["max_tokens_per_turn"],
      temperature=r["temperature"], top_p=1.0, top_k=0, beta=0.0, epsilon=t["clip_eps"],
      loss_type="grpo", scale_rewards="group", mask_truncated_completions=False,
      learning_rate=t["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
      optim="adamw_torch", weight_decay=0.0, max_grad_norm=t["max_grad_norm"],
      use_cpu=True, bf16=False, fp16=False, seed=spec["seed"], report_to=[],
      save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
      log_completions=False)
  trainer = TimedTrainer(model=model, reward_funcs=[reward_fn], args=config,
                         train_dataset=dataset, processing_class=tok, callbacks=[Clock()])
  setup_s = time.perf_counter() - t_setup
  trainer.train()
  if state["step"] != steps:
    raise RuntimeError(f"TRL ran {state['step']} steps, expected {steps}")
  iters = []
  for rec in records:
    b = len(rec["rewards"])
    if b != n * g:
      raise RuntimeError(f"a TRL step scored {b} completions, expected {n * g}")
    iters.append(dict(seconds=rec["seconds"], rollout_s=rec["rollout_s"],
                      update_s=rec["update_s"], since_previous_s=rec["since_previous_s"],
                      env_turns=b, tokens=rec["tokens"], levels=rec["levels"],
                      completion_ids=rec["completion_ids"], rewards=rec["rewards"]))
  return dict(
      trl_version=trl.__version__, transformers_version=transformers.__version__,
      torch_version=torch.__version__, torch_threads=torch.get_num_threads(),
      setup_s=setup_s, iterations=iters,
      peak_rss_mb=rss.peak_rss_mb())


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
