"""The repository's own series on its one metrics endpoint (the gateway's: `/metrics` on the REST port, and
--oip-metrics-port), beside the gateway's request metrics: each model's state, restarts and CPUs, and its
inferences as the statistics extension counts them, labelled by model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from packrat_daemon.repository.daemons import READY

if TYPE_CHECKING:
    from packrat_daemon.repository.service import RepositoryService


def _cpu_count(cpulist: str | None, every: int) -> int:
    if cpulist is None:
        return every
    count = 0
    for part in cpulist.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


class RepositoryCollector(Collector):
    def __init__(self, service: RepositoryService) -> None:
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        service = self.service
        ready = GaugeMetricFamily(
            "packrat_repository_model_ready", "1 while the model serves, by model", labels=["model"]
        )
        loaded = GaugeMetricFamily("packrat_repository_model_loaded", "1 while the model is loaded", labels=["model"])
        restarts = CounterMetricFamily(
            "packrat_repository_model_restarts", "Restarts of the model's daemon after it exited", labels=["model"]
        )
        cpus = GaugeMetricFamily(
            "packrat_repository_model_start_cpus",
            "CPUs the model's daemon (re)starts on (its share of the joint plan's even division)",
            labels=["model"],
        )
        inferences = CounterMetricFamily(
            "packrat_repository_inferences",
            "Inferences answered through the gateway, by model and outcome",
            labels=["model", "outcome"],
        )
        every = sum(len(core) for core in service.joint.cores)
        for name in service.repository.models:
            daemon = service.daemons.get(name)
            loaded.add_metric([name], float(daemon is not None))
            ready.add_metric([name], float(daemon is not None and daemon.state == READY))
            if daemon is None:
                continue
            restarts.add_metric([name], float(daemon.restarts))
            cpus.add_metric([name], float(_cpu_count(daemon.cpus, every)))
            plane = service.plane.planes.get(name)
            if plane is not None:
                counted = plane.statistics.to_json(name, "1")["inference_stats"]
                inferences.add_metric([name, "success"], float(counted["success"]["count"]))
                inferences.add_metric([name, "fail"], float(counted["fail"]["count"]))
        yield from (ready, loaded, restarts, cpus, inferences)
