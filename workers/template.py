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

import zmq

from workers import messages
from workers.pinning import die_with_parent
from workers.runtime import make_runtime


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.template")
    parser.add_argument("--model", required=True)
    parser.add_argument("--input")
    parser.add_argument("--runtime", default="torch")
    parser.add_argument("--backend", required=True, help="the daemon's internal ROUTER endpoint")
    parser.add_argument("--daemon-pid", type=int, required=True)
    args = parser.parse_args(argv)

    die_with_parent()
    # Ctrl-C reaches the whole process group; the daemon or profiler stops the template in order
    # (and keeps what it measured), so the template itself must not die of it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    runtime = make_runtime(args.runtime)
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
            {"pid": os.getpid(), "input": input_spec.to_json(), "model": args.model, "runtime": runtime.name},
        )
    )
    children: dict[int, int] = {}  # pid → worker id
    stopping = False
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while not stopping:
            if socket.poll(200):
                kind, header, _ = messages.decode(socket.recv_multipart())
                if kind == messages.SPAWN:
                    pid = _fork_worker(runtime, input_spec, header, args)
                    children[pid] = header["worker"]
                    socket.send_multipart(messages.encode(messages.SPAWNED, {"worker": header["worker"], "pid": pid}))
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


def _fork_worker(runtime, input_spec, header: dict, args: argparse.Namespace) -> int:  # noqa: ANN001
    pid = os.fork()
    if pid:
        return pid
    # Child: never return into the template's loop, never touch the template's ZeroMQ context.
    code = 1
    try:
        from workers.worker import WorkerConfig, run_worker

        config = WorkerConfig(
            worker_id=int(header["worker"]),
            threads=int(header["threads"]),
            cores=tuple(header["cores"]),
            backend=args.backend,
            template_pid=os.getppid(),
            warmup=tuple(header.get("warmup", (1,))),
        )
        code = run_worker(runtime, input_spec, config)
    except BaseException as exc:  # noqa: BLE001 - a child must always end in os._exit
        print(f"packrat worker {header.get('worker')}: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap(children: dict[int, int], socket: zmq.Socket) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        worker = children.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        socket.send_multipart(messages.encode(messages.EXITED, {"worker": worker, "pid": pid, "status": code}))


def _stop_children(children: dict[int, int]) -> None:
    for pid in children:
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
