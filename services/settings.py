"""Typed, frozen settings built once at start from the environment and flags.

Every service describes its settings as a frozen dataclass whose fields carry
the environment variable they come from (`setting(env=...)`). `load_settings`
is the one loader: defaults, then the environment, then explicit overrides
(usually parsed flags), each value converted to the field's declared type.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

SettingsT = TypeVar("SettingsT")


class SettingsError(ValueError):
    """A setting is missing or cannot be converted to its declared type."""


def setting(*, env: str, default: Any = dataclasses.MISSING, help: str = "") -> Any:
    """Declare a settings field read from environment variable `env`."""
    metadata = {"env": env, "help": help}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=metadata)
    if isinstance(default, list | dict | set):
        raise SettingsError("mutable defaults are not allowed; use a tuple")
    return dataclasses.field(default=default, metadata=metadata)


def _convert(raw: str, annotation: Any, name: str) -> Any:
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in arguments if a is not type(None)]
        if raw == "":
            return None
        return _convert(raw, non_none[0], name)
    if origin is tuple:
        item_type = arguments[0] if arguments else str
        return tuple(_convert(part.strip(), item_type, name) for part in raw.split(",") if part)
    if annotation is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{name}: expected a boolean, got {raw!r}")
    if annotation is int:
        try:
            return int(raw)
        except ValueError as error:
            raise SettingsError(f"{name}: expected an integer, got {raw!r}") from error
    if annotation is Path:
        return Path(raw)
    if annotation is str:
        return raw
    raise SettingsError(f"{name}: unsupported settings type {annotation!r}")


def load_settings(
    cls: type[SettingsT],
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SettingsT:
    """Build `cls` from defaults, then `environ`, then non-None `overrides`."""
    if not dataclasses.is_dataclass(cls):
        raise SettingsError(f"{cls!r} is not a settings dataclass")
    environment = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        env_name = field.metadata.get("env")
        if env_name and env_name in environment:
            values[field.name] = _convert(environment[env_name], hints[field.name], env_name)
        if overrides and overrides.get(field.name) is not None:
            values[field.name] = overrides[field.name]
    try:
        return cls(**values)
    except TypeError as error:
        raise SettingsError(f"missing settings for {cls.__name__}: {error}") from error


@dataclasses.dataclass(frozen=True)
class SettingDescription:
    """One setting as documentation and `--help` show it."""

    field: str
    env: str
    help: str
    type: str  # what the environment variable holds, in words: "integer", "path", ...
    default: Any  # dataclasses.MISSING when the setting is required


def describe_settings(cls: type[Any]) -> list[SettingDescription]:
    """Each field of settings class `cls`: its variable, help, type and default."""
    hints = typing.get_type_hints(cls)
    return [
        SettingDescription(
            field=field.name,
            env=field.metadata.get("env", ""),
            help=field.metadata.get("help", ""),
            type=type_name(hints[field.name]),
            default=field.default,
        )
        for field in dataclasses.fields(cls)
    ]


def type_name(annotation: Any) -> str:
    """What `_convert` reads for `annotation`, in words."""
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in arguments if a is not type(None)]
        return f"{type_name(non_none[0])}, or empty for none"
    if origin is tuple:
        item_type = arguments[0] if arguments else str
        items = "" if item_type is str else f" of {type_name(item_type)}s"
        return f"comma-separated list{items}"
    names = {bool: "boolean", int: "integer", Path: "path", str: "text"}
    return names.get(annotation, repr(annotation))
