"""Tests of the tokenizer interface: sentencepiece, HF tokenizer.json, byte tables."""

import importlib.util
import json
import pathlib
import random

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import jax
import numpy as np

from jagent import tokenizers

ROOT = pathlib.Path(__file__).resolve().parents[3]
HF_DIR = ROOT / "tests" / "fixtures" / "hf_tokenizer"
HAVE_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None
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


if __name__ == "__main__":
  absltest.main()
