"""The command line of the experiment programs: the ``--config`` flag and one-line errors.

``experiments.train``, ``experiments.sweep`` and ``experiments.compare`` read
an ``ml_collections`` config file (``--config=experiments/configs/tiny.py:<env
id>,<algorithm>``) and its overrides (``--config.rl.learning_rate=3e-4``), and
run through :func:`run`. A bad config ends the program with one line naming
what to fix (exit status 1), not a traceback::

    $ python -m experiments.train --config.rl.lr=1e-4
    error: --config.rl.lr=1e-4: the config has no field config.rl.lr; closest:
    config.rl.learning_rate, config.rl.critic_learning_rate, config.sft.learning_rate

``ml_collections`` itself defines an override flag per ``--config.<field>``
while it parses, and a field the config lacks ends in a ~30-line
``AttributeError`` (its own "did you mean" needs 0.75 similarity: none for
``lr``), so :func:`define_config_flag` checks the command line first.
(``experiments.eval`` reads its config from the run directory; its flags are
plain absl flags, whose unknown names absl already reports on one line with
the closest ones, and it runs through :func:`run` too, so a bad value of
them, e.g. ``--env`` or ``--num_levels``, also ends in one line.)

The same one line (:func:`checked`) ends every other failure a user can fix:
a ``--config.model_dir`` that is no model directory, a run directory that
cannot be written (:func:`check_writable`, before any work) or whose
checkpoints none read back, and any ``OSError`` (a full disk, a file that
vanished). ``--verbosity=1`` also prints the traceback above the line. A
SIGTERM ends the program with one line saying it stopped (and, for
``experiments.train``, which checkpoint a rerun of the same command resumes
from), exit status 143 (128 + 15, as the signal's default would).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib
import re
import signal
import sys
import threading
import traceback
from typing import Any, Callable, Sequence

from absl import app
from absl import flags
from ml_collections import config_flags

from experiments import fields
from experiments import hugepages
from experiments import spec

DEFAULT_CONFIG = str(pathlib.Path(__file__).parent / "configs" / "tiny.py")


def _config_spec(argv: Sequence[str], name: str) -> str | None:
  """The value of the last ``--<name>=<v>`` or ``--<name> <v>`` of ``argv``, or None."""
  spec = None
  for i, arg in enumerate(argv):
    m = re.match(rf"^-{{1,2}}{name}(=|$)", arg)
    if m and m.group(1):
      spec = arg[m.end():]
    elif m and i + 1 < len(argv):
      spec = argv[i + 1]
  return spec


def _load(spec: str):
  """``get_config(<arg>)`` of the config file of ``<path>[:<arg>]`` (as ml_collections loads it)."""
  path, colon, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("cli_config", path)
  if module_spec is None or not pathlib.Path(path).is_file():
    raise fields.ConfigError(f"no config file {path!r}")
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if colon else module.get_config()


def check_config_argv(argv: Sequence[str], default: str = DEFAULT_CONFIG,
                      name: str = "config") -> None:
  """Checks the config of a command line before ``ml_collections`` parses it.

  Loads the config file of ``--config`` (else ``default``) with its argument
  and checks that every override ``--config.<field>=...`` names a field of
  it. A command line without ``--config`` flags is not read.

  Args:
    argv: the command line (``sys.argv``; flag files are expanded).
    default: the config file when ``--config`` is absent.
    name: the flag's name.

  Raises:
    ConfigError: the config file's own (e.g. an unregistered environment in
      its argument, see :func:`experiments.fields.config_arg`) or a field the
      config lacks (:func:`experiments.fields.config_field`: the closest known
      ones), naming the flag as given.
  """
  argv = flags.FLAGS.read_flags_from_files(list(argv), force_gnu=False)
  overrides = [a for a in argv if re.match(rf"^-{{1,2}}(no)?{name}\.", a)]
  spec = _config_spec(argv, name)
  if spec is None and not overrides:
    return
  try:
    config = _load(spec or default)
  except fields.ConfigError as e:
    raise fields.ConfigError(f"--{name}={spec or default}: {e}") from None
  except Exception:  # pylint: disable=broad-except
    return  # the config file's own bug: ml_collections reports it with its traceback
  for arg in overrides:
    field = arg.split("=", 1)[0].split(".", 1)[1]
    try:
      fields.config_field(config, field)
    except fields.ConfigError as e:
      raise fields.ConfigError(f"{arg}: {e}") from None
    if "=" in arg and arg.split("=", 1)[1].strip() in ("None", "none", "null"):
      instead = _NONE_INSTEAD.get(field.rsplit(".", 1)[-1], "set it in a config file")
      raise fields.ConfigError(f"{arg}: a flag cannot set None (ml_collections parses the "
                               f"field's type); instead: {instead}")


# What to pass instead of None for fields whose None means "off".
_NONE_INSTEAD = {"dual_clip": "inf (no dual clip)", "value_clip": "inf (no value clipping)"}


# What ends a program with one ``error:`` line (exit status 1) instead of a
# traceback: a bad config, flag or run directory (ConfigError), and the file
# system's errors (a read-only or full disk, a missing file).
USER_ERRORS = (fields.ConfigError, OSError)

# The exit status of a run ended by SIGTERM: 128 + the signal's number, as the
# shell reports a process the signal's default action ended.
TERMINATED_STATUS = 128 + signal.SIGTERM


class Terminated(BaseException):
  """A SIGTERM arrived (raised by the handler :func:`checked` installs).

  A BaseException, as KeyboardInterrupt: library code's ``except Exception``
  lets it through. Its message (if any) is the line the program ends with.
  """


def _exit(error: BaseException):
  sys.exit(f"error: {error}")


def _verbose() -> bool:
  """Whether ``--verbosity`` asks for debug output (>= 1): tracebacks are shown then."""
  try:
    return flags.FLAGS.verbosity >= 1
  except (KeyError, flags.UnparsedFlagAccessError):
    return False


def _raise_terminated(signum, frame):
  del signum, frame
  raise Terminated()


def check_writable(path: str, flag: str) -> None:
  """Refuses a directory that cannot be created or written, before any work.

  Checks ``path`` if it exists, else its nearest existing ancestor (which
  the run would create it in): it must be a directory this process may write
  (``os.access``; a read-only file system is refused even for root).

  Args:
    path: the output directory (e.g. ``--workdir``'s value).
    flag: the flag that set it, named in the message (``"--workdir"``).

  Raises:
    ConfigError: naming ``flag=path``, why, and what to do.
  """
  target = os.path.abspath(path)
  while not os.path.exists(target) and os.path.dirname(target) != target:
    target = os.path.dirname(target)
  why = None
  if not os.path.isdir(target):
    why = f"{target} is not a directory"
  elif not os.access(target, os.W_OK | os.X_OK):
    why = f"{target} is not writable (a read-only file system or no permission)"
  if why:
    raise fields.ConfigError(f"{flag}={path}: cannot write the run there: {why}; pass a "
                             f"writable {flag}")


def define_config_flag(default: str = DEFAULT_CONFIG, *,
                       flag_values: flags.FlagValues = flags.FLAGS,
                       argv: Sequence[str] | None = None) -> flags.FlagHolder:
  """Defines ``--config`` (``config_flags.DEFINE_config_file``) after :func:`check_config_argv`.

  Call it where the program defines its flags (``ml_collections`` parses the
  default config, with the overrides of ``argv``, right there).

  Args:
    default: the config file (``path[:arg]``) when ``--config`` is absent.
    flag_values: where to define it.
    argv: the command line (default ``sys.argv``, read when called).

  Returns:
    the flag's holder (``.value``: the config, once flags are parsed).

  Raises:
    SystemExit: a bad config on the command line, with its one-line message.
  """
  try:
    check_config_argv(sys.argv if argv is None else argv, default)
  except fields.ConfigError as e:
    _exit(e)
  return config_flags.DEFINE_config_file(
      "config", default, "An ml_collections config file (experiments/configs/*.py[:arg]).",
      flag_values=flag_values, sys_argv=None if argv is None else list(argv))


def checked(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
  """``main`` that ends the program with one line on a user's error or a SIGTERM.

  An error of :data:`USER_ERRORS` ends it with ``error: <message>`` (exit
  status 1; with ``--verbosity=1`` the traceback first); any other exception
  (a bug) keeps its traceback. While ``main`` runs (in the main thread), a
  SIGTERM raises :class:`Terminated`, which ends the program with its
  message (``main`` may re-raise it with one saying how to resume), exit
  status :data:`TERMINATED_STATUS`; the previous handler is put back after.
  """
  @functools.wraps(main)
  def run_main(argv):
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
      return main(argv)
    except USER_ERRORS as e:
      if _verbose():
        traceback.print_exc()
      _exit(e)
    except Terminated as e:
      print(str(e) or "stopped: SIGTERM", file=sys.stderr, flush=True)
      sys.exit(TERMINATED_STATUS)
    finally:
      if main_thread and previous is not None:
        signal.signal(signal.SIGTERM, previous)

  return run_main


def run(main: Callable[[list[str]], Any]) -> None:
  """``absl.app.run`` of :func:`checked` ``(main)``, with huge pages for XLA:CPU's buffers.

  The program first restarts once with glibc's transparent huge pages on
  (:func:`experiments.hugepages.restart_with_huge_pages`; ``JAGENT_HUGE_PAGES=0``
  turns it off).
  """
  hugepages.restart_with_huge_pages()
  app.run(checked(main))
