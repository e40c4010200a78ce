"""SentencePiece tokenizers: load any ``.model``; train and load the tiny default."""

from __future__ import annotations

import importlib.resources
import io
import json
from typing import Any, Iterable, Sequence

import sentencepiece as spm

from jagent.tokenizers import _base
from jagent.tokenizers import _hf

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

  def _token_text(self, i: int) -> str:
    return self._sp.id_to_piece(i)

  def _hf_tokenizer_config(self) -> dict[str, Any]:
    unk = self._sp.unk_id()
    return {**super()._hf_tokenizer_config(),
            "unk_token": self._sp.id_to_piece(unk) if unk >= 0 else None}

  def _hf_tokenizer_json(self) -> str:
    return json.dumps(self.hf_tokenizer_spec(), indent=2, ensure_ascii=False)

  def hf_tokenizer_spec(self) -> dict[str, Any]:
    """This model as a Hugging Face ``tokenizer.json`` (a dict): byte-level BPE.

    For models trained by :func:`train_sentencepiece` (BPE, identity
    normalization, no dummy prefix, whitespace kept, byte fallback), whose
    encoding the ``tokenizers`` library then reproduces id for id. Written in
    GPT-2's byte-level form (each byte a printable character, a space
    ``Ġ``), the form ``transformers`` 5 rebuilds every ``qwen2`` model's
    tokenizer in (``Qwen2Tokenizer`` keeps only the vocabulary, merges and
    added tokens of a ``tokenizer.json``):

    - each normal piece is its UTF-8 bytes (U+2581 a space); each byte piece
      ``<0xNN>`` is byte NN, the ids sentencepiece falls back to for a
      character without a piece of its own. A byte that also has a normal
      or user-defined piece (``e``, ``#``) is never written as its byte
      piece by sentencepiece: that id keeps its ``<0xNN>`` text, which no
      merge produces (so ``transformers`` decodes it as that text);
    - the merges are every split ``(l, r)`` of a normal piece into two
      normal pieces, ranked by the piece's score: sentencepiece's BPE merges
      the adjacent pair whose concatenation scores highest (ties leftmost, as
      ``tokenizers`` does), and no normal piece holds a byte that a
      character without a piece is written with, so those bytes never merge;
    - control, unknown and user-defined pieces are added tokens matched in
      the raw text before the model (sentencepiece matches user-defined
      pieces first, longest first); those of :attr:`special_tokens` are
      marked special.

    Not reproduced: a literal U+2581 in the input (sentencepiece reads it as
    a space).

    Raises:
      ValueError: a model trained with other settings (naming the setting).
    """
    from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
    m = sentencepiece_model_pb2.ModelProto()
    m.ParseFromString(self._sp.serialized_model_proto())
    t, n = m.trainer_spec, m.normalizer_spec
    for name, value, want in (
        ("trainer_spec.model_type", t.model_type, t.BPE),
        ("trainer_spec.byte_fallback", t.byte_fallback, True),
        ("trainer_spec.treat_whitespace_as_suffix", t.treat_whitespace_as_suffix, False),
        ("normalizer_spec.name", n.name, "identity"),
        ("normalizer_spec.add_dummy_prefix", n.add_dummy_prefix, False),
        ("normalizer_spec.remove_extra_whitespaces", n.remove_extra_whitespaces, False)):
      if value != want:
        raise ValueError(f"sentencepiece model with {name}={value!r} has no tokenizer.json "
                         f"form here (needs {want!r}: a train_sentencepiece model)")
    kind = m.SentencePiece
    pieces = m.pieces
    byte_char = {b: c for c, b in _hf.byte_decoder().items()}

    def byte_level(piece: str) -> str:
      return "".join(byte_char[b] for b in piece.replace("\u2581", " ").encode("utf-8"))

    vocab: dict[str, int] = {}
    added = []
    for i, p in enumerate(pieces):
      if p.type in (kind.CONTROL, kind.UNKNOWN, kind.USER_DEFINED):
        vocab[p.piece] = i
        added.append({"id": i, "content": p.piece, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False,
                      "special": p.piece in self.special_tokens})
      elif p.type == kind.NORMAL:
        vocab[byte_level(p.piece)] = i
      elif p.type != kind.BYTE:
        raise ValueError(f"sentencepiece piece {i} ({p.piece!r}) is of type {p.type}, which "
                         "has no tokenizer.json form here")
    for i, p in enumerate(pieces):
      if p.type == kind.BYTE:
        text = byte_char[int(p.piece[3:5], 16)]
        vocab[p.piece if text in vocab else text] = i
    normal = {p.piece for p in pieces if p.type == kind.NORMAL}
    merges = []
    for i, p in enumerate(pieces):
      if p.type != kind.NORMAL:
        continue
      for k in range(1, len(p.piece)):
        left, right = p.piece[:k], p.piece[k:]
        if left in normal and right in normal:
          merges.append((-p.score, i, byte_level(left), byte_level(right)))
    merges.sort()
    byte_level_step = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                       "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": byte_level_step, "post_processor": None,
        "decoder": byte_level_step,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[l, r] for *_, l, r in merges]},
    }


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
