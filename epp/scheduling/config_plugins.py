"""Plugin types the config names whose behaviour lives outside the scheduler: parsers and the single profile handler
(markers), endpoint discovery from a file, and the data layer (the scraper's).

Each is kept as its configuration, so the decision layer can accept and describe them without importing the
layers that run them.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.scheduling.params import Params
from epp.scheduling.plugin_type import BuildContext, Factory


@dataclass(frozen=True, slots=True)
class Marker:
    """A plugin with no behaviour of its own here: the single profile handler; a parser (the request path runs
    it: `epp.requests.parsers` holds the implementation of each parser type)."""

    type_name: str
    name: str


def marker(type_name: str) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        params.finish()
        return Marker(type_name, name)

    return factory


@dataclass(frozen=True, slots=True)
class FileDiscoveryPlugin:
    """Upstream's `file-discovery`: endpoints from a YAML/JSON file instead of a cluster (`dataLayer.discovery`).

    Only the parameters here: reading and watching the file is a feeder's job (`epp.discovery.file`), which the
    composition root starts when the config names this plugin.
    """

    type_name: str
    name: str
    path: str
    watch_file: bool


def file_discovery(name: str, params: Params, ctx: BuildContext) -> object:
    path = params.text("path", "")
    watch = params.flag("watchFile", False)
    params.finish()
    if not path:
        raise params.error("path", "required: the endpoints file to read")
    return FileDiscoveryPlugin("file-discovery", name, path, watch)


@dataclass(frozen=True, slots=True)
class DataLayerPlugin:
    """A data-layer plugin (upstream's metrics source and extractor): the scraper, not the scheduler, uses it.

    Its parameters are kept raw here, because the decision layer may not import the scraper: the composition
    root hands them to `epp.scrape.engines.engines_from_config`, which checks them field by field.
    """

    type_name: str
    name: str
    parameters: dict[str, object]


def data_layer(type_name: str) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        return DataLayerPlugin(type_name, name, params.rest())

    return factory
