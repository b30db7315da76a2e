"""``TorchrunEngine``: ``open_run``'s workers as the processes of a ``torchrun`` job.

Rank 0 hosts the run; every other rank's reports travel to it over torchrun's own c10d
store, and rank 0's status comes back as numbered keys (docs/trainers/torchrun.md).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import signal
import threading
import time
import traceback
import uuid
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import msgspec
import torch.distributed as dist

from eventbus._logging import get_logger
from eventbus._text import MAX_TRACEBACK, clip, safe_str
from handlers import Reporter, ReportError, WorkerError, WorkerGroupError
from handlers._metric_values import MetricsError, freeze_metrics
from handlers._reporter import persisted
from handlers._signals import takes_signals

if TYPE_CHECKING:
    from handlers import Run, WorkerFn

__all__ = ["TorchrunEngine", "TorchrunReporter"]

_log = get_logger("adapters.torchrun")

#: How long a rank waits for rank 0 to answer its join, seconds (rank 0 may be
#: restoring a large resume first).
_JOIN_TIMEOUT_S = 600.0
#: How often a joining rank looks for its answer (and for a new rank 0), seconds.
_JOIN_POLL_S = 0.02
#: A rank whose worker failed waits this long for rank 0 to take the failure, and
#: then as long again for torchrun to stop the group, before it exits by itself.
_FAILURE_HANDOFF_S = 10.0
#: How often a rank's thread pushes the messages that wait, seconds: one store call
#: for all of them (a report itself is one append: no syscall, no thread woken).
_SEND_INTERVAL_S = 0.05
#: Status keys kept behind the latest (a follower reads the latest within microseconds).
_KEPT_STATUSES = 64
#: Rejected messages said one by one; the rest are counted, and said at the end.
_SAID_REJECTIONS = 3
#: Blocking store calls wait this long (a follower waits a whole step, or an eval).
_STORE_WAIT = timedelta(hours=24)


# --- what travels ---------------------------------------------------------------------


class _Join(msgspec.Struct, tag="join", array_like=True, forbid_unknown_fields=True):
    rank: int
    nonce: str


class _Report(msgspec.Struct, tag="report", array_like=True, forbid_unknown_fields=True):
    """``escaped``: ``[metrics, checkpoint]`` as JSON, in their place when they hold a lone
    surrogate (a name from undecodable bytes), which MessagePack's UTF-8 cannot."""

    run: str
    rank: int
    nonce: str
    index: int
    metrics: dict[str, Any]
    checkpoint: str | None
    escaped: str | None = None


class _Failed(msgspec.Struct, tag="failed", array_like=True, forbid_unknown_fields=True):
    run: str
    rank: int
    nonce: str
    error_type: str
    message: str
    traceback: str


class _Ended(msgspec.Struct, tag="ended", array_like=True, forbid_unknown_fields=True):
    run: str
    rank: int
    nonce: str


_Message = _Join | _Report | _Failed | _Ended
_decode_messages = msgspec.msgpack.Decoder(list[_Message]).decode
#: What decoding a message that is not one raises (nested past Python's stack, too).
_MALFORMED = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


class _Status(msgspec.Struct, array_like=True, frozen=True):
    """What the workers read, as of rank 0's ``rounds``-th handled round of this attempt.

    ``limit``: the most rounds that can still complete (a rank's worker ended after
    that many reports), ``None`` while every worker runs; ``over``: rank 0's pump
    has ended (the workers' rounds go nowhere any more).
    """

    rounds: int
    stop: bool
    checkpoint: bool
    values: dict[str, Any]
    latest: str | None
    limit: int | None = None
    over: bool = False


class _Hello(msgspec.Struct, array_like=True, frozen=True):
    """Rank 0's answer to a join: the run's id, where the rank's reports start, and
    the status to start from (``seq``: its number)."""

    run: str
    first_index: int
    seq: int
    status: _Status


_encode = msgspec.msgpack.Encoder().encode
_decode_status = msgspec.msgpack.Decoder(_Status).decode
_decode_hello = msgspec.msgpack.Decoder(_Hello).decode


def _sendable(message: _Message) -> msgspec.Raw:
    """``message`` encoded: a report's lone surrogates escaped (JSON keeps them)."""
    try:
        return msgspec.Raw(_encode(message))
    except UnicodeEncodeError:
        if not isinstance(message, _Report):
            raise
    escaped = json.dumps([message.metrics, message.checkpoint])
    escaping = msgspec.structs.replace(message, metrics={}, checkpoint=None, escaped=escaped)
    return msgspec.Raw(_encode(escaping))


def _unescaped(message: _Report) -> tuple[dict[str, Any], str | None]:
    """A report's metrics and checkpoint; ``ValueError`` if its escaped form is not that."""
    if message.escaped is None:
        return message.metrics, message.checkpoint
    try:
        metrics, checkpoint = json.loads(message.escaped)
        if isinstance(metrics, dict) and isinstance(checkpoint, str | None):
            return metrics, checkpoint
    except (ValueError, TypeError, RecursionError):  # not JSON, not a pair, too deep
        pass
    raise ValueError("its escaped metrics are not JSON of a dict and a path")


# --- the store ------------------------------------------------------------------------


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(
            f"TorchrunEngine runs under torchrun, which sets {name}: launch the script with "
            "`torchrun --nproc-per-node N script.py`"
        )
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"{name}={value!r} is not a whole number (torchrun sets it)") from None


class _Link:
    """This process's connection to torchrun's c10d store, under the run's prefix (a store
    object is used by one thread at a time: each thread takes its own ``clone()``)."""

    def __init__(self, store: dist.Store, prefix: str) -> None:
        self._store = store
        self._prefix = prefix
        self.store = dist.PrefixStore(prefix, store)

    @classmethod
    def connect(cls, name: str) -> _Link:
        """A client of the store torchrun's agent hosts (``MASTER_ADDR:MASTER_PORT``)."""
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            raise RuntimeError(
                "TorchrunEngine talks through the store torchrun's agent hosts, and "
                "TORCHELASTIC_USE_AGENT_STORE is not True: launch the script with torchrun"
            )
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            _env_int("MASTER_PORT"),
            is_master=False,
            timeout=_STORE_WAIT,
        )
        return cls(store, f"train_eventbus/{name}/")

    def clone(self) -> _Link:
        return _Link(self._store.clone(), self._prefix)


# --- every rank: sending and following --------------------------------------------------


class _Sender:
    """A rank's messages to rank 0, in order, from a thread of its own: ``send`` only
    appends (a report never waits, nor wakes a thread); the thread pushes what waits
    as one message every ``_SEND_INTERVAL_S``, or at once when told (``now``)."""

    def __init__(self, link: _Link, inbox: str) -> None:
        self._link = link
        self._inbox = inbox
        #: Messages, and the flushes (events set once what is before them was pushed);
        #: ``None`` ends the thread. A deque: appended and popped without a lock.
        self._waiting: collections.deque[msgspec.Raw | threading.Event | None] = collections.deque()
        self._now = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._send, name="eventbus-torchrun-send")
        self._thread.daemon = True
        self._thread.start()

    def send(self, message: _Message, *, now: bool = False) -> None:
        """Queue ``message``, encoded here: what cannot be is the sender's error, never
        the thread's (which would lose every later message)."""
        self._waiting.append(_sendable(message))
        if now:
            self._now.set()

    def push_now(self) -> None:
        """Push what waits without waiting for the interval (a ``sync`` waits on it)."""
        self._now.set()

    def flush(self) -> None:
        """Return once everything given was pushed (or could not be)."""
        pushed = threading.Event()
        self._waiting.append(pushed)
        self._now.set()
        pushed.wait()

    def close(self) -> None:
        self._waiting.append(None)
        self._now.set()
        self._thread.join()

    def _send(self) -> None:
        store = self._link.store
        waiting = self._waiting
        while True:
            self._now.wait(_SEND_INTERVAL_S)
            self._now.clear()
            messages: list[msgspec.Raw] = []
            flushed: list[threading.Event] = []
            closing = False
            while waiting:
                item = waiting.popleft()
                if isinstance(item, threading.Event):
                    flushed.append(item)
                elif item is None:
                    closing = True
                else:
                    messages.append(item)
            try:
                if messages and self.error is None:
                    store.queue_push(self._inbox, _encode(messages))
            except Exception as exc:  # rank 0's store is gone: nothing more can be sent
                self.error = f"{type(exc).__name__}: {exc}"
                _log.warning(f"reports to rank 0 stopped: the store failed ({self.error})")
            for event in flushed:
                event.set()
            if closing:
                return


class _Follower:
    """The status rank 0 writes, followed by a thread of this rank's: read without
    waiting by ``should_stop`` and the like, waited for by ``sync``."""

    def __init__(self, link: _Link, host: str, hello: _Hello) -> None:
        self._link = link
        self._host = host
        self.seq = hello.seq
        self.status = hello.status
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._follow, name="eventbus-torchrun-follow")
        self._thread.daemon = True  # it waits on rank 0, which may be gone
        self._thread.start()

    def wait_rounds(self, rounds: int, timeout: float | None = None) -> bool:
        """Wait until rank 0 handled ``rounds`` rounds, or they cannot come; whether so."""
        with self._changed:
            return self._changed.wait_for(lambda: _reached(self.status, rounds), timeout)

    def wait_over(self, timeout: float | None = None) -> bool:
        """Wait until rank 0's pump is over (and this thread with it); whether it is."""
        with self._changed:
            over = self._changed.wait_for(lambda: self.status.over, timeout)
        if over:  # a thread left waiting inside the store aborts the process at exit
            self._thread.join()
        return over

    def _follow(self) -> None:
        store = self._link.store
        seq = self.seq
        try:
            while not self.status.over:
                latest = int(store.add(_seq_key(self._host), 0))
                seq = latest if latest > seq else seq + 1  # the latest says it all
                status = _decode_status(store.get(_status_key(self._host, seq)))
                with self._changed:
                    self.seq, self.status = seq, status
                    self._changed.notify_all()
        except Exception as exc:  # the store is gone (rank 0's agent ended): say so, end
            _log.warning(f"rank 0's status no longer comes: {type(exc).__name__}: {exc}")
            with self._changed:
                self.status = msgspec.structs.replace(self.status, over=True)
                self._changed.notify_all()


def _reached(status: _Status, rounds: int) -> bool:
    limit = status.limit
    return status.rounds >= rounds or status.over or (limit is not None and limit < rounds)


def _seq_key(host: str) -> str:
    return f"seq/{host}"


def _status_key(host: str, seq: int) -> str:
    return f"status/{host}/{seq}"


def _hello_key(host: str, nonce: str) -> str:
    return f"hello/{host}/{nonce}"


def _inbox(host: str) -> str:
    return f"inbox/{host}"


class TorchrunReporter(Reporter):
    """A rank's ``Reporter`` in a torchrun job: the same interface, sent to rank 0 by a
    thread (a report never waits for rank 0); what it reads is rank 0's latest status."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        *,
        hello: _Hello,
        nonce: str,
        sender: _Sender,
        follower: _Follower,
        state_dir: Path | None,
    ) -> None:
        # Not a run's reporter: the run is in rank 0. Same attributes, though.
        self.rank = rank
        self.world_size = world_size
        self.attempt = _restart_count()
        self.ended = False
        self.run_id = hello.run
        self.nonce = nonce
        self._index = hello.first_index
        self._rounds = 0  # reports of this attempt
        self.sender = sender
        self.follower = follower
        self._state_dir = state_dir

    async def report(
        self, metrics: dict[str, Any], checkpoint: str | os.PathLike[str] | None = None
    ) -> None:
        try:
            frozen = freeze_metrics(metrics)
        except MetricsError as exc:
            raise ReportError(self.rank, exc.field, exc.reason) from None
        location = None if checkpoint is None else self._checkpoint_location(checkpoint)
        index = self._index
        if location is not None and self._state_dir is not None:
            location = await persisted(self.rank, self._state_dir, location, index)
        self._index += 1
        self._rounds += 1
        message = _Report(self.run_id, self.rank, self.nonce, index, dict(frozen), location)
        self.sender.send(message, now=location is not None)

    async def sync(self) -> None:
        if not _reached(self.follower.status, self._rounds):
            self.sender.push_now()
            await anyio.to_thread.run_sync(self.follower.wait_rounds, self._rounds)

    @property
    def reports(self) -> int:
        return self._index

    @property
    def should_stop(self) -> bool:
        return self.follower.status.stop

    @property
    def should_checkpoint(self) -> bool:
        return self.follower.status.checkpoint

    @property
    def from_callbacks(self) -> dict[str, Any]:
        return dict(self.follower.status.values)

    @property
    def latest_checkpoint(self) -> str | None:
        return self.follower.status.latest

    async def finish(self, failure: Exception | None) -> None:
        """Send the worker's end: its failure (as text), or that it returned."""
        if failure is None:
            self.sender.send(_Ended(self.run_id, self.rank, self.nonce), now=True)
            return
        text = clip("".join(traceback.format_exception(failure)), MAX_TRACEBACK)
        kind = type(failure).__qualname__
        failed = _Failed(self.run_id, self.rank, self.nonce, kind, safe_str(failure), text)
        self.sender.send(failed, now=True)


async def _work(fn: WorkerFn, reporter: TorchrunReporter | _HostReporter) -> Exception | None:
    """Run the worker; its end (returned, or its exception) goes to rank 0 after its
    reports. Returns the exception."""
    work = fn(reporter)
    try:
        await (reporter.run.counting_holds(work) if isinstance(reporter, _HostReporter) else work)
    except Exception as exc:
        reporter.ended = True
        await reporter.finish(exc)
        return exc
    finally:
        reporter.ended = True
    await reporter.finish(None)
    return None


class _HostReporter(Reporter):
    """Rank 0's worker's reporter: the run's own ``run.reporter(0)`` (its reports go
    straight to the bus, as on the local engine), and the pump hears of each."""

    def __init__(self, run: Run, pump: _Pump) -> None:
        super().__init__(run, 0)
        self.attempt = _restart_count()
        self._local = run.reporter(0)
        self._pump = pump

    async def report(
        self, metrics: dict[str, Any], checkpoint: str | os.PathLike[str] | None = None
    ) -> None:
        await self._local.report(metrics, checkpoint)
        self._pump.reported()

    async def sync(self) -> None:
        """Wait until the status of this rank's latest round went out to the other
        ranks: its next step (a DDP all-reduce, say) may hold this loop until they
        come to it, which they do once they read that status."""
        await self._pump.host_synced()

    @property
    def reports(self) -> int:
        return self._local.reports

    async def finish(self, failure: Exception | None) -> None:
        await self._pump.host_ended(failure)


# --- rank 0: the pump -----------------------------------------------------------------


class _Publisher:
    """Rank 0's statuses, written by a thread of its own (the loop never waits for the
    store); one that waits behind a newer one is skipped (the newest says it all)."""

    def __init__(self, link: _Link, host: str) -> None:
        self._link = link
        self._host = host
        self._waiting: queue.Queue[_Status | None] = queue.Queue()
        self._thread = threading.Thread(target=self._write, name="eventbus-torchrun-status")
        self._thread.daemon = True
        self._thread.start()

    def publish(self, status: _Status) -> None:
        self._waiting.put(status)

    def close(self, last: _Status) -> None:
        """Write ``last``, then wake the inbox's thread to its end; return when done."""
        self._waiting.put(last)
        self._waiting.put(None)
        self._thread.join()

    def _write(self) -> None:
        store = self._link.store
        seq = 0
        failed = False
        while True:
            status = self._waiting.get()
            closing = status is None
            while not closing:
                try:
                    newer = self._waiting.get_nowait()
                except queue.Empty:
                    break
                closing = newer is None
                status = status if newer is None else newer
            try:
                if status is not None and not failed:
                    seq += 1
                    store.set(_status_key(self._host, seq), _encode(status))
                    store.add(_seq_key(self._host), 1)
                    if seq > _KEPT_STATUSES:
                        store.delete_key(_status_key(self._host, seq - _KEPT_STATUSES))
                if closing:
                    store.queue_push(_inbox(self._host), b"")  # ends the inbox's thread
            except Exception as exc:  # the store is gone: the workers learn it their own way
                if not failed:
                    _log.warning(
                        f"rank 0's status could not be written: {type(exc).__name__}: {exc}"
                    )
                failed = True
            if closing:
                return


class _Pump:
    """Rank 0's side: the ranks' messages into the run, as its own tasks would report,
    and the run's status back to them."""

    def __init__(self, run: Run, link: _Link, host: str) -> None:
        self.run = run
        self.world_size = run.world_size
        self.host = host
        self._link = link  # the inbox's thread's
        self.joined: dict[int, str] = {}  # rank 0's reports do not travel
        self.counts = [0] * run.world_size  # reports taken in, per rank, this attempt
        self.ended: dict[int, int] = {}  # ranks whose worker ended: after how many reports
        self.failures: dict[int, BaseException] = {}
        self.rounds = 0
        self.rejected = 0
        self.over = False
        #: The latest status given to the publisher, and its news.
        self.published = self.status()
        self.publishing = anyio.Event()
        self._host_syncing = False
        #: What the inbox's thread delivered, and the wake-up of the loop's pump (rank 0's
        #: reports wake it too). The thread answers joins at once (a worker's blocking DDP
        #: step may hold the loop); the rest waits for the loop.
        self._delivered: list[bytes] = []
        self._wake = anyio.Event()
        self._moving = anyio.Event()  # the intake took something in
        status = self.published
        self._hellos = [
            _Hello(run.run_id, run.first_index(r), 0, status) for r in range(run.world_size)
        ]
        self._publisher: _Publisher | None = None
        self._receiver: threading.Thread | None = None

    def start(self) -> None:
        """Start the inbox's and the status's threads (in the run's loop)."""
        token = anyio.lowlevel.current_token()
        self._publisher = _Publisher(self._link.clone(), self.host)
        self._receiver = threading.Thread(
            target=self._receive, args=(token,), name="eventbus-torchrun-inbox"
        )
        self._receiver.daemon = True
        self._receiver.start()

    def _receive(self, token: anyio.lowlevel.EventLoopToken) -> None:
        store = self._link.store
        try:
            while True:
                raw = store.queue_pop(_inbox(self.host))
                if raw == b"":  # the pump's own wake-up: it is over
                    return
                try:  # a join is answered here (the pump checks the rest)
                    messages = _decode_messages(raw)
                except _MALFORMED:
                    messages = []
                join = messages[0] if len(messages) == 1 else None
                if isinstance(join, _Join) and 0 < join.rank < self.world_size:
                    hello = msgspec.structs.replace(self._hellos[join.rank], run=self.run.run_id)
                    store.set(_hello_key(self.host, join.nonce), _encode(hello))
                anyio.from_thread.run_sync(self._deliver, raw, token=token)
        except anyio.RunFinishedError:  # the run's loop is over
            return
        except Exception as exc:
            _log.warning(f"rank 0's inbox failed: {type(exc).__name__}: {exc}")

    def _deliver(self, raw: bytes) -> None:
        self._delivered.append(raw)
        self._wake.set()

    def reported(self) -> None:
        """Rank 0's worker reported (to the run, in this process): the status moves if
        that completed a round (rank 0 is most often ahead of the others' pushes)."""
        counts = self.counts
        counts[0] += 1
        if counts[0] <= min(counts[1:], default=counts[0]):
            self._moving.set()

    async def host_ended(self, failure: Exception | None) -> None:
        """Rank 0's worker ended: returned, or failed with ``failure``."""
        self._end(0)
        if failure is not None:
            self.failures[0] = failure
            await self.run.worker_failed(0, failure, _restart_count())
        self._wake.set()

    def status(self, over: bool = False) -> _Status:
        run = self.run
        limit = min(self.ended.values()) if self.ended else None
        return _Status(
            rounds=self.rounds,
            stop=run.should_stop or over,
            checkpoint=run.should_checkpoint,
            values=run.for_workers,
            latest=run.latest_checkpoint,
            limit=limit,
            over=over,
        )

    async def serve(self, worker: anyio.CancelScope) -> None:
        """Take messages until every rank's worker ended or one failed (then rank 0's
        own worker is stopped); the last status says the pump is over."""
        try:
            async with anyio.create_task_group() as statuses:
                statuses.start_soon(self._follow_rounds)
                while len(self.ended) < self.world_size and not self.failures:
                    await self._wake.wait()
                    self._wake = anyio.Event()
                    raws, self._delivered = self._delivered, []
                    for raw in raws:
                        await self._take_in(raw)
                    self._moving.set()
                statuses.cancel_scope.cancel()
            if self.failures:
                worker.cancel()
        finally:
            self.over = True
            self.publishing.set()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._close, self.status(over=True))

    def _close(self, last: _Status) -> None:
        if self._publisher is not None:
            self._publisher.close(last)
        if self._receiver is not None:  # one left inside the store aborts the process at exit
            self._receiver.join(_FAILURE_HANDOFF_S)
        if self.rejected > _SAID_REJECTIONS:
            _log.warning(
                f"{self.rejected} messages that were not this run's were rejected in all",
                run_id=self.run.run_id,
            )

    async def _follow_rounds(self) -> None:
        """Publish the status once the callbacks handled the rounds now complete, or
        once a rank's end changed which rounds can complete: a task beside the intake,
        which goes on meanwhile (a round waits for reports behind it)."""
        while True:
            await self._moving.wait()
            self._moving = anyio.Event()
            complete = min(self.counts)
            if complete > self.rounds:
                # Waited for through a rank that lacks the next round: rank 0's worker may
                # report again meanwhile, and its next round waits for ranks that wait for
                # this status (rank 0 then lacks it only if every other rank is past it).
                others = self.counts[1:]
                rank = 1 + others.index(complete) if complete in others else 0
                await self.run.wait_gathered(rank)
                self.rounds = complete
            status = self.status()
            if status == self.published or self._publisher is None:
                continue
            # A status whose rounds alone moved goes out only if a rank may be waiting in
            # ``sync`` for them: another rank with no round left here, or rank 0's own
            # (each costs the store three calls and rank 0 a thread's turn).
            counts, rounds = self.counts, status.rounds
            awaited = rounds in counts[1:] or (self._host_syncing and rounds >= counts[0])
            only_rounds = msgspec.structs.replace(status, rounds=self.published.rounds)
            if only_rounds == self.published and not awaited:
                continue
            self._publisher.publish(status)
            self.published = status
            self.publishing.set()
            self.publishing = anyio.Event()

    async def host_synced(self) -> None:
        """Wait until the status of rank 0's latest round went out to the other ranks."""
        self._host_syncing = True
        self._moving.set()
        try:
            while not self.over and not _reached(self.published, self.counts[0]):
                await self.publishing.wait()
        finally:
            self._host_syncing = False

    async def _take_in(self, raw: bytes) -> None:
        if not raw:  # the pump's own wake-up
            return
        try:
            messages = _decode_messages(raw)
        except _MALFORMED as exc:
            self._reject(f"a malformed message ({exc})")
            return
        for message in messages:
            if isinstance(message, _Join):  # the receiver answered it already
                if 0 < message.rank < self.world_size:
                    self.joined[message.rank] = message.nonce
                else:
                    size = self.world_size
                    self._reject(f"a join from rank {message.rank}, outside world size {size}")
                continue
            problem = self._foreign(message)
            if problem is not None:
                self._reject(problem)
            elif isinstance(message, _Report):
                await self._report(message)
            elif isinstance(message, _Failed):
                rank = message.rank
                error = WorkerError(rank, message.error_type, message.message, message.traceback)
                self.failures[rank] = error
                self._end(rank)
                await self.run.worker_failed(rank, error, _restart_count())
            else:
                self._end(message.rank)

    def _foreign(self, message: _Report | _Failed | _Ended) -> str | None:
        """Why ``message`` is not this run's (``None``: it is)."""
        rank = message.rank
        if message.run != self.run.run_id:
            return f"a message of another run ({message.run!r}, this is {self.run.run_id!r})"
        if not 0 <= rank < self.world_size:
            return f"a message from rank {rank}, outside world size {self.world_size}"
        if self.joined.get(rank) != message.nonce:
            return f"a message from rank {rank} that is not this attempt's rank {rank}"
        if rank in self.ended:
            return f"a message from rank {rank} after its worker ended"
        return None

    async def _report(self, message: _Report) -> None:
        reporter = self.run.reporter(message.rank)
        if message.index != reporter.reports:
            self._reject(
                f"report {message.index} of rank {message.rank} out of order "
                f"(its next is {reporter.reports})"
            )
            return
        try:
            metrics, checkpoint = _unescaped(message)
        except ValueError as exc:
            self._reject(f"a malformed report ({exc})")
            return
        try:
            await reporter.report(metrics, checkpoint=checkpoint)
        except ReportError as exc:
            self._reject(str(exc))
            return
        self.counts[message.rank] += 1

    def _end(self, rank: int) -> None:
        self.ended[rank] = self.counts[rank]
        self.run.reporter(rank).ended = True

    def _reject(self, reason: str) -> None:
        self.rejected += 1
        if self.rejected <= _SAID_REJECTIONS:
            more = " (further ones are counted)" if self.rejected == _SAID_REJECTIONS else ""
            _log.warning(
                f"rejected a message that is not this run's: {reason[:300]}{more}",
                run_id=self.run.run_id,
            )


def _restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


# --- the engine -----------------------------------------------------------------------


class TorchrunEngine:
    """Runs ``open_run``'s workers as the processes of a ``torchrun`` job.

    Every process runs the script; ``run.workers(train)`` there runs this process's
    rank. Rank 0 hosts the run (``hosts_run``: read ``run.result`` there); the others
    send it their reports and read its status. ``world_size`` must be torchrun's
    ``WORLD_SIZE``, and restarts are torchrun's (``--max-restarts``): rank 0's run,
    opened with ``resume_from=`` its ``state_dir``, continues from the latest
    checkpoint. SIGTERM on the other ranks is left to rank 0's run
    (docs/trainers/torchrun.md).
    """

    def __init__(self) -> None:
        self.rank = _env_int("RANK")
        self.world_size = _env_int("WORLD_SIZE")
        #: Whether this process hosts the run (rank 0).
        self.hosts_run = self.rank == 0

    def check(self, run: Run) -> None:
        """Refuse at ``open_run`` what this torchrun job cannot run."""
        if run.world_size != self.world_size:
            raise ValueError(
                f"engine=TorchrunEngine(): world_size={run.world_size}, but torchrun started "
                f"{self.world_size} processes (WORLD_SIZE): pass "
                "world_size=int(os.environ['WORLD_SIZE'])"
            )
        if run.required_ranks is not None:
            raise ValueError(
                "engine=TorchrunEngine() gathers every rank: leave out required_ranks="
            )

    async def run_workers(self, run: Run, fn: WorkerFn, *, max_restarts: int) -> None:
        """Run ``fn(reporter)`` for this process's rank; on rank 0, host the run too."""
        allowed = _env_int("TORCHELASTIC_MAX_RESTARTS")
        if max_restarts not in (0, allowed):
            raise ValueError(
                f"max_restarts={max_restarts}: on torchrun the group restarts as torchrun's "
                f"--max-restarts says ({allowed} here): leave out max_restarts="
            )
        link = await anyio.to_thread.run_sync(_Link.connect, run.name)
        if self.hosts_run:
            await self._host(run, fn, link, allowed)
        else:
            await self._relay(run, fn, link)

    async def _host(self, run: Run, fn: WorkerFn, link: _Link, max_restarts: int) -> None:
        host = uuid.uuid4().hex
        pump = _Pump(run, link.clone(), host)
        pump.start()
        await anyio.to_thread.run_sync(link.store.set, "host", host)
        async with anyio.create_task_group() as tg:
            worker = anyio.CancelScope()
            tg.start_soon(pump.serve, worker)
            with worker:
                await _work(fn, _HostReporter(run, pump))
        if not pump.failures:
            return
        attempt = _restart_count()  # torchrun restarts the group while its restarts last
        if attempt >= max_restarts:
            raise run.group_failed(pump.failures, attempt, max_restarts)
        ranks = ", ".join(str(rank) for rank in sorted(pump.failures))
        _log.warning(
            f"worker rank(s) {ranks} failed: torchrun restarts the group (restart "
            f"{attempt + 1} of {max_restarts}); the run resumes from its latest checkpoint",
            run_id=run.run_id,
            resume_from=run.latest_checkpoint,
        )
        raise WorkerGroupError(pump.failures)

    async def _relay(self, run: Run, fn: WorkerFn, link: _Link) -> None:
        nonce = uuid.uuid4().hex
        host, hello = await anyio.to_thread.run_sync(_join, link, self.rank, nonce)
        reporter = TorchrunReporter(
            self.rank,
            self.world_size,
            hello=hello,
            nonce=nonce,
            sender=_Sender(link.clone(), _inbox(host)),
            follower=_Follower(link.clone(), host, hello),
            state_dir=run.state_dir,
        )
        with _leaving_sigterm_to_rank_0(reporter.follower):
            failure = await _work(fn, reporter)
        await anyio.to_thread.run_sync(reporter.sender.flush)
        if failure is not None:
            # Rank 0 says the failure (after_exception, the run's end); exit after it.
            follower = reporter.follower
            if await anyio.to_thread.run_sync(follower.wait_over, _FAILURE_HANDOFF_S):
                await anyio.sleep(_FAILURE_HANDOFF_S)  # torchrun stops the group meanwhile
            raise WorkerGroupError({self.rank: failure})
        # Send what is left, then wait for rank 0's pump to be over (SIGTERM, Python's
        # again here, ends a wait for a rank 0 that is gone).
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(reporter.sender.close)
        await anyio.to_thread.run_sync(reporter.follower.wait_over, abandon_on_cancel=True)


def _join(link: _Link, rank: int, nonce: str) -> tuple[str, _Hello]:
    """Join this attempt's rank 0: send ``nonce`` to the inbox it published and wait
    for the answer under it, sending it again to a newer rank 0 (one left from a
    previous attempt never answers)."""
    store = link.store
    deadline = time.monotonic() + _JOIN_TIMEOUT_S
    asked: str | None = None
    asked_at = 0.0
    while time.monotonic() < deadline:
        if asked is not None and store.check([_hello_key(asked, nonce)]):
            return asked, _decode_hello(store.get(_hello_key(asked, nonce)))
        if time.monotonic() - asked_at > 1.0 and store.check(["host"]):
            host = store.get("host").decode()
            if host != asked:
                store.queue_push(_inbox(host), _encode([_Join(rank, nonce)]))
                asked = host
            asked_at = time.monotonic()
        time.sleep(_JOIN_POLL_S)
    raise TimeoutError(
        f"rank {rank}: rank 0 did not take this rank into its run within "
        f"{_JOIN_TIMEOUT_S:g} s (is rank 0's script opening the same run, name and all?)"
    )


@contextlib.contextmanager
def _leaving_sigterm_to_rank_0(follower: _Follower) -> Any:
    """SIGTERM on a rank but 0 while its worker runs: rank 0's run decides the stop
    (it got the same signal from torchrun's agent); once rank 0's run is over,
    SIGTERM ends the process as it would have."""
    if not takes_signals():
        yield
        return
    said: list[int] = []

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if follower.status.over:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        elif not said:
            said.append(signum)
            _log.warning("SIGTERM: rank 0's run decides when this rank checkpoints and stops")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
