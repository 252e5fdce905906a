"""cronoq.app._args: the argument envelope of task functions.

`Signature.bind` turns a call into the envelope object (one member per argument given, named as
the parameter, defaults not sent, values as plain JSON data); `Signature.arguments` reads an
envelope back into the positional and keyword arguments of the function, checking each member
against its annotation and building the declared type; `plain` is the Python-to-JSON half and
`Signature.result` / `Signature.returned` do the same for return values.

Most checks are properties over a table of signatures or annotations with seeded random values:
a call bound, sent as JSON text and read back calls the function exactly as the direct call
does, and `bind` refuses exactly the calls Python itself refuses.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import random
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Annotated, Any, Literal, Optional, TypedDict, Union, get_args, get_origin

import pytest

from cronoq.app._args import ArgumentError, Signature, plain

SEEDS = range(40)


# --- types the annotations use -------------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass(frozen=True)
class Pt:
    x: int
    y: int


@dataclasses.dataclass
class Line:
    name: str
    points: list[Pt]
    color: Color = Color.RED
    weight: float | None = None


@dataclasses.dataclass
class WithDerived:
    a: int
    doubled: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        self.doubled = 2 * self.a


class Point3(TypedDict):
    x: int
    y: int
    z: int


class Money:
    """A pydantic-style model: `model_validate` builds it, `model_dump(mode=...)` is its data."""

    dumped_modes: list[str] = []  # noqa: RUF012 (a record the tests read)

    def __init__(self, amount: int, currency: str) -> None:
        self.amount = amount
        self.currency = currency

    @classmethod
    def model_validate(cls, data: Any) -> Money:
        if not isinstance(data, dict) or set(data) != {"amount", "currency"}:
            raise ValueError("amount and currency are required")
        if type(data["amount"]) is not int:
            raise ValueError("amount must be an integer")
        return cls(data["amount"], data["currency"])

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        Money.dumped_modes.append(mode)
        return {"amount": self.amount, "currency": self.currency}

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Money)
            and (self.amount, self.currency) == (other.amount, other.currency)
            and type(self.amount) is type(other.amount)
        )

    def __hash__(self) -> int:
        return hash((self.amount, self.currency))

    def __repr__(self) -> str:
        return f"Money({self.amount!r}, {self.currency!r})"


# --- helpers --------------------------------------------------------------------------------------


def one_param(tp: Any, name: str = "f") -> Callable[..., Any]:
    """A function `name(x: tp) -> tp` returning its argument (annotations as objects)."""

    def fn(x: Any) -> Any:
        return x

    fn.__annotations__ = {"x": tp, "return": tp}
    fn.__name__ = fn.__qualname__ = name
    return fn


def sig_of(fn: Callable[..., Any]) -> Signature:
    return Signature(fn, fn.__name__)


def wire(members: Any) -> Any:
    """The envelope as it travels: JSON text, read back."""
    return json.loads(json.dumps(members))


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (3 is not 3.0, a tuple is not a list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, datetime):
        return bool(a.isoformat() == b.isoformat())
    if isinstance(a, (set, frozenset)):
        return bool(a == b) and sorted(map(repr, a)) == sorted(map(repr, b))
    return bool(a == b)


ALPHABET = "aZ09 _-\"\\/'\n\té€😀{}[]:,"


def gen(tp: Any, rnd: random.Random, depth: int = 0) -> Any:
    """A random value of annotation `tp` (covering the kinds the envelope supports)."""
    small = rnd.randint(0, 2 if depth > 1 else 4)
    origin, args = get_origin(tp), get_args(tp)
    if tp is int:
        return rnd.choice([0, -1, 2**53 + 1, -(2**70), rnd.randint(-1000, 1000)])
    if tp is float:
        return rnd.choice([0.0, -0.5, 1e300, 5e-324, 3.0, rnd.uniform(-1e6, 1e6)])
    if tp is str:
        return "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 10)))
    if tp is bool:
        return rnd.random() < 0.5
    if tp is type(None):
        return None
    if origin is Annotated:
        return gen(args[0], rnd, depth)
    if origin in (Union, type(int | None)):
        return gen(rnd.choice(args), rnd, depth)
    if origin is Literal:
        return rnd.choice(args)
    if origin in (list, Sequence):
        return [gen(args[0], rnd, depth + 1) for _ in range(small)]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(gen(args[0], rnd, depth + 1) for _ in range(small))
        return tuple(gen(a, rnd, depth + 1) for a in args)
    if origin in (set, frozenset):
        return origin(gen(args[0], rnd, depth + 1) for _ in range(small))
    if origin in (dict, Mapping):
        return {gen(str, rnd): gen(args[1], rnd, depth + 1) for _ in range(small)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return rnd.choice(list(tp))
    if tp is Pt:
        return Pt(gen(int, rnd), gen(int, rnd))
    if tp is Line:
        return Line(
            gen(str, rnd), gen(list[Pt], rnd, depth + 1), gen(Color, rnd), gen(float | None, rnd)
        )
    if tp is Money:
        return Money(gen(int, rnd), rnd.choice(["EUR", "USD"]))
    if tp is datetime:
        tz = rnd.choice([None, UTC, timezone(timedelta(hours=5, minutes=30))])
        return datetime(
            rnd.randint(1, 9999),
            rnd.randint(1, 12),
            rnd.randint(1, 28),
            rnd.randint(0, 23),
            rnd.randint(0, 59),
            rnd.randint(0, 59),
            rnd.choice([0, rnd.randint(1, 999_999)]),
            tzinfo=tz,
        )
    if tp is date:
        return date(rnd.randint(1, 9999), rnd.randint(1, 12), rnd.randint(1, 28))
    if tp is Point3:
        return Point3(x=gen(int, rnd), y=gen(int, rnd), z=gen(int, rnd))
    raise AssertionError(f"no generator for {tp!r}")


# Every kind of annotation the envelope supports, with values that round-trip unambiguously.
ROUND_TRIP_TYPES: list[Any] = [
    int,
    float,
    str,
    bool,
    type(None),
    list[int],
    list[str],
    Sequence[int],
    tuple[int, str],
    tuple[float, ...],
    set[int],
    frozenset[str],
    dict[str, float],
    Mapping[str, list[int]],
    Optional[int],  # noqa: UP045 (the typing spelling on purpose)
    int | None,
    Union[int, str],  # noqa: UP007 (the typing spelling on purpose)
    Literal["a", "b", 3],
    Color,
    Level,
    Color | None,
    Pt,
    list[Pt | None],
    dict[str, Pt],
    tuple[Pt, Color],
    Line,
    Money,
    list[Money],
    datetime,
    date,
    Point3,
    Annotated[int, "a note"],
    Any,
]


# --- plain ----------------------------------------------------------------------------------------


def test_plain_leaves_json_data_alone() -> None:
    for value in (None, True, 0, -3, 1.5, "", "text"):
        assert same(plain(value), value)
    data = {"a": [1, {"b": None}], "c": "d"}
    assert plain(data) == data


def test_plain_turns_python_values_into_json_data() -> None:
    moment = datetime(2024, 2, 29, 12, 30, 5, 123, tzinfo=UTC)
    value = {
        "line": Line("l", [Pt(1, 2)], Color.GREEN, 0.5),
        "color": Color.RED,
        "level": Level.HIGH,
        "when": moment,
        "day": date(2024, 2, 29),
        "tuple": (1, (2, 3)),
        "set": {7},
        "frozen": frozenset({"x"}),
        "money": Money(5, "EUR"),
    }
    assert plain(value) == {
        "line": {"name": "l", "points": [{"x": 1, "y": 2}], "color": "green", "weight": 0.5},
        "color": "red",
        "level": 2,
        "when": "2024-02-29T12:30:05.000123+00:00",
        "day": "2024-02-29",
        "tuple": [1, [2, 3]],
        "set": [7],
        "frozen": ["x"],
        "money": {"amount": 5, "currency": "EUR"},
    }
    assert Money.dumped_modes[-1] == "json"
    # the result is JSON data: it encodes without a default
    json.dumps(plain(value))


def test_plain_gives_dict_keys_as_text() -> None:
    assert plain({1: "a", Color.GREEN: "b", "c": Color.RED}) == {"1": "a", "green": "b", "c": "red"}


def test_plain_leaves_what_it_does_not_know_to_the_codec() -> None:
    thing = object()
    assert plain(thing) is thing
    assert plain([thing])[0] is thing


@pytest.mark.parametrize("seed", SEEDS)
def test_plain_of_any_supported_value_is_json_text(seed: int) -> None:
    rnd = random.Random(seed)
    for tp in ROUND_TRIP_TYPES:
        if tp is Any:
            continue
        value = gen(tp, rnd)
        text = json.dumps(plain(value), allow_nan=False)
        assert json.loads(text) == plain(value)


# --- bind -----------------------------------------------------------------------------------------


def simple(a: int, b: str = "d", *, c: float = 0.5, d: bool) -> tuple[Any, ...]:
    return (a, b, c, d)


def test_bind_names_each_given_argument_and_sends_no_default() -> None:
    sig = sig_of(simple)
    assert sig.bind((1,), {"d": True}) == {"a": 1, "d": True}
    assert sig.bind((1, "x"), {"d": False, "c": 2.0}) == {"a": 1, "b": "x", "d": False, "c": 2.0}
    assert sig.bind((), {"a": 1, "b": "y", "d": True}) == {"a": 1, "b": "y", "d": True}
    # a value equal to the default is still sent: it was given
    assert sig.bind((1, "d"), {"d": True}) == {"a": 1, "b": "d", "d": True}


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {"d": True}, "simple() missing required argument 'a'"),
        ((1,), {}, "simple() missing required argument 'd'"),
        ((1, "x", 2.0), {"d": True}, "simple() takes 2 positional arguments but 3 were given"),
        ((1,), {"d": True, "e": 1}, "simple() got an unexpected keyword argument 'e'"),
        ((1,), {"a": 2, "d": True}, "simple() got multiple values for argument 'a'"),
    ],
)
def test_bind_refuses_what_a_call_would(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError) as info:
        sig_of(simple).bind(args, kwargs)
    assert str(info.value) == message
    with pytest.raises(TypeError):
        simple(*args, **kwargs)


def positional_only(a: int, b: int = 2, /, c: int = 3) -> tuple[Any, ...]:
    return (a, b, c)


def test_bind_positional_only() -> None:
    sig = sig_of(positional_only)
    assert sig.bind((1,), {}) == {"a": 1}
    assert sig.bind((1, 5), {"c": 6}) == {"a": 1, "b": 5, "c": 6}
    with pytest.raises(TypeError) as info:
        sig.bind((), {"a": 1})
    assert str(info.value).startswith("positional_only(): ")
    assert "'a'" in str(info.value)


def var_positional(a: int, /, *rest: int, k: int = 0) -> tuple[Any, ...]:
    return (a, rest, k)


def test_bind_var_positional_is_one_member_holding_the_extra_values() -> None:
    sig = sig_of(var_positional)
    assert sig.bind((1,), {}) == {"a": 1}
    members = sig.bind((1, 2, 3), {"k": 4})
    assert members == {"a": 1, "rest": [2, 3], "k": 4}
    assert wire(members) == {"a": 1, "rest": [2, 3], "k": 4}


def var_keyword(a: int, **extra: int) -> tuple[Any, ...]:
    return (a, extra)


def test_bind_var_keyword_members_are_top_level() -> None:
    sig = sig_of(var_keyword)
    assert sig.bind((1,), {"p": 2, "q": 3}) == {"a": 1, "p": 2, "q": 3}
    assert sig.bind((), {"a": 1}) == {"a": 1}
    with pytest.raises(TypeError):
        sig.bind((1,), {"a": 2})


def keyword_only(*, a: int, b: int = 1) -> tuple[Any, ...]:
    return (a, b)


def test_bind_keyword_only() -> None:
    sig = sig_of(keyword_only)
    assert sig.bind((), {"a": 1}) == {"a": 1}
    with pytest.raises(TypeError, match="positional"):
        sig.bind((1,), {})
    with pytest.raises(TypeError, match="'a'"):
        sig.bind((), {"b": 1})


def test_bind_refuses_keyword_only_parameters_given_by_position() -> None:
    with pytest.raises(TypeError, match=r"^keyword_only_after\(\) takes 1 positional"):
        sig_of(keyword_only_after).bind((1, 2), {})


def keyword_only_after(a: int, *, b: int) -> tuple[Any, ...]:
    return (a, b)


def nothing() -> int:
    return 0


def test_bind_of_no_parameters() -> None:
    sig = sig_of(nothing)
    assert sig.bind((), {}) == {}
    assert sig.arguments({}) == ([], {})
    assert sig.arguments(None) == ([], {})
    with pytest.raises(TypeError):
        sig.bind((1,), {})


# Signatures whose calls are compared with Python's own binding; every parameter takes ints.
def s_plain(a: int, b: int, c: int = 0) -> Any:
    return (a, b, c)


def s_kwonly(a: int, *, b: int, c: int = 0) -> Any:
    return (a, b, c)


def s_posonly(a: int, b: int = 0, /, c: int = 0, *, d: int = 0) -> Any:
    return (a, b, c, d)


def s_only_var(*xs: int) -> Any:
    return xs


def s_posonly_var(a: int, /, *xs: int, k: int = 0) -> Any:
    return (a, xs, k)


def s_var_keyword(a: int, b: int = 0, **kw: int) -> Any:
    return (a, b, kw)


def s_everything(a: int, /, *xs: int, k: int, **kw: int) -> Any:
    return (a, xs, k, kw)


CALL_SIGNATURES = [s_plain, s_kwonly, s_posonly, s_only_var, s_posonly_var, s_var_keyword]
CALL_SIGNATURES.append(s_everything)


def random_call(
    fn: Callable[..., Any], rnd: random.Random
) -> tuple[tuple[int, ...], dict[str, int]]:
    """A random call of `fn`, valid or not: some positional values, some keywords (a known
    name, or one it does not have). Never a keyword named as a positional-only parameter
    (test_positional_only_name_as_extra_keyword covers that one)."""
    params = list(inspect.signature(fn).parameters.values())
    names = [
        p.name for p in params if p.kind not in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        names += ["p", "q"]
    elif rnd.random() < 0.2:
        names.append("zz")
    args = tuple(rnd.randint(-9, 9) for _ in range(rnd.randint(0, 4)))
    kwargs = {n: rnd.randint(-9, 9) for n in rnd.sample(names, rnd.randint(0, len(names)))}
    return args, kwargs


@pytest.mark.parametrize(
    "fn",
    CALL_SIGNATURES,
    ids=lambda f: f.__name__,
)
def test_bind_refuses_exactly_the_calls_python_refuses(fn: Callable[..., Any]) -> None:
    sig = sig_of(fn)
    python = inspect.signature(fn)
    rnd = random.Random(fn.__name__)
    accepted = refused = 0
    for _ in range(300):
        args, kwargs = random_call(fn, rnd)
        try:
            expected = python.bind(*args, **kwargs).arguments
        except TypeError:
            with pytest.raises(TypeError, match=rf"^{fn.__name__}\(\)"):
                sig.bind(args, kwargs)
            refused += 1
            continue
        flat = dict(expected)
        for p in python.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                flat.update(flat.pop(p.name, {}))
            elif p.kind is p.VAR_POSITIONAL and p.name in flat:
                flat[p.name] = list(flat[p.name])  # an array on the wire
        assert sig.bind(args, kwargs) == flat, (args, kwargs)
        accepted += 1
    assert accepted > 10 and refused > 10  # both sides of the property were exercised


@pytest.mark.parametrize("fn", CALL_SIGNATURES, ids=lambda f: f.__name__)
def test_a_call_through_the_json_envelope_is_the_direct_call(fn: Callable[..., Any]) -> None:
    """bind -> JSON text -> arguments calls the function with what the caller gave (defaults
    applied where it runs), for every valid call."""
    sig = sig_of(fn)
    python = inspect.signature(fn)
    rnd = random.Random(f"call {fn.__name__}")
    checked = 0
    for _ in range(300):
        args, kwargs = random_call(fn, rnd)
        try:
            python.bind(*args, **kwargs)
        except TypeError:
            continue
        text = json.dumps(sig.bind(args, kwargs))
        got_args, got_kwargs = sig.arguments(json.loads(text))
        assert fn(*got_args, **got_kwargs) == fn(*args, **kwargs), (args, kwargs, text)
        checked += 1
    assert checked > 10


@pytest.mark.parametrize(
    "fn",
    [s_plain, s_kwonly, s_posonly, s_var_keyword],
    ids=lambda f: f.__name__,
)
def test_a_call_handed_over_in_process_is_the_direct_call(fn: Callable[..., Any]) -> None:
    """Library mode without a store hands the bound object itself to the executing side."""
    sig = sig_of(fn)
    python = inspect.signature(fn)
    rnd = random.Random(f"memory {fn.__name__}")
    for _ in range(200):
        args, kwargs = random_call(fn, rnd)
        try:
            python.bind(*args, **kwargs)
        except TypeError:
            continue
        got_args, got_kwargs = sig.arguments(sig.bind(args, kwargs))
        assert fn(*got_args, **got_kwargs) == fn(*args, **kwargs), (args, kwargs)


def s_keyword_then_var(a: int, *xs: int) -> Any:
    return (a, xs)


def test_positional_or_keyword_before_var_positional() -> None:
    sig = sig_of(s_keyword_then_var)
    got_args, got_kwargs = sig.arguments(wire(sig.bind((1, 2, 3), {})))
    assert s_keyword_then_var(*got_args, **got_kwargs) == (1, (2, 3))


def test_var_positional_handed_over_in_process() -> None:
    sig = sig_of(s_only_var)
    got_args, got_kwargs = sig.arguments(sig.bind((2, 3), {}))
    assert s_only_var(*got_args, **got_kwargs) == (2, 3)


def s_posonly_and_kw(a: int, /, **kw: int) -> Any:
    return (a, kw)


def test_positional_only_name_as_extra_keyword_is_refused() -> None:
    """One JSON object cannot hold both an argument `a` and an extra keyword `a`."""
    sig = sig_of(s_posonly_and_kw)
    assert s_posonly_and_kw(1, a=2) == (1, {"a": 2})
    with pytest.raises(TypeError, match=r"^s_posonly_and_kw\(\): the keyword argument 'a'"):
        sig.bind((1,), {"a": 2})


def colors_by_name(**kw: Color) -> dict[str, Color]:
    return kw


def test_var_keyword_values_become_json_data() -> None:
    sig = sig_of(colors_by_name)
    text = json.dumps(sig.bind((), {"a": Color.GREEN}))
    assert json.loads(text) == {"a": "green"}


def test_var_keyword_values_are_checked_and_built() -> None:
    sig = sig_of(colors_by_name)
    assert sig.arguments({"a": "green", "b": "red"}) == (
        [],
        {"a": Color.GREEN, "b": Color.RED},
    )
    with pytest.raises(ArgumentError) as info:
        sig.arguments({"a": "blue"})
    assert "'a'" in str(info.value) and "blue" in str(info.value)


# --- arguments: accepted and built ----------------------------------------------------------------


@pytest.mark.parametrize("tp", ROUND_TRIP_TYPES, ids=repr)
def test_every_supported_annotation_round_trips(tp: Any) -> None:
    """bind -> JSON text -> arguments gives back an equal value of the same type, for seeded
    random values; so does a result through result -> JSON text -> returned."""
    sig = sig_of(one_param(tp))
    rnd = random.Random(repr(tp))
    for _ in range(60):
        value = gen(int if tp is Any else tp, rnd)
        args, kwargs = sig.arguments(wire(sig.bind((value,), {})))
        assert args == []
        assert same(kwargs["x"], value), (tp, value, kwargs["x"])
        back = sig.returned(wire(sig.result(value)))
        assert same(back, value), (tp, value, back)


@pytest.mark.parametrize("tp", ROUND_TRIP_TYPES, ids=repr)
def test_every_supported_annotation_in_process(tp: Any) -> None:
    """The bound object handed over without JSON (library mode, no store) gives back equal
    values too."""
    sig = sig_of(one_param(tp))
    rnd = random.Random(f"memory {tp!r}")
    for _ in range(30):
        value = gen(int if tp is Any else tp, rnd)
        _, kwargs = sig.arguments(sig.bind((value,), {}))
        assert kwargs["x"] == value, (tp, value, kwargs["x"])


@pytest.mark.parametrize(
    ("tp", "payload", "built"),
    [
        (int, 3.0, 3),  # an integral number is an integer (JSON has one number type)
        (float, 2, 2.0),
        (tuple[int, ...], [1, 2], (1, 2)),
        (set[int], [1, 1, 2], {1, 2}),
        (frozenset[int], [], frozenset()),
        (Literal[Color.RED, "x"], "red", Color.RED),
        (Level, 2, Level.HIGH),
        (datetime, "2024-01-02T03:04:05Z", datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
        (date, "2024-01-02", date(2024, 1, 2)),
        (Line, {"name": "n", "points": []}, Line("n", [], Color.RED, None)),
        (
            Line,
            {"name": "n", "points": [{"x": 1, "y": 2.0}], "weight": 1},
            Line("n", [Pt(1, 2)], Color.RED, 1.0),
        ),
        (Optional[Pt], None, None),  # noqa: UP045
        (dict[str, Any], {"a": [1, {"b": None}]}, {"a": [1, {"b": None}]}),
        (list, [1, "a"], [1, "a"]),
        (tuple, [1, "a"], (1, "a")),
        (dict, {"a": 1}, {"a": 1}),
        (Callable[[int], int], "anything", "anything"),
    ],
    ids=repr,
)
def test_arguments_build_the_declared_type(tp: Any, payload: Any, built: Any) -> None:
    _, kwargs = sig_of(one_param(tp)).arguments({"x": payload})
    assert same(kwargs["x"], built)


def uses_later(x: Later) -> Later:
    return x


# compiled on first use, not here: the annotation names a class defined below
LATER_SIG = Signature(uses_later, "uses_later")


@dataclasses.dataclass
class Later:
    v: int


def test_annotations_may_name_classes_defined_after_the_function() -> None:
    assert LATER_SIG.bind((Later(1),), {}) == {"x": {"v": 1}}
    assert LATER_SIG.arguments({"x": {"v": 2}}) == ([], {"x": Later(2)})
    assert LATER_SIG.returned({"v": 3}) == Later(3)


def unresolvable(x: NoSuchName) -> None:  # type: ignore[name-defined]  # noqa: F821
    pass


def test_unresolvable_annotations_are_a_type_error_naming_the_function() -> None:
    with pytest.raises(TypeError, match=r"^cannot resolve the annotations of unresolvable: "):
        sig_of(unresolvable).bind((1,), {})


# --- arguments: refused ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tp", "payload", "message"),
    [
        (int, "3", 'expected an integer, got "3"'),
        (int, True, "expected an integer, got true"),
        (int, 2.5, "expected an integer, got 2.5"),
        (int, None, "expected an integer, got null"),
        (float, "1.5", 'expected a number, got "1.5"'),
        (float, False, "expected a number, got false"),
        (str, 3, "expected a string, got 3"),
        (bool, 1, "expected a boolean, got 1"),
        (bool, "true", 'expected a boolean, got "true"'),
        (type(None), 0, "expected null, got 0"),
        (list[int], {"a": 1}, 'expected an array, got {"a": 1}'),
        (list[int], [1, "a"], '[1] expected an integer, got "a"'),
        (tuple[int, str], [1], "expected an array of 2, got [1]"),
        (tuple[int, str], [1, 2], "[1] expected a string, got 2"),
        (set[int], "12", 'expected an array, got "12"'),
        (dict[str, int], [], "expected an object, got []"),
        (dict[str, int], {"k": "v"}, "['k'] expected an integer, got \"v\""),
        (Optional[int], "a", 'expected Optional[int], got "a"'),  # noqa: UP045
        (int | str, [], "expected int | str, got []"),
        (Literal["a", "b"], "c", 'expected one of "a", "b", got "c"'),
        (Literal["a", "b"], ["a"], 'expected one of "a", "b", got ["a"]'),
        (Color, "blue", 'expected one of "red", "green" (Color), got "blue"'),
        (Color, "RED", 'expected one of "red", "green" (Color), got "RED"'),
        (Level, "1", 'expected one of 1, 2 (Level), got "1"'),
        (Pt, [1, 2], "expected an object (Pt), got [1, 2]"),
        (Pt, {"x": 1, "y": 2, "z": 3}, "Pt has no field 'z'"),
        (Pt, {"x": "1", "y": 2}, "['x'] expected an integer, got \"1\""),
        (datetime, "yesterday", 'expected an ISO 8601 datetime, got "yesterday"'),
        (datetime, 1700000000, "expected an ISO 8601 datetime, got 1700000000"),
        (date, "2024-02-30", 'expected an ISO 8601 date, got "2024-02-30"'),
        (Money, {"amount": "5", "currency": "EUR"}, "not a valid Money: amount must be an integer"),
    ],
    ids=repr,
)
def test_refusals_name_the_parameter_and_say_what_was_expected(
    tp: Any, payload: Any, message: str
) -> None:
    with pytest.raises(ArgumentError) as info:
        sig_of(one_param(tp, "job")).arguments({"x": payload})
    assert str(info.value) == f"parameter 'x' of job: {message}"


def test_a_missing_dataclass_field_is_refused() -> None:
    with pytest.raises(ArgumentError) as info:
        sig_of(one_param(Pt, "job")).arguments({"x": {"x": 1}})
    text = str(info.value)
    assert text.startswith("parameter 'x' of job: Pt: ")
    assert "'y'" in text


def test_nested_refusals_give_the_path_to_the_member() -> None:
    sig = sig_of(one_param(list[Line], "draw"))
    payload = {
        "x": [
            {"name": "ok", "points": [{"x": 1, "y": 2}]},
            {"name": "bad", "points": [{"x": 1, "y": 2}, {"x": 1, "y": "no"}]},
        ]
    }
    with pytest.raises(ArgumentError) as info:
        sig.arguments(payload)
    assert str(info.value) == (
        "parameter 'x' of draw: [1] ['points'] [1] ['y'] expected an integer, got \"no\""
    )
    with pytest.raises(ArgumentError) as info:
        sig_of(one_param(dict[str, Line], "draw")).arguments(
            {"x": {"first": {"name": "n", "points": [], "color": "blue"}}}
        )
    assert str(info.value).startswith("parameter 'x' of draw: ['first'] ['color'] expected one of")


NOT_AN_OBJECT = "the arguments of two must be a JSON object with one member per parameter"


def two(a: int, b: str = "x") -> None:
    pass


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"b": "y"}, "missing parameter 'a' of two"),
        ({}, "missing parameter 'a' of two"),
        (None, "missing parameter 'a' of two"),
        ({"a": 1, "c": 2}, "two has no parameter 'c'"),
        ([1, "y"], f'{NOT_AN_OBJECT}, got [1, "y"]'),
        ("a", f'{NOT_AN_OBJECT}, got "a"'),
    ],
    ids=repr,
)
def test_envelope_refusals(payload: Any, message: str) -> None:
    with pytest.raises(ArgumentError) as info:
        sig_of(two).arguments(payload)
    assert str(info.value) == message


def test_a_long_value_is_shortened_in_the_message() -> None:
    with pytest.raises(ArgumentError) as info:
        sig_of(one_param(int, "job")).arguments({"x": "z" * 500})
    assert len(str(info.value)) < 120
    assert str(info.value).endswith("...")


def test_an_argument_error_is_a_value_error() -> None:
    assert issubclass(ArgumentError, ValueError)


def test_positional_only_parameters_come_back_in_order_and_gaps_are_refused() -> None:
    sig = sig_of(positional_only)
    assert sig.arguments({"b": 5, "a": 1, "c": 7}) == ([1, 5], {"c": 7})
    with pytest.raises(ArgumentError) as info:
        sig.arguments({"a": 1, "zz": 2})
    assert str(info.value) == "positional_only has no parameter 'zz'"

    def later_only(a: int = 1, b: int = 2, /) -> None:
        pass

    with pytest.raises(ArgumentError) as info:
        sig_of(later_only).arguments({"b": 5})
    assert str(info.value) == "missing parameter 'a' of later_only"


def test_dict_keys_come_back_as_the_key_type() -> None:
    sig = sig_of(one_param(dict[int, str]))
    _, kwargs = sig.arguments(wire(sig.bind(({1: "a", 2: "b"},), {})))
    assert kwargs["x"] == {1: "a", 2: "b"}


def test_a_boolean_is_not_an_integer_literal() -> None:
    with pytest.raises(ArgumentError):
        sig_of(one_param(Literal[1, 2])).arguments({"x": True})


def test_a_dataclass_with_a_derived_field_round_trips() -> None:
    sig = sig_of(one_param(WithDerived))
    _, kwargs = sig.arguments(wire(sig.bind((WithDerived(4),), {})))
    assert kwargs["x"] == WithDerived(4)


def test_typeddict_members_are_checked() -> None:
    with pytest.raises(ArgumentError) as info:
        sig_of(one_param(Point3, "job")).arguments({"x": {"x": "one", "y": 2, "z": 3}})
    assert str(info.value).startswith("parameter 'x' of job: ")


# --- results --------------------------------------------------------------------------------------


def make_line() -> Line:
    return Line("n", [Pt(1, 2)])


def test_results_are_plain_data_and_come_back_as_the_return_annotation() -> None:
    sig = sig_of(make_line)
    assert sig.arguments({}) == ([], {})  # the executing side reads the arguments first
    sent = sig.result(make_line())
    assert sent == {"name": "n", "points": [{"x": 1, "y": 2}], "color": "red", "weight": None}
    assert sig.returned(wire(sent)) == make_line()


def test_a_result_that_does_not_fit_is_a_type_error_naming_the_function() -> None:
    with pytest.raises(TypeError) as info:
        sig_of(make_line).returned({"name": "n"})
    assert str(info.value).startswith("the result of make_line does not fit its annotation: ")
    with pytest.raises(TypeError) as info:
        sig_of(nothing).returned("zero")
    assert str(info.value) == (
        'the result of nothing does not fit its annotation: expected an integer, got "zero"'
    )


def untyped(x):  # type: ignore[no-untyped-def]
    return x


def test_without_annotations_anything_goes_through_unchanged() -> None:
    sig = sig_of(untyped)
    value = {"a": [1, 2.5, None, "s"]}
    assert sig.arguments({"x": value}) == ([], {"x": value})
    assert sig.result(value) is value
    assert sig.returned(value) is value
