"""Hugging Face ``tokenizer.json`` behind the Tokenizer interface (optional extra).

Needs the ``tokenizers`` package (installed with ``transformers``); importing
this module works without it, constructing ``HFTokenizer`` raises ImportError.
"""

from __future__ import annotations

import json
import os
import re
from typing import Sequence

from jagent.tokenizers import _base


def byte_decoder() -> dict[str, int]:
  """Inverse of GPT-2's byte -> printable unicode map (byte-level BPE vocabularies)."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
      range(ord("®"), ord("ÿ") + 1))
  chars = {}
  extra = 0
  for b in range(256):
    if b in keep:
      chars[chr(b)] = b
    else:
      chars[chr(256 + extra)] = b
      extra += 1
  return chars


_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class HFTokenizer(_base.Tokenizer):
  """A Hugging Face fast tokenizer (``tokenizer.json``).

  Args:
    path: a ``tokenizer.json`` file or a directory holding one (and optionally
      ``tokenizer_config.json``, whose ``eos_token`` / ``pad_token`` /
      ``bos_token`` and Jinja ``chat_template`` are used when present; the
      template needs ``jinja2``).
    chat_template: "chatml", "llama3" or a callable; overrides the one in
      tokenizer_config.json.
    eos, pad, bos: token texts overriding tokenizer_config.json.

  Raises:
    ImportError: ``tokenizers`` is not installed.
    ValueError: missing files or unknown special tokens.
  """

  def __init__(self, path: str, chat_template=None, eos: str | None = None,
               pad: str | None = None, bos: str | None = None):
    try:
      import tokenizers  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError("HFTokenizer needs the 'tokenizers' package "
                        "(pip install tokenizers, or the 'hf' extra)") from e
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
      raise ValueError(f"no tokenizer.json at {path!r}")
    self._tok = tokenizers.Tokenizer.from_file(file)
    with open(file, encoding="utf-8") as fh:
      spec = json.load(fh)
    cfg = {}
    cfg_file = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(cfg_file):
      with open(cfg_file, encoding="utf-8") as fh:
        cfg = json.load(fh)
    template = chat_template
    own = cfg.get("chat_template") if isinstance(cfg.get("chat_template"), str) else None
    if template is None and own is not None:
      template = _jinja_template(own, cfg)
    super().__init__(template or "chatml")
    if chat_template is None and own is not None:
      # Exported as it was read (even where jinja2 is missing to render it here).
      self._chat_template_jinja = own
    self._config = {k: v for k, v in cfg.items() if k != "chat_template"}
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    self.special_tokens = {t["content"]: int(t["id"]) for t in spec.get("added_tokens", [])
                           if t.get("special")}

    def tok_id(text, key):
      text = text if text is not None else cfg.get(key)
      if isinstance(text, dict):
        text = text.get("content")
      if text is None:
        return None
      i = self._tok.token_to_id(text)
      if i is None:
        raise ValueError(f"{key} {text!r} is not a token of {file!r}")
      return int(i)

    self.eos_id = tok_id(eos, "eos_token")
    self.pad_id = tok_id(pad, "pad_token")
    self.bos_id = tok_id(bos, "bos_token")
    decoder = spec.get("decoder") or {}
    kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", [])]
    self._byte_level = "ByteLevel" in kinds

  @property
  def backend(self):
    """The underlying ``tokenizers.Tokenizer``."""
    return self._tok

  def encode(self, text: str) -> list[int]:
    return list(self._tok.encode(text, add_special_tokens=False).ids)

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

  def _token_text(self, i: int) -> str:
    return self._tok.id_to_token(i)

  def _hf_tokenizer_json(self) -> str:
    return self._tok.to_str(pretty=True)

  def _hf_tokenizer_config(self) -> dict:
    # The directory's own settings (its tokenizer class, ...), with the
    # special tokens as this tokenizer resolved them.
    ours = super()._hf_tokenizer_config()
    return {**ours, **self._config,
            **{k: ours[k] for k in ("bos_token", "eos_token", "pad_token")}}

  def _piece_bytes(self) -> list[bytes]:
    # Added tokens (special or not) are never byte-level encoded: their text.
    added = {int(i): t.content for i, t in self._tok.get_added_tokens_decoder().items()}
    inv = byte_decoder()
    out = []
    for i in range(self.vocab_size):
      if i in added:
        out.append(added[i].encode("utf-8"))
        continue
      piece = self._tok.id_to_token(i)
      if piece is None:
        out.append(b"")
      elif self._byte_level:
        out.append(bytes(inv[ch] for ch in piece))
      elif m := _BYTE_PIECE.match(piece):
        out.append(bytes([int(m.group(1), 16)]))
      else:
        out.append(piece.replace("\u2581", " ").encode("utf-8"))
    return out


def _jinja_template(source: str, cfg: dict):
  """A callable rendering a Hugging Face Jinja chat template (needs jinja2)."""
  try:
    from jinja2 import sandbox  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  template = env.from_string(source)

  def special(key):
    v = cfg.get(key)
    return v.get("content") if isinstance(v, dict) else v

  def render(messages, add_generation_prompt=True):
    return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                           bos_token=special("bos_token") or "",
                           eos_token=special("eos_token") or "")
  return render
