"""How a task function's arguments become one JSON object and its result a JSON value, and back
(docs/app.md, "The envelope").

A call is sent as an object with one member per argument the caller gave, named as the
parameter (defaults are not sent: the function applies them where it runs). That object is what
a worker in any language reads, and what `cronoq submit --kind ...` can write by hand.

Decoding checks each member against the parameter's annotation and builds the declared type
(dataclasses, enums, `Literal`s, containers, optionals, pydantic-style models), so a payload
from outside fails with a message naming the parameter instead of deep inside the function.
Everything is compiled once per function, on first use: annotations may name classes defined
after the decorator ran.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

__all__ = ["ArgumentError", "Bound", "Signature", "plain"]

Convert = Callable[[Any], Any]
_P = inspect.Parameter
_PRIMITIVES: frozenset[type] = frozenset({str, int, float, bool, type(None)})


class Bound(dict[str, Any]):
    """The envelope object of a call made in this process. In library mode the executor gets
    this very object, so when no member needs building it calls the function with the
    caller's own values, as a direct call would; decoded payloads are always checked."""

    __slots__ = ()


class ArgumentError(ValueError):
    """A payload that does not fit the function's parameters (the task fails permanently)."""


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


# --- Python values to plain JSON data -----------------------------------------------------------


def plain(value: Any) -> Any:
    """`value` as JSON data: dataclasses and models as objects, enums as their values, dates as
    ISO 8601 text, tuples and sets as arrays. Anything else is left for the codec to refuse."""
    cls = type(value)
    if cls in _PRIMITIVES:
        return value
    if cls is list or cls is tuple or isinstance(value, (set, frozenset, tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(plain(k)) if not isinstance(k, str) else k: plain(v) for k, v in value.items()}
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # init=False fields are computed by the class: building it again recomputes them
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return value


def _needs_plain(tp: Any) -> bool:
    """Whether values of annotation `tp` may need `plain` (False only for JSON's own types)."""
    if tp in _PRIMITIVES or tp is Any:
        return False
    origin = get_origin(tp)
    if origin is Literal:
        return any(isinstance(v, enum.Enum) for v in get_args(tp))
    if origin in (Union, types.UnionType, list, dict, Sequence, Mapping):
        return any(_needs_plain(a) for a in get_args(tp))
    return True


# --- plain JSON data to the annotated types -----------------------------------------------------


def _compile(tp: Any, owner: Any) -> Convert | None:
    """A function checking a decoded JSON value against `tp` and building it; None when any
    value is accepted as it is. It raises ArgumentError saying what was expected."""
    if tp is Any or tp is object or tp is inspect.Parameter.empty:
        return None
    if tp is type(None) or tp is None:
        return _exact(type(None), "null")
    if tp is bool:
        return _exact(bool, "a boolean")
    if tp is str:
        return _exact(str, "a string")
    if tp is int:
        return _int
    if tp is float:
        return _float
    if isinstance(tp, typing.TypeVar):
        return None
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is typing.Annotated:
        return _compile(args[0], owner)
    if origin is Literal:
        return _literal(args)
    if origin in (Union, types.UnionType):
        return _union([_compile(a, owner) for a in args], tp)
    if origin in (list, Sequence, set, frozenset, tuple) or tp in (list, tuple, set, frozenset):
        return _array(origin or tp, args, owner)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        key = _key(args[0]) if len(args) == 2 else None
        item = _compile(args[1], owner) if len(args) == 2 else None
        return _object(key, item)
    if isinstance(tp, type):
        return _class(tp)
    return None  # a typing construct we do not check (Callable, NewType, ...)


def _exact(cls: type, expected: str) -> Convert:
    def check(value: Any) -> Any:
        if type(value) is not cls:
            raise ArgumentError(f"expected {expected}, got {_shown(value)}")
        return value

    return check


def _int(value: Any) -> int:
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer():
        return int(value)
    raise ArgumentError(f"expected an integer, got {_shown(value)}")


def _float(value: Any) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise ArgumentError(f"expected a number, got {_shown(value)}")


def _literal(allowed: tuple[Any, ...]) -> Convert:
    # keyed by type too: True == 1, but `true` is not the literal 1
    wire = {(type(plain(a)), plain(a)): a for a in allowed}

    def check(value: Any) -> Any:
        try:
            return wire[type(value), value]
        except (KeyError, TypeError):
            choices = ", ".join(_shown(plain(a)) for a in allowed)
            raise ArgumentError(f"expected one of {choices}, got {_shown(value)}") from None

    return check


def _union(options: list[Convert | None], tp: Any) -> Convert | None:
    if any(o is None for o in options):
        return None

    def check(value: Any) -> Any:
        for option in options:
            assert option is not None
            try:
                return option(value)
            except ArgumentError:
                continue
        raise ArgumentError(f"expected {_type_name(tp)}, got {_shown(value)}")

    return check


def _array(kind: Any, args: tuple[Any, ...], owner: Any) -> Convert:
    build: Callable[[list[Any]], Any] = (
        tuple if kind is tuple else set if kind is set else frozenset if kind is frozenset else list
    )
    if kind is tuple and args and args[-1] is not Ellipsis:
        fixed = [_compile(a, owner) for a in args]

        def check_fixed(value: Any) -> Any:
            if type(value) is not list or len(value) != len(fixed):
                raise ArgumentError(f"expected an array of {len(fixed)}, got {_shown(value)}")
            return tuple(_at(c, i, v) for i, (c, v) in enumerate(zip(fixed, value, strict=True)))

        return check_fixed
    item = _compile(args[0], owner) if args else None

    def check(value: Any) -> Any:
        if type(value) is not list:
            raise ArgumentError(f"expected an array, got {_shown(value)}")
        if item is None:
            return value if build is list else build(value)
        return build([_at(item, i, v) for i, v in enumerate(value)])

    return check


def _at(convert: Convert | None, where: int | str, value: Any) -> Any:
    if convert is None:
        return value
    try:
        return convert(value)
    except ArgumentError as e:
        raise ArgumentError(f"[{where!r}] {e}") from None


def _object(key: Convert | None, item: Convert | None) -> Convert:
    def check(value: Any) -> Any:
        if type(value) is not dict:
            raise ArgumentError(f"expected an object, got {_shown(value)}")
        if key is None and item is None:
            return value
        return {k if key is None else _at(key, k, k): _at(item, k, v) for k, v in value.items()}

    return check


def _key(tp: Any) -> Convert | None:
    """Member names are text on the wire: a key annotated int, float or as an Enum is read
    back from it (`plain` wrote it with str())."""
    if tp is int or tp is float:
        kind = tp

        def number(text: Any) -> Any:
            try:
                return kind(text)
            except ValueError:
                raise ArgumentError(f"expected a {kind.__name__} key, got {_shown(text)}") from None

        return number
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        by_text = {str(plain(m)): m for m in tp}

        def member(text: Any) -> Any:
            try:
                return by_text[text]
            except KeyError:
                raise ArgumentError(f"expected a {tp.__name__} key, got {_shown(text)}") from None

        return member
    return None


def _class(cls: type) -> Convert:
    if issubclass(cls, enum.Enum):
        return _enum(cls)
    if dataclasses.is_dataclass(cls):
        return _dataclass(cls)
    if _is_typeddict(cls):
        return _typeddict(cls)
    if cls is datetime or cls is date:
        return _iso(cls)
    validate = getattr(cls, "model_validate", None)
    if callable(validate):
        return _model(cls, validate)

    def check(value: Any) -> Any:
        if not isinstance(value, cls):
            raise ArgumentError(f"expected {cls.__name__}, got {_shown(value)}")
        return value

    return check


def _is_typeddict(cls: type) -> bool:
    return isinstance(getattr(cls, "__total__", None), bool) and issubclass(cls, dict)


def _typeddict(cls: type) -> Convert:
    fields: dict[str, Convert | None] | None = None
    required: frozenset[str] = getattr(cls, "__required_keys__", frozenset())

    def check(value: Any) -> Any:
        nonlocal fields
        if type(value) is not dict:
            raise ArgumentError(f"expected an object ({cls.__name__}), got {_shown(value)}")
        if fields is None:
            fields = {k: _compile(t, cls) for k, t in get_type_hints(cls).items()}
        unknown = value.keys() - fields.keys()
        if unknown:
            raise ArgumentError(f"{cls.__name__} has no member {sorted(unknown)[0]!r}")
        missing = required - value.keys()
        if missing:
            raise ArgumentError(f"{cls.__name__} needs its member {sorted(missing)[0]!r}")
        return {k: _at(fields[k], k, v) for k, v in value.items()}

    return check


def _enum(cls: type[enum.Enum]) -> Convert:
    def check(value: Any) -> Any:
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(_shown(m.value) for m in cls)
            raise ArgumentError(
                f"expected one of {choices} ({cls.__name__}), got {_shown(value)}"
            ) from None

    return check


def _dataclass(cls: type) -> Convert:
    fields: dict[str, Convert | None] | None = None

    def check(value: Any) -> Any:
        nonlocal fields
        if type(value) is not dict:
            raise ArgumentError(f"expected an object ({cls.__name__}), got {_shown(value)}")
        if fields is None:
            hints = get_type_hints(cls)
            fields = {
                f.name: _compile(hints.get(f.name, Any), cls)
                for f in dataclasses.fields(cls)
                if f.init
            }
        unknown = value.keys() - fields.keys()
        if unknown:
            raise ArgumentError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
        built = {k: _at(fields[k], k, v) for k, v in value.items()}
        try:
            return cls(**built)
        except TypeError as e:  # a missing field
            raise ArgumentError(f"{cls.__name__}: {e}") from None

    return check


def _iso(cls: type[date]) -> Convert:
    def check(value: Any) -> Any:
        if type(value) is str:
            try:
                return cls.fromisoformat(value)
            except ValueError:
                pass
        raise ArgumentError(f"expected an ISO 8601 {cls.__name__}, got {_shown(value)}")

    return check


def _model(cls: type, validate: Callable[[Any], Any]) -> Convert:
    def check(value: Any) -> Any:
        try:
            return validate(value)
        except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
            raise ArgumentError(f"not a valid {cls.__name__}: {e}") from None

    return check


# --- one function's parameters ------------------------------------------------------------------


class Signature:
    """A task function's parameters: binds a call to the envelope object and reads it back."""

    __slots__ = (
        "_by_name",
        "_compiled",
        "_converters",
        "_fn",
        "_names",
        "_params",
        "_plain",
        "_required",
        "_returns",
        "_simple",
        "_var_keyword",
        "_var_positional",
        "converts_result",
        "direct",
        "name",
    )

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self._fn = fn
        self.name = name
        sig = inspect.signature(fn)
        self._params = sig
        params = list(sig.parameters.values())
        self._names = tuple(p.name for p in params if p.kind is _P.POSITIONAL_OR_KEYWORD)
        self._by_name = {p.name: p for p in params}
        self._required = frozenset(
            p.name
            for p in params
            if p.default is _P.empty and p.kind not in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD)
        )
        self._var_positional = next((p.name for p in params if p.kind is _P.VAR_POSITIONAL), None)
        self._var_keyword = next((p.name for p in params if p.kind is _P.VAR_KEYWORD), None)
        # every parameter may be given by name or position: bind without inspect's machinery
        self._simple = all(
            p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY) for p in params
        ) and all(p.kind is _P.POSITIONAL_OR_KEYWORD for p in params[: len(self._names)])
        self._compiled = False
        # Both set when the annotations are compiled (by the first bind or arguments):
        # whether a `Bound` of this process can be the keyword arguments as it is, and
        # whether a returned value may need `result()` to be JSON data.
        self.direct = False
        self.converts_result = False
        self._converters: dict[str, Convert | None] = {}
        self._plain: tuple[str, ...] = ()
        self._returns: tuple[bool, Convert | None] = (False, None)

    def _compile(self) -> dict[str, Convert | None]:
        """Resolve the annotations (now that the module is loaded) and build the converters."""
        try:
            hints = get_type_hints(self._fn, include_extras=True)
        except Exception as e:  # a name the annotations use does not exist
            raise TypeError(f"cannot resolve the annotations of {self.name}: {e}") from None
        converters: dict[str, Convert | None] = {}
        needs_plain = []
        for name, p in self._by_name.items():
            tp = hints.get(name, Any)
            if p.kind is _P.VAR_POSITIONAL:
                tp = list[tp]  # type: ignore[valid-type]
            elif p.kind is _P.VAR_KEYWORD:
                tp = dict[str, tp]  # type: ignore[valid-type]
            converters[name] = _compile(tp, self._fn)
            if _needs_plain(tp):
                needs_plain.append(name)
        returns = hints.get("return", Any)
        self._plain = tuple(needs_plain)
        self._returns = (_needs_plain(returns), _compile(returns, self._fn))
        self.direct = self._simple and not needs_plain
        self.converts_result = self._returns[0]
        self._converters = converters
        self._compiled = True
        return converters

    # caller side

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
        """The envelope object of a call; TypeError, as calling the function would, when the
        arguments do not fit its parameters."""
        if not self._compiled:
            self._compile()
        names = self._names
        if not kwargs and self._simple and len(args) == len(names) == len(self._by_name):
            members = Bound(zip(names, args, strict=True))  # every parameter, by position
        elif self._simple:
            if len(args) > len(names):
                raise TypeError(
                    f"{self.name}() takes {len(names)} positional arguments"
                    f" but {len(args)} were given"
                )
            members = Bound(zip(names, args, strict=False))
            for k, v in kwargs.items():
                if k in members:
                    raise TypeError(f"{self.name}() got multiple values for argument {k!r}")
                if k not in self._by_name:
                    raise TypeError(f"{self.name}() got an unexpected keyword argument {k!r}")
                members[k] = v
            if len(members) < len(self._required) or not self._required <= members.keys():
                missing = sorted(self._required - members.keys())
                raise TypeError(f"{self.name}() missing required argument {missing[0]!r}")
        else:
            try:
                bound = self._params.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{self.name}(): {e}") from None
            members = Bound(bound.arguments)
            star = self._var_positional
            if star is not None and star in members:  # an array on the wire: a list here too
                members[star] = list(members[star])
            if self._var_keyword is not None:
                self._spread(members)
        for name in self._plain:
            if name in members:
                members[name] = plain(members[name])
        return members

    def _spread(self, members: Bound) -> None:
        """Put the `**kwargs` of a call among the members, where the envelope carries them."""
        assert self._var_keyword is not None
        extra = members.pop(self._var_keyword, {})
        clash = next((k for k in extra if k in self._by_name), None)
        if clash is not None:  # only a positional-only name can clash: one object holds both
            raise TypeError(
                f"{self.name}(): the keyword argument {clash!r} has the name of a positional-only"
                " parameter, which the task's arguments cannot carry both of"
            )
        if self._var_keyword in self._plain:
            extra = {k: plain(v) for k, v in extra.items()}
        members.update(extra)

    def result(self, value: Any) -> Any:
        """A returned value as JSON data."""
        if not self._compiled:
            self._compile()
        return plain(value) if self._returns[0] else value

    def returned(self, value: Any) -> Any:
        """A result received as JSON data, as the return annotation's type."""
        if not self._compiled:
            self._compile()
        convert = self._returns[1]
        if convert is None:
            return value
        try:
            return convert(value)
        except ArgumentError as e:
            raise TypeError(f"the result of {self.name} does not fit its annotation: {e}") from None

    # worker side

    def arguments(self, payload: Any) -> tuple[list[Any], dict[str, Any]]:
        """The positional and keyword arguments an envelope object stands for; ArgumentError
        naming the parameter when it does not fit."""
        converters = self._converters if self._compiled else self._compile()
        if payload is None:
            payload = {}
        elif not isinstance(payload, dict):
            raise ArgumentError(
                f"the arguments of {self.name} must be a JSON object with one member per"
                f" parameter, got {_shown(payload)}"
            )
        missing = self._required - payload.keys()
        if missing:
            raise ArgumentError(f"missing parameter {sorted(missing)[0]!r} of {self.name}")
        kwargs: dict[str, Any] = {}
        if self._simple:  # every parameter by name: the members are the keyword arguments
            for name, value in payload.items():
                try:
                    convert = converters[name]
                except KeyError:
                    raise ArgumentError(f"{self.name} has no parameter {name!r}") from None
                kwargs[name] = value if convert is None else self._member(name, convert, value)
            return [], kwargs
        var_keyword = self._var_keyword
        extra = {k: v for k, v in payload.items() if k not in self._by_name or k == var_keyword}
        if extra and var_keyword is None:
            raise ArgumentError(f"{self.name} has no parameter {sorted(extra)[0]!r}")
        # With values for *args, every parameter before it goes by position, as in a call.
        by_position: tuple[inspect._ParameterKind, ...] = (_P.POSITIONAL_ONLY,)
        if self._var_positional in payload:
            by_position = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)
        args: list[Any] = []
        skipped = None  # a positional parameter left to its default
        for name, p in self._by_name.items():
            if name not in payload or p.kind is _P.VAR_KEYWORD:
                if p.kind in by_position:
                    skipped = name
                continue
            value = self._member(name, converters[name], payload[name])
            if p.kind in by_position or p.kind is _P.VAR_POSITIONAL:
                if skipped is not None:
                    raise ArgumentError(f"missing parameter {skipped!r} of {self.name}")
                if p.kind is _P.VAR_POSITIONAL:
                    args.extend(value)
                else:
                    args.append(value)
            else:
                kwargs[name] = value
        if extra:
            assert var_keyword is not None
            kwargs.update(self._member(var_keyword, converters[var_keyword], extra))
        return args, kwargs

    def _member(self, name: str, convert: Convert | None, value: Any) -> Any:
        if convert is None:
            return value
        try:
            return convert(value)
        except ArgumentError as e:
            raise ArgumentError(f"parameter {name!r} of {self.name}: {e}") from None
