"""`packrat simulate`: the daemon's own batcher, splitter, policy and online adaptation run against a
virtual clock, with emulated service times, so hours of traffic on 16–128 cores take seconds.

`clock` holds the virtual clock and the event loop, `service` the emulated service times, `costs` the
daemon's own costs and its one loop, `run` the simulated daemon and its report, `colocated` several models'
daemons sharing one machine's cores under a coordinator. Results are a simulation and say so in their JSON
(`"simulated": true`).
"""

from packrat_daemon.simulate.clock import EventLoop, VirtualClock
from packrat_daemon.simulate.costs import DaemonCosts, LoopModel
from packrat_daemon.simulate.run import Simulation, SimulationResult, Traffic
from packrat_daemon.simulate.service import ServiceModel

__all__ = [
    "DaemonCosts",
    "EventLoop",
    "LoopModel",
    "ServiceModel",
    "Simulation",
    "SimulationResult",
    "Traffic",
    "VirtualClock",
]
