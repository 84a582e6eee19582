"""One request's lifecycle between the protocol and the decision."""

from epp.director.director import Decision, Director
from epp.director.random_scheduler import RandomScheduler

__all__ = ["Decision", "Director", "RandomScheduler"]
