"""Passing exported memory fds between the processes of a group (SCM_RIGHTS).

Why a Unix socket: an fd is a capability, and the kernel moves it between processes only
through ``SCM_RIGHTS`` on a Unix-domain socket (as PyTorch's SymmetricMemory
``IpcChannel`` and NCCL's ``ipcsocket.cc`` do). ``pidfd_getfd`` would need ptrace rights
that Yama and container seccomp deny. The socket is ``SOCK_SEQPACKET`` so every message
keeps its boundary: one JSON header (owner, allocation, handle type, size, device) and
exactly one fd per message; the handle type is on the wire so nobody guesses it.

Each importer listens on an abstract-namespace address (agreed through the group); each
owner connects once to each of its validated importers and sends one message per
allocation, then ``done``, or ``fail`` with its first error. The receiver accepts a
connection only from a peer whose credentials (``SO_PEERCRED``) have this process's uid
and the pid that an owner it imports from announced; anything else is refused and its
fds are closed at once. A receiver thread drains every connection while the main thread
makes its own memory, so two ranks that import each other never block on a full socket.
Every fd received and not taken is closed by :meth:`FdServer.close`.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kvgrant.errors import GroupError

__all__ = ["FdClient", "FdServer", "HANDLE_TYPE", "Received", "open_fd_count"]

#: The handle type every message carries (cuMemExportToShareableHandle's POSIX fd).
HANDLE_TYPE = "posix_fd"
_MAX_MSG = 4096
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_POLL_S = 0.05


def open_fd_count() -> int:
    """Open fds of this process (for the tests' "every fd closed" promise)."""
    return len(os.listdir("/proc/self/fd")) - 1  # minus the one listdir opened


def _peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    pid, uid, gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                 _CRED.size))
    return pid, uid, gid


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


@dataclass
class Received:
    """One fd received from an owner: the allocation it exports and what it is."""

    owner: int
    alloc: int
    fd: int
    size: int
    device: int
    handle_type: str


@dataclass
class _Conn:
    sock: socket.socket
    owner: int | None = None
    count: int = 0


@dataclass
class _Inbox:
    fds: dict[int, Received] = field(default_factory=dict)  # alloc -> not yet taken
    done: bool = False
    failed: str | None = None     # the owner's own error, as it sent it
    ended: str | None = None      # the connection ended before ``done``


class FdServer:
    """The importer's end: a listening socket and a thread that receives fds.

    Parameters
    ----------
    rank : int
        This process's rank (part of the address, for messages).
    token : str
        A name shared by the group's attempt (so two groups never meet).
    """

    def __init__(self, rank: int, token: str) -> None:
        self.rank = rank
        self.address = f"\0kvgrant-{token}-{rank}-{os.getpid()}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._listener.bind(self.address)
            self._listener.listen(64)
            self._listener.setblocking(False)
        except BaseException:
            self._listener.close()
            raise
        self._cond = threading.Condition()
        self._allowed: dict[int, int] = {}   # pid -> owner rank it may send as
        self._uid = os.getuid()
        self._inbox: dict[int, _Inbox] = {}
        self._refused: list[str] = []
        self._conns: list[_Conn] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        self._stopped = False

    # ------------------------------------------------------------------ set-up
    def start(self, owners: Mapping[int, int]) -> None:
        """Start receiving from ``owners`` (owner rank -> its pid): the ranks this
        process imports from; every other sender is refused."""
        self._allowed = {pid: o for o, pid in owners.items()}
        self._inbox = {o: _Inbox() for o in owners}
        self._thread = threading.Thread(target=self._serve, name=f"kvgrant-fds-{self.rank}",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while True:
                for key, _ in sel.select():
                    if key.data == "wake":
                        return
                    if key.data is None:
                        self._accept(sel)
                    else:
                        self._receive(sel, key.data)
        except Exception as err:  # noqa: BLE001 - reported to the main thread
            with self._cond:
                self._refused.append(f"fd receiver of rank {self.rank} stopped: "
                                     f"{type(err).__name__}: {err}")
                self._cond.notify_all()
        finally:
            sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        try:
            pid, uid, _ = _peer_cred(sock)
        except OSError as err:
            self._refuse(sock, f"no peer credentials ({err.strerror or err})")
            return
        owner = self._allowed.get(pid)
        why = None
        if uid != self._uid:
            why = f"peer pid {pid} runs as uid {uid}, not {self._uid}"
        elif owner is None:
            why = (f"peer pid {pid} is not the process of a rank that rank {self.rank} "
                   f"imports from (owners: { {o: p for p, o in self._allowed.items()} })")
        if why is not None:
            self._refuse(sock, why)
            return
        sock.setblocking(False)
        conn = _Conn(sock, owner)
        self._conns.append(conn)
        sel.register(sock, selectors.EVENT_READ, conn)

    def _refuse(self, sock: socket.socket, why: str) -> None:
        """Close a connection we do not accept, and any fds already queued on it."""
        sock.setblocking(False)
        try:
            while True:
                msg, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, 8, socket.MSG_CMSG_CLOEXEC)
                _close_all(fds)
                if not msg and not fds:
                    break
        except (BlockingIOError, OSError):
            pass
        sock.close()
        with self._cond:
            self._refused.append(f"rank {self.rank} refused a connection: {why}")
            self._cond.notify_all()

    def _receive(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        try:
            msg, fds, flags, _ = socket.recv_fds(conn.sock, _MAX_MSG, 2,
                                                 socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            msg, fds, flags = b"", [], 0
            reason = f"connection error {err.strerror or err}"
        else:
            reason = "closed the connection"
        owner = conn.owner
        assert owner is not None
        with self._cond:
            box = self._inbox[owner]
            if not msg and not fds:                         # EOF
                sel.unregister(conn.sock)
                conn.sock.close()
                self._conns.remove(conn)
                if not box.done and box.failed is None:
                    box.ended = f"owner {owner} {reason} after {conn.count} fd(s)"
                self._cond.notify_all()
                return
            try:
                head: dict[str, Any] = json.loads(msg)
            except ValueError:
                head = {}
            bad = None
            if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
                bad = "message or fds truncated"
            elif head.get("owner") != owner:
                bad = f"claims owner {head.get('owner')!r} on owner {owner}'s connection"
            elif "fail" in head:
                box.failed = str(head["fail"])
            elif head.get("done"):
                box.done = True
            elif len(fds) != 1 or head.get("type") != HANDLE_TYPE:
                bad = f"expected one {HANDLE_TYPE} fd, got {len(fds)} of type {head.get('type')!r}"
            else:
                a = int(head["alloc"])
                if a in box.fds:
                    bad = f"allocation {a} sent twice"
                else:
                    box.fds[a] = Received(owner, a, fds[0], int(head["size"]),
                                          int(head["device"]), HANDLE_TYPE)
                    conn.count += 1
                    fds = []
            if bad is not None:
                self._refused.append(f"rank {self.rank} refused a message from owner "
                                     f"{owner}: {bad}")
            _close_all(fds)
            self._cond.notify_all()

    # ----------------------------------------------------------------- taking
    def take(self, owner: int, alloc: int, deadline: float,
             check: Callable[[], None] | None = None) -> Received:
        """Wait for ``owner``'s fd of ``alloc``; the caller owns (and closes) it.

        ``check`` is called every few tens of ms while waiting (it raises to stop, e.g.
        when ``owner``'s process died).

        Raises
        ------
        GroupError
            The owner failed, ended its connection early, a sender was refused, or the
            deadline passed.
        """
        with self._cond:
            while True:
                box = self._inbox.get(owner)
                if box is None:
                    raise GroupError(f"rank {self.rank} does not import from rank {owner}",
                                     rank=self.rank, peer=owner)
                got = box.fds.pop(alloc, None)
                if got is not None:
                    return got
                if self._refused:
                    raise GroupError(self._refused[0], rank=self.rank, peer=owner)
                if box.failed is not None:
                    raise GroupError(f"owner rank {owner} failed before sending allocation "
                                     f"{alloc}: {box.failed[:200]}", rank=self.rank, peer=owner)
                if box.ended is not None or box.done:
                    what = box.ended or f"owner {owner} said done"
                    raise GroupError(f"rank {self.rank} got no fd of allocation {alloc} from "
                                     f"rank {owner}: {what}", rank=self.rank, peer=owner)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GroupError(f"rank {self.rank} waited past its deadline for rank "
                                     f"{owner}'s fd of allocation {alloc}", rank=self.rank,
                                     peer=owner, missing=[owner])
                self._cond.wait(min(left, _POLL_S))
                if check is not None:
                    self._cond.release()
                    try:
                        check()
                    finally:
                        self._cond.acquire()

    @property
    def refused(self) -> list[str]:
        with self._cond:
            return list(self._refused)

    def close(self) -> None:
        """Stop the thread, close every socket and every fd received and not taken."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._cond:
            for box in self._inbox.values():
                _close_all([r.fd for r in box.fds.values()])
                box.fds.clear()
            for conn in self._conns:
                conn.sock.close()
            self._conns.clear()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()


class FdClient:
    """The owner's end of one connection to one importer."""

    def __init__(self, owner: int, importer: int, address: str, deadline: float) -> None:
        self.owner = owner
        self.importer = importer
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            self.sock.connect(address)
        except BaseException:
            self.sock.close()
            raise

    def send(self, alloc: int, fd: int, size: int, device: int, deadline: float) -> None:
        """Send one fd of ``alloc`` (the socket blocks at most until ``deadline``)."""
        head = {"owner": self.owner, "alloc": alloc, "type": HANDLE_TYPE, "size": size,
                "device": device}
        self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        socket.send_fds(self.sock, [json.dumps(head).encode()], [fd], socket.MSG_NOSIGNAL)

    def finish(self, error: str | None = None) -> None:
        """Say ``done`` (or ``fail`` with the first error) and close; never raises."""
        head: dict[str, Any] = {"owner": self.owner}
        if error is None:
            head["done"] = True
        else:
            head["fail"] = error[:3000]
        try:
            self.sock.settimeout(1.0)
            self.sock.send(json.dumps(head).encode(), socket.MSG_NOSIGNAL)
        except OSError:
            pass
        self.sock.close()
