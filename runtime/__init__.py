"""kvgrant.runtime: the driver interface, the transactional allocator, traces, views.

The CUDA backend is imported lazily (by :func:`open_driver`), so this package imports
without a GPU or a driver.
"""

from kvgrant.runtime.allocator import Capacity, Counts, Published, allocate
from kvgrant.runtime.capacity import MemoryLimit, PageFit, fit_pages, parse_memory_limit
from kvgrant.runtime.driver import Driver, LiveCounts, open_driver
from kvgrant.runtime.trace import TRACE_ENV, TraceWriter, open_trace
from kvgrant.runtime.transaction import Teardown, Transaction
from kvgrant.runtime.views import DeviceBuffer, as_tensor

__all__ = [
    "Capacity",
    "Counts",
    "DeviceBuffer",
    "Driver",
    "LiveCounts",
    "MemoryLimit",
    "PageFit",
    "Published",
    "TRACE_ENV",
    "Teardown",
    "TraceWriter",
    "Transaction",
    "allocate",
    "as_tensor",
    "fit_pages",
    "open_driver",
    "open_trace",
    "parse_memory_limit",
]
