"""Test support: storage faults and latency injected into every store of this process.

A fault plan is a comma-separated list of rules (the syntax of ``oxlake::storage::faults``):

- ``<call>@<n>:<mode>`` fails the n-th call of a kind, counted from the plan's installation;
  ``<call>:<mode>`` every call of that kind. Calls: ``list``, ``get``, ``head``, ``put``,
  ``put_if_absent`` (the commit protocol's conditional create), ``delete``, ``any``.
  Modes: ``once`` (that call fails; a retry succeeds), ``always`` (that call and every later one of
  its kind fail), ``lost`` (the call takes effect but its answer is lost).
- ``latency=<ms>``: every call waits first, and a listing again for each further page of 1,000
  entries (S3's pages); ``backoff=<ms>``: the retries' first pause.

Another process gets a plan from the ``OXLAKE_FAULTS`` environment variable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from oxlake import _native

__all__ = ["fault_counts", "faults", "inject_faults"]


def inject_faults(spec: str) -> None:
    """Installs a fault plan for every store of this process; ``""`` removes it. Counters restart."""
    _native.inject_faults(spec)


def fault_counts() -> dict[str, int]:
    """Store calls per kind since the plan was installed, and ``injected``: failures injected."""
    return dict(_native.fault_counts())


@contextmanager
def faults(spec: str) -> Iterator[dict[str, int]]:
    """Runs the block under a fault plan; the dict yielded holds the counts when the block ends."""
    counts: dict[str, int] = {}
    inject_faults(spec)
    try:
        yield counts
    finally:
        counts.update(fault_counts())
        inject_faults("")
