"""Shared-memory state passed between stage processes: the control record, the request table."""

from horizonserve.runtime.monitor.record import (
    ControlRecord,
    DecisionWriter,
    DownstreamActivity,
    DownstreamWriter,
    RecordBusyError,
    RecordFormatError,
    SmDecision,
)
from horizonserve.runtime.monitor.request_table import (
    RequestEntry,
    RequestTable,
    TableFormatError,
    TableFullError,
)
from horizonserve.runtime.monitor.shm import shm_dir, shm_path

__all__ = [
    "ControlRecord",
    "DecisionWriter",
    "DownstreamActivity",
    "DownstreamWriter",
    "RecordBusyError",
    "RecordFormatError",
    "RequestEntry",
    "RequestTable",
    "SmDecision",
    "TableFormatError",
    "TableFullError",
    "shm_dir",
    "shm_path",
]
