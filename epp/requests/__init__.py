"""OpenAI request bodies parsed into the small value the decision needs."""

from epp.requests.openai import ApiKind, InferenceRequest, api_kind_of_path, parse_request, request_without_body

__all__ = ["ApiKind", "InferenceRequest", "api_kind_of_path", "parse_request", "request_without_body"]
