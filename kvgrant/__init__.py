"""kvgrant: allocate a multi-GPU KV cache through the CUDA VMM API in few driver objects.

The package is a library first: ``kvgrant.layout`` plans (pure Python),
``kvgrant.runtime`` allocates (sim or CUDA backend, loaded lazily), and
``kvgrant.conformance`` checks runtime traces against the TLA+ model.
"""

from kvgrant.errors import (
    AllocationError,
    ArgumentError,
    BackendUnavailable,
    ContractError,
    DriverError,
    GeometryError,
    GroupError,
    HandleBudgetError,
    KVGrantError,
    LedgerError,
    LedgerLockTimeout,
    NotALedger,
    PlanCacheTimeout,
    PlanError,
    PlanFileError,
    ReleasedError,
    ToolError,
    TraceError,
)

__version__ = "0.1.0"

__all__ = [
    "AllocationError",
    "ArgumentError",
    "BackendUnavailable",
    "ContractError",
    "DriverError",
    "GeometryError",
    "GroupError",
    "HandleBudgetError",
    "KVGrantError",
    "LedgerError",
    "LedgerLockTimeout",
    "NotALedger",
    "PlanCacheTimeout",
    "PlanError",
    "PlanFileError",
    "ReleasedError",
    "ToolError",
    "TraceError",
    "__version__",
]
