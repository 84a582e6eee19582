"""One request's lifecycle between the protocol and the decision."""

from epp.director.decision import Decision, NeedDecision
from epp.director.director import Director
from epp.director.pipeline import DecisionPipeline

__all__ = ["Decision", "DecisionPipeline", "Director", "NeedDecision"]
