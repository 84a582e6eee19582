"""epp: an Endpoint Picker for the Gateway API Inference Extension.

Envoy hands each LLM request to the picker over ext_proc; the picker answers with the endpoint that should serve it.
The public surface is small on purpose; everything else is reached through the `epp` command.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
