"""Apache Hudi's Spark bundles for the Java round-trip suite, fetched reproducibly.

    python3 tests/java/bundles.py fetch            # every bundle of bundles.lock (make java-deps)
    python3 tests/java/bundles.py fetch 1.0.2      # one of them
    python3 tests/java/bundles.py path 1.0.2       # the jar of a fetched bundle
    python3 tests/java/bundles.py versions         # the versions of bundles.lock, one a line
    python3 tests/java/bundles.py lock 1.3.0 9     # fetch a new version, record its sha256

Each bundle is pinned by version and sha256 in `bundles.lock` beside this file. `fetch` resolves it
from Maven Central with `mvn dependency:copy` (pinned plugin version, its own local repository)
into a cache outside the clone, `$OXLAKE_JAVA_CACHE` (default `~/.cache/oxlake-java`), and checks
the checksum; a jar already there with the right checksum is not fetched again. A version Maven
cannot resolve fails naming the artifact, with mvn's output. Standard library only: it runs
before any venv exists.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

GROUP = "org.apache.hudi"
ARTIFACT = "hudi-spark3.5-bundle_2.12"
#: The maven-dependency-plugin that copies the jars (pinned: its defaults change between releases).
PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
LOCK = Path(__file__).resolve().with_name("bundles.lock")


@dataclass(frozen=True)
class Bundle:
    """One pinned bundle: its Hudi version, the table version it writes, the jar's sha256."""

    version: str
    table_version: int
    sha256: str

    @property
    def coordinates(self) -> str:
        return f"{GROUP}:{ARTIFACT}:{self.version}"

    @property
    def jar_name(self) -> str:
        return f"{ARTIFACT}-{self.version}.jar"


class FetchError(Exception):
    """A bundle that could not be fetched or does not match its pinned checksum."""


def cache_dir() -> Path:
    """Where the jars (and Maven's local repository for them) live: outside the clone."""
    return Path(os.environ.get("OXLAKE_JAVA_CACHE") or Path.home() / ".cache" / "oxlake-java")


def read_lock(lock: Path = LOCK) -> dict[str, Bundle]:
    """The bundles of `bundles.lock`, by Hudi version, in the file's order."""
    out: dict[str, Bundle] = {}
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        version, table_version, sha256 = line.split()
        out[version] = Bundle(version, int(table_version), sha256)
    return out


def write_lock(bundles: dict[str, Bundle], lock: Path = LOCK) -> None:
    header = [
        f"# {GROUP}:{ARTIFACT}, pinned for the Java round-trip suite (tests/java, docs/JAVA_HUDI.md).",
        "# hudi-version  table-version  sha256 of the jar (`python3 tests/java/bundles.py lock` adds one)",
    ]
    body = [f"{b.version:<14}{b.table_version:<15}{b.sha256}" for b in bundles.values()]
    lock.write_text("\n".join(header + body) + "\n")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def jar_path(bundle: Bundle) -> Path:
    return cache_dir() / "jars" / bundle.jar_name


def _mvn_copy(coordinates: str, out_dir: Path) -> None:
    """`mvn dependency:copy` of one artifact (no transitive dependencies: a bundle is shaded)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        "mvn",
        "-B",
        "--no-transfer-progress",
        "-Dstyle.color=never",
        f"{PLUGIN}:copy",
        f"-Dartifact={coordinates}",
        f"-DoutputDirectory={out_dir}",
        f"-Dmaven.repo.local={cache_dir() / 'm2'}",
        "-Dmdep.overWriteReleases=true",
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=cache_dir())
    except FileNotFoundError as e:
        raise FetchError(f"cannot fetch {coordinates}: `mvn` is not installed (Maven 3, Java 17)") from e
    if done.returncode != 0:
        raise FetchError(
            f"cannot fetch {coordinates} from Maven Central: mvn exited {done.returncode}\n"
            f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}"
        )


def fetch(bundle: Bundle) -> Path:
    """The bundle's jar in the cache, fetched when missing or not matching its checksum."""
    jar = jar_path(bundle)
    if jar.is_file() and sha256_of(jar) == bundle.sha256:
        return jar
    cache_dir().mkdir(parents=True, exist_ok=True)
    staging = cache_dir() / "staging"
    _mvn_copy(bundle.coordinates, staging)
    got = staging / bundle.jar_name
    if not got.is_file():
        raise FetchError(f"mvn reported success for {bundle.coordinates} but left no {got}")
    digest = sha256_of(got)
    if digest != bundle.sha256:
        got.unlink()
        raise FetchError(
            f"{bundle.coordinates}: sha256 {digest} is not the pinned {bundle.sha256} "
            f"({LOCK.name}); the artifact served changed, or the lock is wrong"
        )
    jar.parent.mkdir(parents=True, exist_ok=True)
    got.replace(jar)
    return jar


def bundle_for(version: str) -> Bundle:
    bundles = read_lock()
    if version not in bundles:
        raise FetchError(f"Hudi {version} is not pinned in {LOCK} (pinned: {', '.join(bundles)})")
    return bundles[version]


def fetched_jar(version: str) -> Path:
    """The jar of a pinned version, checked against its checksum, without fetching it."""
    bundle = bundle_for(version)
    jar = jar_path(bundle)
    if not jar.is_file():
        raise FetchError(f"{bundle.coordinates} is not in {jar.parent}: run `make java-deps`")
    if (digest := sha256_of(jar)) != bundle.sha256:
        raise FetchError(f"{jar}: sha256 {digest} is not the pinned {bundle.sha256}: run `make java-deps`")
    return jar


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("fetch", "path", "versions", "lock"):
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    try:
        if command == "versions":
            print("\n".join(read_lock()))
        elif command == "path":
            print(fetched_jar(args[0]))
        elif command == "lock":
            version, table_version = args
            bundles = read_lock()
            staging = cache_dir() / "staging"
            cache_dir().mkdir(parents=True, exist_ok=True)
            _mvn_copy(f"{GROUP}:{ARTIFACT}:{version}", staging)
            digest = sha256_of(staging / f"{ARTIFACT}-{version}.jar")
            bundles[version] = Bundle(version, int(table_version), digest)
            write_lock(bundles)
            print(f"{version} {digest}")
        else:
            wanted = args or list(read_lock())
            for version in wanted:
                bundle = bundle_for(version)
                print(f"== {bundle.coordinates} (table version {bundle.table_version}): {fetch(bundle)}")
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
