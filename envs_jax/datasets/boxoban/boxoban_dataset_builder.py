"""tfds builder for the Boxoban levels shipped in ``envs_jax/data/boxoban``.

Source: DeepMind's Boxoban levels (Guez, Mirza, Gregor, Kabra et al. 2018,
"An investigation of model-free planning", ICML 2019;
github.com/deepmind/boxoban-levels), Apache-2.0. This package ships 1000 levels
of each of three subsets; see ``envs_jax/data/boxoban/README.md``.

The builder never downloads: ``_split_generators`` reads the text files from the
installed package with ``importlib.resources``. Prepare with
``file_format="array_record"`` and read with ``as_data_source()`` (no
TensorFlow needed); ``envs_jax.load_boxoban_levels`` does both. This module
imports the level files' names and format from ``envs_jax._src.boxoban_levels``
only, never the loader that imports it.
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

from envs_jax._src import boxoban_levels

_GRID = boxoban_levels.GRID_SIZE
SUBSETS = boxoban_levels.SUBSETS

_DESCRIPTION = """\
Boxoban: 10x10 Sokoban levels with 4 boxes, published by DeepMind (Guez et al.
2018). This builder holds the 1000 levels shipped with envs_jax for each of
three subsets: the unfiltered test set, the first 1000 levels of the medium
validation split and the first 1000 levels of the hard split. Each example is
one level: its index in the source file ("; N" header) and its 10x10 grid as
ASCII bytes ('#' wall, '@' player, '$' box, '.' goal, ' ' floor), plus counts of
players, boxes and goals. Examples keep file order (shuffling disabled).
"""

_CITATION = """\
@misc{boxobanlevels,
  author = {Arthur Guez and Mehdi Mirza and Karol Gregor and Rishabh Kabra and
            S{\\'e}bastien Racani{\\`e}re and Th{\\'e}ophane Weber and
            David Raposo and Adam Santoro and Laurent Orseau and Tom Eccles and
            Greg Wayne and David Silver and Timothy Lillicrap and Victor Valdes},
  title = {An investigation of Model-free planning: boxoban levels},
  howpublished = {https://github.com/deepmind/boxoban-levels/},
  year = {2018}
}
"""


class Builder(tfds.core.GeneratorBasedBuilder):
  """Boxoban levels, one config per shipped subset, one "test" split each.

  Features: ``level_index`` (int32, the file's ``; N``), ``grid`` (uint8
  [10, 10] ASCII), ``num_players``/``num_boxes``/``num_goals`` (int32).
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: 1000 levels per shipped subset."}
  BUILDER_CONFIGS = [
      tfds.core.BuilderConfig(
          name=name,
          description=f"Boxoban {name} levels (1000, from {'/'.join(parts[2:])}).",
      )
      for name, parts in boxoban_levels.SUBSET_FILES.items()
  ]
  DEFAULT_BUILDER_CONFIG_NAME = "unfiltered-test"

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=_DESCRIPTION,
        features=tfds.features.FeaturesDict({
            "level_index": tfds.features.Scalar(np.int32),
            "grid": tfds.features.Tensor(shape=(_GRID, _GRID), dtype=np.uint8),
            "num_players": tfds.features.Scalar(np.int32),
            "num_boxes": tfds.features.Scalar(np.int32),
            "num_goals": tfds.features.Scalar(np.int32),
        }),
        supervised_keys=None,
        disable_shuffling=True,  # keep file order: level 0 first.
        homepage="https://github.com/deepmind/boxoban-levels",
        citation=_CITATION,
        license="Apache-2.0",
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Nothing to download: the levels ship with the package.
    return {"test": self._generate_examples(self.builder_config.name)}

  def _generate_examples(self, subset: str):
    text = boxoban_levels.subset_file(subset).read_text(encoding="ascii")
    for index, grid in boxoban_levels.parse_levels(text):
      yield index, {
          "level_index": index,
          "grid": grid,
          "num_players": int(np.sum(grid == ord("@"))),
          "num_boxes": int(np.sum(grid == ord("$"))),
          "num_goals": int(np.sum(grid == ord("."))),
      }
