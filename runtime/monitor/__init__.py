"""Shared-memory state passed between stage processes: the control record, the request table."""

from horizonserve.runtime.monitor.cleanup import remove_stale
from horizonserve.runtime.monitor.record import (
    ControlRecord,
    DecisionWriter,
    DownstreamActivity,
    DownstreamWriter,
    PublishedDecision,
    RecordBusyError,
    RecordFormatError,
)
from horizonserve.runtime.monitor.request_table import (
    RequestEntry,
    RequestTable,
    TableBusyError,
    TableFormatError,
    TableFullError,
)
from horizonserve.runtime.monitor.shm import shm_dir, shm_path

__all__ = [
    "ControlRecord",
    "DecisionWriter",
    "DownstreamActivity",
    "DownstreamWriter",
    "PublishedDecision",
    "RecordBusyError",
    "RecordFormatError",
    "RequestEntry",
    "RequestTable",
    "TableBusyError",
    "TableFormatError",
    "TableFullError",
    "remove_stale",
    "shm_dir",
    "shm_path",
]
