"""An in-memory stand-in for the few torch.distributed Store calls allocate_rank makes
(add, set, get, check, compare_set), for groups whose ranks are threads of one test
process."""

from __future__ import annotations

import threading


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
