"""Peak resident memory of this process, for every benchmark.

Standard library only: the peers' sides (``peer_rl_trl``, ``peer_rl_tunix``)
run in virtualenvs without JAX and import it too.
"""

from __future__ import annotations

import resource
import sys


def peak_rss_mb() -> float:
  """This process's own peak resident set size in MiB.

  ``VmHWM`` of /proc/self/status where there is one (Linux), not
  ``getrusage``'s ``ru_maxrss``: Linux carries the parent's peak into a
  child across fork + exec, so a peer side spawned by a benchmark would
  report the benchmark's peak. Elsewhere ``ru_maxrss`` (KiB on Linux, bytes
  on macOS).

  Returns:
    MiB as a float.
  """
  try:
    with open("/proc/self/status", encoding="ascii", errors="replace") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024.0
  except OSError:
    pass
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0
