"""The record's codec: a kind declares each field once with what it holds
(``reserved: int | None = nbytes()``); its JSON (``to_json``) and its validated ``parse``
follow, in declaration order. A byte count is a non-negative integer below MAX_BYTES (signed
for a residual), a count an integer not a bool, a time finite. A bad value becomes None (or
the field's empty value) and its dotted name, ``WHERE`` and field (``mark.torch.reserved``),
goes to ``bad``: the line is kept. A ``required`` field missing or wrong: ``parse`` is None."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, field, fields
from functools import cache, partial
from typing import Any, ClassVar, NamedTuple, TypeVar

# Far deeper than any record the probe writes, with room for a user's extra; a line nested
# past it is skipped before the JSON parser recurses into it.
MAX_DEPTH = 64
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_OPEN_CLOSE = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[{]}")

# No card holds a pebibyte: a byte count at or past 2**50 is a corrupted value, not a reading.
MAX_BYTES = 1 << 50

Json = dict[str, Any]
Bad = list[str]  # names of the fields a parse rejected, e.g. "mark.torch.reserved"
# A validator: (raw value, bad, dotted name) -> the value, or None and the name in bad.
Parse = Callable[[Any, Bad, str], Any]


def nested_deeper_than(text: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON ``text`` nests arrays and objects more than ``limit`` deep, found
    without parsing it: outside its strings, innermost bracket pairs are peeled off a level
    at a time (C-speed passes, at most ``limit`` of them)."""
    if text.count(b"[") + text.count(b"{") <= limit:
        return False
    shape = _STRING.sub(b"", text).translate(_OPEN_CLOSE, _NOT_BRACKET)
    for depth in range(limit + 1):
        if b"()" not in shape:
            # What is left never closes; each unclosed opener is one more level.
            return depth + shape.count(b"(") > limit
        shape = shape.replace(b"()", b"")
    return True


def reject(value: Any, bad: Bad, name: str) -> Any:
    """A value of the wrong shape: null stays null, anything else is named in ``bad``."""
    if value is not None:
        bad.append(name)
    return None


def _checker(ok: Callable[[Any], bool], convert: Callable[[Any], Any] | None = None) -> Parse:
    def parse(value: Any, bad: Bad, name: str) -> Any:
        if value is not None and ok(value):
            return value if convert is None else convert(value)
        return reject(value, bad, name)

    return parse


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_ints(v: Any) -> bool:
    return isinstance(v, list) and all(type(x) is int for x in v)


as_count = _checker(lambda v: _is_int(v) and 0 <= v < MAX_BYTES)  # bytes, or events
as_int = _checker(lambda v: _is_int(v) and abs(v) < MAX_BYTES)  # an index, a rank, a residual
as_time = _checker(lambda v: (_is_int(v) or isinstance(v, float)) and math.isfinite(v), float)
as_text = _checker(lambda v: isinstance(v, str))
as_bool = _checker(lambda v: isinstance(v, bool))
as_ints = _checker(_is_ints)  # a group's ranks, a pool id, a pid namespace path
as_int_tuple = _checker(_is_ints, tuple)
as_strings = _checker(lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), tuple)


def as_whole(value: Any, bad: Bad, name: str) -> int | None:
    """Any integer that is not a bool (a pid, the schema version): no bound, never bad."""
    return value if _is_int(value) else None


def as_object(value: Any, bad: Bad, name: str) -> Mapping[str, Any]:
    """A nested object; an absent one reads as empty (every field null)."""
    return value if isinstance(value, dict) else reject(value, bad, name) or {}


def as_count_by_int(value: Any, bad: Bad, name: str) -> dict[int, int | None] | None:
    """``{"12": n}`` (a JSON object's keys are strings) -> ``{12: n}``, each n a count."""
    if not isinstance(value, dict):
        return reject(value, bad, name)
    out: dict[int, int | None] = {}
    for key, n in value.items():
        try:
            number = int(key)
        except ValueError:
            bad.append(name)
            continue
        out[number] = as_count(n, bad, name)
    return out


def as_list(value: Any) -> list[Any] | None:
    return None if value is None else list(value)


def str_keys(value: Mapping[Any, Any] | None) -> Json | None:
    return None if value is None else {str(k): v for k, v in value.items()}


def json_of_each(value: Mapping[str, Codec] | None) -> Json | None:
    return None if value is None else {name: v.to_json() for name, v in value.items()}


class Spec(NamedTuple):
    parse: Parse | None  # None: the kind parses the field itself
    encode: Callable[[Any], Any] | None  # None: the value is its own JSON
    required: bool
    section: type[Codec] | None = None  # a nested object of this kind


def custom(
    parse: Parse | None,
    encode: Callable[[Any], Any] | None = None,
    *,
    default: Any = None,
    factory: Any = MISSING,
    required: bool = False,
    section: type[Codec] | None = None,
) -> Any:
    """A field: ``parse`` validates its raw value, ``encode`` makes its JSON. A required field
    has no default; ``default=MISSING`` makes one that is not required."""
    if required or factory is not MISSING:
        default = MISSING
    meta = {Spec: Spec(parse, encode, required, section)}
    return field(default=default, default_factory=factory, metadata=meta)


count = nbytes = partial(custom, as_count)
integer = signed_bytes = partial(custom, as_int)
whole = partial(custom, as_whole, required=True)
time = partial(custom, as_time)
text = partial(custom, as_text)
boolean = partial(custom, as_bool)
flag = partial(custom, lambda v, bad, name: v is True, default=False)  # true only if written so
ints = partial(custom, as_ints)
ints_tuple = partial(custom, as_int_tuple, as_list)
strings = partial(custom, lambda v, bad, name: as_strings(v, bad, name) or (), list, default=())


def section(cls: type[Codec], *, optional: bool = False) -> Any:
    """A nested object of kind ``cls``; absent, it reads as ``cls()``, or None if ``optional``."""

    def parse(value: Any, bad: Bad, name: str) -> Any:
        if optional and not isinstance(value, dict):  # null, or a counted bad field
            return reject(value, bad, name)
        return parse_section(cls, as_object(value, bad, name), bad)

    return custom(
        parse,
        lambda v: None if v is None else v.to_json(),
        factory=MISSING if optional else cls,
        section=cls,
    )


def sections(cls: type[Codec]) -> Any:
    """Name -> nested object of kind ``cls``; an entry that is no object is bad and left out."""

    def parse(value: Any, bad: Bad, name: str) -> dict[str, Any]:
        out = {}
        for key, raw in as_object(value, bad, name).items():
            if isinstance(raw, dict):
                out[key] = parse_section(cls, raw, bad)
            else:
                bad.append(name)
        return out

    return custom(parse, json_of_each, factory=dict)


@cache
def plan(cls: type) -> list[tuple[str, Spec, str]]:
    """``cls``'s fields in declaration order: (name, spec, dotted name)."""
    where = getattr(cls, "WHERE", "")
    none = Spec(None, None, False)
    return [(f.name, f.metadata.get(Spec, none), f"{where}.{f.name}") for f in fields(cls)]


def encode_fields(obj: Any, cls: type) -> Json:
    """``obj``'s fields of ``cls`` as a JSON object, in declaration order."""
    out: Json = {}
    for name, (_, encode, *_), _ in plan(cls):
        value = getattr(obj, name)
        out[name] = value if encode is None else encode(value)
    return out


def parse_fields(cls: type, obj: Mapping[str, Any], bad: Bad) -> dict[str, Any] | None:
    """The validated values of ``cls``'s declared fields in ``obj``; None when a required one
    is missing or wrong (checked first, so a rejected object names no field in ``bad``)."""
    entries = plan(cls)
    for name, (parse, _, required, _), label in entries:
        if required and parse is not None and parse(obj.get(name), [], label) is None:
            return None
    return {
        name: parse(obj.get(name), bad, label)
        for name, (parse, *_), label in entries
        if parse is not None
    }


T = TypeVar("T", bound="Codec")


def parse_section(cls: type[T], obj: Mapping[str, Any], bad: Bad) -> T:
    """``cls.parse`` of a kind with no required field, which always parses."""
    section = cls.parse(obj, bad)
    assert section is not None
    return section


class Codec:
    """The base of every typed section and kind, named in its class statement:
    ``class Mark(Codec, kind="mark", stream="marks", where="mark")`` (its ``kind`` string, the
    file it goes to, its fields' prefix in ``bad``). A kind overrides either method where its
    wire shape is special (reusing encode_fields / parse_fields)."""

    __slots__ = ()
    KIND: ClassVar[str] = ""
    STREAM: ClassVar[str] = ""
    WHERE: ClassVar[str] = ""

    def __init_subclass__(cls, kind: str = "", stream: str = "", where: str = "") -> None:
        # Only those given: dataclass(slots=True) makes the class again, without keywords.
        for name, value in (("KIND", kind), ("STREAM", stream), ("WHERE", where)):
            if value:
                setattr(cls, name, value)

    def to_json(self) -> Json:
        return encode_fields(self, type(self))

    @classmethod
    def parse(cls: type[T], obj: Mapping[str, Any], bad: Bad) -> T | None:
        values = parse_fields(cls, obj, bad)
        return None if values is None else cls(**values)
