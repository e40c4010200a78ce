"""Tests of jagent._src.files: results and exports are written whole or not at all."""

import json
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
import jax
import numpy as np

from jagent import models
from jagent._src import files

CFG = models.ModelConfig(vocab_size=32, embed_dim=8, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=4, mlp_dim=16, tie_embeddings=False)


class _Crash(Exception):
  pass


class FilesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp(prefix="files_test_")
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

  def test_write_json_round_trip_mode_and_no_leftovers(self):
    path = os.path.join(self.dir, "summary.json")
    files.write_json(path, {"success": 0.5, "steps": 3})
    with open(path) as f:
      self.assertEqual(json.load(f), {"success": 0.5, "steps": 3})
    plain = os.path.join(self.dir, "plain.txt")
    with open(plain, "w") as f:
      f.write("x")
    self.assertEqual(os.stat(path).st_mode, os.stat(plain).st_mode)  # as open() makes it
    self.assertEqual(sorted(os.listdir(self.dir)), ["plain.txt", "summary.json"])

  def test_unserializable_value_leaves_the_old_file(self):
    path = os.path.join(self.dir, "summary.json")
    files.write_json(path, {"old": 1})
    with self.assertRaises(TypeError):
      files.write_json(path, {"new": {1, 2}})  # a set: not JSON
    with open(path) as f:
      self.assertEqual(json.load(f), {"old": 1})
    self.assertEqual(os.listdir(self.dir), ["summary.json"])

  def test_crash_mid_write_leaves_the_old_file(self):
    path = os.path.join(self.dir, "out.txt")
    files.write_text(path, "complete old text")
    with self.assertRaises(_Crash):
      with files.atomic_path(path) as tmp:
        with open(tmp, "w") as f:
          f.write("half of the new")
        raise _Crash()
    with open(path) as f:
      self.assertEqual(f.read(), "complete old text")
    self.assertEqual(os.listdir(self.dir), ["out.txt"])

  def test_missing_directory_is_named(self):
    with self.assertRaisesRegex(FileNotFoundError, "nowhere"):
      files.write_text(os.path.join(self.dir, "nowhere", "x.txt"), "x")

  def test_staged_directory_order_remove_and_crash(self):
    dest = os.path.join(self.dir, "ckpt")
    os.makedirs(dest)
    for name, text in (("keep.txt", "user file"), ("index", "stale")):
      files.write_text(os.path.join(dest, name), text)
    moved = []
    real_replace = os.replace

    def spy(src, dst):
      moved.append(os.path.basename(dst))
      real_replace(src, dst)

    with mock.patch.object(os, "replace", spy):
      with files.staged_directory(dest, last=("config",), remove=("index",)) as staging:
        for name in ("config", "b", "a"):
          files.write_text(os.path.join(staging, name), name)
    # atomic_path's own renames happen inside the staging directory first.
    self.assertEqual([m for m in moved if m in ("a", "b", "config")][-3:], ["a", "b", "config"])
    self.assertEqual(sorted(os.listdir(dest)), ["a", "b", "config", "keep.txt"])
    self.assertEqual(sorted(os.listdir(self.dir)), ["ckpt"])  # no staging left
    with self.assertRaises(_Crash):
      with files.staged_directory(dest, last=("config",)) as staging:
        files.write_text(os.path.join(staging, "a"), "new a")
        raise _Crash()
    with open(os.path.join(dest, "a")) as f:
      self.assertEqual(f.read(), "a")
    self.assertEqual(sorted(os.listdir(self.dir)), ["ckpt"])


class CheckpointExportTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    root = tempfile.mkdtemp(prefix="files_test_")
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    self.path = os.path.join(root, "policy")
    self.old = models.init(CFG, jax.random.key(0))
    self.new = models.init(CFG, jax.random.key(1))
    models.save_hf_checkpoint(self.old, CFG, self.path)

  def assert_loads(self, want):
    got, _ = models.load_hf_checkpoint(self.path)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(w))

  def test_interrupted_export_keeps_the_previous_checkpoint(self):
    import safetensors.numpy  # pylint: disable=g-import-not-at-top
    real_save = safetensors.numpy.save_file
    calls = []

    def dies_on_second_shard(tensors, filename, metadata=None):
      calls.append(filename)
      if len(calls) == 2:
        with open(filename, "wb") as f:
          f.write(b"\x00" * 10)  # a truncated file
        raise _Crash()
      return real_save(tensors, filename, metadata=metadata)

    sharded = os.path.join(os.path.dirname(self.path), "sharded")
    models.save_hf_checkpoint(self.old, CFG, sharded, max_shard_bytes=2048)
    with mock.patch.object(safetensors.numpy, "save_file", dies_on_second_shard):
      with self.assertRaises(_Crash):
        models.save_hf_checkpoint(self.new, CFG, sharded, max_shard_bytes=2048)
    self.assertGreater(len(calls), 1)
    got, _ = models.load_hf_checkpoint(sharded)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(self.old)):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    parent = os.path.dirname(self.path)
    self.assertEqual(sorted(os.listdir(parent)), ["policy", "sharded"])  # no staging left

  def test_single_file_export_over_a_sharded_one_is_the_new_one(self):
    models.save_hf_checkpoint(self.old, CFG, self.path, max_shard_bytes=2048)
    self.assertIn("model.safetensors.index.json", os.listdir(self.path))
    models.save_hf_checkpoint(self.new, CFG, self.path)
    self.assertNotIn("model.safetensors.index.json", os.listdir(self.path))
    self.assert_loads(self.new)
    models.save_hf_checkpoint(self.old, CFG, self.path, max_shard_bytes=2048)
    self.assert_loads(self.old)


if __name__ == "__main__":
  absltest.main()
