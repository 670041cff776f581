"""The root of every error a user sees as one line, and the error of the contract between the halves.

:class:`PacktrainError` is what the CLI catches (packtrain/cli/commands.py ``run``): every error whose
message names the file or field and the fix derives from it, in core/, pipeline/ and trainer/, and
is printed as ``error: <message>`` with exit code 2, never a traceback. An error that is not one (a
bug) keeps its traceback.

Its own module so that the lowest core modules (schema.py, inputs.py) can raise :class:`ContractError`
without importing contract.py, which reads files through them.
"""


class PacktrainError(Exception):
    """A refusal or stop a user can act on; the message says what is wrong and how to fix it. Its
    text is :func:`bounded`: however long a value it quotes, a few hundred characters a line."""

    def __str__(self) -> str:
        return bounded(super().__str__())


class ContractError(PacktrainError):
    """A build directory, shard, manifest or name does not satisfy the contract."""


# --- Bounded messages (issue 46) ------------------------------------------------------------------
# A message quotes what it is about: a value, a line, a parser's error. Quoted whole, a hostile input
# made an error line of 428 kB (a YAML alias bomb's expansion) and 312 MB of error output. Every
# message is cut here, once: PacktrainError's str(), the CLI's error line (packtrain/cli/commands.py
# ``run``), and the JSON lines of rebuild and status (:func:`describe_error`).

MAX_LINE = 1000
"""The most characters of one line of an error message; longer lines lose their middle, said. A
safety net: a value quoted in a message is cut where it is quoted (:func:`quote`, :func:`cut` to
80-200 characters), so such a line is a few hundred characters; the longest line packtrain writes of
its own is the list of the train section's keys after an unknown one (about 900)."""

MAX_LINES = 40
"""The most lines of one error message (a config's problems, listed at once); the rest are counted."""


def cut(text: str, limit: int = MAX_LINE) -> str:
    """``text``, or where it is longer than ``limit``, its start and its end (where the fix is said)
    around a marker that says how much was cut; never longer than ``limit`` (limit >= 60)::

        >>> cut("x" * 50 + "y" * 950 + "z" * 50, 120)
        'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxyyyy [... 1,050 characters: 969 cut ...] zzzzzzzzzzzzzzzzzzzzzzzzzzz'
    """
    if len(text) <= limit:
        return text
    marker = f" [... {len(text):,} characters: {{:,}} cut ...] "
    room = limit - len(marker.format(len(text)))
    head, tail = room - room // 3, room // 3
    return text[:head] + marker.format(len(text) - head - tail) + text[len(text) - tail:]


def clipped(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and its length: ``aaaa... (100,000 characters)``."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def quote(value: object, limit: int = 80) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters with the value's length said:
    ``'aaaa...' (100,000 characters)``. A large list or mapping is never written out whole first."""
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value):,} characters)"
    if isinstance(value, (list, tuple, dict, set)) and len(value) > 20:
        import reprlib

        return f"{reprlib.repr(value)} ({len(value):,} items)"
    return clipped(repr(value), limit)


def bounded(message: str) -> str:
    """``message`` with each line :func:`cut` to :data:`MAX_LINE` characters and at most
    :data:`MAX_LINES` lines, the rest counted."""
    lines = message.split("\n")
    if all(len(line) <= MAX_LINE for line in lines) and len(lines) <= MAX_LINES:
        return message
    kept = [cut(line) for line in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        kept.append(f"  ... and {len(lines) - MAX_LINES:,} more lines")
    return "\n".join(kept)


def describe_error(error: BaseException) -> str:
    """``Type: message``, bounded: an error in a JSON line (rebuild, status) or a log."""
    return bounded(f"{type(error).__name__}: {error_text(error)}")


def error_text(error: BaseException) -> str:
    """The message of an expected error (the CLI's ``error:`` line): the error's own, and for an
    ``OSError`` of access (a read-only file system, no permission: a cache or runs directory mounted
    read-only) also what to do, where it said only ``[Errno 30] Read-only file system: 'cache/sql'``."""
    import errno

    if not isinstance(error, OSError) or not error.filename:
        return str(error)
    where = ("point packtrain at a writable place: --cache-dir (CACHE_DIR) for builds, train.output_dir for runs")
    if error.errno == errno.EROFS:
        return f"{error.filename} cannot be written: it is on a read-only file system; {where}"
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"{error.filename}: {error.strerror}; give this user access to it, or {where}"
    return str(error)


class Interrupted(PacktrainError):
    """A command stopped by SIGINT or SIGTERM after it saved what it had (training: a checkpoint at the step
    boundary, trainer/run/interrupts.py). The CLI prints the message as one line, not as an error, and exits
    with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a shell reports a command that
    the signal ended: what SLURM and Kubernetes expect of a pre-empted job."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
