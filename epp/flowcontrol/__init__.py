"""Flow control: requests held in the picker while the pool is saturated, in priority bands with fairness between
flows and an ordering within each flow, dispatched when the pool has room (docs/flow-control.md).

Pure decision code: no I/O and no clock (`now` is an argument), so the virtual-time benchmark runs it unchanged;
the director's dispatch loop (`epp.director.flow`) drives it on the serving path.
"""

from epp.flowcontrol.queue import FlowController, FlowSettings
from epp.flowcontrol.types import Outcome, QueuedRequest

__all__ = ["FlowController", "FlowSettings", "Outcome", "QueuedRequest"]
