"""Tests of the on-device reply parser against hand-computed values and its regex reference."""

import doctest
import functools
import random

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from jagent import rollout
from jagent import tokenizers
from jagent.rollout import _parse as parse_module

SOKOBAN = ("Up", "Down", "Left", "Right")
TINY = tokenizers.load_tiny_tokenizer()
TABLE, TABLE_LENGTHS = TINY.token_bytes()
PIECES = [TABLE[i, :TABLE_LENGTHS[i]].tobytes() for i in range(TINY.vocab_size)]
BYTE_ID = {p[0]: i for i, p in reversed(list(enumerate(PIECES))) if len(p) == 1}

SPECS = {
    "think": rollout.ParseSpec(SOKOBAN),
    "answer_only": rollout.ParseSpec(SOKOBAN, think=False),
    "think_text": rollout.ParseSpec((), max_answer_bytes=24),
    "answer_only_text": rollout.ParseSpec((), think=False, max_answer_bytes=24),
    # The three separator formulations, and RAGEN-2's 2 actions per turn.
    "comma_k2": rollout.ParseSpec(SOKOBAN, max_actions_per_turn=2, separator=","),
    "bordered_sep": rollout.ParseSpec(SOKOBAN, max_actions_per_turn=3, separator="-|-"),
    # "x||" can start like a piece followed by the separator: "x|||" is the piece "x".
    "triple_bar": rollout.ParseSpec(SOKOBAN + ("x||",), think=False, separator="|||"),
}
FIELDS = ("matched", "actions", "num_actions", "num_pieces", "num_invalid", "format_valid",
          "answer", "answer_length")
M = 256  # fuzz buffer width (bytes)
FUZZ_BATCH = 16384

_parse = jax.jit(rollout.parse_reply, static_argnames="spec")
_gather = jax.jit(tokenizers.gather_bytes, static_argnames="max_bytes")


def _pack(replies, width, tails=None):
  """uint8 [B, width] buffers and int32 [B] lengths; ``tails`` fill bytes past the length."""
  buf = np.zeros((len(replies), width), np.uint8)
  lengths = np.zeros(len(replies), np.int32)
  for i, r in enumerate(replies):
    r = r[:width]
    lengths[i] = len(r)
    full = (r + (tails[i] if tails else b""))[:width]
    buf[i, :len(full)] = np.frombuffer(full, np.uint8)
  return buf, lengths


def _reference_arrays(replies, spec):
  """The reference parse of each reply, as arrays shaped like ParsedReply."""
  b, k, ma = len(replies), spec.max_actions_per_turn, spec.max_answer_bytes
  out = {f: np.zeros(b, np.int32) for f in FIELDS}
  out["actions"] = np.full((b, k), -1, np.int32)
  out["answer"] = np.zeros((b, ma), np.uint8)
  for i, r in enumerate(replies):
    ref = rollout.reference_parse(r, spec)
    for f in ("matched", "num_actions", "num_pieces", "num_invalid", "format_valid",
              "answer_length"):
      out[f][i] = ref[f]
    out["actions"][i, :len(ref["actions"])] = ref["actions"]
    out["answer"][i, :len(ref["answer"])] = np.frombuffer(ref["answer"], np.uint8)
  for f in ("matched", "format_valid"):
    out[f] = out[f].astype(bool)
  return out


def _fragment_bytes(rng):
  """One random fragment: tags, near-miss tags, separators, names, whitespace, unicode, bytes."""
  kind = rng.random()
  if kind < 0.2:
    return rng.choice([b"<think>", b"</think>", b"<answer>", b"</answer>"])
  if kind < 0.3:
    return rng.choice([b"<answr>", b"</Answer>", b"< answer>", b"</think >", b"<answer",
                       b"/answer>", b"<<answer>", b"</thin", b"</ANSWER>", b"<think/>",
                       b"</answer", b"<"])
  if kind < 0.45:
    return rng.choice([b"|", b"||", b"|||", b"||||", b"-|-", b"-|", b",", b"-"])
  if kind < 0.65:
    name = rng.choice(SOKOBAN + ("Upp", "jump", "U p", "Lef", "Rightt", "NOOP"))
    return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in name).encode()
  if kind < 0.8:
    return bytes(rng.choice(b" \t\n\r\x0b\x0c") for _ in range(rng.randint(1, 4)))
  if kind < 0.9:
    return rng.choice(["\u221a", "\u00e9", "e\u0301", "\U0001f600", "3 + 4 - 5", "\u00a0",
                       "\x85", "\x1c", "(7*2)"]).encode()
  return bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))


def _answer_body(rng):
  """An answer: names / junk joined by separators with whitespace, or an empty one."""
  if rng.random() < 0.1:
    return bytes(rng.choice(b" \n|") for _ in range(rng.randint(0, 5)))
  parts = []
  for _ in range(rng.randint(1, 8)):
    if rng.random() < 0.75:
      name = rng.choice(SOKOBAN)
      parts.append("".join(c.upper() if rng.random() < 0.2 else c for c in name).encode())
    else:
      parts.append(_fragment_bytes(rng))
  sep = rng.choice([b"||", b"||", b"|", b"|||", b",", b"-|-", b"||||"])
  ws = lambda: bytes(rng.choice(b"  \n\t") for _ in range(rng.choice((0, 0, 1, 2))))
  return ws() + b"".join(ws() + p + ws() + sep for p in parts)[:-len(sep)] + ws()


def _structured_reply(rng):
  """A reply from fragments around a (possibly damaged) think/answer skeleton."""
  noise = lambda n: b"".join(_fragment_bytes(rng) for _ in range(rng.randint(0, n)))
  if rng.random() < 0.15:
    return noise(20)
  tags = [b"</think>", b"<answer>", b"</answer>"]
  for i in range(3):
    if rng.random() < 0.08:
      tags[i] = rng.choice([b"", b"</Answer>", b"<answr>", b"</think >", b"< answer>"])
  gap = bytes(rng.choice(b" \n\t\r") for _ in range(rng.choice((0, 0, 1, 3))))
  if rng.random() < 0.05:
    gap += b"x"
  body = _answer_body(rng)
  reply = noise(4) + tags[0] + gap + tags[1] + body + tags[2] + noise(3)
  if rng.random() < 0.1:  # A second answer (nested / duplicated tags).
    reply += b"</think><answer>" + _answer_body(rng) + b"</answer>"
  return reply


def _tokens_for(data: bytes):
  """Token ids whose table bytes concatenate to ``data`` (text pieces or byte fallback)."""
  try:
    return TINY.encode(data.decode("utf-8"))
  except UnicodeDecodeError:
    return [BYTE_ID[c] for c in data]


# (name, spec, reply, expected fields, bytes stored past num_bytes, num_bytes override).
HAND_CASES = (
      ("ragen_example", "think", b"I should go up</think><answer>Up || left</answer>",
       dict(matched=True, actions=[0, 2], num_pieces=2, num_invalid=0, format_valid=True)),
      ("wrong_case", "think", b"</think><answer>uP||DOWN||rIgHt</answer>",
       dict(matched=True, actions=[0, 1, 3], num_pieces=3, num_invalid=0, format_valid=True)),
      ("spaces_newlines", "think", b"hmm\n</think> \n\t<answer>\n  Left  ||\n Up \n</answer>",
       dict(matched=True, actions=[2, 0], num_pieces=2, format_valid=True, answer=b"Left  ||\n Up")),
      ("empty_answer", "think", b"</think><answer> \n </answer>",
       dict(matched=True, actions=[], num_pieces=0, num_invalid=0, format_valid=False,
            answer=b"")),
      ("only_separators", "think", b"</think><answer>||||</answer>",
       dict(matched=True, actions=[], num_pieces=0, num_invalid=0, format_valid=False)),
      ("odd_bars", "think", b"</think><answer>Up|||Down</answer>",  # split: "Up", "|Down"
       dict(matched=True, actions=[0], num_pieces=2, num_invalid=1, format_valid=False)),
      ("unknown_name", "think", b"</think><answer>Up || Jump</answer>",
       dict(matched=True, actions=[0], num_pieces=2, num_invalid=1, format_valid=False)),
      ("more_than_max", "think", b"</think><answer>Up||Up||x||Up||Up||Down||Left</answer>",
       dict(matched=True, actions=[0, 0, 0, 0], num_pieces=5, num_invalid=1,
            format_valid=False)),
      ("inner_name_space", "think", b"</think><answer>U p || Up</answer>",
       dict(matched=True, actions=[0], num_pieces=2, num_invalid=1)),
      ("first_think_close_wins", "think",
       b"a</think> <answer>Up</think><answer>Down</answer>",
       dict(matched=True, actions=[], num_pieces=1, num_invalid=1,
            answer=b"Up</think><answer>Down")),
      ("skip_think_close_without_answer", "think",
       b"a</think>b</think><answer>Down</answer>",
       dict(matched=True, actions=[1], answer=b"Down")),
      ("first_pair_lacks_close", "think", b"</think><answer>Up",
       dict(matched=False, actions=[], num_pieces=0, format_valid=False, answer=b"")),
      ("missing_close_answer", "think", b"x</think><answer>Up</answ>",
       dict(matched=False, actions=[], format_valid=False)),
      ("no_think_close", "think", b"<answer>Up</answer>",
       dict(matched=False, actions=[], format_valid=False)),
      ("near_miss_tags", "think", b"</think><Answer>Up</answer>",
       dict(matched=False, actions=[])),
      ("text_between_tags", "think", b"</think> so <answer>Up</answer>",
       dict(matched=False, actions=[])),
      ("answer_only_mode", "answer_only", b"<think>x</think> <answer>Right</answer>",
       dict(matched=True, actions=[3], format_valid=True)),
      ("answer_only_first_open", "answer_only", b"<answer>Up<answer>Down</answer>",
       dict(matched=True, actions=[], num_invalid=1, answer=b"Up<answer>Down")),
      ("answer_only_no_close", "answer_only", b"<answer>Up</Answer>",
       dict(matched=False, actions=[])),
      ("countdown", "think_text", b"12+3=15?</think><answer> 3 + 4 - 5 </answer>",
       dict(matched=True, actions=[], num_actions=1, num_pieces=1, num_invalid=0,
            format_valid=True, answer=b"3 + 4 - 5", answer_length=9)),
      ("countdown_no_split", "think_text", b"</think><answer>1 || 2</answer>",
       dict(matched=True, num_actions=1, answer=b"1 || 2", format_valid=True)),
      ("countdown_empty", "answer_only_text", b"<answer>\n</answer>",
       dict(matched=True, num_actions=0, format_valid=False, answer=b"", answer_length=0)),
      ("countdown_truncated", "answer_only_text", b"<answer>" + b"1+" * 20 + b"1</answer>",
       dict(matched=True, format_valid=True, answer=(b"1+" * 12), answer_length=24)),
      ("non_utf8", "think", b"\xff\xfe</think>\x80<answer>Up</answer>",
       dict(matched=False)),
      ("non_utf8_inside", "think", b"\xff</think>\n<answer>\xc3(||Up\xe2\x88\x9a||Up</answer>",
       dict(matched=True, actions=[0], num_pieces=3, num_invalid=2)),
      ("unicode_whitespace_is_not_stripped", "think",
       "</think><answer>\u00a0Up</answer>".encode(),
       dict(matched=True, actions=[], num_invalid=1)),
      ("vertical_tab_form_feed", "think", b"</think>\x0b\x0c<answer>\x0bDown\x0c</answer>",
       dict(matched=True, actions=[1], format_valid=True)),
      ("comma_separator_k2", "comma_k2", b"</think><answer>Up, Down, x</answer>",
       dict(matched=True, actions=[0, 1], num_pieces=2, num_invalid=0, format_valid=True)),
      ("bordered_separator", "bordered_sep", b"</think><answer>Up-|-|-Down-|-Left</answer>",
       dict(matched=True, actions=[0, 2], num_pieces=3, num_invalid=1)),  # "Up", "|-Down", "Left"
      ("name_overlapping_separator", "triple_bar", b"<answer>x||||||Up|||x||</answer>",
       dict(matched=True, actions=[0, 4], num_pieces=3, num_invalid=1)),  # "x", "Up", "x||"
      # Bytes at or past num_bytes are ignored; num_bytes is clipped to [0, M].
      ("tail_close_ignored", "think", b"</think><answer>Up||Down", dict(matched=False),
       b"</answer>"),
      ("tail_action_ignored", "think", b"</think><answer>Up||Down</answer>",
       dict(matched=True, actions=[0, 1]), b"||Left"),
      ("tail_bracket_ignored", "think", b"</think><answer>Up||Down</answer",
       dict(matched=False), b">"),
      ("num_bytes_past_m", "think", b"</think><answer>Up||Down</answer>",
       dict(matched=True, actions=[0, 1]), b"", 10_000),
      ("num_bytes_negative", "think", b"</think><answer>Up||Down</answer>",
       dict(matched=False, answer=b""), b"", -3),
)


@functools.cache
def _hand_outputs(spec_name):
  """Device parses of every hand-written case of one spec, in one call at the fuzz shape."""
  cases = [c for c in HAND_CASES if c[1] == spec_name]
  replies = [c[2] for c in cases] + [b""] * (FUZZ_BATCH - len(cases))
  tails = [c[4] if len(c) > 4 else b"" for c in cases] + [b""] * (FUZZ_BATCH - len(cases))
  buf, n = _pack(replies, M, tails)
  for i, c in enumerate(cases):
    if len(c) > 5:
      n[i] = c[5]
  out = jax.tree_util.tree_map(np.asarray, _parse(buf, n, spec=SPECS[spec_name]))
  return out, {(c[2],) + tuple(c[4:]): i for i, c in enumerate(cases)}


class HandWrittenTest(parameterized.TestCase):

  @parameterized.named_parameters(*HAND_CASES)
  def test_case(self, spec_name, reply, expected, *tail_and_num_bytes):
    spec = SPECS[spec_name]
    out, rows = _hand_outputs(spec_name)
    row = rows[(reply,) + tail_and_num_bytes]
    out = jax.tree_util.tree_map(lambda x: x[row], out)
    num_bytes = tail_and_num_bytes[1] if len(tail_and_num_bytes) > 1 else None
    if num_bytes is not None:
      reply = reply[:max(0, min(num_bytes, M))]
    ref = rollout.reference_parse(reply, spec)
    for field, want in expected.items():
      dev = out.__getattribute__(field)
      if field == "actions":
        self.assertEqual(ref[field], want, "reference")
        self.assertEqual([int(a) for a in dev if a >= 0], want, "device")
        self.assertTrue(np.all(dev[len(want):] == -1))
      elif field == "answer":
        self.assertEqual(ref[field], want, "reference")
        self.assertEqual(dev[:out.answer_length].tobytes(), want, "device")
        self.assertFalse(dev[out.answer_length:].any())
      else:
        self.assertEqual(ref[field], want, f"reference {field}")
        self.assertEqual(dev.item(), want, f"device {field}")
    if "actions" in expected and "num_actions" not in expected:
      self.assertEqual(int(out.num_actions), len(expected["actions"]))


class ApiTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("names_str", dict(action_names="Up"), "action_names"),
      ("empty_name", dict(action_names=("Up", "")), "action_names"),
      ("non_ascii", dict(action_names=("\u221a",)), "action_names"),
      ("duplicate", dict(action_names=("Up", "UP")), "action_names.*duplicates"),
      ("whitespace", dict(action_names=(" Up",)), "action_names.*whitespace"),
      ("contains_sep", dict(action_names=("a||b",)), "action_names.*separator"),
      ("think", dict(action_names=(), think=1), "think"),
      ("max_actions", dict(action_names=(), max_actions_per_turn=0), "max_actions_per_turn"),
      ("max_actions_bool", dict(action_names=(), max_actions_per_turn=True),
       "max_actions_per_turn"),
      ("separator", dict(action_names=(), separator=""), "separator"),
      ("max_answer_bytes", dict(action_names=(), max_answer_bytes=0), "max_answer_bytes"),
  )
  def test_spec_validation(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      rollout.ParseSpec(**kwargs)

  def test_spec_is_hashable_and_lists_become_tuples(self):
    self.assertEqual(rollout.ParseSpec(list(SOKOBAN)), SPECS["think"])
    self.assertEqual(hash(rollout.ParseSpec(list(SOKOBAN))), hash(SPECS["think"]))

  def test_bad_arrays(self):
    with self.assertRaisesRegex(ValueError, "reply must be uint8"):
      rollout.parse_reply(np.zeros((2, 8), np.int32), np.zeros(2, np.int32), SPECS["think"])
    with self.assertRaisesRegex(ValueError, "num_bytes must be"):
      rollout.parse_reply(np.zeros((2, 8), np.uint8), np.zeros(3, np.int32), SPECS["think"])

  def test_shapes_and_dtypes(self):
    out, _ = _hand_outputs("think")
    k, ma = SPECS["think"].max_actions_per_turn, SPECS["think"].max_answer_bytes
    self.assertEqual(
        {f: (getattr(out, f).shape, getattr(out, f).dtype) for f in FIELDS},
        dict(matched=((FUZZ_BATCH,), bool), actions=((FUZZ_BATCH, k), np.int32),
             num_actions=((FUZZ_BATCH,), np.int32), num_pieces=((FUZZ_BATCH,), np.int32),
             num_invalid=((FUZZ_BATCH,), np.int32), format_valid=((FUZZ_BATCH,), bool),
             answer=((FUZZ_BATCH, ma), np.uint8), answer_length=((FUZZ_BATCH,), np.int32)))

  def test_unbatched_rows_under_vmap_match_the_batch(self):
    replies = [b"</think><answer>Up||Down</answer>", b"x", b"</think><answer>Left|||up</answer>",
               b"<answer>Up</answer>", b"</think> <answer> 3 + 4 </answer>", b""]
    buf, n = _pack(replies, 48)
    spec = SPECS["think"]
    per_row = jax.jit(jax.vmap(lambda r, k: rollout.parse_reply(r, k, spec)))(buf, n)
    ref = _reference_arrays(replies, spec)
    for field in FIELDS:
      np.testing.assert_array_equal(getattr(per_row, field), ref[field], field)

  def test_docstring_examples(self):
    result = doctest.testmod(parse_module)
    self.assertGreater(result.attempted, 0)
    self.assertEqual(result.failed, 0)

  def test_parse_tokens_is_gather_then_parse(self):
    spec = SPECS["answer_only_text"]
    text = "<answer> 3 + 4 - 5 </answer>"
    ids = TINY.encode(text)
    tokens = np.full((2, 32), 7, np.int32)  # junk past the lengths
    tokens[:, :len(ids)] = ids
    out = jax.jit(rollout.parse_tokens, static_argnames=("spec", "max_bytes"))(
        tokens, np.array([len(ids), len(ids) - 1], np.int32), TABLE, TABLE_LENGTHS,
        spec=spec, max_bytes=40)
    np.testing.assert_array_equal(out.matched, [True, False])
    self.assertEqual(out.answer[0, :out.answer_length[0]].tobytes(), b"3 + 4 - 5")


def _generate(generator, seed):
  """(replies as bytes, device inputs) for one fuzz generator."""
  rng = random.Random(seed)
  if generator.startswith("tokens"):
    n_tok = 128
    tokens = np.zeros((FUZZ_BATCH, n_tok), np.int32)
    lengths = np.zeros(FUZZ_BATCH, np.int32)
    tag_ids = [TINY.encode(t) for t in ("</think>", "<answer>", "</answer>", "Up", " Down",
                                        "||", " ")]
    for i in range(FUZZ_BATCH):
      if generator == "tokens_random":  # Uniform ids with the tags' token runs mixed in.
        ids, target = [], rng.randint(0, n_tok)
        while len(ids) < target:
          ids += rng.choice(tag_ids) if rng.random() < 0.3 else [rng.randrange(TINY.vocab_size)]
      else:  # Structured replies, tokenized fragment by fragment.
        ids = _tokens_for(_structured_reply(rng))
      ids = ids[:n_tok]
      tokens[i, :len(ids)] = ids
      lengths[i] = len(ids)
      # Junk after the reply (e.g. tokens sampled after EOS) must be ignored.
      tokens[i, len(ids):] = rng.randrange(TINY.vocab_size)
    replies = [b"".join(PIECES[t] for t in tokens[i, :lengths[i]])[:M]
               for i in range(FUZZ_BATCH)]
    return replies, _gather(tokens, lengths, TABLE, TABLE_LENGTHS, max_bytes=M)
  replies, tails = [], []
  for _ in range(FUZZ_BATCH):
    if generator == "structured":
      r = _structured_reply(rng)
    elif generator == "empty_answers":
      body = bytes(rng.choice(b" \t\n\r\x0b\x0c|,-") for _ in range(rng.randint(0, 6)))
      if rng.random() < 0.3:
        body += rng.choice(SOKOBAN).encode()
      r = rng.choice([b"", b"a", b"\n</think>"]) + rng.choice([b"</think>", b"</think>\n"])
      r += b"<answer>" + body + rng.choice([b"</answer>", b"</answer", b"</answer>\n"])
    elif generator == "truncated_tails":  # Cut a structured reply; garbage after the cut.
      full = _structured_reply(rng)
      cut = rng.randint(0, len(full))
      r = full[:cut]
      tails.append(full[cut:] + b"</answer>")
    else:  # random_bytes: uniform bytes with fragments inserted.
      r = b"".join(bytes([rng.randrange(256)]) if rng.random() < 0.6 else _fragment_bytes(rng)
                   for _ in range(rng.randint(0, 60)))
    replies.append(r[:M])
  buf, lengths = _pack(replies, M, tails or None)
  return replies, (buf, lengths)


# generator -> specs it is checked under.
FUZZ = {
    "tokens_random": ("think", "answer_only"),
    "tokens_structured": ("think", "think_text"),
    "structured": ("think", "answer_only", "answer_only_text", "bordered_sep"),
    "structured_b": ("comma_k2", "triple_bar", "think_text"),
    "empty_answers": ("think", "think_text"),
    "truncated_tails": ("think", "answer_only"),
    "random_bytes": ("think", "answer_only", "answer_only_text"),
}
ALL_BRANCHES = ("unmatched", "matched", "format_valid", "matched_invalid", "empty_answer",
                "invalid_piece", "several_actions", "pieces_at_max", "truncated")
# generator -> (floor, branches each of its specs must hit more than floor times).
BRANCHES = {
    "tokens_random": (100, ("unmatched", "matched", "matched_invalid", "invalid_piece")),
    "tokens_structured": (100, ALL_BRANCHES),
    "structured": (100, ALL_BRANCHES),
    "structured_b": (100, ALL_BRANCHES),
    "empty_answers": (100, ALL_BRANCHES[:6]),
    "truncated_tails": (100, ALL_BRANCHES),
    "random_bytes": (20, ("unmatched", "matched", "matched_invalid")),
}


class FuzzTest(parameterized.TestCase):
  """Device == reference on 7 x 16,384 = 114,688 replies, every field exactly."""

  @parameterized.parameters(*enumerate(FUZZ))
  def test_device_matches_reference(self, seed, generator):
    replies, inputs = _generate(generator.removesuffix("_b"), seed)
    self.assertLen(replies, FUZZ_BATCH)
    counts = {}
    for spec_name in FUZZ[generator]:
      spec = SPECS[spec_name]
      out = _parse(*inputs, spec=spec)
      dev = {f: np.asarray(getattr(out, f)) for f in FIELDS}
      ref = _reference_arrays(replies, spec)
      for f in FIELDS:
        bad = np.nonzero((dev[f] != ref[f]).reshape(FUZZ_BATCH, -1).any(axis=1))[0]
        if bad.size:
          i = bad[0]
          self.fail(f"{generator}/{spec_name}: {f} differs on {bad.size} replies, first "
                    f"{replies[i]!r}: device {dev[f][i]} reference {ref[f][i]}")
      c = dict(replies=FUZZ_BATCH, matched=int(ref["matched"].sum()),
               format_valid=int(ref["format_valid"].sum()),
               empty_answer=int((ref["matched"] & (ref["answer_length"] == 0)).sum()))
      if spec.action_names:
        c.update(invalid_piece=int((ref["num_invalid"] > 0).sum()),
                 several_actions=int((ref["num_actions"] > 1).sum()),
                 pieces_at_max=int((ref["num_pieces"] == spec.max_actions_per_turn).sum()))
      else:
        c.update(truncated=int((ref["answer_length"] == spec.max_answer_bytes).sum()))
      counts[spec_name] = c
    print(f"\nfuzz {generator}: {counts}")
    self._check_branches(generator, counts)

  def _check_branches(self, generator, counts):
    """Each generator hits the branches it is meant to, a meaningful number of times."""
    floor, wanted = BRANCHES[generator]
    for spec_name, c in counts.items():
      c = dict(c, unmatched=c["replies"] - c["matched"],
               matched_invalid=c["matched"] - c["format_valid"])
      for branch in wanted:
        if branch in c:  # discrete-only / free-text-only counters
          self.assertGreater(c[branch], floor, (generator, spec_name, branch))

  def test_fuzz_size(self):
    self.assertGreaterEqual(len(FUZZ) * FUZZ_BATCH, 100_000)

if __name__ == "__main__":
  absltest.main()
