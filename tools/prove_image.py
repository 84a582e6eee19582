"""Build the picker's image without a registry and run its entrypoint as upstream's chart does (not in `make test`).

No registry for base images is reachable on the build machines, so (the way the deployment notes describe):
1. `debootstrap` a minimal Debian bookworm with python3 + venv, `podman import` it as `localhost/epp-base:bookworm`;
2. `make image BASE=localhost/epp-base:bookworm` with `podman build --isolation=chroot` and a containers.conf that
   clears podman's default ulimits (which chroot isolation cannot set);
3. `podman image mount` the result and `chroot --userspec=65532:65532` into it to run the image's ENTRYPOINT with
   the chart's args (tests/data/chart-args/single-replica.args: `--pool-name … --zap-encoder json --config-file
   /config/default-plugins.yaml --grpc-health-port 9003 --tracing=false`)
   plus `--kubeconfig` for a fake API server on loopback (tests/fakes/apiserver.py) holding the pool and a pod;
4. wait until the gRPC health service `inference-extension` is SERVING, check that the log lines are JSON and that
   `/metrics` answers 401 without a token and 200 with one the fake API server authorizes; stop with SIGTERM.

    sudo .venv/bin/python -m tools.prove_image [--work /tmp/epp-image]

Needs root (chroot, mounts), podman and debootstrap (apt-get install podman debootstrap). Bounded: every wait has a
deadline; the picker is stopped by its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = "localhost/epp-base:bookworm"
# The single-replica args upstream's chart renders (sources: tests/data/SOURCES.md), used as they are; ports and
# the kubeconfig are appended (the last value of a flag wins).
CHART_ARGS = (ROOT / "tests/data/chart-args/single-replica.args").read_text().split()


def sh(*argv: str, env: dict[str, str] | None = None, capture: bool = False) -> str:
    print("+", " ".join(argv), flush=True)
    done = subprocess.run(argv, check=True, env=env, text=True, stdout=subprocess.PIPE if capture else None)
    return done.stdout.strip() if capture else ""


def base_image(work: Path) -> None:
    rootfs = work / "rootfs"
    if not (rootfs / "usr/bin/python3").exists():
        sh(
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,ca-certificates",
            "bookworm",
            str(rootfs),
        )
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["podman", "import", "-", BASE], stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL)
    tar.wait()


def build(work: Path) -> tuple[str, dict[str, str]]:
    conf = work / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    image = sh("make", "-s", "-C", str(ROOT), "--eval", "print-image: ; @echo $(IMAGE)", "print-image", capture=True)
    build_args = "--isolation=chroot"
    ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    if ca and Path(ca).is_file():  # this machine's egress CA, mounted for pip only (not in the image)
        build_args += f" --volume {ca}:/run/build-ca.crt:ro --build-arg PIP_CERT=/run/build-ca.crt"
    sh("make", "-C", str(ROOT), "image", f"BASE={BASE}", "CONTAINER=podman", f"CONTAINER_BUILD_ARGS={build_args}",
       env=env)  # fmt: skip
    return image, env


@contextlib.contextmanager
def mounted(image: str, env: dict[str, str], work: Path) -> Iterator[Path]:
    """The image's filesystem, read-only as `podman image mount` gives it, under a writable overlay (for /config,
    the kubeconfig and /proc), so the image itself is never changed."""
    lower = Path(sh("podman", "image", "mount", image, env=env, capture=True))
    upper, scratch, root = work / "upper", work / "overlay-work", work / "root"
    for d in (upper, scratch, root):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={scratch}", str(root))
    try:
        for d in ("config", "run/epp"):
            (root / d).mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "proc", "proc", str(root / "proc"))
        yield root
    finally:
        subprocess.run(["umount", str(root / "proc")], check=False)
        subprocess.run(["umount", str(root)], check=False)
        subprocess.run(["podman", "image", "unmount", image], check=False, env=env)


CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


def image_env() -> dict[str, str]:
    """The image's ENV (as a container runtime would set it) plus what the chart's Deployment adds."""
    pairs = json.loads(sh("podman", "image", "inspect", "--format", "{{json .Config.Env}}", IMAGE, capture=True))
    env = dict(p.split("=", 1) for p in pairs or [])
    return {**env, "NAMESPACE": "default", "POD_NAME": "epp-0"}


def health(port: int, service: str) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status)


def status_of(url: str, token: str | None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def run(mnt: Path, log_path: Path) -> int:
    sys.path.insert(0, str(ROOT))
    from tests.discovery.k8s_objects import pod, pool
    from tests.fakes.apiserver import FakeApiServer
    from tests.support.procs import free_port

    shutil.copy(
        ROOT / "tests/data/epp-configs/gie-integration-default-config.yaml", mnt / "config/default-plugins.yaml"
    )
    with FakeApiServer() as api:
        api.apply(pool("vllm-pool"))
        api.apply(pod("vllm-0", ip="127.10.0.7"))
        api.review_tokens = {"reader": ("system:serviceaccount:monitoring:prometheus", [])}
        api.allow_non_resource = {("system:serviceaccount:monitoring:prometheus", "get", "/metrics")}
        api.write_kubeconfig(mnt / "run/epp/kubeconfig")
        os.chmod(mnt / "run/epp/kubeconfig", 0o644)
        grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
        argv = [*CHART_ARGS, "--kubeconfig", "/run/epp/kubeconfig", "--grpc-port", str(grpc_port),
                "--grpc-health-port", str(health_port), "--metrics-port", str(metrics_port)]  # fmt: skip
        entrypoint = json.loads(sh("podman", "image", "inspect", "--format", "{{json .Config.Entrypoint}}",
                                   IMAGE, capture=True))  # fmt: skip
        cmd = ["chroot", "--userspec=65532:65532", str(mnt), *entrypoint, *argv]
        print("+", " ".join(cmd), flush=True)
        with log_path.open("w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=image_env(), executable=CHROOT)
        try:
            deadline, state = time.monotonic() + 60, -1
            while time.monotonic() < deadline and proc.poll() is None:
                with contextlib.suppress(Exception):
                    state = health(health_port, "inference-extension")
                    if state == 1:
                        break
                time.sleep(0.5)
            print(f"inference-extension health: {'SERVING' if state == 1 else state}")
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            print(
                f"/metrics without a token: {status_of(url, None)}; "
                f"with an authorized token: {status_of(url, 'reader')}"
            )
            uid = subprocess.run(["ps", "-o", "uid=", "-p", str(proc.pid)], text=True, capture_output=True).stdout
            print(f"entrypoint uid: {uid.strip()} (pid {proc.pid})")
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        lines = log_path.read_text().splitlines()
        json_lines = sum(1 for line in lines if line.startswith("{") and json.loads(line))
        print(f"exit {code}; {json_lines} of {len(lines)} log lines are JSON; first: {lines[0] if lines else ''}")
        return 0 if state == 1 and code == 0 else 1


IMAGE = ""


def main() -> int:
    global IMAGE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "epp-image"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    base_image(work)
    IMAGE, env = build(work)
    with mounted(IMAGE, env, work) as mnt:
        return run(mnt, work / "entrypoint.log")


if __name__ == "__main__":
    sys.exit(main())
