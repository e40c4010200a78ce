"""Checkpointer: exact round trip, keep-N, interrupted saves; export_policy."""

import importlib.util
import json
import os
import shutil
import tempfile

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jagent import models
from jagent import tokenizers
from jagent import train
from jagent import transforms

HAVE_HF = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
HAVE_TOKENIZERS = all(importlib.util.find_spec(m) is not None for m in ("tokenizers", "jinja2"))
CFG = models.ModelConfig(vocab_size=32, embed_dim=32, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64)
TC = train.TrainConfig(model=CFG, actor_optimizer=train.OptimizerConfig(
    learning_rate=1e-2, weight_decay=0.0, warmup_steps=5), num_microbatches=2)
# A stateful objective (running reward normaliser) so the objective state
# holds real arrays inside NamedTuples.
OBJ = transforms.objective(
    transforms.chain(transforms.normalize_rewards(), transforms.compute_grpo()),
    transforms.make_loss(transforms.pg_term()))


def _state():
  params = models.init(CFG, jax.random.key(0))
  return train.init_train_state(params, jax.random.key(1), config=TC,
                                critic="model", reference=True, objective=OBJ)


def _batch():
  tokens = jax.random.randint(jax.random.key(1), (8, 8), 1, CFG.vocab_size)
  return transforms.Batch(tokens=tokens,
                          loss_mask=jnp.ones((8, 8)).at[:, 0].set(0.0))


def _assert_same(test, a, b):
  test.assertEqual(jax.tree.structure(a), jax.tree.structure(b))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    test.assertEqual((x.shape, x.dtype), (y.shape, y.dtype))
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class CheckpointTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.workdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.workdir, ignore_errors=True)

  @pytest.mark.smoke
  def test_round_trip_is_exact_and_resumes(self):
    state = _state()
    state, _ = train.sft_step(state, _batch(), config=TC)  # non-trivial opt state
    ckpt = train.Checkpointer(self.workdir, keep=2)
    self.assertIsNone(ckpt.latest_step())
    meta = {"data_position": 128, "config": {"lr": 0.01, "name": "tiny"}}
    ckpt.save(1, state, meta)
    self.assertEqual(ckpt.latest_step(), 1)
    restored, got_meta = ckpt.restore(jax.eval_shape(_state))
    ckpt.close()
    self.assertEqual(got_meta, meta)
    _assert_same(self, state, restored)
    # optax NamedTuples come back as themselves, not lists.
    self.assertIsInstance(restored.opt_state[1][0], optax.ScaleByAdamState)
    self.assertIsInstance(restored.critic_params, train.CriticParams)
    # Resuming gives exactly the same next step.
    a, ma = train.sft_step(state, _batch(), config=TC)
    b, mb = train.sft_step(restored, _batch(), config=TC)
    _assert_same(self, a, b)
    self.assertEqual(float(ma["sft/nll"]), float(mb["sft/nll"]))
    # A new Checkpointer on the same directory sees it; metadata alone too.
    again = train.Checkpointer(self.workdir)
    self.assertEqual(again.restore_metadata(), meta)
    again.close()

  def test_keep_n_and_interrupted_save(self):
    state = _state()
    ckpt = train.Checkpointer(self.workdir, keep=2)
    for step in (1, 2, 3, 4):
      ckpt.save(step, state.replace(step=jnp.int32(step)), {"step": step})
    self.assertEqual(ckpt.all_steps(), [3, 4])
    ckpt.close()
    # Simulate a save of step 5 killed mid-write: a partial copy in orbax's
    # temporary directory, never renamed.
    root = os.path.join(self.workdir, "checkpoints")
    tmp = os.path.join(root, "5.orbax-checkpoint-tmp-1700000000000000")
    shutil.copytree(os.path.join(root, "4"), tmp)
    for dirpath, _, files in os.walk(tmp):
      for f in files:
        with open(os.path.join(dirpath, f), "wb") as fh:
          fh.write(b"\x00garbage")
    ckpt = train.Checkpointer(self.workdir, keep=2)
    self.assertEqual(ckpt.latest_step(), 4)
    restored, meta = ckpt.restore(state)
    self.assertEqual(meta, {"step": 4})
    self.assertEqual(int(restored.step), 4)
    # The run goes on: saving step 5 for real works and becomes the latest.
    ckpt.save(5, state.replace(step=jnp.int32(5)), {"step": 5})
    self.assertEqual(ckpt.all_steps(), [4, 5])
    self.assertEqual(int(ckpt.restore(state)[0].step), 5)
    with self.assertRaisesRegex(ValueError, "step 9"):
      ckpt.restore(state, step=9)
    ckpt.close()
    with self.assertRaisesRegex(ValueError, "keep"):
      train.Checkpointer(self.workdir, keep=0)

  def test_export_policy_round_trip(self):
    params = models.init(CFG, jax.random.key(3))
    path = os.path.join(self.workdir, "hf")
    train.export_policy(params, CFG, path)
    loaded, cfg = models.load_hf_checkpoint(path)
    self.assertEqual(cfg.embed_dim, CFG.embed_dim)
    _assert_same(self, params, loaded)


# A chat as the tiny Sokoban prompt writes it (system message, one grid).
_MESSAGES = [{"role": "system", "content": "You play Sokoban."},
             {"role": "user", "content": "######\n#_P__#\n#_X_O#\n#____#\n######\n"}]


def _export_tiny_policy(path):
  """A random ``nano`` policy (the tiny tokenizer's 512 ids) exported with its tokenizer.

  Its weights are scaled by 3: at the initial scale the greedy reply repeats
  one token; this policy's 12 greedy tokens are all different from their
  neighbours, each ahead of the runner-up by >= 0.05 in logits (float32
  round-off between torch and XLA is ~1e-5).
  """
  tok = tokenizers.load_tiny_tokenizer()
  cfg = models.get_config("nano")
  params = jax.tree.map(lambda x: 3.0 * x, models.init(cfg, jax.random.key(0)))
  train.export_policy(params, cfg, path, tokenizer=tok, chat_template="chatml")
  return tok, cfg, params


class ExportPolicyTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.path = os.path.join(tempfile.mkdtemp(), "policy")
    self.addCleanup(shutil.rmtree, os.path.dirname(self.path), ignore_errors=True)

  def test_writes_weights_config_and_tokenizer(self):
    tok, cfg, params = _export_tiny_policy(self.path)
    self.assertEqual(sorted(os.listdir(self.path)), [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"])
    loaded, cfg2 = models.load_hf_checkpoint(self.path)
    self.assertEqual(cfg2, cfg)
    _assert_same(self, params, loaded)
    with open(os.path.join(self.path, "config.json")) as f:
      hf = json.load(f)
    with open(os.path.join(self.path, "tokenizer_config.json")) as f:
      tc = json.load(f)
    # The model stops on the tokenizer's end of reply; the template is the run's.
    self.assertEqual((hf["eos_token_id"], hf["pad_token_id"], hf["vocab_size"]),
                     (tok.eos_id, tok.pad_id, tok.vocab_size))
    self.assertEqual((tc["eos_token"], tc["pad_token"], tc["chat_template"]),
                     ("<|im_end|>", "<pad>", tokenizers.CHAT_TEMPLATES_JINJA["chatml"]))
    if HAVE_TOKENIZERS:
      back = tokenizers.HFTokenizer(self.path)
      self.assertEqual(back.encode_chat(_MESSAGES), tok.encode_chat(_MESSAGES))

  def test_rejects_a_tokenizer_larger_than_the_model(self):
    with self.assertRaisesRegex(ValueError, "512 ids does not fit the model's vocab_size=32"):
      train.export_policy(models.init(CFG, jax.random.key(0)), CFG, self.path,
                          tokenizer=tokenizers.load_tiny_tokenizer())
    self.assertFalse(os.path.exists(self.path))


@absltest.skipUnless(HAVE_HF, "needs torch and transformers (pip install -e .[hf])")
class TransformersLoadsExportTest(absltest.TestCase):
  """The exported directory as a Hugging Face user meets it: Auto classes, chat, generate."""

  def test_greedy_reply_equals_jagent(self):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    with tempfile.TemporaryDirectory() as tmp:
      tok, cfg, params = _export_tiny_policy(tmp)
      hf_tok = transformers.AutoTokenizer.from_pretrained(tmp)
      model = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    prompt = hf_tok.apply_chat_template(_MESSAGES, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    self.assertEqual(list(prompt), tok.encode_chat(_MESSAGES))
    n = 12
    with torch.no_grad():
      out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    theirs = out[0, len(prompt):].tolist()
    ours = models.generate(
        params, np.asarray([prompt], np.int32), np.asarray([len(prompt)], np.int32),
        jax.random.key(0), config=cfg,
        sampling=models.SamplingConfig(max_new_tokens=n, greedy=True, eos_ids=(tok.eos_id,)))
    ours = [int(t) for t in ours.tokens[0, :int(ours.lengths[0])]]
    self.assertLen(ours, n)
    self.assertGreater(len(set(ours)), n // 2)
    self.assertEqual(theirs, ours)
    self.assertEqual(hf_tok.decode(prompt), tok.decode(prompt))


if __name__ == "__main__":
  absltest.main()
