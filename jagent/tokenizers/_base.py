"""The tokenizer interface, chat templates and on-device byte decoding."""

from __future__ import annotations

import abc
import json
import os
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jagent._src import files

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


def chatml_template(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
  """ChatML (Qwen2 / Qwen2.5 chat format, and our tiny tokenizer's).

  ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then
  ``<|im_start|>assistant\\n`` when ``add_generation_prompt``. (Qwen2.5's own
  Jinja template also inserts a default system message when none is given;
  use the HF tokenizer's template for byte-exact Qwen prompts.)
  """
  out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
  return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def llama3_template(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
  """Llama 3 chat format (without the date preamble of Llama 3.1+'s template).

  ``<|begin_of_text|>`` then per message
  ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``, then
  the assistant header when ``add_generation_prompt``.
  """
  out = "<|begin_of_text|>" + "".join(
      f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
      for m in messages)
  if add_generation_prompt:
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n"
  return out


def plain_template(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
  """A plain-text chat format without special tokens (for models trained from scratch).

  ``{Role}: {content}\n`` per message (role capitalised), then
  ``"Assistant: "`` when ``add_generation_prompt``. Replies end with the
  tokenizer's EOS token, which the template never writes.
  """
  out = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages)
  return out + ("Assistant: " if add_generation_prompt else "")


CHAT_TEMPLATES: dict[str, Callable[..., str]] = {
    "chatml": chatml_template, "llama3": llama3_template, "plain": plain_template}

# Each named template as a Hugging Face Jinja ``chat_template`` (what
# ``transformers``' ``apply_chat_template`` renders, with trim_blocks and
# lstrip_blocks): the same text as the Python function of the same name.
CHAT_TEMPLATES_JINJA: dict[str, str] = {
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    "llama3": (
        "{{ '<|begin_of_text|>' }}"
        "{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
        " + message['content'] + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
    "plain": (
        "{% for message in messages %}"
        "{{ message['role'] | capitalize + ': ' + message['content'] + '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}"),
}

# The files of a Hugging Face tokenizer directory.
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


class Tokenizer(abc.ABC):
  """One interface over sentencepiece and Hugging Face tokenizers.

  Attributes:
    vocab_size: V, number of token ids (ids are in [0, V)).
    bos_id, eos_id, pad_id: special ids or None. ``eos_id`` is the token that
      ends an assistant reply in this tokenizer's chat format.
    special_tokens: text -> id of tokens that are never merged with others
      (chat markers, padding, control tokens).
  """

  vocab_size: int
  bos_id: int | None
  eos_id: int | None
  pad_id: int | None
  special_tokens: Mapping[str, int]

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Token ids of ``text``; special-token text (e.g. ``<|im_end|>``) maps to its id."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int]) -> str:
    """Text of ``ids``, special tokens included as their text (pad/control as "")."""

  @abc.abstractmethod
  def _piece_bytes(self) -> list[bytes]:
    """The bytes each id contributes to a decoded UTF-8 string (V entries)."""

  def __init__(self, chat_template: str | Callable[..., str] = "chatml",
               chat_template_jinja: str | None = None):
    if isinstance(chat_template, str):
      if chat_template not in CHAT_TEMPLATES:
        raise ValueError(f"unknown chat_template {chat_template!r}; known: "
                         f"{sorted(CHAT_TEMPLATES)} or a callable")
      chat_template_jinja = CHAT_TEMPLATES_JINJA[chat_template]
      chat_template = CHAT_TEMPLATES[chat_template]
    self._chat_template = chat_template
    # The Jinja source of the template (None: a callable without one).
    self._chat_template_jinja = chat_template_jinja
    self._table = None

  # ------------------------------------------------------- Hugging Face files
  @abc.abstractmethod
  def _hf_tokenizer_json(self) -> str:
    """The text of this tokenizer's Hugging Face ``tokenizer.json``."""

  @abc.abstractmethod
  def _token_text(self, i: int) -> str:
    """The vocabulary entry of id ``i`` (e.g. ``"<|im_end|>"``)."""

  def _hf_tokenizer_config(self) -> dict[str, Any]:
    """``tokenizer_config.json`` without the chat template (subclasses extend it)."""
    text = lambda i: None if i is None else self._token_text(i)  # noqa: E731
    return {"tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": text(self.bos_id), "eos_token": text(self.eos_id),
            "pad_token": text(self.pad_id),
            # Decoding must give the text back as it was (no " ." -> ".").
            "clean_up_tokenization_spaces": False}

  def hf_files(self, chat_template: str | None = None) -> dict[str, str]:
    """The files of a Hugging Face tokenizer directory: file name -> text.

    ``tokenizer.json`` (the fast tokenizer: vocabulary, merges, special
    tokens, normalizer, decoder) and ``tokenizer_config.json`` (the bos / eos
    / pad tokens and the Jinja ``chat_template``), so that
    ``transformers.AutoTokenizer.from_pretrained(dir)`` encodes, decodes and
    applies the chat template as this tokenizer does, and
    :class:`jagent.tokenizers.HFTokenizer` loads the directory back.

    Args:
      chat_template: a name of :data:`CHAT_TEMPLATES` (the template the
        model was trained with), or None: this tokenizer's own.

    Returns:
      ``{"tokenizer.json": ..., "tokenizer_config.json": ...}``.

    Raises:
      ValueError: an unknown ``chat_template`` name, a tokenizer whose own
        template is a Python callable without Jinja source, or (from the
        subclass) a tokenizer that has no ``tokenizer.json`` form.
    """
    if chat_template is None:
      jinja = self._chat_template_jinja
      if jinja is None:
        raise ValueError("this tokenizer's chat template is a Python callable with no Jinja "
                         f"source; pass chat_template= one of {sorted(CHAT_TEMPLATES_JINJA)}")
    elif chat_template in CHAT_TEMPLATES_JINJA:
      jinja = CHAT_TEMPLATES_JINJA[chat_template]
    else:
      raise ValueError(f"unknown chat_template {chat_template!r}; known: "
                       f"{sorted(CHAT_TEMPLATES_JINJA)}")
    config = {**self._hf_tokenizer_config(), "chat_template": jinja}
    return {TOKENIZER_FILE: self._hf_tokenizer_json(),
            TOKENIZER_CONFIG_FILE: json.dumps(config, indent=2, ensure_ascii=False) + "\n"}

  def save_pretrained(self, path: str, chat_template: str | None = None) -> list[str]:
    """Writes :meth:`hf_files` into directory ``path`` (created); returns their paths."""
    os.makedirs(path, exist_ok=True)
    out = []
    for name, text in self.hf_files(chat_template).items():
      out.append(os.path.join(path, name))
      files.write_text(out[-1], text)
    return out

  def apply_chat_template(self, messages: Sequence[Message],
                          add_generation_prompt: bool = True) -> str:
    """The prompt text of a conversation (list of {"role", "content"} dicts)."""
    return self._chat_template(messages, add_generation_prompt=add_generation_prompt)

  def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True
                  ) -> list[int]:
    """``encode(apply_chat_template(messages, add_generation_prompt))``."""
    return self.encode(self.apply_chat_template(messages, add_generation_prompt))

  def token_bytes(self) -> tuple[np.ndarray, np.ndarray]:
    """The id -> bytes table used to decode replies on device.

    Returns:
      ``(table, lengths)``: uint8 [V, max_bytes] with each id's bytes left
      aligned and zero padded, and int32 [V] byte counts. Concatenating the
      rows of a sequence of ids gives the UTF-8 bytes of ``decode(ids)``
      (pad / control ids contribute no bytes).
    """
    if self._table is None:
      pieces = self._piece_bytes()
      if len(pieces) != self.vocab_size:
        raise ValueError(f"{len(pieces)} byte strings for vocab_size {self.vocab_size}")
      width = max(1, max(len(p) for p in pieces))
      table = np.zeros((len(pieces), width), np.uint8)
      for i, p in enumerate(pieces):
        table[i, :len(p)] = np.frombuffer(p, np.uint8)
      self._table = (table, np.array([len(p) for p in pieces], np.int32))
    return self._table

  def symbol_ids(self, symbols: Sequence[str]) -> np.ndarray:
    """int32 [len(symbols)]: the single token of each symbol, for table rendering.

    An environment renders observations as symbol ids; this maps them to token
    ids by lookup. ``""`` (the padding symbol) maps to ``pad_id``.

    Raises:
      ValueError: a symbol that does not encode to exactly one token, or
        whose token differs inside a run of symbols (rendering by lookup would
        then disagree with ``encode``).
    """
    out = []
    for s in symbols:
      if s == "":
        out.append(self.pad_id if self.pad_id is not None else 0)
        continue
      ids = self.encode(s)
      if len(ids) != 1 or self.encode(s + s) != ids * 2:
        raise ValueError(f"symbol {s!r} encodes to {ids} (and {s + s!r} to "
                         f"{self.encode(s + s)}): not one context-free token")
      out.append(ids[0])
    return np.asarray(out, np.int32)


def gather_bytes(tokens: jax.Array, lengths: jax.Array, table: jax.Array,
                 table_lengths: jax.Array, max_bytes: int) -> tuple[jax.Array, jax.Array]:
  """Decodes token ids to UTF-8 bytes on device (jittable, static shapes).

  Token t of row b goes to byte offset ``cumsum(table_lengths[tokens])`` (the
  bytes of earlier tokens); bytes past ``max_bytes`` are dropped.

  Args:
    tokens: int32 [B, N] token ids.
    lengths: int32 [B] valid tokens per row.
    table: uint8 [V, W] from ``Tokenizer.token_bytes()``.
    table_lengths: int32 [V].
    max_bytes: M, the output buffer width (static).

  Returns:
    ``(buf, n)``: uint8 [B, M] zero-padded bytes and int32 [B] byte counts
    (clipped to M).
  """
  b, n = tokens.shape
  valid = jnp.arange(n)[None, :] < lengths[:, None]
  lens = jnp.where(valid, table_lengths[tokens], 0)  # [B, N]
  start = jnp.cumsum(lens, axis=1) - lens
  w = table.shape[1]
  off = start[:, :, None] + jnp.arange(w)[None, None, :]  # [B, N, W]
  keep = jnp.arange(w)[None, None, :] < lens[:, :, None]
  off = jnp.where(keep, off, max_bytes)  # out of range -> dropped
  rows = jnp.broadcast_to(jnp.arange(b)[:, None, None], off.shape)
  buf = jnp.zeros((b, max_bytes), jnp.uint8).at[rows, off].set(table[tokens], mode="drop")
  return buf, jnp.minimum(jnp.sum(lens, axis=1), max_bytes).astype(jnp.int32)
