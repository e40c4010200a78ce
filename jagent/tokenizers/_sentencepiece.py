"""SentencePiece tokenizers: load any ``.model``; train and load the tiny default."""

from __future__ import annotations

import importlib.resources
import io
from typing import Iterable, Sequence

import sentencepiece as spm

from jagent.tokenizers import _base

# Pieces of the tiny tokenizer that are always single tokens, in id order
# after <pad> (0) and <unk> (1): chat markers, then environment grid symbols
# (RAGEN Sokoban's two symbol sets and FrozenLake's) and the newline, so an
# observation renders to tokens by a plain table lookup.
TINY_SPECIAL = ("<|im_end|>", "<|im_start|>")
TINY_SYMBOLS = ("\n", "#", "_", "O", "√", "X", "P", "S", "G", "W", ".", "C", "B", "A", "@")
# The reply tags: one token each, so "<answer>Up</answer>" is 3 tokens (not 7)
# and a reply is 4 decode steps with its end-of-turn token.
TINY_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
TINY_VOCAB_SIZE = 512
TINY_MODEL = "tiny_sp512.model"


class SentencePieceTokenizer(_base.Tokenizer):
  """A ``sentencepiece`` model behind the :class:`Tokenizer` interface.

  Args:
    model: path of a ``.model`` file, or its serialized bytes.
    chat_template: "chatml", "llama3" or a callable (see ``apply_chat_template``).
    eos: text of the end-of-reply token; default: the model's ``</s>`` if it
      has one, else ``<|im_end|>`` if that is a piece.
    special: extra piece texts to list in ``special_tokens``.

  Raises:
    ValueError: an unknown ``eos`` piece.
  """

  def __init__(self, model: str | bytes, chat_template="chatml", eos: str | None = None,
               special: Sequence[str] = ()):
    super().__init__(chat_template)
    if isinstance(model, bytes):
      self._sp = spm.SentencePieceProcessor(model_proto=model)
    else:
      self._sp = spm.SentencePieceProcessor(model_file=str(model))
    sp = self._sp
    self.vocab_size = sp.get_piece_size()

    def opt(i):
      return None if i < 0 else int(i)

    self.bos_id, self.pad_id = opt(sp.bos_id()), opt(sp.pad_id())
    specials = {}
    for i in range(self.vocab_size):
      if sp.is_control(i) or sp.is_unknown(i):
        specials[sp.id_to_piece(i)] = i
    for text in tuple(special) + TINY_SPECIAL:
      i = sp.piece_to_id(text)
      if i != sp.unk_id() and sp.id_to_piece(i) == text:
        specials[text] = i
    self.special_tokens = specials
    if eos is None:
      eos_id = opt(sp.eos_id())
      if eos_id is None and "<|im_end|>" in specials:
        eos_id = specials["<|im_end|>"]
    else:
      eos_id = sp.piece_to_id(eos)
      if sp.id_to_piece(eos_id) != eos:
        raise ValueError(f"eos piece {eos!r} is not in the sentencepiece model")
    self.eos_id = eos_id

  @property
  def processor(self) -> spm.SentencePieceProcessor:
    """The underlying ``SentencePieceProcessor``."""
    return self._sp

  def encode(self, text: str) -> list[int]:
    return list(self._sp.encode(text))

  def decode(self, ids: Sequence[int]) -> str:
    sp = self._sp
    ids = [int(i) for i in ids if not (sp.is_control(int(i)) or sp.is_unknown(int(i)))]
    return sp.decode(ids)

  def _piece_bytes(self) -> list[bytes]:
    sp = self._sp
    out = []
    for i in range(self.vocab_size):
      piece = sp.id_to_piece(i)
      if sp.is_control(i) or sp.is_unknown(i):
        out.append(b"")
      elif sp.is_byte(i):  # "<0xAB>"
        out.append(bytes([int(piece[3:5], 16)]))
      else:
        out.append(piece.replace("\u2581", " ").encode("utf-8"))
    return out


def train_sentencepiece(
    lines: Iterable[str],
    vocab_size: int = TINY_VOCAB_SIZE,
    user_defined_symbols: Sequence[str] = TINY_SPECIAL + TINY_SYMBOLS + TINY_TAGS,
    **trainer_kwargs,
) -> bytes:
  """Trains a byte-fallback BPE sentencepiece model whose round trip is exact.

  Settings: identity normalization, no dummy prefix, whitespace kept, digits
  split, byte fallback, ids ``<pad>``=0, ``<unk>``=1, then
  ``user_defined_symbols`` from id 2 (each always one token, even inside
  words), no bos/eos control tokens, one thread (deterministic).

  Args:
    lines: training text; a line may contain newlines.
    vocab_size: V.
    user_defined_symbols: pieces forced to be single tokens.
    **trainer_kwargs: overrides for ``SentencePieceTrainer.train``.

  Returns:
    The serialized model (load with ``SentencePieceTokenizer(bytes)``).

  Raises:
    RuntimeError: from sentencepiece, e.g. a corpus too small for the vocab.
  """
  out = io.BytesIO()
  kwargs = dict(
      model_type="bpe", vocab_size=vocab_size, byte_fallback=True, split_digits=True,
      user_defined_symbols=list(user_defined_symbols), pad_id=0, unk_id=1, bos_id=-1,
      eos_id=-1, normalization_rule_name="identity", remove_extra_whitespaces=False,
      add_dummy_prefix=False, num_threads=1, minloglevel=2, character_coverage=1.0,
      max_sentence_length=1 << 16)
  kwargs.update(trainer_kwargs)
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, **kwargs)
  return out.getvalue()


def tiny_tokenizer_path() -> str:
  """Path of the shipped tiny tokenizer model (experiments/make_tiny_tokenizer.py)."""
  return str(importlib.resources.files("jagent.tokenizers") / "data" / TINY_MODEL)


def load_tiny_tokenizer() -> SentencePieceTokenizer:
  """The shipped 512-piece tokenizer of the ``tiny`` model (ChatML, eos ``<|im_end|>``=2)."""
  return SentencePieceTokenizer(tiny_tokenizer_path(), chat_template="chatml")
