"""The JSON of the HTTP listener (docs/http.md, "JSON"): request bodies and query strings to the
gRPC request messages, answers to the published JSON shapes, and the `code` of each HTTP status.

Nothing here validates what the gRPC services validate (limits, names, unknown pools): this
module only turns JSON into messages and back, refusing what cannot become a message at all (a
field that does not exist, a value of the wrong type, bad base64) with `BadRequest`, which the
listener answers 400. So both listeners refuse the same inputs for the same reasons.

Requests (docs/http.md, "Task object"): every field optional, unknown ones refused by name, a
`null` the same as an absent field. `payload` is any JSON value (sent as compact JSON text),
`payload_b64` raw bytes in standard base64; `json` is our older name for `payload`. Field names
may also be the camelCase names of the proto3 JSON mapping (`contentType`), enum values the
proto's own names (`PRIORITY_HIGH`), upper-case short names or numbers.

Answers (docs/http.md, "Answers"): ids and every time (`*_unix_ns`) as decimal strings, enums
by lower-case short names, and a field that is empty, zero or unset left out, by the rules of
each object; keys come out sorted.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Collection, Mapping
from http import HTTPStatus
from typing import Any

# Untyped for mypy (see fronts/routes.py).
from google.protobuf.message import Message  # type: ignore[import-untyped]

from ...proto.cronoq.v1 import cronoq_pb2 as pb

__all__ = [
    "BadRequest",
    "batch_answer",
    "batch_request",
    "bulk_answer",
    "bulk_request",
    "dumps",
    "list_answer",
    "list_request",
    "loads",
    "path_id",
    "pool_control_answer",
    "pool_request",
    "reason",
    "recurring_answer",
    "recurring_request",
    "search_answer",
    "search_request",
    "snapshot_answer",
    "submit_answer",
    "submit_request",
    "task_filter",
    "task_info",
    "task_result",
    "timeout_query",
    "workers_answer",
]

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
JSON_TYPE = "application/json"
OCTET_STREAM = "application/octet-stream"


class BadRequest(ValueError):
    """A request that cannot become a gRPC request message: 400 with this text."""


# --- the `code` of an error body ---------------------------------------------------------------

# docs/http.md, "Errors": the reason phrase of the status in lower case, `_` for spaces, as
# the published server spells it (413 and 429 by their RFC 9110 / 6585 names).
REASONS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
    500: "internal_server_error",
    501: "not_implemented",
    503: "service_unavailable",
    504: "gateway_timeout",
}


def reason(status: int) -> str:
    """The `code` of an error body: a function of the HTTP status alone."""
    if status in REASONS:
        return REASONS[status]
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "error"
    return re.sub(r"[^a-z0-9]+", "_", phrase.lower()).strip("_")


def dumps(data: Any) -> bytes:
    """An answer's body: UTF-8 JSON, keys sorted."""
    return json.dumps(data, sort_keys=True, ensure_ascii=False).encode()


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number out of range: {text}")
    return number


def _reject(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


# A `\uD800`-`\uDFFF` escape: the only way a JSON text (which is UTF-8) can hold a surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def loads(data: bytes) -> Any:
    """One strict JSON text: UTF-8, no NaN or Infinity, no number out of a double's range.
    ValueError (or RecursionError for absurd nesting) otherwise; BadRequest naming the field
    for a lone surrogate (`"\ud800"`), which JSON lets through but no text is made of (protobuf
    and every encoder refuse it)."""
    value = json.loads(data.decode(), parse_constant=_reject, parse_float=_finite)
    if _SURROGATE_ESCAPE.search(data):  # else there is none to look for (pairs decode whole)
        _check_text(value, "")
    return value


def _check_text(value: Any, where: str) -> None:
    """BadRequest at the first string (or object key) under `value` holding a surrogate."""
    if isinstance(value, str):
        if found := _SURROGATE.search(value):
            raise BadRequest(f"{where or 'the body'}: {_lone(found[0])}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_text(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if found := _SURROGATE.search(key):
                raise BadRequest(f"{where or 'the body'}: a field name {_lone(found[0])}")
            _check_text(item, f"{where}.{key}" if where else key)


def _lone(surrogate: str) -> str:
    return f"holds a lone surrogate (\\u{ord(surrogate):04x}), which is not Unicode text"


# --- scalars -----------------------------------------------------------------------------------

_DIGITS = re.compile(r"[0-9]+")
_SIGNED = re.compile(r"-?[0-9]+")
# a JSON-style decimal number (float() alone would also take "inf", "nan" and "1_0")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _wrong(field: str, expected: str, value: Any) -> BadRequest:
    return BadRequest(f"{field}: must be {expected}, not {_type_name(value)}")


def _string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _wrong(field, "a string", value)
    return value


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _wrong(field, "true or false", value)
    return value


def _number(value: Any, field: str) -> float:
    """A JSON number (seconds and the like); the services check its range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong(field, "a number", value)
    number = float(value)
    if not math.isfinite(number):
        raise BadRequest(f"{field}: must be a finite number")
    return number


def _integer(value: Any, field: str, low: int, high: int, *, strings: bool = True) -> int:
    """A JSON integer within [low, high]; also a string of decimal digits, as answers carry
    ids and times (unless `strings` is off)."""
    if strings and isinstance(value, str) and _SIGNED.fullmatch(value):
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        raise _wrong(field, "an integer", value)
    if not low <= number <= high:
        raise BadRequest(f"{field}: {number} is out of range [{low}, {high}]")
    return number


def _task_id(value: Any, field: str) -> int:
    return _integer(value, field, 0, U64_MAX)


def path_id(text: str) -> int:
    """The `{id}` of a task route: an unsigned 64-bit decimal, never read as a key."""
    if _DIGITS.fullmatch(text) and int(text) <= U64_MAX:
        return int(text)
    raise BadRequest(
        f"{text!r} is not a task id (an unsigned 64-bit decimal); to name a task by its key,"
        " use /v1/tasks/by-key/{key}"
    )


def _string_map(value: Any, field: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _wrong(field, "an object of strings", value)
    return {k: _string(v, f"{field}[{k!r}]") for k, v in value.items()}


def _enum(enum: Any, value: Any, field: str) -> Any:
    """An enum value by its short name in any case (`high`, `HIGH`), its proto name
    (`PRIORITY_HIGH`) or its number."""
    names = enum.DESCRIPTOR.values_by_name
    numbers = enum.DESCRIPTOR.values_by_number
    if isinstance(value, int) and not isinstance(value, bool) and value in numbers:
        return int(value)
    if isinstance(value, str):
        prefix = str(numbers[0].name).removesuffix("UNSPECIFIED")
        for name in (value, prefix + value.upper()):
            if name in names:
                return int(names[name].number)
    choices = ", ".join(_short(enum, n) for n in numbers if n)
    raise BadRequest(f"{field}: {json.dumps(value)} is not one of {choices}")


def _short(enum: Any, number: int) -> str:
    """The lower-case short name of an enum value (`high` for PRIORITY_HIGH)."""
    desc = enum.DESCRIPTOR
    prefix = str(desc.values_by_number[0].name).removesuffix("UNSPECIFIED")
    value = desc.values_by_number.get(number)
    return str(number) if value is None else str(value.name).removeprefix(prefix).lower()


# --- request bodies ----------------------------------------------------------------------------


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _fields(data: Any, where: str, known: Collection[str]) -> dict[str, Any]:
    """A JSON object's fields by their snake_case names (camelCase accepted), nulls dropped;
    BadRequest for a non-object, an unknown field or one given under both names."""
    if not isinstance(data, Mapping):
        raise _wrong(where.rstrip(".") or "the body", "a JSON object", data)
    aliases = {_camel(name): name for name in known}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key if key in known else aliases.get(key)
        if name is None:
            raise BadRequest(f"{where}{key}: unknown field")
        if name in out:
            raise BadRequest(f"{where}{name}: given twice ({name!r} and {_camel(name)!r})")
        out[name] = value
    return {k: v for k, v in out.items() if v is not None}


_SPEC_FIELDS = (
    "payload",
    "payload_b64",
    "json",  # ours: the older name of `payload`
    "content_type",
    "kind",
    "pool",
    "priority",
    "key",
    "deadline_in_s",
    "deadline_unix_ns",
    "start_in_s",
    "start_unix_ns",
    "tolerance_s",
    "on_miss",
    "duration_hint_s",
    "timeout_s",
    "retry",
    "after",
    "deps",
    "resources",
    "tags",
    "labels",
    "tenant",
)
_STRINGS = ("content_type", "kind", "pool", "key", "tenant")
_SECONDS = ("deadline_in_s", "start_in_s", "tolerance_s", "duration_hint_s", "timeout_s")
_TIMES = ("deadline_unix_ns", "start_unix_ns")
_SUBMIT_FIELDS = ("wait", "wait_timeout_s")
_RETRY_FIELDS = ("max_attempts", "initial_backoff_s", "multiplier", "max_backoff_s", "jitter")
_DEP_FIELDS = ("id", "key", "cond", "target")  # `target`: ours, the proto form {"id"}|{"key"}


def _spec(fields: Mapping[str, Any], where: str) -> pb.TaskSpec:
    """A TaskSpec from the fields of a task object (docs/http.md, "Task object")."""
    spec = pb.TaskSpec()
    given = [name for name in ("payload", "payload_b64", "json") if name in fields]
    if len(given) > 1:
        raise BadRequest(f"{where}{given[1]}: give only one of {' and '.join(given)}")
    if given and given[0] == "payload_b64":
        text = _string(fields["payload_b64"], f"{where}payload_b64")
        try:
            spec.payload = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"{where}payload_b64: not valid standard base64") from None
        spec.content_type = OCTET_STREAM
    elif given:
        name = given[0]
        try:
            text = json.dumps(
                fields[name], separators=(",", ":"), ensure_ascii=False, allow_nan=False
            )
        except ValueError:  # NaN or Infinity, which json.loads lets through
            raise BadRequest(f"{where}{name}: not a JSON value") from None
        spec.payload = text.encode()
        spec.content_type = JSON_TYPE
    for name in _STRINGS:
        if name in fields:
            setattr(spec, name, _string(fields[name], f"{where}{name}"))
    if "priority" in fields:
        spec.priority = _enum(pb.Priority, fields["priority"], f"{where}priority")
    if "on_miss" in fields:
        spec.on_miss = _enum(pb.MissPolicy, fields["on_miss"], f"{where}on_miss")
    for name in _SECONDS:
        if name in fields:
            setattr(spec, name, _number(fields[name], f"{where}{name}"))
    for name in _TIMES:
        if name in fields:
            setattr(spec, name, _integer(fields[name], f"{where}{name}", I64_MIN, I64_MAX))
    if "retry" in fields:
        spec.retry.CopyFrom(_retry(fields["retry"], f"{where}retry"))
    if "after" in fields:
        spec.deps.extend(_after(fields["after"], f"{where}after"))
    if "deps" in fields:
        spec.deps.extend(_deps(fields["deps"], f"{where}deps"))
    if "resources" in fields:
        value = fields["resources"]
        if not isinstance(value, Mapping):
            raise _wrong(f"{where}resources", "an object of integers", value)
        for name, amount in value.items():
            spec.resources[name] = _integer(
                amount, f"{where}resources[{name!r}]", 0, U32_MAX, strings=False
            )
    for name in ("tags", "labels"):
        if name in fields:
            getattr(spec, name).update(_string_map(fields[name], f"{where}{name}"))
    return spec


def _retry(value: Any, where: str) -> pb.RetryPolicy:
    """`max_attempts` is required; `jitter` defaults to true; a 0 number means the default."""
    fields = _fields(value, where + ".", _RETRY_FIELDS)
    if "max_attempts" not in fields:
        raise BadRequest(f"{where}.max_attempts: required")
    policy = pb.RetryPolicy(
        max_attempts=_integer(
            fields["max_attempts"], f"{where}.max_attempts", 0, U32_MAX, strings=False
        ),
        jitter=_bool(fields.get("jitter", True), f"{where}.jitter"),
    )
    for name in ("initial_backoff_s", "multiplier", "max_backoff_s"):
        if name in fields:
            setattr(policy, name, _number(fields[name], f"{where}.{name}"))
    return policy


def _array(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise _wrong(field, "an array", value)
    return value


def _after(value: Any, where: str) -> list[pb.Dep]:
    """`after`: on_success dependencies, each a key (string), an id (number) or {"id": id}."""
    deps = []
    for i, entry in enumerate(_array(value, where)):
        field = f"{where}[{i}]"
        if isinstance(entry, str):
            ref = pb.TaskRef(key=entry)
        elif isinstance(entry, (int, float)) and not isinstance(entry, bool):
            ref = pb.TaskRef(id=_task_id(entry, field))
        elif isinstance(entry, Mapping) and set(entry) == {"id"}:
            ref = pb.TaskRef(id=_task_id(entry["id"], f"{field}.id"))
        else:
            raise BadRequest(f'{field}: must be a key (a string), an id (a number) or {{"id": id}}')
        deps.append(pb.Dep(target=ref, cond=pb.EDGE_COND_ON_SUCCESS))
    return deps


def _deps(value: Any, where: str) -> list[pb.Dep]:
    """`deps`: {"id": id} or {"key": key}, plus an optional `cond`."""
    deps = []
    for i, entry in enumerate(_array(value, where)):
        field = f"{where}[{i}]"
        fields = _fields(entry, field + ".", _DEP_FIELDS)
        named = [n for n in ("id", "key", "target") if n in fields]
        if len(named) != 1:
            raise BadRequest(f"{field}: give exactly one of id and key")
        if named == ["target"]:
            fields = {**fields, **_fields(fields.pop("target"), field + ".target.", ("id", "key"))}
            named = [n for n in ("id", "key") if n in fields]
            if len(named) != 1:
                raise BadRequest(f"{field}.target: give exactly one of id and key")
        if named == ["id"]:
            ref = pb.TaskRef(id=_task_id(fields["id"], f"{field}.id"))
        else:
            ref = pb.TaskRef(key=_string(fields["key"], f"{field}.key"))
        cond = pb.EDGE_COND_UNSPECIFIED
        if "cond" in fields:
            cond = _enum(pb.EdgeCond, fields["cond"], f"{field}.cond")
        deps.append(pb.Dep(target=ref, cond=cond))
    return deps


def task_spec(data: Any, where: str = "") -> pb.TaskSpec:
    """A task object (each entry of a batch, a recurring template) as a TaskSpec; `where`
    prefixes field names in messages (`tasks[2].`)."""
    return _spec(_fields(data, where, _SPEC_FIELDS), where)


def submit_request(data: Any) -> pb.SubmitRequest:
    """`POST /v1/tasks`: a task object plus `wait` and `wait_timeout_s`."""
    fields = _fields(data, "", (*_SPEC_FIELDS, *_SUBMIT_FIELDS))
    request = pb.SubmitRequest(task=_spec(fields, ""))
    if "wait" in fields:
        request.wait = _bool(fields["wait"], "wait")
    if "wait_timeout_s" in fields:
        request.wait_timeout_s = _number(fields["wait_timeout_s"], "wait_timeout_s")
    return request


def batch_request(data: Any, max_tasks: int) -> pb.SubmitBatchRequest:
    """`POST /v1/tasks:batch`: `{"tasks": [task object, ...]}` and nothing else."""
    fields = _fields(data, "", ("tasks",))
    if "tasks" not in fields:
        raise BadRequest("tasks: required")
    tasks = _array(fields["tasks"], "tasks")
    if len(tasks) > max_tasks:
        raise BadRequest(f"at most {max_tasks} tasks per batch")
    specs = []
    for i, task in enumerate(tasks):
        where = f"tasks[{i}]."
        if isinstance(task, Mapping):
            for name in _SUBMIT_FIELDS:
                if name in task or _camel(name) in task:
                    raise BadRequest(f"{where}{name}: only a single submission can wait")
        specs.append(task_spec(task, where))
    return pb.SubmitBatchRequest(tasks=specs)


def recurring_request(data: Any) -> pb.RecurringRequest:
    """`POST /v1/recurring` (ours): name, cron, tz, overlap and a task object as `template`."""
    fields = _fields(data, "", ("name", "cron", "tz", "template", "overlap"))
    request = pb.RecurringRequest()
    for name in ("name", "cron", "tz"):
        if name in fields:
            setattr(request, name, _string(fields[name], name))
    if "overlap" in fields:
        request.overlap = _enum(pb.Overlap, fields["overlap"], "overlap")
    if "template" in fields:
        request.template.CopyFrom(task_spec(fields["template"], "template."))
    return request


def _status(value: Any, field: str) -> int:
    """A task status by the name answers give it (`dead_lettered`), as `_enum` reads names."""
    number: int = _enum(pb.TaskStatus, value, field)
    if number == pb.TASK_STATUS_UNSPECIFIED:
        raise BadRequest(f"{field}: {json.dumps(value)} is no status")
    return number


def _strings(value: Any, field: str) -> list[str]:
    return [_string(item, f"{field}[{i}]") for i, item in enumerate(_array(value, field))]


_FILTER_FIELDS = (
    "pools",
    "statuses",
    "kinds",
    "tags",
    "key",
    "key_prefix",
    "submitted_after",
    "submitted_before",
    "ids",
)


def _unix_ns(value: Any, field: str) -> int:
    """Unix seconds (a JSON number) as the wire's nanoseconds."""
    ns = round(_number(value, field) * 1e9)
    if not I64_MIN <= ns <= I64_MAX:
        raise BadRequest(f"{field}: {value} is out of range for a time")
    return ns


def task_filter(data: Any, where: str = "filter") -> pb.TaskFilter:
    """The `filter` object of a search or bulk action (docs/http.md, "Operations"): the
    statuses by the names answers use, the times in Unix seconds."""
    fields = _fields(data, where + ".", _FILTER_FIELDS)
    msg = pb.TaskFilter()
    for name in ("pools", "kinds"):
        if name in fields:
            getattr(msg, name).extend(_strings(fields[name], f"{where}.{name}"))
    if "statuses" in fields:
        field = f"{where}.statuses"
        msg.statuses.extend(
            _status(v, f"{field}[{i}]") for i, v in enumerate(_array(fields["statuses"], field))
        )
    if "tags" in fields:
        msg.tags.update(_string_map(fields["tags"], f"{where}.tags"))
    for name in ("key", "key_prefix"):
        if name in fields:
            setattr(msg, name, _string(fields[name], f"{where}.{name}"))
    for name in ("submitted_after", "submitted_before"):
        if name in fields:
            setattr(msg, f"{name}_unix_ns", _unix_ns(fields[name], f"{where}.{name}"))
    if "ids" in fields:
        field = f"{where}.ids"
        msg.ids.extend(
            _task_id(v, f"{field}[{i}]") for i, v in enumerate(_array(fields["ids"], field))
        )
    return msg


def search_request(data: Any) -> pb.SearchTasksRequest:
    """`POST /v1/tasks/search`: filter, sort (`id`, `submitted`, ...), ascending, limit and
    offset, each optional."""
    fields = _fields(data, "", ("filter", "sort", "ascending", "limit", "offset"))
    request = pb.SearchTasksRequest()
    if "filter" in fields:
        request.filter.CopyFrom(task_filter(fields["filter"]))
    if "sort" in fields:
        request.sort = _enum(pb.TaskSort, fields["sort"], "sort")
    if "ascending" in fields:
        request.ascending = _bool(fields["ascending"], "ascending")
    for name in ("limit", "offset"):
        if name in fields:
            setattr(request, name, _integer(fields[name], name, 0, U32_MAX, strings=False))
    return request


def pool_request(pool: str, data: Any) -> pb.PoolRequest:
    """`POST /v1/pools/{pool}/pause` and `/resume`: the pool is in the path; a body, if any,
    is an empty object."""
    _fields(data, "", ())
    return pb.PoolRequest(pool=pool)


def bulk_request(data: Any) -> pb.BulkRequest:
    """`POST /v1/tasks/bulk`: an action (required), a filter (an absent one matches every
    task) and dry_run."""
    fields = _fields(data, "", ("action", "filter", "dry_run"))
    if "action" not in fields:
        raise BadRequest("action: required (cancel, retry or delete)")
    request = pb.BulkRequest(action=_enum(pb.BulkAction, fields["action"], "action"))
    if request.action == pb.BULK_ACTION_UNSPECIFIED:
        raise BadRequest("action: must be cancel, retry or delete")
    if "filter" in fields:
        request.filter.CopyFrom(task_filter(fields["filter"]))
    if "dry_run" in fields:
        request.dry_run = _bool(fields["dry_run"], "dry_run")
    return request


# --- query strings -----------------------------------------------------------------------------


def _query(query: Any, known: Collection[str]) -> dict[str, str]:
    """Each parameter at most once, none but the route's (docs/http.md, "Query strings")."""
    out: dict[str, str] = {}
    for name in query:
        if name not in known:
            raise BadRequest(f"unknown query parameter {name!r}")
        values = query.getall(name)
        if len(values) > 1:
            raise BadRequest(f"query parameter {name!r} given more than once")
        out[name] = values[0]
    return out


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def list_request(query: Any) -> pb.ListTasksRequest:
    """`GET /v1/tasks?pool=a,b&status=ready,running&after=17&limit=50`."""
    params = _query(query, ("pool", "status", "after", "limit"))
    request = pb.ListTasksRequest(pools=_items(params.get("pool", "")))
    request.statuses.extend(_status(name, "status") for name in _items(params.get("status", "")))
    for name, high in (("after", U64_MAX), ("limit", None)):
        text = params.get(name, "")
        if not text:
            continue
        if not _DIGITS.fullmatch(text) or (high is not None and int(text) > high):
            raise BadRequest(f"{name}: {text!r} is not an unsigned integer")
        setattr(request, name, int(text) if high is not None else min(int(text), U32_MAX))
    return request


def timeout_query(query: Any) -> float | None:
    """`timeout_s` of the `/result` routes: a non-negative number of seconds, or None."""
    text = _query(query, ("timeout_s",)).get("timeout_s")
    if text is None:
        return None
    if not _NUMBER.fullmatch(text) or not math.isfinite(float(text)) or float(text) < 0:
        raise BadRequest(f"timeout_s: {text!r} is not a non-negative number of seconds")
    return float(text)


# --- answers -----------------------------------------------------------------------------------


def _set(
    out: dict[str, Any], msg: Message, *names: str, convert: Callable[[Any], Any] = str
) -> None:
    """out[name] = convert(msg.name) for each name the message has a value for (presence, or
    non-zero and non-empty)."""
    for name in names:
        field = msg.DESCRIPTOR.fields_by_name[name]
        present = msg.HasField(name) if field.has_presence else bool(getattr(msg, name))
        if present:
            out[name] = convert(getattr(msg, name))


def submit_answer(resp: pb.SubmitResponse, waited: bool) -> dict[str, Any]:
    """`{"id", "duplicate"}`, and `result` when the request waited."""
    out: dict[str, Any] = {"id": str(resp.id), "duplicate": resp.duplicate}
    if waited and resp.HasField("result"):
        out["result"] = task_result(resp.result)
    return out


def batch_answer(resp: pb.SubmitBatchResponse) -> dict[str, Any]:
    return {"tasks": [submit_answer(t, waited=False) for t in resp.tasks]}


def task_info(info: pb.TaskInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(info.id),
        "status": _short(pb.TaskStatus, info.status),
        "pool": info.pool,
        "attempt": info.attempt,
        "output_available": info.output_available,
    }
    _set(out, info, "key", "kind", "message", "tenant", "worker_name", "worker_id")
    _set(out, info, "max_attempts", convert=int)
    _set(out, info, "created_unix_ns", "started_unix_ns", "finished_unix_ns")
    if info.priority != pb.PRIORITY_UNSPECIFIED:
        out["priority"] = _short(pb.Priority, info.priority)
    return out


def _as_json(data: bytes) -> tuple[bool, Any]:
    """(True, value) if `data` is one strict JSON text (`loads`)."""
    try:
        return True, loads(data)
    except (ValueError, RecursionError):
        return False, None


def task_result(res: pb.TaskResult) -> dict[str, Any]:
    """`output_b64` whenever the output bytes are known, `output` too when they are JSON."""
    out: dict[str, Any] = {
        "id": str(res.id),
        "status": _short(pb.TaskStatus, res.status),
        "output_available": res.output_available,
    }
    _set(out, res, "message")
    if res.HasField("output"):
        out["output_b64"] = base64.b64encode(res.output).decode("ascii")
        parsed, value = _as_json(res.output)
        if parsed:
            out["output"] = value
    return out


def _shards(out: dict[str, Any], resp: Message) -> dict[str, Any]:
    if resp.unavailable_shards:
        out["unavailable_shards"] = list(resp.unavailable_shards)
    return out


def list_answer(resp: pb.ListTasksResponse) -> dict[str, Any]:
    """`next_after` only while another page may follow."""
    out: dict[str, Any] = {"tasks": [task_info(t) for t in resp.tasks]}
    _set(out, resp, "next_after")
    return _shards(out, resp)


def search_answer(resp: pb.SearchTasksResponse) -> dict[str, Any]:
    """`total` counts every match, not only this page."""
    out = {"tasks": [task_info(t) for t in resp.tasks], "total": resp.total}
    return _shards(out, resp)


def bulk_answer(resp: pb.BulkResponse, request: pb.BulkRequest) -> dict[str, Any]:
    out = {
        "action": _short(pb.BulkAction, request.action),
        "dry_run": request.dry_run,
        "matched": resp.matched,
        "affected": resp.affected,
    }
    return _shards(out, resp)


def pool_control_answer(resp: pb.PoolControlResponse) -> dict[str, Any]:
    return {"pool": resp.pool, "paused": resp.paused, "changed": resp.changed}


def workers_answer(resp: pb.ListWorkersResponse) -> dict[str, Any]:
    workers = [
        {
            "id": str(w.id),
            "name": w.name,
            "pool": w.pool,
            "labels": dict(w.labels),
            "slots": w.slots,
            "busy": w.busy,
            "connected_unix_ns": str(w.connected_unix_ns),
        }
        for w in resp.workers
    ]
    return _shards({"workers": workers}, resp)


def recurring_answer(resp: pb.ListRecurringResponse) -> dict[str, Any]:
    schedules = []
    for r in resp.schedules:
        info: dict[str, Any] = {
            "name": r.name,
            "cron": r.cron,
            "pool": r.pool,
            "kind": r.kind,
            "overlap": _short(pb.Overlap, r.overlap or pb.OVERLAP_SKIP),
        }
        _set(info, r, "tz", "next_unix_ns", "last_task_id")
        schedules.append(info)
    return _shards({"schedules": schedules}, resp)


def _numbers(msg: Message, names: Collection[str] | None = None) -> dict[str, Any]:
    """The scalar fields of a message (all of them, zero or not)."""
    fields = msg.DESCRIPTOR.fields
    return {
        f.name: getattr(msg, f.name)
        for f in fields
        if f.message_type is None and not f.is_repeated and (names is None or f.name in names)
    }


def snapshot_answer(resp: pb.SnapshotResponse) -> dict[str, Any]:
    """Every field always; per pool also `pending` (the sum of `pending_by_class`), and the
    group of unlabeled workers even when none is connected."""
    pools = []
    for p in resp.pools:
        pool = _numbers(p)
        pool["pending_by_class"] = list(p.pending_by_class)
        pool["pending"] = sum(p.pending_by_class)
        groups = [
            {"labels": dict(g.labels), "capacity": g.capacity, "busy": g.busy} for g in p.groups
        ]
        if not any(not g["labels"] for g in groups):
            groups.insert(0, {"labels": {}, "capacity": 0, "busy": 0})
        pool["groups"] = groups
        pools.append(pool)
    out = _numbers(resp)
    out["pools"] = pools
    out["totals"] = _numbers(resp.totals)
    out["unavailable_shards"] = list(resp.unavailable_shards)
    return out
