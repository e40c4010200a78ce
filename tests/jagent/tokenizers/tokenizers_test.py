"""Tests of the tokenizer interface: sentencepiece, HF tokenizer.json, byte tables."""

import importlib.util
import json
import os
import pathlib
import random
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np
import pytest

from jagent import tokenizers

ROOT = pathlib.Path(__file__).resolve().parents[3]
HF_DIR = ROOT / "tests" / "fixtures" / "hf_tokenizer"
HAVE_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None
HAVE_JINJA = importlib.util.find_spec("jinja2") is not None
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
TINY = tokenizers.load_tiny_tokenizer()


def _table_decode(tok, ids):
  table, lens = tok.token_bytes()
  return b"".join(table[i, :lens[i]].tobytes() for i in ids)


def _tokenizers():
  out = [("tiny", TINY)]
  if HAVE_TOKENIZERS:
    out.append(("hf", tokenizers.HFTokenizer(str(HF_DIR))))
  return out


class TinyTokenizerTest(parameterized.TestCase):

  def test_special_ids(self):
    self.assertEqual((TINY.vocab_size, TINY.pad_id, TINY.eos_id, TINY.bos_id), (512, 0, 2, None))
    self.assertEqual(TINY.special_tokens["<|im_start|>"], 3)

  @hypothesis.settings(max_examples=60, deadline=None)
  @hypothesis.given(TEXT)
  def test_round_trip_exact(self, text):
    self.assertEqual(TINY.decode(TINY.encode(text)), text)

  def test_grid_symbols_render_by_lookup(self):
    symbols = ("",) + tokenizers.TINY_SYMBOLS
    ids = TINY.symbol_ids(symbols)
    rng = random.Random(0)
    for _ in range(50):
      seq = [rng.randrange(1, len(symbols)) for _ in range(rng.randint(1, 40))]
      text = "".join(symbols[s] for s in seq)
      self.assertEqual(TINY.encode(text), [int(ids[s]) for s in seq], repr(text))

  @pytest.mark.smoke
  def test_reply_tags_are_one_token_each(self):
    tags = tokenizers.TINY_TAGS
    ids = [TINY.encode(t) for t in tags]
    self.assertEqual([len(i) for i in ids], [1, 1, 1, 1])
    self.assertEqual([TINY.decode(i) for i in ids], list(tags))
    # Inside a reply too: the tags never merge with their neighbours.
    reply = TINY.encode("<think>go left</think><answer>Left</answer>")
    self.assertEqual(reply[0], ids[0][0])
    self.assertEqual(reply[-1], ids[3][0])
    self.assertIn(ids[1][0], reply)
    self.assertEqual(len(TINY.encode("<answer>Up</answer>")), 3)

  def test_symbol_ids_refuses_multi_token_symbols(self):
    with self.assertRaisesRegex(ValueError, "'Sokoban'.*not one context-free token"):
      TINY.symbol_ids(("Sokoban",))

  @pytest.mark.smoke
  def test_chat_template(self):
    msgs = [{"role": "user", "content": "Turn 1:\n#_P#"}]
    text = TINY.apply_chat_template(msgs)
    self.assertEqual(text, "<|im_start|>user\nTurn 1:\n#_P#<|im_end|>\n<|im_start|>assistant\n")
    ids = TINY.encode_chat(msgs)
    self.assertEqual(ids[0], 3)
    self.assertEqual(ids.count(TINY.eos_id), 1)
    self.assertEqual(TINY.decode(ids), text)
    with self.assertRaisesRegex(ValueError, "unknown chat_template 'zephyr'"):
      tokenizers.SentencePieceTokenizer(tokenizers.tiny_tokenizer_path(),
                                        chat_template="zephyr")

  def test_shipped_model_is_reproducible(self):
    from experiments import make_tiny_tokenizer  # pylint: disable=g-import-not-at-top
    model = tokenizers.train_sentencepiece(make_tiny_tokenizer.corpus())
    self.assertEqual(model, pathlib.Path(tokenizers.tiny_tokenizer_path()).read_bytes())

  def test_loads_any_model_with_control_tokens(self):
    lines = [f"line {i} with some words {i * 7}" for i in range(400)]
    model = tokenizers.train_sentencepiece(lines, vocab_size=300, user_defined_symbols=(),
                                           bos_id=1, eos_id=2, unk_id=3, pad_id=0)
    tok = tokenizers.SentencePieceTokenizer(model, chat_template="llama3")
    self.assertEqual((tok.pad_id, tok.bos_id, tok.eos_id), (0, 1, 2))
    self.assertEqual(tok.decode([1] + tok.encode("line 5") + [2]), "line 5")
    self.assertEqual(_table_decode(tok, [1] + tok.encode("line 5") + [2]), b"line 5")


class TokenBytesTest(parameterized.TestCase):

  @parameterized.named_parameters(*_tokenizers())
  def test_table_concatenation_is_decode(self, tok):
    rng = np.random.default_rng(0)
    table, lens = tok.token_bytes()
    self.assertEqual(table.shape[0], tok.vocab_size)
    self.assertEqual(table.dtype, np.uint8)
    texts = ["#__P#\n#_XO#", "<think>go</think><answer>Up || Left</answer>", "ü€√ 12 x"]
    for text in texts:
      ids = tok.encode(text)
      self.assertEqual(_table_decode(tok, ids).decode("utf-8"), tok.decode(ids))
    # Random non-special ids: byte pieces may form invalid UTF-8, whose
    # replacement-character conventions differ; compare the valid pieces exactly.
    specials = set(tok.special_tokens.values())
    for _ in range(200):
      ids = [int(i) for i in rng.integers(0, tok.vocab_size, 8) if i not in specials]
      try:
        text = _table_decode(tok, ids).decode("utf-8")
      except UnicodeDecodeError:
        continue
      self.assertEqual(text, tok.decode(ids), ids)

  @parameterized.named_parameters(*_tokenizers())
  def test_gather_bytes_on_device(self, tok):
    texts = ["Up", "<answer>Left || Down</answer>", "", "#_P\n√ü"]
    ids = [tok.encode(t) for t in texts]
    n = max(len(i) for i in ids)
    tokens = np.zeros((len(texts), n), np.int32)
    for b, row in enumerate(ids):
      tokens[b, :len(row)] = row
    table, lens = tok.token_bytes()
    fn = jax.jit(tokenizers.gather_bytes, static_argnames="max_bytes")
    buf, nbytes = fn(tokens, np.array([len(i) for i in ids]), table, lens, max_bytes=24)
    for b, text in enumerate(texts):
      want = text.encode("utf-8")[:24]
      self.assertEqual(int(nbytes[b]), len(want))
      self.assertEqual(bytes(np.asarray(buf[b, :nbytes[b]])), want)
      np.testing.assert_array_equal(buf[b, nbytes[b]:], 0)


@absltest.skipUnless(HAVE_TOKENIZERS, "needs the optional 'tokenizers' package")
class HFTokenizerTest(absltest.TestCase):

  def test_matches_transformers_reference(self):
    ref = json.loads((HF_DIR / "reference.json").read_text())
    tok = tokenizers.HFTokenizer(str(HF_DIR))
    self.assertEqual((tok.vocab_size, tok.eos_id, tok.pad_id), (ref["vocab_size"],
                                                                  ref["eos_id"], ref["pad_id"]))
    for text, ids in zip(ref["texts"], ref["ids"]):
      self.assertEqual(tok.encode(text), ids)
      self.assertEqual(tok.decode(ids), text)
    self.assertEqual(tok.apply_chat_template(ref["messages"]), ref["chat"])
    builtin = tokenizers.HFTokenizer(str(HF_DIR / "tokenizer.json"), chat_template="chatml",
                                     eos="<|im_end|>")
    self.assertEqual(builtin.apply_chat_template(ref["messages"]), ref["chat"])

  def test_bad_special_token(self):
    with self.assertRaisesRegex(ValueError, "eos_token '<nope>' is not a token"):
      tokenizers.HFTokenizer(str(HF_DIR), eos="<nope>")


# Conversations over every role, for the chat templates.
_CHATS = (
    [{"role": "user", "content": "Turn 1:\n#_P#"}],
    [{"role": "system", "content": "You play Sokoban."},
     {"role": "user", "content": "#__#\n#PX#"},
     {"role": "assistant", "content": "<answer>Up</answer>"},
     {"role": "user", "content": "Reward:\n-0.1\n"}],
)


def _exported_tiny():
  """The tiny tokenizer written as Hugging Face files and loaded back (HFTokenizer)."""
  tmp = tempfile.mkdtemp(prefix="hf_tiny_")
  paths = TINY.save_pretrained(tmp)
  return tmp, paths, tokenizers.HFTokenizer(tmp)


@absltest.skipUnless(HAVE_TOKENIZERS and HAVE_JINJA, "needs 'tokenizers' and 'jinja2'")
class HFFilesTest(absltest.TestCase):
  """``Tokenizer.hf_files`` / ``save_pretrained``: the Hugging Face form of a tokenizer."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.dir, cls.paths, cls.exported = _exported_tiny()

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.dir, ignore_errors=True)
    super().tearDownClass()

  def test_jinja_templates_render_like_the_python_ones(self):
    # HFTokenizer renders a tokenizer_config.json template with jinja2 as
    # transformers does (trim_blocks, lstrip_blocks).
    for name, template in tokenizers.CHAT_TEMPLATES_JINJA.items():
      with tempfile.TemporaryDirectory() as tmp:
        TINY.save_pretrained(tmp, chat_template=name)
        tok = tokenizers.HFTokenizer(tmp)
        with open(os.path.join(tmp, "tokenizer_config.json")) as f:
          self.assertEqual(json.load(f)["chat_template"], template)
        for msgs in _CHATS:
          for gen in (True, False):
            self.assertEqual(tok.apply_chat_template(msgs, gen),
                             tokenizers.CHAT_TEMPLATES[name](msgs, gen), (name, msgs, gen))

  def test_files_and_special_tokens(self):
    self.assertEqual(sorted(os.path.basename(p) for p in self.paths),
                     ["tokenizer.json", "tokenizer_config.json"])
    with open(os.path.join(self.dir, "tokenizer_config.json")) as f:
      config = json.load(f)
    self.assertEqual(
        {k: config[k] for k in ("tokenizer_class", "bos_token", "eos_token", "pad_token",
                                "unk_token", "clean_up_tokenization_spaces")},
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
         "eos_token": "<|im_end|>", "pad_token": "<pad>", "unk_token": "<unk>",
         "clean_up_tokenization_spaces": False})
    self.assertEqual(config["chat_template"], tokenizers.CHAT_TEMPLATES_JINJA["chatml"])
    tok = self.exported
    self.assertEqual((tok.vocab_size, tok.eos_id, tok.pad_id, tok.bos_id),
                     (TINY.vocab_size, TINY.eos_id, TINY.pad_id, TINY.bos_id))
    self.assertEqual(tok.special_tokens, TINY.special_tokens)
    for msgs in _CHATS:
      self.assertEqual(tok.encode_chat(msgs), TINY.encode_chat(msgs))

  def test_encodes_and_decodes_like_sentencepiece(self):
    from experiments import make_tiny_tokenizer  # pylint: disable=g-import-not-at-top
    # The tokenizers library's own encoder on the file, not HFTokenizer's wrapping.
    import tokenizers as hf_tokenizers  # pylint: disable=g-import-not-at-top
    backend = hf_tokenizers.Tokenizer.from_file(os.path.join(self.dir, "tokenizer.json"))
    rng = random.Random(0)
    alphabet = [chr(c) for c in range(32, 127)] + list("\n\n\t\r  √éü€漢😀")
    texts = make_tiny_tokenizer.corpus(seed=1, n=300) + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(300)]
    for text in texts:
      want = TINY.encode(text)
      self.assertEqual(backend.encode(text, add_special_tokens=False).ids, want, repr(text))
      self.assertEqual(backend.decode(want, skip_special_tokens=False), text, repr(text))

  @hypothesis.settings(max_examples=60, deadline=None)
  @hypothesis.given(TEXT)
  def test_any_text_encodes_like_sentencepiece(self, text):
    hypothesis.assume("\u2581" not in text)  # sentencepiece reads U+2581 as a space
    self.assertEqual(self.exported.encode(text), TINY.encode(text))

  def test_token_bytes_agree_on_every_id_sentencepiece_writes(self):
    # Ids sentencepiece never writes differ: pad/unk (no bytes in ours, their
    # text in a tokenizer.json) and the byte pieces of bytes that have a piece
    # of their own ("e": piece 'e', never <0x65>).
    ours, ours_len = TINY.token_bytes()
    theirs, theirs_len = self.exported.token_bytes()
    sp = TINY.processor
    single = {sp.id_to_piece(i).encode() for i in range(TINY.vocab_size)
              if not sp.is_byte(i) and len(sp.id_to_piece(i).encode()) == 1}
    differ = []
    for i in range(TINY.vocab_size):
      if ours[i, :ours_len[i]].tobytes() != theirs[i, :theirs_len[i]].tobytes():
        differ.append(i)
    written = [i for i in differ if not (sp.is_control(i) or sp.is_unknown(i) or (
        sp.is_byte(i) and bytes([int(sp.id_to_piece(i)[3:5], 16)]) in single | {b" "}))]
    self.assertEqual(written, [])
    self.assertGreater(len(differ), 2)  # the unwritten byte pieces are there

  def test_hf_tokenizer_round_trip(self):
    ref = json.loads((HF_DIR / "reference.json").read_text())
    tok = tokenizers.HFTokenizer(str(HF_DIR))
    with tempfile.TemporaryDirectory() as tmp:
      tok.save_pretrained(tmp)
      again = tokenizers.HFTokenizer(tmp)
      with open(os.path.join(tmp, "tokenizer_config.json")) as f:
        config = json.load(f)
    self.assertEqual(config["model_max_length"], 4096)  # the directory's own settings kept
    self.assertEqual((again.eos_id, again.pad_id, again.bos_id),
                     (tok.eos_id, tok.pad_id, tok.bos_id))
    for text, ids in zip(ref["texts"], ref["ids"]):
      self.assertEqual(again.encode(text), ids)
    self.assertEqual(again.apply_chat_template(ref["messages"]), ref["chat"])

  def test_bad_templates_and_models(self):
    with self.assertRaisesRegex(ValueError, "unknown chat_template 'zephyr'"):
      TINY.hf_files("zephyr")
    custom = tokenizers.SentencePieceTokenizer(
        tokenizers.tiny_tokenizer_path(), chat_template=tokenizers.plain_template)
    with self.assertRaisesRegex(ValueError, "Python callable with no Jinja source"):
      custom.hf_files()
    self.assertIn("tokenizer.json", custom.hf_files("plain"))
    lines = [f"line {i} with some words {i * 7}" for i in range(400)]
    no_bytes = tokenizers.SentencePieceTokenizer(tokenizers.train_sentencepiece(
        lines, vocab_size=50, user_defined_symbols=(), byte_fallback=False))
    with self.assertRaisesRegex(ValueError, "trainer_spec.byte_fallback=False"):
      no_bytes.hf_files("chatml")


if __name__ == "__main__":
  absltest.main()
