"""File input and output for every command: JSON in with one-line errors, outputs written whole.

Reading refuses what is not a regular file before opening it (a FIFO would block, a
device never ends), caps the size, needs UTF-8, and parses JSON strictly: no NaN or
Infinity, no number that overflows a float, no key given twice.

Writing is staged: every output of a command is first written to a temporary file next
to it, and only when all of them are complete are they renamed into place, so a bad
second output leaves the first untouched. A regular file keeps its mode (a new one gets
the user's umask, like a shell redirection); a character device or FIFO (`-o /dev/null`)
is written through, never replaced. `check_outputs` refuses bad paths before any work.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

from pydantic import BaseModel, ValidationError

from optimizer.errors import InputError

Model = TypeVar("Model", bound=BaseModel)

# The largest input file read: a schedule at the size limit (optimizer/problem.py) is
# about 5 MB of JSON, so 64 MiB leaves room for indentation and metadata.
MAX_INPUT_BYTES = 64 * 2**20
# JSON values and containers (objects and lists) an input may hold, counted on the text
# before parsing. A schedule at the size limit has one object per op (50000) and about 7
# values each, so these leave room; without them a hostile file of millions of `{}` or
# keys under 64 MiB costs gigabytes, in parsing and in a validation error for every item.
MAX_JSON_VALUES = 2_000_000
MAX_JSON_CONTAINERS = 60_000


# A message longer than this is cut: it may quote a whole input (a 100 kB option value, a
# file's contents), and what names the field or the file comes first (a per-device list
# at 256 devices takes about 2,500).
MAX_MESSAGE = 4000


def one_line(text: str) -> str:
    """Messages reach the user as one line, even when they quote a name with a newline, and
    with any other control character they quote (an option's value, a file's cell) escaped;
    at most MAX_MESSAGE characters of it."""
    line = _escaped(" ".join(str(text).split("\n")).replace("\r", " "))
    if len(line) <= MAX_MESSAGE:
        return line
    return f"{line[:MAX_MESSAGE]}... (message cut, {len(line)} characters in all)"


def _escaped(text: str) -> str:
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def clipped(text: str, most: int = 40) -> str:
    """Input quoted in a message: at most `most` characters (a name may be megabytes long)."""
    return text if len(text) <= most else text[:most] + "..."


def printable(text: str, most: int = 80) -> str:
    """A name read from a file, safe to print on a terminal: control characters (escape
    sequences, newlines) escaped, at most `most` characters."""
    return clipped(_escaped(text), most)


def describe_validation_error(error: ValidationError) -> str:
    """The first problem pydantic found, as `field.path: message`."""
    errors = error.errors()
    first = errors[0]
    # A field that takes a number or a list reports both branches: the deepest error of
    # that field says where the input went wrong (a list's item, not "a valid number").
    same_field = [e for e in errors if e["loc"][:1] == first["loc"][:1]]
    first = max(same_field, key=lambda e: len(e["loc"]))
    # Union branches appear in the location as type tags ("constrained-float"); fields and indices name the place.
    location = ".".join(str(part) for part in first["loc"] if not isinstance(part, str) or part.isidentifier())
    if first["type"] == "extra_forbidden" and first["loc"]:
        unknown = str(first["loc"][-1])
        shown = ascii(clipped(unknown))
        parent = ".".join(str(part) for part in first["loc"][:-1])
        return f"{parent + ': ' if parent else ''}unknown field {shown}"
    message = first["msg"]
    # Our own model validators raise ValueError whose text already names the field.
    message = message.removeprefix("Value error, ")
    if first["type"] == "value_error" and ":" in message.split(" ", 1)[0]:
        return message
    return f"{location}: {message}" if location else message


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_input_file(path: str | Path, limit: int = MAX_INPUT_BYTES) -> None:
    """That `path` is a regular file of at most `limit` bytes, without reading it;
    InputError naming the file otherwise."""
    path = Path(path)
    try:
        info = path.stat()  # the type is checked before opening: opening a FIFO blocks
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{path}: is {_file_kind(info.st_mode)}, not a file")
    if info.st_size > limit:
        raise InputError(f"{path}: {info.st_size} bytes is more than the {limit} bytes pipesched reads")


def read_input_bytes(path: str | Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; InputError naming the file otherwise."""
    path = Path(path)
    check_input_file(path, limit)
    try:
        # O_NONBLOCK: should the path have become a FIFO since the check, do not wait for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc.__class__.__name__})") from None
    if len(data) > limit:
        raise InputError(f"{path}: more than the {limit} bytes pipesched reads")
    return data


class _BadJson(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    data: dict = {}
    for key, value in pairs:
        if key in data:
            raise _BadJson(f"key {key!r} appears twice in one object")
        data[key] = value
    return data


# Digits of the longest integer read: far beyond any field's range (counts, sizes, seeds).
_MAX_INT_DIGITS = 30


class _Refused:
    """A number the parser met and refused (NaN, Infinity, an overflow, too many digits),
    left in place so that the error can name the field holding it (`_first_in`)."""

    def __init__(self, why: str) -> None:
        self.why = why


class _Numbers:
    """The parser's number hooks for one file: finite floats and short integers as they
    are, the others as _Refused; `refused` tells whether the parsed data holds one (so that
    only then is it walked)."""

    def __init__(self) -> None:
        self.refused = False

    def _refuse(self, why: str) -> _Refused:
        self.refused = True
        return _Refused(why)

    def constant(self, name: str) -> _Refused:
        return self._refuse(f"{name} is not a number pipesched accepts (only finite numbers)")

    def finite_float(self, text: str) -> float | _Refused:
        value = float(text)
        return value if math.isfinite(value) else self._refuse(f"{text} overflows a 64-bit float")

    def short_int(self, text: str) -> int | _Refused:
        digits = len(text.lstrip("-"))
        if digits > _MAX_INT_DIGITS:
            return self._refuse(f"an integer of {digits} digits is out of range for every field")
        return int(text)


def _first_in(data: object, wanted: Callable[[object], bool]) -> tuple[str, object] | None:
    """The first key or value of parsed JSON, in the file's order, that is `wanted`, with
    its dotted path ("stages.0.forward", "" at the top); None when there is none."""
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        path, item = stack.pop()
        if wanted(item):
            return path, item
        children = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        # reversed onto the stack, so the first child is looked at first; a key before its value
        for key, value in reversed(list(children)):
            inner = f"{path}.{key}" if path else str(key)
            stack.append((inner, value))
            if isinstance(key, str):
                stack.append((inner, key))
    return None


# A \uXXXX escape of a UTF-16 surrogate: only then can a decoded string hold a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(item: object) -> bool:
    """Whether `item` is a string holding a lone UTF-16 surrogate, which no file or
    terminal can encode."""
    return isinstance(item, str) and any("\ud800" <= char <= "\udfff" for char in item)


def _refuse_oversized(text: str, source: str) -> None:
    """Refuse JSON text with more values or containers than any valid input holds.

    Counted on the characters (separators and openings inside strings count too: only a
    hostile file has millions of them)."""
    containers = text.count("{") + text.count("[")
    if containers > MAX_JSON_CONTAINERS:
        raise InputError(
            f"{source}: {containers} JSON objects and lists is more than the {MAX_JSON_CONTAINERS} pipesched reads (README, Size limits)"
        )
    values = containers + text.count(",") + text.count(":")
    if values > MAX_JSON_VALUES:
        raise InputError(f"{source}: about {values} JSON values is more than the {MAX_JSON_VALUES} pipesched reads (README, Size limits)")


def parse_json(text: str, source: str) -> object:
    """Strict JSON: finite numbers only, no duplicate keys, no lone surrogates in strings,
    no more values than any valid input holds; errors name `source` (and the field, for
    a number refused)."""
    _refuse_oversized(text, source)
    try:
        numbers = _Numbers()
        data = json.loads(
            text,
            object_pairs_hook=_no_duplicate_keys,
            parse_constant=numbers.constant,
            parse_float=numbers.finite_float,
            parse_int=numbers.short_int,
        )
        if numbers.refused and (refused := _first_in(data, lambda item: isinstance(item, _Refused))) is not None:
            path, number = refused
            why = cast(_Refused, number).why
            raise _BadJson(f"{path}: {why}" if path else why)
        if _SURROGATE_ESCAPE.search(text) and (bad := _first_in(data, _lone_surrogate)) is not None:
            raise _BadJson(f"a string holds an unpaired UTF-16 surrogate ({cast(str, bad[1])[:20]!a})")
        return data
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except _BadJson as exc:
        raise InputError(f"{source}: {exc}") from None
    except RecursionError:
        raise InputError(f"{source}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise InputError(f"{source}: not valid JSON ({one_line(str(exc))})") from None


def read_input_text(path: str | Path, limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of an input file (`read_input_bytes`'s checks); InputError naming it otherwise."""
    try:
        return read_input_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def read_json(path: str | Path, limit: int = MAX_INPUT_BYTES) -> object:
    return parse_json(read_input_text(path, limit).removeprefix("\ufeff"), str(path))


def json_kind(value: object) -> str:
    """What a parsed JSON value is, in JSON's words ("a list", "null"), for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    names = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def validate_model(model: type[Model], data: object, source: str) -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{source}: {describe_validation_error(exc)}") from None
    except RecursionError:
        raise InputError(f"{source}: nested too deeply") from None


def read_model(model: type[Model], path: str | Path) -> Model:
    return validate_model(model, read_json(path), str(path))


# ------------------------------------------------------------------------------ output


def _write_through(mode: int) -> bool:
    """Character devices and FIFOs are written into, never replaced (`-o /dev/null`)."""
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def writes_stdout(path: str | Path) -> bool:
    """Whether `path` is this process's standard output (e.g. /dev/stdout, or a file
    standard output is redirected to)."""
    try:
        given, stdout = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such file, or stdout is no real file
        return False
    return (given.st_dev, given.st_ino) == (stdout.st_dev, stdout.st_ino)


# Names of this process's own open files: /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N.
_PROCESS_FD = re.compile(r"^/(?:dev/fd|proc/self/fd)/(\d+)$")


def process_fd(path: str | Path) -> int | None:
    """The file descriptor `path` names when it names one of this process's open files
    (`-o /dev/stdout`), else None. Such an output is written into the descriptor, at its
    offset: resolved and replaced like a file, a redirected stdout lost what was written
    around it, and a second write replaced /dev/stdout itself (a deleted file's link)."""
    text = os.fspath(path)
    named = {"/dev/stdout": 1, "/dev/stderr": 2}.get(text)
    found = _PROCESS_FD.match(text)
    return named if named is not None else int(found[1]) if found else None


def output_target(path: str | Path) -> Path:
    """Where writing `path` lands: its symbolic links followed; a link that names no path
    (/dev/stdout on a pipe points at "pipe:[...]") is written through as given."""
    if process_fd(path) is not None:
        return Path(path)  # written into the descriptor (write_outputs), never resolved
    resolved = Path(os.path.realpath(path))
    try:
        if not resolved.exists() and os.path.exists(path):
            return Path(path)
    except OSError:  # a name too long, say: the checks that follow name the error
        pass
    return resolved


# Bytes of an output's name kept in its temporary file's name: the rest of that name (a
# dot before, 8 random characters and ".tmp" after) must fit the 255 bytes a name may have.
_TEMPORARY_NAME_BYTES = 200


def _temporary_prefix(target: Path) -> str:
    """The temporary file's name start for `target`: its name, cut to fit a file name."""
    kept = target.name.encode("utf-8", "surrogateescape")[:_TEMPORARY_NAME_BYTES]
    return f".{kept.decode('utf-8', 'ignore')}."


def check_outputs(outputs: Iterable[str | Path | None], inputs: Iterable[str | Path | None] = ()) -> None:
    """Refuse, before any work, an output that cannot be written or would overwrite an input.

    Outputs given twice, a directory, a socket or block device, an input file of the same
    command, or a folder that does not exist or is not writable are refused.
    """
    wanted = [Path(p) for p in outputs if p is not None]
    inputs_stat = []
    for p in inputs:
        if p is None:
            continue
        try:
            inputs_stat.append((Path(p), Path(p).stat()))
        except OSError:
            continue
    seen: list[Path] = []
    for path in wanted:
        target = output_target(path)
        if target in seen:
            raise InputError(f"{path}: given as two outputs")
        seen.append(target)
        if (fd := process_fd(path)) is not None:
            try:
                os.fstat(fd)
            except OSError:
                raise InputError(f"{path}: this process has no file descriptor {fd} open") from None
            continue
        try:
            info = target.stat()
        except FileNotFoundError:
            info = None
        except OSError as exc:
            raise InputError(f"{path}: cannot write ({exc.strerror or exc.__class__.__name__})") from None
        if info is not None:
            if not (stat.S_ISREG(info.st_mode) or _write_through(info.st_mode)):
                raise InputError(f"{path}: is {_file_kind(info.st_mode)}; give a file name")
            for name, input_info in inputs_stat:
                if _same_file(info, input_info):
                    raise InputError(f"{path}: is also the input {name}; write the output to another file")
            if _write_through(info.st_mode):
                continue
            # access() says yes to root whatever the mode: a file without its owner's write
            # bit is read-only for everyone here.
            if not os.access(target, os.W_OK) or not info.st_mode & stat.S_IWUSR:  # replacing it would bypass its mode
                raise InputError(f"{path}: is read-only; make it writable or write another file")
        folder = target.parent
        # A symbolic link is written where it points: name that folder when it differs.
        shown = path.parent if os.path.realpath(path.parent) == str(folder) else folder
        if not folder.is_dir():
            raise InputError(f"{path}: folder {shown} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise InputError(f"{path}: folder {shown} is not writable")
        try:  # access() says yes to root everywhere: try it, as the write will
            fd, probe = tempfile.mkstemp(prefix=_temporary_prefix(target), suffix=".tmp", dir=folder)
        except OSError as exc:
            raise InputError(f"{path}: cannot write in {path.parent} ({exc.strerror or exc.__class__.__name__})") from None
        os.close(fd)
        os.unlink(probe)


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o022)  # no /proc: read it the only other way, and put it back
    os.umask(current)
    return current


@dataclass
class _Staged:
    path: Path
    target: Path
    text: str
    tmp: str | None = None


def write_outputs(outputs: Sequence[tuple[str | Path, str]]) -> None:
    """Write every (path, text) or none: each to a temporary file first, then all renamed.

    Readers see the old content or the whole new one. Errors (a full disk, a folder that
    is not writable) are InputError naming the path; no temporary file is left behind.
    """
    staged = [_Staged(Path(path), output_target(path), text) for path, text in outputs]
    check_outputs([s.path for s in staged])
    current: _Staged | None = None
    try:
        for current in staged:
            if process_fd(current.path) is not None:
                continue
            try:
                info: os.stat_result | None = current.target.stat()
            except FileNotFoundError:
                info = None
            if info is not None and _write_through(info.st_mode):
                continue
            keep = stat.S_IMODE(info.st_mode) if info is not None else 0o666 & ~_umask()
            fd, current.tmp = tempfile.mkstemp(prefix=_temporary_prefix(current.target), suffix=".tmp", dir=current.target.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                os.fchmod(handle.fileno(), keep)
                if info is not None and os.geteuid() == 0 and (info.st_uid, info.st_gid) != (0, 0):
                    os.fchown(handle.fileno(), info.st_uid, info.st_gid)  # root rewriting a user's file keeps it theirs
                handle.write(current.text)
                handle.flush()
                os.fsync(handle.fileno())  # a full disk shows here, before anything is replaced
        for current in staged:  # devices and FIFOs first: they are the ones that can still fail
            if (descriptor := process_fd(current.path)) is not None:
                _write_fd(descriptor, current.text)
            elif current.tmp is None:
                _write_into(current.target, current.text)
        for current in staged:
            if current.tmp is not None:
                os.replace(current.tmp, current.target)
                current.tmp = None
    except OSError as exc:
        name = current.path if current is not None else "output"
        if exc.errno == errno.ENXIO:  # a FIFO without a reader, or a device with nothing behind it
            what = "a FIFO that no process reads" if _is_fifo(name) else f"no device behind it ({exc.strerror})"
            raise InputError(f"{name}: {what}") from None
        raise InputError(f"{name}: cannot write ({exc.strerror or exc.__class__.__name__})") from None
    finally:
        for s in staged:
            if s.tmp is not None:
                Path(s.tmp).unlink(missing_ok=True)


def _write_into(target: Path, text: str) -> None:
    # O_NONBLOCK: a FIFO nobody reads fails at once (ENXIO) instead of hanging.
    fd = os.open(target, os.O_WRONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        os.set_blocking(fd, True)
        _write_all(fd, text)
    finally:
        os.close(fd)


def _write_fd(fd: int, text: str) -> None:
    """Write into one of this process's open descriptors, after what Python's own streams
    on it hold (at the descriptor's offset: a redirected stdout keeps what came before)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and stream.fileno() == fd:
                stream.flush()
        except (OSError, ValueError, AttributeError):  # a stream with no descriptor (a test's capture)
            pass
    _write_all(fd, text)


def _write_all(fd: int, text: str) -> None:
    data = text.encode("utf-8")
    while data:
        written = os.write(fd, data)
        data = data[written:]


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write one file so that readers see the old content or the whole new one, never a part."""
    write_outputs([(path, text)])


# Above this size an output is written without indentation: Python's indenting encoder
# is pure Python and takes seconds on a schedule at the size limit, the compact one does not.
_INDENT_UP_TO_BYTES = 1_000_000


def json_text(data: object) -> str:
    compact = json.dumps(data, allow_nan=False)
    if len(compact) > _INDENT_UP_TO_BYTES:
        return compact + "\n"
    return json.dumps(data, indent=1, allow_nan=False) + "\n"


def write_json_atomic(path: str | Path, data: object) -> None:
    write_outputs([(path, json_text(data))])


def _is_fifo(path: str | os.PathLike[str]) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False
