"""Checkpoints of the whole train state (orbax) and policy export (Hugging Face)."""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from jagent import models
from jagent import tokenizers
from jagent._src import checks
from jagent._src.types import PyTree

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(ValueError):
  """No checkpoint of a run directory reads back (every one is damaged or of another structure).

  The message names the checkpoint directory and each checkpoint tried with
  why it failed.
  """


def _reason(error: BaseException) -> str:
  """The first line of the innermost cause of ``error`` (orbax wraps tensorstore's)."""
  while error.__cause__ is not None:
    error = error.__cause__
  text = str(error).strip().splitlines()
  line = text[0] if text else type(error).__name__
  return line if len(line) <= 300 else line[:297] + "..."


def _abstract(target: PyTree) -> PyTree:
  """``ShapeDtypeStruct`` leaves (keeping shardings) for a concrete or abstract tree."""

  def leaf(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return x
    return jax.ShapeDtypeStruct(x.shape, x.dtype,
                                sharding=getattr(x, "sharding", None))

  return jax.tree.map(leaf, target)


class Checkpointer:
  """Saves and restores a :class:`jagent.train.TrainState` plus JSON metadata.

  Wraps ``orbax.checkpoint.CheckpointManager`` (orbax-checkpoint 0.12.8) on
  ``<workdir>/checkpoints/<step>/`` with two items: ``state`` (the pytree,
  ``StandardSave``) and ``meta`` (a JSON dict of host data: data position,
  config, seeds). Each save is written to a temporary directory and renamed
  when complete, so an interrupted save never replaces or corrupts the last
  good checkpoint; leftover temporary directories are not listed as steps.
  Only the newest ``keep`` checkpoints are kept. A checkpoint damaged on
  disk afterwards (a truncated or corrupted file) is skipped by
  :meth:`restore_readable`, which restores the newest one that reads back;
  the damaged one stays on disk until this object writes its step again,
  which replaces it (:meth:`save`). Saves run asynchronously
  (``async_save``) and :meth:`wait` blocks until they are on disk; every
  reading method waits first.

  LoRA: the frozen base of every :class:`jagent.models.LoraParams` in the
  state is left out (``models.split_frozen``): a checkpoint holds the
  adapters, their optimizer state and the rest of the state, and
  :meth:`restore` puts the target's bases back. The base is reloaded from
  where it came from (its Hugging Face directory, or ``models.init`` with
  the run's seed), so pass a target whose bases are those arrays (abstract
  bases come back abstract: join the real ones with ``models.join_frozen``).

  Restore needs a target (a state of the right structure, or its
  ``jax.eval_shape``): without one orbax turns optax's NamedTuples into
  lists (orbax-checkpoint 0.12.8 restores a tree it has no type for as
  lists and dicts). Shardings of the target's leaves are honoured, so
  a run can resume on another mesh.

  Example::

    ckpt = train.Checkpointer(workdir, keep=3)
    ckpt.save(int(state.step), state, {"data_position": 128})
    ...
    state, meta = ckpt.restore(jax.eval_shape(lambda: fresh_state))

  Args:
    workdir: the run directory (created if missing).
    keep: checkpoints to keep (>= 1).
    async_save: write in a background thread.

  Raises:
    ValueError: for ``keep < 1``.
  """

  def __init__(self, workdir: str, *, keep: int = 3, async_save: bool = True):
    checks.check_int("keep", keep, 1)
    self.directory = os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._unreadable: set[int] = set()  # steps restore_readable skipped

  def save(self, step: int, state: PyTree,
           metadata: dict[str, Any] | None = None) -> bool:
    """Starts saving ``state`` and ``metadata`` as checkpoint ``step``.

    Args:
      step: the step number (Python int >= 0, increasing).
      state: the train state pytree.
      metadata: a JSON-serialisable dict (default ``{}``).

    A step that :meth:`restore_readable` skipped as unreadable is deleted
    first and written anew (a run resumed from an older checkpoint writes the
    same step again); any other existing step is an error.

    Returns:
      True if a save was started.

    Raises:
      ValueError: for a negative or non-int step, or a step already on disk
        that was not skipped as unreadable (orbax's StepAlreadyExistsError).
    """
    checks.check_int("step", step, 0)
    if step in self._unreadable:
      self._unreadable.discard(step)
      if step in self.all_steps():
        self._manager.delete(step)
    state, _ = models.split_frozen(state)  # LoRA: no base in the checkpoint
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              meta=ocp.args.JsonSave(dict(metadata or {})))
    return self._manager.save(step, args=args, force=True)

  def wait(self) -> None:
    """Blocks until pending saves are complete."""
    self._manager.wait_until_finished()

  def all_steps(self) -> list[int]:
    """Steps of the complete checkpoints on disk, ascending."""
    self.wait()
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None if there is none."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def _step(self, step):
    step = self.latest_step() if step is None else step
    if step is None:
      raise ValueError(f"no checkpoint in {self.directory}.")
    if step not in self.all_steps():
      raise ValueError(f"no checkpoint for step {step} in {self.directory}; "
                       f"have {self.all_steps()}.")
    return step

  def restore(self, target: PyTree, step: int | None = None
              ) -> tuple[PyTree, dict[str, Any]]:
    """Restores checkpoint ``step`` (default: the latest) onto ``target``.

    Args:
      target: a state of the saved structure, concrete or from
        ``jax.eval_shape`` (leaves' shapes, dtypes and shardings are used).
      step: the step to restore, or None for the latest.

    Returns:
      ``(state, metadata)``; with LoRA, each ``LoraParams``'s base is the
      target's (the checkpoint holds none).

    Raises:
      ValueError: if there is no such checkpoint.
    """
    step = self._step(step)
    target, frozen = models.split_frozen(target)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(target)),
                              meta=ocp.args.JsonRestore())
    out = self._manager.restore(step, args=args)
    return models.join_frozen(out.state, frozen), dict(out.meta)

  def restore_readable(self, target: PyTree) -> tuple[int, PyTree, dict[str, Any],
                                                      list[tuple[int, str]]]:
    """Restores the newest checkpoint that reads back, skipping damaged ones.

    Tries the checkpoints newest first (:meth:`restore` onto ``target``);
    one whose files fail to read (orbax and tensorstore raise ValueError,
    OSError and others for a truncated or corrupted file) is skipped and left
    on disk (a later :meth:`save` of its step replaces it). Falling back
    loses only the steps after the restored checkpoint, which a resumed run
    trains again.

    Args:
      target: as in :meth:`restore`.

    Returns:
      ``(step, state, metadata, skipped)``: the restored checkpoint's step,
      state and metadata, and ``(step, reason)`` of each newer checkpoint
      skipped (newest first; the reason is the first line of the innermost
      error).

    Raises:
      CheckpointError: there is no checkpoint, or none reads back (naming
        the directory, each step and why).
    """
    steps = self.all_steps()
    if not steps:
      raise CheckpointError(f"no checkpoint in {self.directory}.")
    skipped = []
    for step in reversed(steps):
      try:
        state, meta = self.restore(target, step)
      except Exception as e:  # pylint: disable=broad-except
        # Which error a damaged file raises depends on which file and how.
        skipped.append((step, _reason(e)))
        self._unreadable.add(step)
        continue
      return step, state, meta, skipped
    tried = "; ".join(f"checkpoint {s}: {why}" for s, why in skipped)
    raise CheckpointError(f"no checkpoint in {self.directory} reads back ({tried})")

  def restore_metadata(self, step: int | None = None) -> dict[str, Any]:
    """Only the JSON metadata of checkpoint ``step`` (default: the latest).

    Raises:
      ValueError: if there is no such checkpoint.
    """
    step = self._step(step)
    out = self._manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(out.meta)

  def close(self) -> None:
    """Waits for pending saves and releases the manager."""
    self._manager.wait_until_finished()
    self._manager.close()


def export_policy(params: models.Params | models.LoraParams, config: models.ModelConfig,
                  path: str, *, tokenizer: tokenizers.Tokenizer | None = None,
                  chat_template: str | None = None) -> None:
  """Writes the policy as a Hugging Face directory that ``transformers`` loads and chats with.

  :func:`jagent.models.save_hf_checkpoint` (``config.json`` +
  ``model.safetensors``) plus, given a ``tokenizer``, its
  ``tokenizer.json`` and ``tokenizer_config.json`` (special tokens and the
  Jinja chat template; ``Tokenizer.hf_files``), all moved in together, so
  ``AutoTokenizer.from_pretrained(path)`` and
  ``AutoModelForCausalLM.from_pretrained(path)`` load it and
  ``apply_chat_template`` writes the prompts the policy was trained on.
  :func:`jagent.models.load_hf_checkpoint` and
  :class:`jagent.tokenizers.HFTokenizer` load it back. A LoRA policy is
  written merged (:func:`jagent.models.merge_lora`); its adapters alone, in
  PEFT's format: :func:`jagent.models.save_peft_adapter`.

  Args:
    params: policy parameters (e.g. ``state.params``), plain or LoRA.
    config: their model config.
    path: output directory (created).
    tokenizer: the policy's tokenizer (None: weights and config only).
    chat_template: the name of the chat template the policy was trained
      with (``jagent.tokenizers.CHAT_TEMPLATES``; e.g. the run's
      ``PromptConfig.chat_template``); None: the tokenizer's own.

  Raises:
    ValueError: params whose shapes disagree with ``config``, a tokenizer
      whose vocabulary is larger than ``config.vocab_size``, or what
      ``Tokenizer.hf_files`` raises (an unknown template, a tokenizer without
      a ``tokenizer.json`` form); all before anything is written.
  """
  extra = None
  if tokenizer is not None:
    if tokenizer.vocab_size > config.vocab_size:
      raise ValueError(f"tokenizer of {tokenizer.vocab_size} ids does not fit the model's "
                       f"vocab_size={config.vocab_size}")
    extra = tokenizer.hf_files(chat_template)
  if isinstance(params, models.LoraParams):  # a bfloat16 base: merged in the config's dtype
    params = models.merge_lora(params, min_dtype=config.jnp_param_dtype)
  models.save_hf_checkpoint(params, config, path, extra_files=extra)
