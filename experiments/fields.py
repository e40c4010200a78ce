"""A bad config's error, naming the config field, and the lookup of dotted fields.

:class:`ConfigError` is the error of a bad config: its message names the
field (``config.rl.steps=-5: must be an int >= 0``), and the programs
(``experiments.cli.run``) print it as one line. :func:`bad` and
:func:`require_int` build it; :func:`config_field` reads a dotted field,
naming the closest known ones (:func:`closest`) when there is none;
:func:`config_arg` reads a config file's ``<env id>,<algorithm>`` argument.
"""

from __future__ import annotations

import difflib
from typing import Any, Sequence

import envs_jax
import jagent
from jagent import transforms


class ConfigError(ValueError):
  """A bad config: the message names the config field (``config.rl.steps=-5: ...``).

  The programs (``experiments.cli.run``) print it as one line, without a
  traceback.
  """


def bad(field: str, value: Any, why: str) -> ConfigError:
  """The ConfigError ``config.<field>=<value!r>: <why>`` (returned, for ``raise``)."""
  return ConfigError(f"config.{field}={value!r}: {why}")


def closest(name: str, known: Sequence[str], n: int = 3) -> list[str]:
  """Up to ``n`` of ``known`` closest to ``name`` (a misspelt field), best first.

  Each candidate's last dotted part is compared with ``name``'s by
  ``difflib`` similarity, and also by its initials (``lr`` is close to
  ``learning_rate``); those at least 0.65 similar are kept, the candidates
  in ``name``'s own group first.
  """
  parent, _, last = name.rpartition(".")

  def score(candidate):
    group, _, field = candidate.rpartition(".")
    initials = "".join(w[:1] for w in field.split("_"))
    sim = max(difflib.SequenceMatcher(None, last, f).ratio() for f in (field, initials))
    return group == parent, sim

  scored = [(score(c), c) for c in known]
  return [c for (_, sim), c in sorted((x for x in scored if x[0][1] >= 0.65),
                                       key=lambda x: x[0], reverse=True)[:n]]


def _paths(node, prefix: str = "") -> list[str]:
  """Every dotted field path of a ConfigDict (groups and their fields)."""
  out = []
  for k in node.keys():
    out.append(prefix + k)
    if hasattr(node[k], "keys"):
      out += _paths(node[k], f"{prefix}{k}.")
  return out


def config_field(config, path: str) -> Any:
  """The value of the dotted field ``path`` of ``config`` (``"rl.learning_rate"``).

  Raises:
    ConfigError: ``config`` has no such field: the message names it and the
      closest known fields (:func:`closest`), or else the fields of its group.
  """
  node = config
  parts = path.split(".")
  for i, part in enumerate(parts):
    group = ".".join(["config"] + parts[:i])
    if not hasattr(node, "keys"):
      raise ConfigError(f"{group} is a value, not a group of fields (no field config.{path})")
    if part not in node:
      where = ".".join(parts[:i + 1])
      near = closest(where, _paths(config))
      raise ConfigError(f"the config has no field config.{where}; " + (
          f"closest: {', '.join('config.' + c for c in near)}" if near
          else f"{group} has: {', '.join(sorted(node.keys()))}"))
    node = node[part]
  return node


def config_arg(arg: str | None, default: str) -> tuple[str, str]:
  """``(env id, algorithm)`` of a config file's argument ``"<env id>,<algorithm>"``.

  The argument is the text after the config file's ``:``
  (``--config=experiments/configs/tiny.py:FrozenLake-4x4-v0,grpo``); None or
  ``""`` is ``default``.

  Raises:
    ConfigError: not two comma-separated names, an unregistered environment
      or an unknown algorithm, naming the argument and the known names.
  """
  text = arg or default
  parts = text.split(",")
  where = f"config argument {text!r} (<env id>,<algorithm> after the config file's ':')"
  if len(parts) != 2 or not all(p.strip() for p in parts):
    raise ConfigError(f"{where}: expected two names separated by a comma, e.g. {default!r}")
  env, algorithm = (p.strip() for p in parts)
  if env not in envs_jax.registered():
    near = closest(env, sorted(envs_jax.registered()))
    raise ConfigError(f"{where}: unknown environment {env!r}"
                      + (f" (closest: {', '.join(near)})" if near else "")
                      + f"; registered: {', '.join(sorted(envs_jax.registered()))}")
  if algorithm not in transforms.registered():
    raise ConfigError(f"{where}: unknown algorithm {algorithm!r}; registered: "
                      f"{', '.join(transforms.registered())}")
  return env, algorithm


def require_int(field: str, value: Any, minimum: int, why: str) -> None:
  """Raises ``bad(field, value, why)`` unless ``value`` is an int (not a bool) >= ``minimum``.

  The check is :func:`jagent.check_int`'s, so ints are accepted as everywhere else.
  """
  jagent.check_int(f"config.{field}", value, minimum, why=why, error=ConfigError)
