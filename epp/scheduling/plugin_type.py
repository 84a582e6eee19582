"""What a plugin type is: its kind, upstream's stability, and the factory that builds it from a config entry.

The vocabulary every factory module and the registry share, kept apart from both so a factory module needs only
this (and its plugin's own module) and the registry can import every factory module.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from epp.config.model import PluginSpec, SaturationThresholds
from epp.datastore import Freshness
from epp.scheduling.params import Params


class Kind(enum.Enum):
    FILTER = "filter"
    SCORER = "scorer"
    PICKER = "picker"
    PROFILE_HANDLER = "profile handler"
    DECIDER = "decider"  # whether a disaggregated stage runs for a request (read by the profile handler)
    PARSER = "parser"
    DATA_LAYER = "data-layer plugin"
    DISCOVERY = "endpoint-discovery plugin"
    FLOW_CONTROL = "flow-control policy"
    ADMITTER = "admitter"
    # Upstream's data producers (approx-prefix-cache-producer, token-producer, ...): they run for every request
    # before the filters and write data that scorers read, naming the producer in a parameter (e.g. the prefix
    # scorer's `prefixMatchInfoProducerName`). Built before every other plugin, so such a factory finds its
    # producer with `BuildContext.plugin`.
    PRODUCER = "data producer"
    # Upstream's pre-request and response plugins (disagg-headers-handler, request-attribute-reporter): listed in a
    # profile, they are skipped there, as upstream's profile keeps only its filters, scorers and picker.
    REQUEST_HOOK = "request hook"


class Stability(enum.Enum):
    """Upstream's stability levels: an ALPHA type loads only with `--allow-experimental-plugins`, as upstream."""

    ALPHA = "alpha"
    BETA = "beta"


@dataclass(slots=True)
class BuildContext:
    """What factories may use: a seed source so every randomised plugin gets its own reproducible stream, the
    config's saturation thresholds, and the pool's one rule for usable data."""

    seed_sequence: np.random.SeedSequence
    saturation: SaturationThresholds
    freshness: Freshness = field(default_factory=Freshness)
    built: dict[str, object] = field(default_factory=dict)  # the plugins built so far, by name (producers first)
    plugin_types: dict[str, str] = field(default_factory=dict)  # every plugin of the config: name → type
    warnings: list[str] = field(default_factory=list)  # what loads but is not done here, one line per plugin

    def warn(self, where: str, why: str) -> None:
        """A plugin that loads but cannot do (all of) its job here: logged once at start-up, printed by check-config."""
        line = f"{where}: {why}"
        if line not in self.warnings:
            self.warnings.append(line)

    def next_seed(self) -> int:
        return int(self.seed_sequence.spawn(1)[0].generate_state(1)[0])

    def plugin(self, name: str) -> object | None:
        """A plugin built earlier (every producer is): for a factory whose parameter names another plugin."""
        return self.built.get(name)


Factory = Callable[[str, Params, BuildContext], object]

# A config's plugins as built, by name: kind, plugin object, its config entry, its parameters after defaults.
Built = dict[str, tuple[Kind, object, PluginSpec, Params]]


@dataclass(frozen=True, slots=True)
class PluginType:
    type_name: str
    kind: Kind
    factory: Factory
    summary: str
    stability: Stability = Stability.BETA
    replaced_by: str | None = None  # deprecated upstream in favour of this type: loading it logs a warning
    limitation: str | None = None  # loads, but cannot do its job here: this is logged once per plugin (stand_ins)
    reported_type: str | None = None  # the type upstream's instance reports when it differs (decode-filter: by-label)


def no_params(cls: Callable[[str], object]) -> Factory:
    """The factory of a type that takes no parameters: any given is refused by name (`Params.finish`)."""

    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        params.finish()
        return cls(name)

    return factory
