"""Files written whole or not at all: the one home for result and export writes.

A file is written under a temporary name in its own directory, flushed to disk
and renamed onto its final name (``os.replace``, atomic on POSIX and Windows
within one file system). A run killed mid-write, a full disk or a value that
does not serialize therefore leaves the previous file (or none) in place, never
a truncated one: a reader of ``eval_summary.json`` or of an exported
``model.safetensors`` sees a complete old or a complete new file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
  """Yields a temporary path beside ``path``; a clean exit renames it onto ``path``.

  Write the whole file to the yielded path (any writer that takes a file
  name, e.g. ``safetensors.numpy.save_file``). If the ``with`` body raises,
  the temporary file is removed and ``path`` is left as it was.

  Args:
    path: the final file name; its directory must exist.

  Yields:
    str, the temporary file name ``<dir>/.<name>.<pid>.<thread>.tmp``.

  Raises:
    FileNotFoundError: the directory of ``path`` does not exist.
  """
  directory, name = os.path.split(os.path.abspath(path))
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"atomic_path: the directory of {path!r} does not exist")
  tmp = os.path.join(directory, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
  try:
    yield tmp
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)
    raise


@contextlib.contextmanager
def staged_directory(path: str, *, last: tuple[str, ...] = (),
                     remove: tuple[str, ...] = ()) -> Iterator[str]:
  """Yields an empty staging directory; a clean exit moves its files into ``path``.

  For a set of files that belong together (a checkpoint's shards, index and
  config): they are written in full beside ``path`` first, then renamed into
  ``path`` (created if missing; other files there are kept) one by one, the
  names in ``last`` after all others, so a reader that opens ``last`` first
  finds every other file already complete. Files named in ``remove`` (stale
  files of an earlier write that a reader would prefer, e.g. an old shard
  index) are deleted from ``path`` just before ``last`` moves. If the
  ``with`` body raises, nothing in ``path`` changes. The staging directory is
  removed either way.

  Args:
    path: the destination directory.
    last: file names moved last, in this order.
    remove: file names deleted from ``path`` (if there) before ``last`` moves.

  Yields:
    str, the staging directory ``<parent>/.<name>.<pid>.<thread>.staging``.
  """
  parent, name = os.path.split(os.path.abspath(path))
  staging = os.path.join(parent, f".{name}.{os.getpid()}.{threading.get_ident()}.staging")
  shutil.rmtree(staging, ignore_errors=True)
  os.makedirs(staging)
  try:
    yield staging
    os.makedirs(path, exist_ok=True)
    for n in sorted(set(os.listdir(staging)) - set(last)):
      os.replace(os.path.join(staging, n), os.path.join(path, n))
    for n in remove:
      with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(path, n))
    for n in last:
      if os.path.exists(os.path.join(staging, n)):
        os.replace(os.path.join(staging, n), os.path.join(path, n))
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def write_text(path: str, text: str) -> None:
  """Writes ``text`` (UTF-8) to ``path`` whole or not at all (see :func:`atomic_path`)."""
  with atomic_path(path) as tmp:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())


def write_json(path: str, obj: Any, *, indent: int | None = 2) -> None:
  """Writes ``obj`` as JSON to ``path`` whole or not at all.

  The value is serialized before any file is touched, so a value JSON cannot
  encode raises with ``path`` unchanged and no temporary file left.

  Raises:
    TypeError / ValueError: from ``json.dumps`` (e.g. a NaN is fine, a set
      is not), before writing.
  """
  write_text(path, json.dumps(obj, indent=indent))
