"""An in-memory stand-in for the few torch.distributed Store calls allocate_rank makes
(add, set, get, check, compare_set), and a group whose ranks are threads of one test
process on it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Sequence

from kvgrant.layout.geometry import Geometry
from kvgrant.runtime.group import GroupPublished, allocate_rank


class DictStore:
    """The store calls of runtime/group.py's _Channel, on a dict under a lock."""

    def __init__(self) -> None:
        self.d: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def add(self, key: str, n: int) -> int:
        with self.lock:
            v = int(self.d.get(key, b"0")) + n
            self.d[key] = str(v).encode()
            return v

    def set(self, key: str, value: str) -> None:
        with self.lock:
            self.d[key] = value.encode()

    def get(self, key: str) -> bytes:
        with self.lock:
            return self.d[key]

    def check(self, keys: list[str]) -> bool:
        with self.lock:
            return all(k in self.d for k in keys)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        with self.lock:
            if key not in self.d and expected == "":
                self.d[key] = desired.encode()
            return self.d[key]


def run_threads(g: Geometry, drivers: Sequence[Any], tmp_path: Path | None = None, *,
                per_rank: dict[int, dict[str, Any]] | None = None, timeout_s: float = 10.0,
                store: DictStore | None = None, **kw: Any) -> list[Any]:
    """One allocate_rank per rank, each in its own thread; returns what each returned
    (a GroupPublished) or raised. Traces go to ``tmp_path/rank<R>.ndjson``."""
    n = g.topology.ranks
    store = store if store is not None else DictStore()
    out: list[Any] = [None] * n

    def one(r: int) -> None:
        args = dict(kw, driver=drivers[r], device=r, timeout_s=timeout_s, store=store)
        if tmp_path is not None:
            args["trace"] = tmp_path / f"rank{r}.ndjson"
        args.update((per_rank or {}).get(r, {}))
        try:
            out[r] = allocate_rank(g, r, **args)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out[r] = e

    threads = [threading.Thread(target=one, args=(r,), name=f"rank{r}") for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank did not return"
    return out


def release_all(outs: Sequence[Any]) -> None:
    for o in outs:
        if isinstance(o, GroupPublished):
            o.release()
