"""The PostgreSQL store's SQL (store/postgres.py): the tables, the one-round-trip commit
function and the statements the store sends, with the column lists and positions they are
built from. Kept apart from the store's logic so that each reads on its own."""

from __future__ import annotations

from collections.abc import Sequence

from .base import COLUMN, DONE_CHANGE, LIVE_CHANGE, TASK_COLUMNS

PRUNE_ROWS = 1000  # finished rows deleted per prune statement

FENCED_STATE = "CQ001"  # the SQLSTATE cronoq_commit raises when the epoch is not ours

# TASK_COLUMNS (the row tuples' order) -> the table's columns. Times are Unix ns; durations that
# the rows keep in seconds (tolerance, duration hint, timeout) are stored as ns too.
_PG_COLUMN = {
    "arrival": "arrival_unix_ns",
    "deadline": "deadline_unix_ns",
    "fixed_start": "fixed_at_unix_ns",
    "tolerance": "fixed_tolerance_ns",
    "on_miss": "fixed_on_miss",
    "duration_hint": "duration_hint_ns",
    "timeout": "timeout_ns",
    "updated": "updated_unix_ns",
    "eligible": "eligible_unix_ns",
    "not_before": "not_before_unix_ns",
    "started": "started_unix_ns",
}
_NAMES = TASK_COLUMNS.split(", ")
COLUMNS = ", ".join(_PG_COLUMN.get(n, n) for n in _NAMES)
# Places (`_AT`) in a row tuple of the columns that need converting on the way in and out.
SECONDS_AT = tuple(COLUMN[n] for n in ("tolerance", "duration_hint", "timeout"))
TEXT_AT = tuple(
    COLUMN[n] for n in ("pool", "kind", "key", "on_miss", "tenant", "status", "message")
)
JSON_AT = tuple(
    COLUMN[n] for n in ("retry", "deps", "resources", "tags", "labels", "worker", "attempts")
)
# The text and JSON columns of Batch.updates and Batch.finishes rows, by place.
LIVE_TEXT = tuple(i for i, c in enumerate(LIVE_CHANGE) if c in ("status", "message"))
DONE_TEXT = tuple(i for i, c in enumerate(DONE_CHANGE) if c in ("status", "message", "key"))
LIVE_JSON = tuple(i for i, c in enumerate(LIVE_CHANGE) if c in ("worker", "attempts"))
DONE_JSON = tuple(i for i, c in enumerate(DONE_CHANGE) if c in ("worker", "attempts"))
ID_AT = COLUMN["id"]
TERMINAL_AT = COLUMN["terminal"]

# Pools an operator paused (a resumed one stays, paused = false).
POOLS_TABLE = "CREATE TABLE cronoq_pools (name text PRIMARY KEY, paused bool NOT NULL)"

# The tables of the current version (SCHEMA_VERSION in store/postgres.py).
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cronoq_schema_version (
        id smallint PRIMARY KEY CHECK (id = 1),
        version int NOT NULL)""",
    """CREATE TABLE cronoq_leader (
        id smallint PRIMARY KEY CHECK (id = 1),
        epoch int NOT NULL,
        max_id bigint NOT NULL DEFAULT 0)""",
    "INSERT INTO cronoq_leader (id, epoch, max_id) VALUES (1, 0, 0)",
    """CREATE TABLE cronoq_tasks (
        id bigint PRIMARY KEY,
        seq bigint NOT NULL,
        arrival_unix_ns bigint NOT NULL,
        pool text NOT NULL,
        kind text NOT NULL,
        priority smallint NOT NULL,
        key text,
        payload bytea,
        deadline_unix_ns bigint,
        fixed_at_unix_ns bigint,
        fixed_tolerance_ns bigint,
        fixed_on_miss text,
        duration_hint_ns bigint,
        timeout_ns bigint,
        retry jsonb,
        deps jsonb,
        resources jsonb,
        tags jsonb,
        labels jsonb DEFAULT '[]',
        tenant text,
        status text NOT NULL,
        terminal bool NOT NULL,
        attempt int NOT NULL,
        updated_unix_ns bigint NOT NULL,
        message text,
        output bytea,
        eligible_unix_ns bigint,
        not_before_unix_ns bigint,
        started_unix_ns bigint,
        worker jsonb,
        attempts jsonb)""",
    "CREATE UNIQUE INDEX cronoq_tasks_live_key ON cronoq_tasks (key) "
    "WHERE key IS NOT NULL AND NOT terminal",
    "CREATE INDEX cronoq_tasks_key_id ON cronoq_tasks (key, id) WHERE key IS NOT NULL",
    "CREATE INDEX cronoq_tasks_live ON cronoq_tasks (id) WHERE NOT terminal",
    "CREATE INDEX cronoq_tasks_done ON cronoq_tasks (updated_unix_ns) WHERE terminal",
    """CREATE TABLE cronoq_recurring (
        name text PRIMARY KEY,
        spec jsonb NOT NULL,
        template_payload bytea,
        next_unix_ns bigint,
        last_task_id bigint)""",
    POOLS_TABLE,
)

# MIGRATIONS[v] takes a schema from version v to v + 1 (then the commit function of this
# version replaces the old one: REPLACE_COMMIT_FUNCTION and COMMIT_FUNCTION).
MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 6: the worker of a task's latest attempt and its earlier attempts, and the paused pools.
    5: (
        "ALTER TABLE cronoq_tasks ADD COLUMN worker jsonb, ADD COLUMN attempts jsonb",
        POOLS_TABLE,
    ),
}
REPLACE_COMMIT_FUNCTION = "DROP FUNCTION cronoq_commit"

# Each column's type, in TASK_COLUMNS order (as in the CREATE TABLE above).
_TYPES = (
    "bigint",
    "bigint",
    "bigint",
    "text",
    "text",
    "smallint",
    "text",
    "bytea",
    "bigint",
    "bigint",
    "bigint",
    "text",
    "bigint",
    "bigint",
    "jsonb",
    "jsonb",
    "jsonb",
    "jsonb",
    "jsonb",
    "text",
    "text",
    "bool",
    "int",
    "bigint",
    "text",
    "bytea",
    "bigint",
    "bigint",
    "bigint",
    "jsonb",
    "jsonb",
)
_LIVE = (
    ("status", "text"),
    ("attempt", "int"),
    ("message", "text"),
    ("eligible_unix_ns", "bigint"),
    ("not_before_unix_ns", "bigint"),
    ("started_unix_ns", "bigint"),
    ("worker", "jsonb"),
    ("attempts", "jsonb"),
)
_DONE = (
    ("status", "text"),
    ("attempt", "int"),
    ("updated_unix_ns", "bigint"),
    ("message", "text"),
    ("output", "bytea"),
    ("key", "text"),
    ("started_unix_ns", "bigint"),
    ("worker", "jsonb"),
    ("attempts", "jsonb"),
)
SCHEDULE = (
    ("name", "text"),
    ("spec", "jsonb"),
    ("template_payload", "bytea"),
    ("next_unix_ns", "bigint"),
    ("last_task_id", "bigint"),
)
_PG_NAMES = COLUMNS.split(", ")


def _arrays(prefix: str, columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{prefix}{name} {kind}[]" for name, kind in columns)


def _unnest(prefix: str, columns: Sequence[tuple[str, str]]) -> str:
    names = [name for name, _ in columns]
    return f"unnest({', '.join(prefix + n for n in names)}) AS v({', '.join(names)})"


LIVE_IDS = (*_LIVE, ("id", "bigint"))
DONE_IDS = (*_DONE, ("id", "bigint"))
INSERTED = tuple(zip(_PG_NAMES, _TYPES, strict=True))
POOLS = (("name", "text"), ("paused", "bool"))
# One commit is one call of this function, in one round trip (its own transaction): the fence
# first (it locks the leader row; another epoch raises "fenced", rolling everything back), then
# status changes, inserts (a key freed by the batch may be reused in it; ids already written by
# a retried commit are skipped), the outputs with the finishes, the schedules, the pools, and
# last the deletions (a task may end and be deleted in one batch). The arrays are the batch's
# columns; NULL where the batch has none.
COMMIT_FUNCTION = f"""
CREATE FUNCTION cronoq_commit(
    p_epoch int, p_max_id bigint,
    {_arrays("u_", LIVE_IDS)},
    {_arrays("d_", DONE_IDS)},
    {_arrays("i_", INSERTED)},
    {_arrays("s_", SCHEDULE)},
    r_names text[],
    {_arrays("pl_", POOLS)},
    x_ids bigint[]
) RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off AS $fn$
DECLARE
    current_epoch int;
BEGIN
    IF p_max_id IS NULL THEN
        SELECT epoch INTO current_epoch FROM cronoq_leader WHERE id = 1 FOR SHARE;
    ELSE
        -- the high-water mark, by the unsigned value (XOR with the sign bit)
        UPDATE cronoq_leader SET max_id = CASE
            WHEN (max_id # (-9223372036854775807 - 1)) < (p_max_id # (-9223372036854775807 - 1))
            THEN p_max_id ELSE max_id END
        WHERE id = 1 RETURNING epoch INTO current_epoch;
    END IF;
    IF current_epoch IS DISTINCT FROM p_epoch THEN
        RAISE EXCEPTION 'fenced: epoch %, ours %', current_epoch, p_epoch USING ERRCODE = '{
    FENCED_STATE
}';
    END IF;
    -- (the function's settings keep these joins nested loops over the arrays, each row an
    -- index lookup by id, also in a plan cached while the table was small)
    IF u_id IS NOT NULL THEN
        UPDATE cronoq_tasks AS t SET {", ".join(f"{n} = v.{n}" for n, _ in _LIVE)}
        FROM {_unnest("u_", LIVE_IDS)} WHERE t.id = v.id;
    END IF;
    IF d_id IS NOT NULL THEN
        UPDATE cronoq_tasks AS t SET terminal = true, {", ".join(f"{n} = v.{n}" for n, _ in _DONE)}
        FROM {_unnest("d_", DONE_IDS)} WHERE t.id = v.id;
    END IF;
    IF i_id IS NOT NULL THEN
        INSERT INTO cronoq_tasks ({COLUMNS})
        SELECT * FROM {_unnest("i_", INSERTED)}
        ON CONFLICT (id) DO NOTHING;
    END IF;
    IF s_name IS NOT NULL THEN
        INSERT INTO cronoq_recurring ({", ".join(n for n, _ in SCHEDULE)})
        SELECT * FROM {_unnest("s_", SCHEDULE)}
        ON CONFLICT (name) DO UPDATE SET {
    ", ".join(f"{n} = excluded.{n}" for n, _ in SCHEDULE[1:])
};
    END IF;
    IF r_names IS NOT NULL THEN
        DELETE FROM cronoq_recurring WHERE name = ANY (r_names);
    END IF;
    IF pl_name IS NOT NULL THEN
        INSERT INTO cronoq_pools (name, paused) SELECT * FROM {_unnest("pl_", POOLS)}
        ON CONFLICT (name) DO UPDATE SET paused = excluded.paused;
    END IF;
    IF x_ids IS NOT NULL THEN
        DELETE FROM cronoq_tasks WHERE id = ANY (x_ids) AND terminal;
    END IF;
END
$fn$
"""
_COMMIT_ARITY = (
    2 + len(LIVE_IDS) + len(DONE_IDS) + len(INSERTED) + len(SCHEDULE) + 1 + len(POOLS) + 1
)
COMMIT = f"SELECT cronoq_commit({', '.join(f'${i + 1}' for i in range(_COMMIT_ARITY))})"
FENCE = "SELECT epoch FROM cronoq_leader WHERE id = 1 FOR SHARE"
# A finished task's id as its dependents name it in `deps` (JSON: the unsigned value).
_UNSIGNED_TEXT = (
    "(CASE WHEN t.id < 0 THEN t.id::numeric + 18446744073709551616 ELSE t.id END)::text"
)
# A live task's dependency edges ([[id or key, condition], ...]); none when the column holds
# something else (a corrupt row must not fail every load and prune: recovery fails its task).
_EDGES = "jsonb_array_elements(CASE jsonb_typeof(c.deps) WHEN 'array' THEN c.deps END)"
# Finished rows older than $1, at most PRUNE_ROWS, that no live task depends on (by id or key).
PRUNE = f"""
DELETE FROM cronoq_tasks WHERE id IN (
    SELECT t.id FROM cronoq_tasks AS t
    WHERE t.terminal AND t.updated_unix_ns < $1 AND NOT EXISTS (
        SELECT 1 FROM cronoq_tasks AS c, {_EDGES} AS edge
        WHERE NOT c.terminal AND c.deps IS NOT NULL
          AND edge->>0 IN ({_UNSIGNED_TEXT}, t.key))
    LIMIT {PRUNE_ROWS})
"""
# What a new leader reloads: live tasks, tasks finished since $1, and finished parents of live
# tasks (however old).
LOAD = f"""
SELECT {COLUMNS} FROM cronoq_tasks AS t
WHERE NOT t.terminal OR t.updated_unix_ns >= $1 OR EXISTS (
    SELECT 1 FROM cronoq_tasks AS c, {_EDGES} AS edge
    WHERE NOT c.terminal AND c.deps IS NOT NULL AND edge->>0 IN ({_UNSIGNED_TEXT}, t.key))
"""
