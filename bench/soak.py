"""A long mixed-traffic soak against one real daemon: errors, and the slope of the daemon's RSS; prints JSON.

A `packrat serve` of built-in ResNet-50 (`--runtime torch --precision fp32`, the packrat policy with online
adaptation on, its start-up profile measured into a private state folder) takes open-loop Poisson traffic
of mixed request sizes from one `packrat load` for `--minutes`. Every `--sample-s` seconds the daemon's RSS,
each of its children's (the template and the workers) and the workers' CPU time are read with psutil. The
slope is a least-squares line through the daemon's samples after the first `--settle-minutes`, in MB per
10 minutes (the issue's target: under 1). `--stop-at HH:MM` (UTC) ends the traffic early if the run would
outlast it; the report then says so and fits what ran.

    .venv/bin/python bench/soak.py --minutes 60 --out bench/results/soak-resnet50.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import psutil  # noqa: E402
from harness import DaemonProcess  # noqa: E402

MB = 1e6


def slope_mb_per_10min(samples: list[dict[str, Any]], key: str, after_s: float) -> float | None:
    """Least-squares slope of `key` (bytes) against `t_s` over the samples from `after_s` on, in MB per
    10 minutes; None with fewer than 3 samples."""
    points = [(s["t_s"], s[key]) for s in samples if s["t_s"] >= after_s and s.get(key) is not None]
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    if var_t == 0:
        return None
    cov = sum((t - mean_t) * (y - mean_y) for t, y in points)
    return round(cov / var_t * 600.0 / MB, 3)


def sample(daemon: psutil.Process, started: float, last_cpu: dict[int, float], last_t: list[float]) -> dict:
    """One reading: the daemon's RSS, each child's, and the workers' CPU share of the machine since the last."""
    now = time.monotonic()
    # Descriptors too: an inbox memfd left open holds its pages although nothing maps it, which RSS does not show.
    reading: dict[str, Any] = {"t_s": round(now - started, 1), "daemon_rss": daemon.memory_info().rss,
                               "daemon_fds": daemon.num_fds()}  # fmt: skip
    children: dict[str, int] = {}
    cpu_now: dict[int, float] = {}
    for child in daemon.children(recursive=True):
        try:
            children[str(child.pid)] = child.memory_info().rss
            times = child.cpu_times()
            cpu_now[child.pid] = times.user + times.system
        except psutil.Error:  # a worker replaced between the listing and the reading
            continue
    reading["children_rss"] = children
    reading["children_rss_total"] = sum(children.values())
    if last_t:
        spent = sum(cpu - last_cpu.get(pid, cpu) for pid, cpu in cpu_now.items())
        reading["children_cpu_share"] = round(spent / max(now - last_t[0], 1e-9) / (os.cpu_count() or 1), 3)
    last_cpu.clear()
    last_cpu.update(cpu_now)
    last_t[:] = [now]
    return reading


def stop_seconds(stop_at: str | None) -> float | None:
    """Seconds from now until the next `HH:MM` UTC, or None."""
    if not stop_at:
        return None
    now = dt.datetime.now(dt.UTC)
    hour, minute = (int(part) for part in stop_at.split(":"))
    target = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if target <= now:
        target += dt.timedelta(days=1)
    return (target - now).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="minutes of traffic")
    parser.add_argument("--rate", type=float, default=1.5, help="requests per second (Poisson)")
    parser.add_argument("--batches", default="1:0.6,4:0.3,16:0.1", help="request sizes: size:weight,...")
    parser.add_argument("--sample-s", type=float, default=30.0, help="seconds between RSS samples")
    parser.add_argument("--settle-minutes", type=float, default=10.0, help="minutes left out of the fit")
    parser.add_argument("--stop-at", default=None, help="HH:MM UTC: end the traffic by then at the latest")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here (after each sample)")
    args = parser.parse_args()

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    report: dict[str, Any] = {
        "model": "builtin:resnet50", "runtime": "torch", "precision": "fp32", "policy": "packrat", "adapt": True,
        "rate_rps": args.rate, "batches": args.batches, "minutes_asked": args.minutes, "commit": commit,
        "sample_s": args.sample_s, "settle_minutes": args.settle_minutes, "started_utc": None,
    }  # fmt: skip

    def save() -> None:
        text = json.dumps(report, indent=1)
        if args.out:
            args.out.write_text(text + "\n")

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(f"stopped by signal {signum}")  # the finally blocks close the load and the daemon

    signal.signal(signal.SIGTERM, stop)
    samples: list[dict[str, Any]] = []
    load: subprocess.Popen[str] | None = None
    with tempfile.TemporaryDirectory(prefix="packrat-soak-") as tmp:
        folder = Path(tmp)
        state = folder / "state"
        state.mkdir(mode=0o700)
        serve = ["--model", "builtin:resnet50", "--runtime", "torch", "--precision", "fp32",
                 "--state-dir", str(state)]  # fmt: skip
        daemon = DaemonProcess("soak", folder, serve)
        try:
            info = daemon.wait(timeout=1500)
            report["plan_at_start"] = info.get("plan")
            report["max_batch"] = info.get("max_batch")
            seconds = args.minutes * 60.0
            left = stop_seconds(args.stop_at)
            if left is not None and left - 30 < seconds:
                seconds = max(left - 30, 0.0)
                report["cut_short_by_stop_at"] = args.stop_at
            report["traffic_s_planned"] = round(seconds, 1)
            report["started_utc"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
            load_cmd = [sys.executable, "-m", "packrat_daemon", "load", "--endpoint", daemon.endpoint,
                        "--rate", str(args.rate), "--batches", args.batches, "--duration", str(seconds),
                        "--json", "--quiet", "--seed", "27"]  # fmt: skip
            # SIGINT at its default in the load generator, which then reports what it has: a shell's background job
            # (the soak, run with &) inherits SIGINT ignored, and an ignored SIGINT stopped nothing.
            load = subprocess.Popen(load_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
            process = psutil.Process(daemon.process.pid)
            started = time.monotonic()
            report["samples"] = samples
            last_cpu: dict[int, float] = {}
            last_t: list[float] = []
            next_at = started
            while load.poll() is None:
                if time.monotonic() >= next_at:
                    samples.append(sample(process, started, last_cpu, last_t))
                    next_at += args.sample_s
                    save()
                if time.monotonic() - started > seconds + 120:  # load's own bound is one timeout and 5 s more
                    load.send_signal(signal.SIGINT)
                    report["load_interrupted"] = True
                    break
                time.sleep(min(1.0, max(next_at - time.monotonic(), 0.05)))
            out, err = load.communicate(timeout=120)
            samples.append(sample(process, started, last_cpu, last_t))
            try:
                report["load"] = json.loads(out)
            except json.JSONDecodeError:
                report["load"] = {"unparsed_stdout": out[-2000:], "stderr": err[-2000:]}
            report["daemon_alive_at_end"] = daemon.process.poll() is None
            report["plan_log"] = daemon.plan_log()
        finally:
            if load is not None and load.poll() is None:
                load.kill()
            daemon.close()
            log = daemon.log_path.read_text(errors="replace").splitlines()
            report["log_errors"] = [line for line in log if " ERROR " in line or "Traceback" in line][:50]
            # Workers replaced as hung: with no model that hangs, each is a false positive of the hang rule.
            report["hang_verdicts"] = [line for line in log if "the batch is given up" in line][:50]
    load_report = report.get("load", {})
    errors = load_report.get("errors", {}) if isinstance(load_report, dict) else {}
    # None, not 0, when the load generator left no report: its errors are then unknown.
    report["errors_total"] = sum(errors.values()) if isinstance(errors, dict) and "errors" in load_report else None
    after = args.settle_minutes * 60.0
    report["traffic_s_ran"] = samples[-1]["t_s"] if samples else 0.0
    report["daemon_rss_slope_mb_per_10min"] = slope_mb_per_10min(samples, "daemon_rss", after)
    report["children_rss_slope_mb_per_10min"] = slope_mb_per_10min(samples, "children_rss_total", after)
    if samples:
        report["daemon_rss_mb_first_last"] = [round(samples[0]["daemon_rss"] / MB, 1),
                                              round(samples[-1]["daemon_rss"] / MB, 1)]  # fmt: skip
        shares = [s["children_cpu_share"] for s in samples if "children_cpu_share" in s]
        report["children_cpu_share_mean"] = round(sum(shares) / len(shares), 3) if shares else None
    report["finished_utc"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    save()
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))


if __name__ == "__main__":
    main()
