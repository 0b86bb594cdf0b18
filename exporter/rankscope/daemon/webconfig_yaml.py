"""Strict YAML for the web config, read as exporter-toolkit's Go parser reads it (yaml.v2's
UnmarshalStrict into typed fields): an unknown or repeated key is an error, so a typo or a
second, empty `basic_auth_users:` never leaves the daemon open; each scalar converts as a Go
field of its type takes it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
# yaml.v2 reads these plain scalars as booleans (YAML 1.1); PyYAML leaves out y/Y/n/N.
_TRUE = frozenset(["y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"])
_FALSE = frozenset(["n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"])
# Go's time.ParseDuration: a sequence of decimal numbers, each with a unit.
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class WebConfigError(ValueError):
    """The web config file cannot be used; the message names the file and the key."""


class Reader:
    """Typed reads of a composed YAML document; every error names ``source`` and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, message: str) -> WebConfigError:
        return WebConfigError(f"{self.source}: {message}")

    def document(self, text: str) -> yaml.Node | None:
        try:
            return yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            raise self.error(f"not valid YAML: {exc}") from exc

    def mapping(
        self, node: yaml.Node | None, where: str, allowed: tuple[str, ...] | None = None
    ) -> dict[str, yaml.Node]:
        """The keys of a mapping (none for null); ``allowed`` None takes any key."""
        if node is None or is_null(node):
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.error(f"{where} must be a mapping")
        out: dict[str, yaml.Node] = {}
        for key_node, value in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                raise self.error(f"{where} has a key that is not a plain name")
            key = key_node.value
            if key in out:
                raise self.error(
                    f"{key!r} appears twice in {where} (line {key_node.start_mark.line + 1}); "
                    "one would silently override the other"
                )
            out[key] = value
        if allowed is not None:
            unknown = sorted(k for k in out if k not in allowed)
            if unknown:
                raise self.error(
                    f"unknown key(s) {', '.join(unknown)} in {where} (known: {', '.join(allowed)})"
                )
        return out

    def string(self, node: yaml.Node | None, where: str) -> str:
        """Any scalar's text, as a Go string field takes it; "" for null or absent."""
        if node is None or is_null(node):
            return ""
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(f"{where} must be a string")
        return str(node.value)

    def strings(self, node: yaml.Node | None, where: str) -> tuple[str, ...]:
        if node is None or is_null(node):
            return ()
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(f"{where} must be a list")
        return tuple(self.string(item, f"{where}[{i}]") for i, item in enumerate(node.value))

    def boolean(self, node: yaml.Node | None, where: str, default: bool) -> bool:
        if node is None:
            return default
        if is_null(node):
            return False  # yaml.v2 sets the zero value
        plain = isinstance(node, yaml.ScalarNode) and (node.style is None or node.tag == _BOOL)
        if plain and node.value in _TRUE | _FALSE:
            return node.value in _TRUE
        raise self.error(f"{where} must be true or false, not {_shown(node)}")

    def integer(self, node: yaml.Node | None, where: str) -> int:
        if node is None or is_null(node):
            return 0
        if isinstance(node, yaml.ScalarNode) and node.tag == _INT:
            return int(_construct(node))
        raise self.error(f"{where} must be an integer, not {_shown(node)}")

    def duration(self, node: yaml.Node | None, where: str) -> float:
        """Seconds, from a Go duration ("1m30s") or an integer of nanoseconds, as yaml.v2
        reads a time.Duration."""
        if node is None or is_null(node):
            return 0.0
        if isinstance(node, yaml.ScalarNode) and node.tag == _INT:
            return int(_construct(node)) * 1e-9
        text = self.string(node, where)
        seconds = go_duration(text)
        if seconds is None:
            raise self.error(f"{where} {text!r} is not a duration (like 1s, 500ms, 1m30s)")
        return seconds


def is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL


def go_duration(text: str) -> float | None:
    """Seconds of a Go duration string, None when Go's time.ParseDuration refuses it."""
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in "+-" else text
    body = body.replace("µ", "u").replace("μ", "u")  # Go takes either micro sign for us
    if body == "0":
        return 0.0
    if not body or _DURATION_PART.sub("", body):
        return None
    return sign * sum(
        float(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(body)
    )


def _construct(node: yaml.Node) -> Any:
    return yaml.SafeLoader("").construct_object(node)


def _shown(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return repr(node.value[:40])
    return "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
