"""A batch's life on the runner, from its record in the store to its output files.

    validating   the input read once (``blitz.batches.lines.plan``): its pieces kept in
                 ``plan.json``, its bad lines' errors in ``parts/invalid.err``; a batch
                 whose input cannot run at all (a custom_id twice, too many lines) fails
    in_progress  its pieces run by the ``Engine`` (Ray Data, ``deployments/batches.py``;
                 or threads here, ``local_engine``); each piece's lines and errors
                 written whole, then its ``.done`` record: a piece is done exactly once
    finalizing   the pieces' lines joined into the output and error files (their ids are
                 chosen first, so a finalize cut off is done again into the same files)
    completed    or cancelled (a cancel asked for), or expired (its completion window
                 ended): the pieces not run are written as errors, so every custom_id is
                 in the output or the error file exactly once

Everything is in the store, nothing only in a process: a runner stopped anywhere and
started again (``tick``) picks each batch up where its record says, redoing at most the
pieces that were in flight. A cancel (or an expiry) is seen between pieces, within
``poll_s``: what was done is kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from blitz.batches import lines as batch_lines
from blitz.batches import objects
from blitz.batches.store import Store, new_id
from blitz.settings.batches import BatchSettings

logger = logging.getLogger("blitz.batches")

# (endpoint, request bodies) -> per body (status, request id, reply body): the requests
# answered by the ingress's routes (``blitz.batches.execute``)
Call = Callable[[str, list[bytes]], list[tuple[int, str, bytes]]]
# (owner, batch record, pieces to run, should_stop) -> each piece's record as it is done
Engine = Callable[[str, dict[str, Any], list[dict[str, int]], Callable[[], bool]],
                  Iterator[dict[str, Any]]]
SWEEP_S = 60.0  # how often retention is applied


def run_piece(store: Store, owner: str, batch: dict[str, Any], piece: dict[str, int],
              call: Call, max_line_bytes: int) -> dict[str, Any]:
    """Run one piece of a batch (any worker: it reads and writes the store only): its
    lines answered, its output and error lines written, its record last. A piece done
    already (a restart) is not run again."""
    batch_id, index = batch["id"], piece["index"]
    done = store.get_json(store.part_path(owner, batch_id, f"{index}.done"))
    if isinstance(done, dict):
        return done
    with store.open_data(owner, batch["input_file_id"]) as f:
        requests = batch_lines.piece_lines(f, piece, batch["endpoint"], max_line_bytes)
    replies = call(batch["endpoint"], [body for _, body in requests]) if requests else []
    out: list[bytes] = []
    err: list[bytes] = []
    for (custom_id, _), (status, request_id, body) in zip(requests, replies, strict=True):
        (out if 200 <= status < 300 else err).append(
            batch_lines.output_line(custom_id, status, request_id, body))
    return _finish_piece(store, owner, batch_id, index, out, err)


def _finish_piece(store: Store, owner: str, batch_id: str, index: int, out: list[bytes],
                  err: list[bytes]) -> dict[str, Any]:
    if out:
        store.put(store.part_path(owner, batch_id, f"{index}.out"), b"".join(out))
    if err:
        store.put(store.part_path(owner, batch_id, f"{index}.err"), b"".join(err))
    record = {"index": index, "completed": len(out), "failed": len(err)}
    store.put_json(store.part_path(owner, batch_id, f"{index}.done"), record)
    return record


def local_engine(store: Store, call_for: Callable[[str], Call], concurrency: int,
                 max_line_bytes: int) -> Engine:
    """Pieces run in ``concurrency`` threads of this process (``call_for(owner)`` answers
    an owner's requests): the engine without Ray Data."""

    def run(owner: str, batch: dict[str, Any], pieces: list[dict[str, int]],
            should_stop: Callable[[], bool]) -> Iterator[dict[str, Any]]:
        call = call_for(owner)
        queue = list(reversed(pieces))
        running: set[Future[dict[str, Any]]] = set()
        with ThreadPoolExecutor(concurrency, thread_name_prefix="blitz-batch") as pool:
            while queue or running:
                while queue and len(running) < concurrency and not should_stop():
                    running.add(pool.submit(run_piece, store, owner, batch, queue.pop(),
                                            call, max_line_bytes))
                if not running:
                    return
                finished, running = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in finished:
                    yield future.result()
                if should_stop():
                    queue.clear()  # those in flight finish; no new one starts
    return run


class BatchRunner:
    """Moves every batch in ``store`` along its states (``tick``), pieces run by ``engine``."""

    def __init__(self, store: Store, settings: BatchSettings, max_line_bytes: int,
                 engine: Engine, clock: Callable[[], float] = time.time):
        self.store, self.settings, self.engine = store, settings, engine
        self.max_line_bytes = max_line_bytes
        self.clock = clock
        self.swept = 0.0

    def now(self) -> int:
        return int(self.clock())

    # --- the loop ----------------------------------------------------------------------

    def tick(self) -> None:
        """One look at every batch: new ones validated, cancelled or expired ones ended,
        the oldest running one run until it ends or is stopped; retention applied."""
        self.start_new()
        running = sorted(((b["created_at"], owner, b) for owner, b in self._open()
                          if b["status"] in (objects.IN_PROGRESS, objects.FINALIZING)),
                         key=lambda t: t[0])
        for _, owner, batch in running:
            self.run(owner, batch)
        if self.clock() - self.swept >= SWEEP_S:
            self.sweep()

    def _open(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The batches not ended, by their ``open`` markers (one listing per owner)."""
        for owner in self.store.owners():
            for batch_id in self.store.open_ids(owner):
                batch = self.store.batch(owner, batch_id)
                if batch is None:
                    continue  # its record not written yet, or deleted
                if batch["status"] in objects.ENDED:
                    self.store.mark_ended(owner, batch_id)  # an end cut off before this
                else:
                    yield owner, batch

    def start_new(self) -> None:
        for owner, batch in self._open():
            if batch["status"] == objects.VALIDATING:
                self.validate(owner, batch)

    # --- validating ----------------------------------------------------------------------

    def validate(self, owner: str, batch: dict[str, Any]) -> None:
        store, batch_id = self.store, batch["id"]
        if store.cancel_asked(owner, batch_id) is not None:
            self.end(owner, batch, objects.CANCELLED)
            return
        if store.file_meta(owner, batch["input_file_id"]) is None:
            self._fail(owner, batch, [{"code": "missing_input_file", "message":
                                       f"input file {batch['input_file_id']} was deleted",
                                       "param": "input_file_id", "line": None}])
            return
        bad_path = store.part_path(owner, batch_id, "invalid.err")
        writer, partial = store.open_writer(bad_path)
        try:
            with writer, store.open_data(owner, batch["input_file_id"]) as f:
                found = batch_lines.plan(f, batch["endpoint"], self.max_line_bytes,
                                         self.settings.chunk_lines,
                                         self.settings.max_requests_per_batch, writer)
        except BaseException:
            store.drop(partial)
            raise
        if found.problems:
            store.drop(partial)
            self._fail(owner, batch, found.problems)
            return
        store.finish_writer(partial, bad_path)
        store.put_json(f"{store.batch_dir(owner, batch_id)}/plan.json",
                       {"total": found.total, "bad": found.bad, "pieces": found.pieces})
        batch.update(status=objects.IN_PROGRESS, in_progress_at=self.now(),
                     request_counts={"total": found.total, "completed": 0,
                                     "failed": found.bad})
        store.save_batch(owner, batch)
        logger.info("batch %s: %d requests in %d pieces (%d bad lines)", batch_id,
                    found.total, len(found.pieces), found.bad)

    def _fail(self, owner: str, batch: dict[str, Any], problems: list[dict[str, Any]]) -> None:
        now = self.now()
        batch.update(status=objects.FAILED, failed_at=now, _ended_at=now,
                     errors=objects.errors_list(problems))
        self.store.save_batch(owner, batch)
        self.store.mark_ended(owner, batch["id"])
        logger.info("batch %s failed: %s", batch["id"], problems[0]["message"])

    # --- in progress -------------------------------------------------------------------

    def _plan(self, owner: str, batch_id: str) -> dict[str, Any]:
        found = self.store.get_json(f"{self.store.batch_dir(owner, batch_id)}/plan.json")
        if not isinstance(found, dict):
            raise RuntimeError(f"batch {batch_id} is in progress without its plan")
        return found

    def _done(self, owner: str, batch_id: str) -> dict[int, dict[str, Any]]:
        done = {}
        for name in self.store.part_names(owner, batch_id):
            if name.endswith(".done"):
                record = self.store.get_json(self.store.part_path(owner, batch_id, name))
                if isinstance(record, dict):
                    done[int(record["index"])] = record
        return done

    def stop_reason(self, owner: str, batch: dict[str, Any]) -> str | None:
        """Why a batch must end before its pieces are all done: cancelled or expired."""
        if self.store.cancel_asked(owner, batch["id"]) is not None:
            return objects.CANCELLED
        if self.now() >= int(batch["expires_at"]):
            return objects.EXPIRED
        return None

    def run(self, owner: str, batch: dict[str, Any]) -> None:
        """Run a batch's pieces not done yet, counting each as it is done; then end it."""
        if batch["status"] == objects.FINALIZING and batch["_ending"] != objects.COMPLETED:
            self.end(owner, batch, batch["_ending"])
            return
        plan = self._plan(owner, batch["id"])
        done = self._done(owner, batch["id"])
        pending = [p for p in plan["pieces"] if p["index"] not in done]
        reason = self.stop_reason(owner, batch)
        looked = time.monotonic()

        def should_stop() -> bool:
            nonlocal reason, looked
            if reason is None and time.monotonic() - looked >= self.settings.poll_s:
                looked = time.monotonic()
                reason = self.stop_reason(owner, batch)
                self.start_new()  # batches made meanwhile show in_progress
            return reason is not None

        if pending and reason is None:
            for record in self.engine(owner, batch, pending, should_stop):
                done[int(record["index"])] = record
                batch["request_counts"] = self._counts(plan, done)
                self.store.save_batch(owner, batch)
        self.end(owner, batch, reason or objects.COMPLETED)

    @staticmethod
    def _counts(plan: dict[str, Any], done: dict[int, dict[str, Any]]) -> dict[str, int]:
        return {"total": plan["total"],
                "completed": sum(d["completed"] for d in done.values()),
                "failed": plan["bad"] + sum(d["failed"] for d in done.values())}

    # --- ending ------------------------------------------------------------------------

    def end(self, owner: str, batch: dict[str, Any], ending: str) -> None:
        """Finalize a batch as ``ending`` (completed, cancelled or expired): the pieces not
        run written as errors, the parts joined into its output and error files."""
        store, batch_id, now = self.store, batch["id"], self.now()
        if batch["status"] != objects.FINALIZING:
            if ending == objects.CANCELLED:
                batch["cancelling_at"] = int(store.cancel_asked(owner, batch_id) or now)
            batch.update(status=objects.FINALIZING, finalizing_at=now, _ending=ending,
                         _output_id=new_id("file-"), _error_id=new_id("file-"))
            store.save_batch(owner, batch)
        plan = store.get_json(f"{store.batch_dir(owner, batch_id)}/plan.json")
        if isinstance(plan, dict):
            done = self._done(owner, batch_id)
            for piece in plan["pieces"]:
                if piece["index"] not in done:
                    done[piece["index"]] = self._unrun(owner, batch, piece, ending)
            batch["request_counts"] = self._counts(plan, done)
            names = sorted(done)
            batch["output_file_id"] = self._join(
                owner, batch, batch["_output_id"], [f"{i}.out" for i in names], "output")
            batch["error_file_id"] = self._join(
                owner, batch, batch["_error_id"],
                ["invalid.err", *(f"{i}.err" for i in names)], "error")
        batch.update(status=ending, _ended_at=now, **{f"{ending}_at": now})
        store.save_batch(owner, batch)
        store.mark_ended(owner, batch_id)
        store.forget_parts(owner, batch_id)
        logger.info("batch %s %s: %s", batch_id, ending, batch["request_counts"])

    def _unrun(self, owner: str, batch: dict[str, Any], piece: dict[str, int],
               ending: str) -> dict[str, Any]:
        """A piece a cancel or an expiry left: each of its requests an error line."""
        with self.store.open_data(owner, batch["input_file_id"]) as f:
            requests = batch_lines.piece_lines(f, piece, batch["endpoint"],
                                               self.max_line_bytes)
        code = "batch_cancelled" if ending == objects.CANCELLED else "batch_expired"
        message = ("the batch was cancelled before this request ran"
                   if ending == objects.CANCELLED else
                   "the batch's completion window ended before this request ran")
        err = [batch_lines.error_line(custom_id, code, message) for custom_id, _ in requests]
        return _finish_piece(self.store, owner, batch["id"], piece["index"], [], err)

    def _join(self, owner: str, batch: dict[str, Any], file_id: str, parts: list[str],
              what: str) -> str | None:
        """Join ``parts`` into the file ``file_id`` (purpose batch_output); None when they
        hold no line."""
        store = self.store
        path = store.file_path(owner, file_id, "data")
        writer, partial = store.open_writer(path)
        size = 0
        with writer:
            for name in parts:
                part = store.part_path(owner, batch["id"], name)
                if not store.exists(part):
                    continue
                with store.fs.open(part, "rb") as f:
                    while chunk := f.read(1 << 20):
                        writer.write(chunk)
                        size += len(chunk)
        if size == 0:
            store.drop(partial)
            return None
        store.finish_writer(partial, path)
        now = self.now()
        store.put_json(store.file_path(owner, file_id, "json"), objects.file_object(
            file_id, f"{batch['id']}_{what}.jsonl", objects.PURPOSE_OUT, size, now,
            now + int(self.settings.retention_s)))
        return file_id

    # --- retention -----------------------------------------------------------------------

    def sweep(self) -> None:
        """Files past their ``expires_at`` and batches ended more than ``retention_s`` ago
        deleted (each by the names the store gives it: nothing else)."""
        self.swept = self.clock()
        now = self.now()
        for owner in self.store.owners():
            for meta in self.store.files(owner):
                if meta.get("expires_at") is not None and int(meta["expires_at"]) <= now:
                    self.store.forget_file(owner, meta["id"])
            for batch in self.store.batches(owner):
                ended = batch.get("_ended_at")
                if ended is not None and ended + self.settings.retention_s <= now:
                    self.store.forget_batch(owner, batch["id"])

