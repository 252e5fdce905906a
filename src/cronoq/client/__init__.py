"""`cronoq.client`: the gRPC client and remote worker for `cronoq-server` (docs/client.md).

Needs the `client` extra (`pip install 'cronoq[client]'`); `import cronoq` alone never imports
this package or grpc. The API matches the published `cronoq.client` name for name
(docs/client.md, "Compatibility with the published client").
"""

# Re-exported on purpose (docs/worker.md, "Exceptions"): `cronoq.client.Retryable is
# cronoq.Retryable`.
from cronoq.errors import CronoqError as CronoqError
from cronoq.errors import Permanent as Permanent
from cronoq.errors import Retryable as Retryable

from ._client import BULK_ACTIONS as BULK_ACTIONS
from ._client import SORTS as SORTS
from ._client import BulkResult as BulkResult
from ._client import (
    Client,
    Event,
    PoolSnapshot,
    RecurringInfo,
    Result,
    Snapshot,
    Submitted,
    TaskInfo,
    TaskPage,
    Totals,
    WorkerGroup,
    WorkerInfo,
    task,
)
from ._client import PoolControl as PoolControl
from ._client import SearchPage as SearchPage
from ._client import TaskFilter as TaskFilter
from ._common import CancelTask, ClientError, Reject
from ._common import Payload as Payload
from ._common import TaskRef as TaskRef
from ._worker import MAX_REDIRECTS as MAX_REDIRECTS
from ._worker import PROTOCOL_VERSION, Lease, Worker
from ._worker import Handler as Handler

# The published client's names. This server's additions (BULK_ACTIONS, BulkResult, PoolControl,
# SearchPage, SORTS, TaskFilter: pools paused, tasks searched and acted on in bulk) are
# importable from here but left out, so `import *` gives what it gives with the published
# client (docs/client.md, "Operations").
__all__ = [
    "CancelTask",
    "Client",
    "ClientError",
    "Event",
    "Lease",
    "PROTOCOL_VERSION",
    "PoolSnapshot",
    "RecurringInfo",
    "Reject",
    "Result",
    "Snapshot",
    "Submitted",
    "TaskInfo",
    "TaskPage",
    "Totals",
    "Worker",
    "WorkerGroup",
    "WorkerInfo",
    "task",
]

# Pickles and reprs name the public module, as they do for the published client, so an error
# pickled by either one unpickles with the other.
for _cls in (
    BulkResult, CancelTask, Client, ClientError, Event, Lease, PoolControl, PoolSnapshot,
    RecurringInfo, Reject, Result, SearchPage, Snapshot, Submitted, TaskInfo, TaskPage, Totals,
    Worker, WorkerGroup, WorkerInfo,
):  # fmt: skip
    _cls.__module__ = __name__
del _cls
