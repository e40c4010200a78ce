"""Tests of the Boxoban tfds builder (array_record) and ``load_boxoban_levels``."""

import ast
import glob
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from array_record.python import array_record_module
import numpy as np

import envs_jax
from envs_jax._src import boxoban_data
from envs_jax._src import boxoban_levels
from envs_jax.datasets.boxoban import boxoban_dataset_builder

_DATA = pathlib.Path(envs_jax.__file__).parent / "data" / "boxoban"
_FILES = {
    "unfiltered-test": _DATA / "unfiltered" / "test" / "000.txt",
    "medium-valid": _DATA / "medium" / "valid" / "000.txt",
    "hard": _DATA / "hard" / "000.txt",
}


def _imported_modules(module):
  """The modules that ``module``'s source imports (absolute imports)."""
  tree = ast.parse(pathlib.Path(module.__file__).read_text())
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


def _reference_levels(path):
  """Independent parse: split on blank lines, check '; i' headers in order."""
  blocks = [b for b in path.read_text().split("\n\n") if b.strip()]
  grids = []
  for i, block in enumerate(blocks):
    header, *rows = block.strip("\n").split("\n")
    assert header == f"; {i}", (path, i, header)
    grids.append([[ord(c) for c in row] for row in rows])
  return np.array(grids, dtype=np.uint8)


class BoxobanDataTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.data_dir = tempfile.mkdtemp(prefix="boxoban_test_")
    self.addCleanup(shutil.rmtree, self.data_dir, ignore_errors=True)
    boxoban_data._CACHE.clear()
    self.addCleanup(boxoban_data._CACHE.clear)

  def _variant_dir(self, subset):
    return os.path.join(self.data_dir, "boxoban", subset, "1.0.0")

  def test_subsets(self):
    self.assertEqual(envs_jax.BOXOBAN_SUBSETS, ("unfiltered-test", "medium-valid", "hard"))
    self.assertIs(envs_jax.load_boxoban_levels, boxoban_data.load_levels)
    self.assertEqual(
        tuple(c.name for c in boxoban_dataset_builder.Builder.BUILDER_CONFIGS),
        envs_jax.BOXOBAN_SUBSETS,
    )

  def test_imports_run_one_way(self):
    # loader -> builder -> level files; neither of the last two imports back.
    self.assertIn("envs_jax.datasets.boxoban.boxoban_dataset_builder",
                  _imported_modules(boxoban_data))
    self.assertNotIn("envs_jax._src.boxoban_data",
                     _imported_modules(boxoban_dataset_builder))
    self.assertEmpty({m for m in _imported_modules(boxoban_levels)
                      if m.startswith("envs_jax") or m.startswith("tensorflow")})

  @parameterized.parameters("unfiltered-test", "medium-valid", "hard")
  def test_levels_equal_text_files(self, subset):
    levels = envs_jax.load_boxoban_levels(subset, data_dir=self.data_dir)
    self.assertEqual(levels.shape, (1000, 10, 10))
    self.assertEqual(levels.dtype, np.uint8)
    np.testing.assert_array_equal(levels, _reference_levels(_FILES[subset]))
    self.assertFalse(levels.flags.writeable)
    # Level 0 of the unfiltered test set, copied from the file by hand.
    if subset == "unfiltered-test":
      self.assertEqual(bytes(levels[0, 1]), b"###    . #")
      self.assertEqual(bytes(levels[0, 8]), b"#####@####")

  @parameterized.parameters("unfiltered-test", "medium-valid", "hard")
  def test_level_invariants(self, subset):
    levels = envs_jax.load_boxoban_levels(subset, data_dir=self.data_dir)
    count = lambda c: np.sum(levels == ord(c), axis=(1, 2))
    np.testing.assert_array_equal(count("$"), 4)
    np.testing.assert_array_equal(count("."), 4)
    np.testing.assert_array_equal(count("@"), 1)
    # Only the five symbols: no '*' (box on goal) or '+' (player on goal).
    self.assertEqual(set(np.unique(levels).tolist()), {ord(c) for c in "#@$. "})
    wall = ord("#")
    self.assertTrue(np.all(levels[:, 0, :] == wall))
    self.assertTrue(np.all(levels[:, -1, :] == wall))
    self.assertTrue(np.all(levels[:, :, 0] == wall))
    self.assertTrue(np.all(levels[:, :, -1] == wall))

  def test_stored_as_array_record(self):
    levels = envs_jax.load_boxoban_levels("hard", data_dir=self.data_dir)
    shards = glob.glob(os.path.join(self._variant_dir("hard"), "boxoban-test.array_record-*"))
    self.assertLen(shards, 1)
    reader = array_record_module.ArrayRecordReader(shards[0])
    self.assertEqual(reader.num_records(), 1000)
    reader.close()
    builder = boxoban_dataset_builder.Builder(config="hard", data_dir=self.data_dir)
    self.assertEqual(builder.info.file_format.value, "array_record")
    self.assertEqual(builder.info.splits["test"].num_examples, 1000)
    self.assertEqual(builder.info.redistribution_info.license, "Apache-2.0")
    self.assertIn("Guez", builder.info.citation)
    source = builder.as_data_source(split="test")
    self.assertEqual(type(source).__name__, "ArrayRecordDataSource")
    example = source[7]
    self.assertEqual(int(example["level_index"]), 7)
    np.testing.assert_array_equal(example["grid"], levels[7])
    self.assertEqual(
        (int(example["num_players"]), int(example["num_boxes"]), int(example["num_goals"])),
        (1, 4, 4),
    )

  def test_unknown_subset(self):
    with self.assertRaisesRegex(ValueError, r"'bogus'.*unfiltered-test, medium-valid, hard"):
      envs_jax.load_boxoban_levels("bogus", data_dir=self.data_dir)
    self.assertEmpty(os.listdir(self.data_dir))  # Nothing written.

  def test_second_load_reads_prepared_files(self):
    first = envs_jax.load_boxoban_levels("medium-valid", data_dir=self.data_dir)
    self.assertIs(envs_jax.load_boxoban_levels("medium-valid", data_dir=self.data_dir), first)
    shard = glob.glob(os.path.join(self._variant_dir("medium-valid"), "*.array_record-*"))[0]
    mtime = os.stat(shard).st_mtime_ns
    boxoban_data._CACHE.clear()  # As in a new process.
    with mock.patch.object(
        boxoban_dataset_builder.Builder, "_download_and_prepare",
        side_effect=AssertionError("re-prepared"),
    ):
      second = envs_jax.load_boxoban_levels("medium-valid", data_dir=self.data_dir)
    self.assertIsNot(second, first)
    np.testing.assert_array_equal(second, first)
    self.assertEqual(os.stat(shard).st_mtime_ns, mtime)

  def test_interrupted_prepare_then_load(self):
    subset_dir = os.path.join(self.data_dir, "boxoban", "hard")
    # Leftover of a killed run (tfds' temp-dir naming).
    stale = os.path.join(subset_dir, "incomplete.ABC123_1.0.0")
    os.makedirs(stale)
    pathlib.Path(stale, "boxoban-test.array_record-00000-of-00001").write_bytes(b"junk")

    def broken_examples(self, subset):
      del self, subset
      yield 0, {"level_index": 0, "grid": np.zeros((10, 10), np.uint8),
                "num_players": 0, "num_boxes": 0, "num_goals": 0}
      raise KeyboardInterrupt("interrupted")

    with mock.patch.object(
        boxoban_dataset_builder.Builder, "_generate_examples", broken_examples
    ):
      with self.assertRaises(KeyboardInterrupt):
        envs_jax.load_boxoban_levels("hard", data_dir=self.data_dir)
    self.assertFalse(os.path.exists(self._variant_dir("hard")))
    levels = envs_jax.load_boxoban_levels("hard", data_dir=self.data_dir)
    np.testing.assert_array_equal(levels, _reference_levels(_FILES["hard"]))
    self.assertEqual(os.listdir(subset_dir), ["1.0.0"])  # Stale folder removed.

  def test_invalid_variant_dir_is_rebuilt(self):
    os.makedirs(self._variant_dir("hard"))  # Exists, but holds no dataset.
    levels = envs_jax.load_boxoban_levels("hard", data_dir=self.data_dir)
    np.testing.assert_array_equal(levels, _reference_levels(_FILES["hard"]))

  def test_default_data_dir_from_env(self):
    with mock.patch.dict(os.environ, {"JAGENT_DATA_DIR": self.data_dir}):
      self.assertEqual(boxoban_data.default_data_dir(), self.data_dir)
      levels = envs_jax.load_boxoban_levels("hard")
    self.assertTrue(os.path.isdir(self._variant_dir("hard")))
    self.assertEqual(levels.shape, (1000, 10, 10))
    with mock.patch.dict(os.environ, {}, clear=True):
      os.environ.pop("JAGENT_DATA_DIR", None)
      self.assertEqual(
          boxoban_data.default_data_dir(),
          os.path.expanduser("~/.cache/jagent/tensorflow_datasets"),
      )

  def test_another_process_prepares_between_builder_and_check(self):
    # The race test_two_processes_prepare_at_once hit now and then: this
    # process builds its tfds builder while another one is still preparing the
    # files, and checks them after they are complete. That builder holds the
    # code's default info (file format TFRECORD), not the prepared one.
    real = boxoban_data._is_prepared
    raced = []

    def racing(builder):
      if not raced:
        raced.append(True)
        boxoban_data._prepared_builder("unfiltered-test", self.data_dir)  # "another process"
      return real(builder)

    with mock.patch.object(boxoban_data, "_is_prepared", racing):
      levels = envs_jax.load_boxoban_levels("unfiltered-test", data_dir=self.data_dir)
    self.assertEqual(raced, [True])
    np.testing.assert_array_equal(levels, _reference_levels(_FILES["unfiltered-test"]))

  def test_two_processes_prepare_at_once(self):
    script = textwrap.dedent(f"""
        import sys, zlib
        from envs_jax._src import boxoban_data
        levels = boxoban_data.load_levels("unfiltered-test", data_dir={self.data_dir!r})
        print("CRC", zlib.crc32(levels.tobytes()), flush=True)
    """)
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
      self.assertEqual(p.returncode, 0, out)
    want = _reference_levels(_FILES["unfiltered-test"])
    import zlib  # pylint: disable=g-import-not-at-top
    for out in outs:
      self.assertIn(f"CRC {zlib.crc32(want.tobytes())}", out)
    # The lock serialises them: at most one prepared, the other reused.
    self.assertLessEqual(sum("Downloading and preparing" in out for out in outs), 1)


if __name__ == "__main__":
  absltest.main()
