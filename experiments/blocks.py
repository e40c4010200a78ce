"""The jagent config dataclass of each block of a run's config.

One builder a block: :func:`prompt_config` (``config.prompt``),
:func:`rollout_config` (``config.rollout``), :func:`eval_rollout_config`
(``config.eval``), :func:`model_config` (``config.model`` or
``config.model_dir``), :func:`train_config` (``config.rl``),
:func:`sft_optimizer` (``config.sft``), :func:`lora_config` and
:func:`lora_base_dtype` (``config.lora``), :func:`filter_config`
(``config.rl.filter_*``). Each passes the config's fields to the
dataclass, whose own checks' :class:`jagent.FieldError` comes back as an
:class:`experiments.fields.ConfigError` naming the config field
(``RolloutConfig.group_size=0`` as ``config.rollout.group_size=0``).
:class:`experiments.spec.RunSpec` builds them once a run.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from experiments import fields
import jagent
from jagent import losses
from jagent import models
from jagent import rollout
from jagent import tokenizers
from jagent import train

# What to set instead, for a config field whose dataclass's own message names
# a field of the dataclass that the config does not have.
_HINTS = {
    "rollout.temperature": "the train rollout samples; greedy evaluation is config.eval.greedy",
    "eval.temperature": "config.eval.greedy=True adds a greedy evaluation",
}


def _named(build: Callable[..., Any], args: dict[str, tuple[str, Any]], *,
           owners: Sequence[str] | None = None,
           nested: dict[str, tuple[str, Any]] | None = None, **fixed) -> Any:
  """``build(**args' values, **fixed)``, its errors named as config fields.

  ``args`` maps each argument of ``build`` (a config dataclass) to
  ``(config field, value)``. A :class:`jagent.FieldError` of the dataclass's
  own checks (``owners``: the dataclasses whose checks run, default
  ``build``'s own name) on one of those arguments
  (``RolloutConfig.group_size=0: ...``) is re-raised as a
  :class:`experiments.fields.ConfigError` naming the config field
  (``config.rollout.group_size=0: ...``), its advice replaced by
  :data:`_HINTS`'s where that names the dataclass's fields; any other error
  propagates as it is. ``nested`` names, the same way, errors on the fields
  of a dataclass built into one argument (``"tree.branches"``: the
  ``RolloutConfig.tree.branches`` of the tree passed as ``tree``); it is not
  passed to ``build``.
  """
  try:
    return build(**{arg: value for arg, (_, value) in args.items()}, **fixed)
  except jagent.FieldError as e:
    names = {**args, **(nested or {})}
    if e.owner not in (owners or (build.__name__,)) or e.field not in names:
      raise
    field, value = names[e.field]
    why = f"{e.why} ({_HINTS[field]})" if field in _HINTS else e.reason()
    raise fields.bad(field, value, why) from e


def prompt_config(config) -> rollout.PromptConfig:
  """The run's PromptConfig (``config.prompt``).

  Raises:
    ConfigError: PromptConfig's own checks, or a ``chat_template`` that is
      not one of ``jagent.tokenizers.CHAT_TEMPLATES`` (``""``: the
      tokenizer's), naming ``config.prompt.<field>``.
  """
  p = config.prompt
  if p.chat_template and p.chat_template not in tokenizers.CHAT_TEMPLATES:
    raise fields.bad(
        "prompt.chat_template", p.chat_template,
        f"unknown; known: {sorted(tokenizers.CHAT_TEMPLATES)} or \"\" (the tokenizer's)")
  return _named(rollout.PromptConfig, {
      f: (f"prompt.{f}", p[f]) for f in ("system", "first_turn", "next_turn", "think",
                                         "max_actions_per_turn")},
                instructions=p.instructions if p.instructions != "" or
                "{instructions}" not in p.first_turn else None,
                chat_template=p.chat_template or None)


def rollout_config(config) -> rollout.RolloutConfig:
  """The train rollout's RolloutConfig (``config.rollout``).

  Raises:
    ValueError: RolloutConfig's own checks, naming ``config.rollout.<field>``.
  """
  r = config.rollout
  tree, tree_args = tree_config(r.tree)
  return _named(rollout.RolloutConfig, {
      **{f: (f"rollout.{f}", r[f]) for f in ("num_groups", "group_size", "max_turns",
                                             "max_tokens_per_turn", "max_actions_per_traj",
                                             "temperature")},
      "history_turns": ("rollout.history_turns", r.history_turns),
      "merge_lora": ("rollout.merge_lora", r.merge_lora),
      "prefill_chunk": ("rollout.prefill_chunk", r.prefill_chunk),
      "tree": ("rollout.tree", tree)},
                owners=("RolloutConfig", "SamplingConfig"), nested=tree_args)  # the latter: temperature


def tree_config(tree) -> tuple[rollout.TreeConfig | None, dict[str, tuple[str, Any]]]:
  """``config.rollout.tree`` as a :class:`jagent.rollout.TreeConfig` (None: no tree).

  The config holds every field as a tuple, so that a flag can set one value
  or one per fork turn (``--config.rollout.tree.branches="(2, 4)"``): a
  one-value ``branches`` or ``expand`` applies at every fork turn, and an
  empty ``expand`` expands every node. An empty ``fork_turns`` turns trees
  off.

  Returns:
    ``(TreeConfig or None, {"tree.<field>": ("rollout.tree.<field>", value)})``:
    the second maps the check errors of ``RolloutConfig`` on the tree
    (:class:`jagent.FieldError` fields ``tree.<field>``) to the config field.
  """
  names = ("fork_turns", "branches", "expand", "trees", "select")
  args = {f"tree.{n}": (f"rollout.tree.{n}", tree[n]) for n in names}
  if not tree.fork_turns:
    return None, args

  def per_fork(v):
    v = tuple(v) if isinstance(v, (tuple, list)) else v
    return v[0] if isinstance(v, tuple) and len(v) == 1 else v

  expand = per_fork(tree.expand)
  return rollout.TreeConfig(
      fork_turns=tuple(tree.fork_turns), branches=per_fork(tree.branches),
      expand=None if expand == () else expand, trees=tree.trees,
      select=tree.select), args


def train_config(config, model_config: models.ModelConfig,
                 num_microbatches: int) -> train.TrainConfig:
  """The RL stage's TrainConfig (``config.rl``; ``num_microbatches`` resolved from -1).

  Raises:
    ValueError: TrainConfig's and OptimizerConfig's own checks, naming
      ``config.rl.<field>`` (or ``config.rollout.temperature``).
  """
  rl = config.rl
  named = lambda *fs: {f: (f"rl.{f}", rl[f]) for f in fs}  # noqa: E731
  actor = _named(train.OptimizerConfig,
                 named("learning_rate", "warmup_steps", "decay", "weight_decay",
                       "max_grad_norm"),
                 decay_steps=max(1, rl.steps * rl.num_minibatches * rl.ppo_epochs
                                 - rl.warmup_steps) if rl.decay != "constant" else 0)
  critic = _named(train.OptimizerConfig,
                  {"learning_rate": ("rl.critic_learning_rate", rl.critic_learning_rate),
                   **named("weight_decay", "max_grad_norm")})
  return _named(train.TrainConfig, {
      "temperature": ("rollout.temperature", config.rollout.temperature),
      **named("ppo_epochs", "num_minibatches", "old_logprobs"),
      "num_microbatches": ("rl.num_microbatches", num_microbatches)},
                model=model_config, actor_optimizer=actor, critic_optimizer=critic)


def lora_config(config, model_config: models.ModelConfig | None = None
                ) -> models.LoraConfig | None:
  """The run's LoRA adapters (``config.lora``), or None when off.

  Off when ``lora.rank`` is 0.
  With ``model_config``, also checks that its family has every target module.
  The other fields are checked even when off, so a typo (say
  ``target_modules=bogus``) is refused before it silently costs a run.

  Raises:
    ValueError: a negative or non-int ``lora.rank``, or LoraConfig's own
      checks (``alpha``, ``dropout``, an unknown or missing module), naming
      ``config.lora.<field>``.
  """
  lo = config.lora
  rank = lo.rank
  fields.require_int("lora.rank", rank, 0, "must be an int >= 0 (0: LoRA off)")

  def build(**kwargs):
    lc = models.LoraConfig(**kwargs)
    if model_config is not None:
      lc.check_model(model_config)
    return lc

  # Rank 0 is checked as rank 1: LoraConfig refuses 0, the other fields stand.
  lc = _named(build, {f: (f"lora.{f}", lo[f]) for f in ("alpha", "dropout", "target_modules")},
              owners=("LoraConfig",), rank=max(rank, 1))
  return lc if rank else None


LORA_BASE_DTYPES = ("float32", "bfloat16")


def lora_base_dtype(config) -> str | None:
  """The dtype the frozen LoRA base is stored in (``config.lora.base_dtype``).

  ``"bfloat16"`` halves the base's memory; the model still computes in its
  ``dtype`` (weights are cast at use) and the adapters stay float32.

  Returns:
    The dtype name, or None when LoRA is off or the field is None (the
    loaded dtype).

  Raises:
    ConfigError: a value not in :data:`LORA_BASE_DTYPES` (LoRA on or off),
      naming the field.
  """
  dtype = config.lora.base_dtype
  if dtype is not None and dtype not in LORA_BASE_DTYPES:
    raise fields.bad("lora.base_dtype", dtype, f"must be one of {LORA_BASE_DTYPES}")
  return dtype if config.lora.rank else None


def lora_base_warning(config) -> str | None:
  """The warning line of LoRA on a random base, or None.

  With ``config.lora.rank > 0`` and an empty ``config.model_dir`` the frozen
  base is ``models.init``'s random weights, and adapters alone can hardly
  move such a model: its tied embeddings (std 0.02) and final norm keep
  every logit within about +-1.3, so no reply format can be learned
  (measured on Bandit with ``nano``: adapters-only SFT reached a format NLL
  of ~5.06 nats/token where full fine-tuning reached 0.09, and RL then
  success 0.0). Adapters need a trained base (``config.model_dir``: e.g. a
  full fine-tuning run's ``policy/`` export) and about 10x the full
  fine-tuning learning rate.

  Args:
    config: a run's config (``experiments/configs/*.py``).

  Returns:
    One line naming ``config.lora.rank`` and ``config.model_dir``, or None
    (LoRA off, or a base loaded from ``model_dir``).
  """
  rank = config.lora.rank
  if not rank or config.model_dir:
    return None
  return (f"config.lora.rank={rank} with config.model_dir='': the adapters train on a "
          f"RANDOM frozen base ({config.model}), which they cannot teach a reply format "
          "(its logits stay within ~+-1.3); pass a trained base as config.model_dir "
          "(e.g. a full fine-tuning run's <workdir>/policy) and ~10x its learning rate")


def eval_rollout_config(config, *, temperature: float | None = None, greedy: bool = False,
                        group_size: int = 1, context_size: int | None = None
                        ) -> rollout.RolloutConfig:
  """The evaluation rollout's RolloutConfig: ``eval.num_groups`` levels a chunk.

  ``temperature`` overrides ``config.eval.temperature``; turn, token and
  action limits are the train rollout's (``config.rollout``).

  Raises:
    ValueError: RolloutConfig's own checks, naming the config field.
  """
  r = config.rollout
  return _named(rollout.RolloutConfig, {
      "num_groups": ("eval.num_groups", config.eval.num_groups),
      "temperature": ("eval.temperature",
                      config.eval.temperature if temperature is None else temperature),
      **{f: (f"rollout.{f}", r[f]) for f in ("max_turns", "max_tokens_per_turn",
                                             "max_actions_per_traj")},
      "history_turns": ("rollout.history_turns", r.history_turns)},
                owners=("RolloutConfig", "SamplingConfig"), group_size=group_size, greedy=greedy,
                context_size=context_size)


def filter_config(config) -> losses.FilterConfig:
  """The run's uncertainty filter, from ``config.rl.filter_mode/filter_value/include_zero``.

  Raises:
    ValueError: from :class:`jagent.losses.FilterConfig`, naming the field.
  """
  rl = config.rl
  return _named(losses.FilterConfig, {
      "mode": ("rl.filter_mode", rl.filter_mode), "value": ("rl.filter_value", rl.filter_value),
      "include_zero": ("rl.include_zero", rl.include_zero)})


def model_config(config, read_model_dir: bool) -> models.ModelConfig:
  """The policy's ModelConfig with the run's fields (see :attr:`experiments.spec.RunSpec.model`).

  Raises:
    ConfigError: a ``config.model_dir`` without a ``config.json``, or
      ModelConfig's own checks of ``remat``, ``compute_dtype``,
      ``attention_impl`` and ``cache_dtype``, naming the field.
  """
  if config.model_dir and read_model_dir:
    if not os.path.isfile(os.path.join(config.model_dir, "config.json")):
      raise fields.bad("model_dir", config.model_dir, "no config.json there: a Hugging Face model "
                       "directory is needed (e.g. a run's <workdir>/policy)")
    base = models.read_hf_config(config.model_dir)
  else:
    base = models.get_config("nano" if config.model_dir else config.model)
  return _named(base.replace, {
      "dtype": ("compute_dtype", config.compute_dtype),
      "attention_impl": ("attention_impl", config.attention_impl),
      "cache_dtype": ("cache_dtype", config.cache_dtype)},
                owners=("ModelConfig",), remat=bool(config.remat))


def sft_optimizer(config, learning_rate=None) -> train.OptimizerConfig:
  """The SFT stage's OptimizerConfig (``learning_rate`` overrides ``sft.learning_rate``).

  ``learning_rate`` may be a traced float32 scalar (a vmapped sweep).

  Raises:
    ValueError: OptimizerConfig's own checks, naming ``config.sft.<field>``.
  """
  sft = config.sft
  lr = sft.learning_rate if learning_rate is None else learning_rate
  return _named(train.OptimizerConfig, {
      "learning_rate": ("sft.learning_rate", lr),
      "warmup_steps": ("sft.warmup_steps", sft.warmup_steps)},
                decay="cosine", decay_steps=max(1, sft.steps - sft.warmup_steps),
                weight_decay=0.0)
