"""File input and output: pydantic models from JSON with one-line errors, atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from optimizer.errors import InputError

Model = TypeVar("Model", bound=BaseModel)


def describe_validation_error(error: ValidationError) -> str:
    """The first problem pydantic found, as `field.path: message`."""
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    message = first["msg"]
    # Our own model validators raise ValueError whose text already names the field.
    message = message.removeprefix("Value error, ")
    if first["type"] == "value_error" and ":" in message.split(" ", 1)[0]:
        return message
    return f"{location}: {message}" if location else message


def read_json(path: str | Path) -> object:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({exc.__class__.__name__})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None


def validate_model(model: type[Model], data: object, source: str) -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{source}: {describe_validation_error(exc)}") from None


def read_model(model: type[Model], path: str | Path) -> Model:
    return validate_model(model, read_json(path), str(path))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a file so that readers see the old content or the whole new one, never a part."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"{path}: folder {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, data: object) -> None:
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")
