r"""Regenerates the shipped tiny tokenizer (jagent/tokenizers/data/tiny_sp512.model).

    python -m experiments.make_tiny_tokenizer [--model_path=jagent/tokenizers/data/tiny_sp512.model]

Trains a 512-piece byte-fallback BPE sentencepiece model (see
``jagent.tokenizers.train_sentencepiece``) on a deterministic, generated corpus
of environment-like text: Sokoban and FrozenLake grids in every shipped symbol
set, game instructions, turn headers, rewards, Countdown-style number puzzles
and ``<think>...</think><answer>...</answer>`` replies with the action names.
Grid symbols, the newline, the ChatML markers and the reply tags
(``<think>``, ``</think>``, ``<answer>``, ``</answer>``) are user-defined
pieces, so each is always exactly one token. Training is single-threaded and seeded, so
rerunning reproduces the committed file byte for byte
(tests/jagent/tokenizers/tokenizers_test.py checks this).
"""

from __future__ import annotations

import random

from absl import app
from absl import flags

from jagent import tokenizers

_OUT = flags.DEFINE_string(
    "model_path", tokenizers.tiny_tokenizer_path(), "Output .model path.")

SOKOBAN_SETS = (("#", "_", "O", "√", "X", "P", "S"), ("W", ".", "G", "C", "B", "A", "@"))
LAKE = ("P", "_", "O", "G", "X", "√")
ACTIONS = ("Up", "Down", "Left", "Right")
WORDS = (
    "the a an you your is are to of in on at for with and or not no it this that "
    "each every all one two three four move moves push pushes pull player box boxes "
    "target targets wall walls floor empty hole holes goal lake ice frozen slippery grid "
    "state action actions reward rewards turn turns step steps left right up down puzzle "
    "game solve solved solving reach avoid fall falls into onto next best valid invalid "
    "answer think plan first then after before must can cannot should will would keep "
    "position row column corner stuck deadlock success failure done episode maximum "
    "number numbers target equation use using only once result equal equals plus minus "
    "times divided arm arms bandit choose pull higher lower average point points name "
    "names symbol symbols meaning means player's box's current new try again still "
    "closer farther path shortest blocked open free clear reply format output respond "
    "helpful assistant user system question".split())


def _grid(rng, symbols, border):
  h, w = rng.randint(4, 10), rng.randint(4, 10)
  rows = []
  for r in range(h):
    row = []
    for c in range(w):
      if border and (r in (0, h - 1) or c in (0, w - 1)):
        row.append(symbols[0])
      else:
        row.append(rng.choice(symbols))
    rows.append("".join(row))
  return "\n".join(rows)


def _sentence(rng, n):
  words = [rng.choice(WORDS) for _ in range(n)]
  words[0] = words[0].capitalize()
  return " ".join(words) + rng.choice((".", ".", ".", "?", "!", ":", ","))


def _reply(rng):
  acts = " || ".join(rng.choice(ACTIONS) for _ in range(rng.randint(1, 3)))
  think = " ".join(_sentence(rng, rng.randint(3, 12)) for _ in range(rng.randint(0, 3)))
  return f"<think>{think}</think><answer>{acts}</answer>"


def _countdown(rng):
  nums = [rng.randint(1, 100) for _ in range(rng.randint(3, 4))]
  ops = [rng.choice("+-*/") for _ in nums[1:]]
  expr = str(nums[0]) + "".join(f" {o} {n}" for o, n in zip(ops, nums[1:]))
  return (f"Target: {rng.randint(1, 200)}, nums: [{', '.join(map(str, nums))}]\n"
          f"<answer>({expr})</answer>")


def corpus(seed: int = 0, n: int = 6000) -> list[str]:
  """The deterministic training text (``n`` documents)."""
  rng = random.Random(seed)
  docs = []
  for i in range(n):
    kind = i % 6
    if kind == 0:
      docs.append(_grid(rng, rng.choice(SOKOBAN_SETS), border=True))
    elif kind == 1:
      docs.append(_grid(rng, LAKE, border=False))
    elif kind == 2:
      docs.append(" ".join(_sentence(rng, rng.randint(4, 16)) for _ in range(3)))
    elif kind == 3:
      docs.append(f"Turn {rng.randint(1, 20)}:\nState:\n" + _grid(rng, rng.choice(
          SOKOBAN_SETS + (LAKE,)), border=rng.random() < 0.5) + f"\nReward: "
                  f"{rng.choice(('0', '1', '-0.1', '10', '0.5'))}\n" + _reply(rng))
    elif kind == 4:
      docs.append(_countdown(rng))
    else:
      docs.append(f"<|im_start|>{rng.choice(('system', 'user', 'assistant'))}\n"
                  f"{_sentence(rng, rng.randint(4, 20))}<|im_end|>\n" + _reply(rng))
  return docs


def main(argv):
  del argv
  model = tokenizers.train_sentencepiece(corpus())
  with open(_OUT.value, "wb") as fh:
    fh.write(model)
  print(f"wrote {_OUT.value} ({len(model)} bytes)")


if __name__ == "__main__":
  app.run(main)
