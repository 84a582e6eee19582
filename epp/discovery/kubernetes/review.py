"""Who may read `/metrics`: the API server's TokenReview and SubjectAccessReview, as upstream's
`--metrics-endpoint-auth` (controller-runtime's authn/authz filter) asks them."""

from __future__ import annotations

from typing import NamedTuple

from epp.discovery.kubernetes.rest import ApiError, KubeRest


class Verdict(NamedTuple):
    status: int  # 200 allowed, 401 not authenticated, 403 authenticated but not authorized, 503 no answer
    reason: str


class AccessReviewer:
    """Blocking: run it in a worker thread. One TokenReview, then one SubjectAccessReview for the user it names."""

    def __init__(self, rest: KubeRest, path: str = "/metrics", verb: str = "get") -> None:
        self._rest = rest
        self._path = path
        self._verb = verb

    def review(self, token: str) -> Verdict:
        try:
            answer = self._rest.call(
                "POST",
                "/apis/authentication.k8s.io/v1/tokenreviews",
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
                read_timeout_s=5.0,
            )
            status = answer.get("status") or {}
            if not status.get("authenticated"):
                return Verdict(401, "token not accepted by the API server")
            user = status.get("user") or {}
            spec = {
                "user": user.get("username", ""),
                "groups": user.get("groups") or [],
                "uid": user.get("uid", ""),
                "extra": user.get("extra") or {},
                "nonResourceAttributes": {"path": self._path, "verb": self._verb},
            }
            answer = self._rest.call(
                "POST",
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
                read_timeout_s=5.0,
            )
        except ApiError as exc:
            return Verdict(503, f"cannot review the token with the API server: {exc.status} {exc.reason}")
        if not (answer.get("status") or {}).get("allowed"):
            return Verdict(403, f"user {spec['user']!r} may not {self._verb} {self._path}")
        return Verdict(200, "ok")
