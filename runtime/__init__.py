"""kvgrant.runtime: the driver interface, the transactional allocator and its grouped
options (:class:`HandleBudget`, :class:`TraceOptions`, :class:`Backend`), traces, views,
and the group runtime (one process per rank: :func:`allocate_rank`).

The CUDA backend is imported lazily (by :func:`open_driver`), and torch only when a
group is used, so this package imports without a GPU, a driver or torch.
"""

from kvgrant.runtime.allocator import Capacity, Counts, Published, allocate
from kvgrant.runtime.capacity import MemoryLimit, PageFit, fit_pages, parse_memory_limit
from kvgrant.runtime.driver import Driver, LiveCounts, open_driver
from kvgrant.runtime.group import GroupPublished, allocate_rank
from kvgrant.runtime.options import Backend, HandleBudget, TraceOptions
from kvgrant.runtime.trace import TRACE_ENV, TraceWriter, open_trace
from kvgrant.runtime.transaction import Teardown, Transaction
from kvgrant.runtime.views import DeviceBuffer, as_tensor

__all__ = [
    "Backend",
    "Capacity",
    "Counts",
    "DeviceBuffer",
    "Driver",
    "GroupPublished",
    "HandleBudget",
    "LiveCounts",
    "MemoryLimit",
    "PageFit",
    "Published",
    "TRACE_ENV",
    "Teardown",
    "TraceOptions",
    "TraceWriter",
    "Transaction",
    "allocate",
    "allocate_rank",
    "as_tensor",
    "fit_pages",
    "open_driver",
    "open_trace",
    "parse_memory_limit",
]
