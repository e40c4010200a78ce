"""Transparent huge pages for XLA:CPU's buffers: the entry points restart once with them.

On CPU, XLA allocates each program run's temporaries afresh, glibc serves
blocks above 32 MiB with their own ``mmap``, and the kernel then faults every
4 KiB page in on first write, every step. glibc >= 2.35 can ask
for transparent huge pages (2 MiB) on such blocks, with the tunable
``glibc.malloc.hugetlb=1``; it is read when the process starts, so
:func:`restart_with_huge_pages` re-executes the program once with it set
(measured effect: docs/results.md).

Nothing happens when the tunable is already set, when the C library is not
glibc, when the kernel's transparent huge pages are ``never`` (or unknown),
or when ``JAGENT_HUGE_PAGES=0`` (the opt-out).
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "JAGENT_HUGE_PAGES"
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def _thp_available(path: str = _THP_MODE) -> bool:
  """Whether the kernel's transparent huge pages are ``always`` or ``madvise``."""
  try:
    with open(path) as f:
      mode = f.read()
  except OSError:
    return False
  return "[never]" not in mode and "[" in mode


def environ_with_huge_pages(environ: Mapping[str, str],
                            thp_mode_path: str = _THP_MODE) -> dict[str, str] | None:
  """``environ`` with ``GLIBC_TUNABLES`` asking for huge pages, or None when not needed.

  Args:
    environ: a process environment (e.g. ``os.environ``); not modified.
    thp_mode_path: the kernel's transparent-huge-page mode file (for tests).

  Returns:
    A new dict whose ``GLIBC_TUNABLES`` ends in ``glibc.malloc.hugetlb=1``
    (appended after any tunables already there, ``:``-separated), or None:
    the tunable is already set (to any value), ``JAGENT_HUGE_PAGES=0``, the
    C library is not glibc, or transparent huge pages are off.
  """
  tunables = environ.get("GLIBC_TUNABLES", "")
  if (TUNABLE in tunables or environ.get(OPT_OUT) == "0"
      or platform.libc_ver()[0] != "glibc" or not _thp_available(thp_mode_path)):
    return None
  out = dict(environ)
  out["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}=1" if tunables else f"{TUNABLE}=1"
  return out


def restart_with_huge_pages() -> None:
  """Re-executes this Python program with :func:`environ_with_huge_pages`, if it applies.

  Uses ``sys.orig_argv`` (the interpreter's own command line, e.g. ``python
  -m experiments.train --config...``), so the program restarts as it was
  started; call it first thing in ``__main__``, before threads or files are
  opened. Returns normally (doing nothing) when the environment needs no
  change; otherwise does not return.
  """
  env = environ_with_huge_pages(os.environ)
  if env is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
