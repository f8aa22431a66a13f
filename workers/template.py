"""The template process: loads the model once, then forks pinned workers on request.

Run by the daemon as ``python -m workers.template``. The template never runs inference and keeps
torch single-threaded, so no OpenMP pool exists when it forks (libgomp is not fork-safe), and every
worker shares the weights with it copy-on-write.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from packrat_daemon.wire.errors import WorkerBootError
from workers import messages
from workers.models.spec import InputSpec
from workers.pinning import die_with_parent
from workers.runtimes import make_runtime
from workers.runtimes.base import Runtime
from workers.worker import WorkerConfig, run_worker

# One write of at most PIPE_BUF bytes is atomic and never blocks on an empty pipe.
BOOT_REPORT_MAX_BYTES = 4096


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.template")
    parser.add_argument("--model", required=True)
    parser.add_argument("--input")
    parser.add_argument("--runtime", default="torch")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--backend", required=True, help="the daemon's internal ROUTER endpoint")
    parser.add_argument("--daemon-pid", type=int, required=True)
    args = parser.parse_args(argv)

    die_with_parent(args.daemon_pid)  # SIGKILL when the daemon dies, even while stopped
    # Ctrl-C reaches the whole process group; the daemon or profiler stops the template in order
    # (and keeps what it measured), so the template itself must not die of it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    runtime = make_runtime(args.runtime, args.precision)
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.IDENTITY, messages.TEMPLATE_IDENTITY)
    socket.setsockopt(zmq.LINGER, 1000)
    socket.connect(args.backend)
    try:
        input_spec = runtime.load(args.model, args.input)
    except Exception as exc:  # report why, so the daemon can tell the user instead of timing out
        socket.send_multipart(messages.encode(messages.FAILED, {"message": f"{type(exc).__name__}: {exc}"}))
        socket.close()
        context.term()
        return 1
    socket.send_multipart(
        messages.encode(
            messages.READY,
            {
                "pid": os.getpid(),
                "input": input_spec.to_json(),
                "model": args.model,
                "runtime": runtime.name,
                "precision": runtime.precision,
            },
        )
    )
    children: dict[int, _Child] = {}  # by pid
    stopping = False
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while not stopping:
            if socket.poll(200):
                kind, header, _ = messages.decode(socket.recv_multipart())
                if kind == messages.SPAWN:
                    pid, child = _fork_worker(runtime, input_spec, header, args.backend, children)
                    children[pid] = child
                    socket.send_multipart(messages.encode(messages.SPAWNED, {"worker": child.worker, "pid": pid}))
                elif kind == messages.STOP:
                    stopping = True
            _reap(children, socket)
            if os.getppid() != args.daemon_pid:
                break  # the daemon is gone: take the workers down with us
    finally:
        _stop_children(children)
        socket.close(linger=200)
        context.term()
    return 0


@dataclass(frozen=True)
class _Child:
    worker: int
    boot_report: int  # read end of a pipe on which the child writes why it failed to boot, if it does


def _fork_worker(
    runtime: Runtime, input_spec: InputSpec, header: dict[str, Any], backend: str, siblings: dict[int, _Child]
) -> tuple[int, _Child]:
    # A pipe, not the backend socket: the template's EXITED report then carries the reason in the same
    # message as the exit status, where a message from the worker itself could arrive after it.
    report_read, report_write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(report_write)
        os.set_blocking(report_read, False)
        return pid, _Child(int(header["worker"]), report_read)
    # Child: never return into the template's loop, never touch the template's ZeroMQ context.
    os.close(report_read)
    for sibling in siblings.values():
        os.close(sibling.boot_report)
    code = 1
    try:
        config = WorkerConfig(
            worker_id=int(header["worker"]),
            threads=int(header["threads"]),
            cores=tuple(header["cores"]),
            backend=backend,
            template_pid=os.getppid(),
            warmup=tuple(header.get("warmup", (1,))),
        )
        code = run_worker(runtime, input_spec, config)
    except WorkerBootError as exc:
        code = messages.WORKER_BOOT_ERROR
        print(f"packrat worker {header.get('worker')} failed to start: {exc}", file=sys.stderr)
        with contextlib.suppress(OSError):
            os.write(report_write, str(exc).encode(errors="replace")[:BOOT_REPORT_MAX_BYTES])
    except BaseException as exc:  # a child must always end in os._exit
        print(f"packrat worker {header.get('worker')}: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap(children: dict[int, _Child], socket: zmq.Socket) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        child = children.pop(pid, None)
        report: dict[str, object] = {
            "worker": child.worker if child else None,
            "pid": pid,
            "status": os.waitstatus_to_exitcode(status),
        }
        if child is not None:
            error = _read_boot_report(child.boot_report)
            if error:
                report["error"] = error
        socket.send_multipart(messages.encode(messages.EXITED, report))


def _read_boot_report(fd: int) -> str:
    """What the exited child wrote on its boot-report pipe (nothing unless it failed to boot); closes it."""
    try:
        return os.read(fd, BOOT_REPORT_MAX_BYTES).decode(errors="replace")
    except BlockingIOError:
        return ""  # a grandchild still holds the write end, and nothing was written
    finally:
        os.close(fd)


def _stop_children(children: dict[int, _Child]) -> None:
    for pid, child in children.items():
        os.close(child.boot_report)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            children.pop(pid, None)
        else:
            time.sleep(0.02)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
