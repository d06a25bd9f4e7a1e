"""Compilers: what a pipeline task computes, in the patterns of incremental publishing.

- `DirectCompiler`: each output partition's key follows from input keys alone
  (`output_keys`, 1:N and M:N); `compile` builds one output partition from the inputs mapped to
  it. An incremental run recompiles the outputs of the changed inputs' keys.
- `MapGroupCompiler`: outputs follow from content: `map` turns one input partition into
  `(layer, partition, value)` pieces, `reduce` builds an output partition from its pieces. The
  input → output graph is kept in the state layer, so an incremental run recompiles the outputs
  that changed inputs fed before and feed now.
- `FunctionCompiler` (or the `@compiler` decorator): a plain function from input DataFrames to
  output DataFrames, run in full every time.

Inputs are declared as `{catalog name: [layers]}`, outputs as `[layers]`; `config` (JSON-able)
is part of the task's fingerprint, with the library version and the compiler's source code.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from oxlake import __version__, _native

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


#: What a compiler returns for one output partition: bytes, a dict for a structured layer, or
#: None (no content).
Payload = bytes | dict[str, Any] | None

#: The layout of the state layer's rows (part of every fingerprint: a new layout runs in full).
#: 3: a map-group task's "out" graph rows keep the output's pieces, not only its inputs' keys.
#: 4: inputs without a payload are not mapped (pieces kept from them by a full run of 3 would
#: outlive them), and structured layers' types are part of the fingerprint.
STATE_FORMAT = 4


class PipelineDefinitionError(_native.InvalidArgumentError):
    """A pipeline that cannot run: two tasks produce one layer, a task reads an output layer no
    earlier task produces, an unknown catalog, a reserved layer."""


@dataclass(frozen=True, order=True)
class InputPartition:
    """One published partition of an input catalog: its payload is bytes, or for a structured
    layer a dict of the layer's struct type."""

    catalog: str
    layer: str
    partition: str
    payload: Any


class Compiler:
    """The base of every compiler: its name, inputs, outputs and configuration."""

    #: `{catalog name: [layers]}` read by the task.
    inputs: ClassVar[Mapping[str, Sequence[str]]] = {}
    #: Layers of the output catalog the task produces (each by exactly one task).
    outputs: ClassVar[Sequence[str]] = ()
    #: Whether the driver may run it incrementally.
    incremental: ClassVar[bool] = True

    def __init__(self, name: str | None = None, config: Mapping[str, Any] | None = None) -> None:
        self.name = name or type(self).__name__
        self.config = dict(config or {})
        if "|" in self.name:
            raise ValueError(f"task name {self.name!r} must not contain '|'")

    def input_layers(self) -> list[tuple[str, str]]:
        return [(c, layer) for c, layers in self.inputs.items() for layer in layers]

    def output_key(self, layer: object, partition: object) -> tuple[str, str]:
        """An output key `output_keys` or `map` gave, checked: a partition (str) of one of the
        declared `outputs`. Anything else would be written where no task owns it (another
        task's layer, the state layer), so it is refused."""
        if not isinstance(layer, str) or layer not in self.outputs or not isinstance(partition, str):
            raise PipelineDefinitionError(
                f"task {self.name!r} named the output ({layer!r}, {partition!r}), which is not a "
                f"partition (str) of its declared outputs {list(self.outputs)}"
            )
        return layer, partition

    def code(self) -> str:
        """The source the fingerprint covers (falls back to the qualified name)."""
        try:
            return inspect.getsource(type(self))
        except (OSError, TypeError):
            return type(self).__qualname__

    def fingerprint(self) -> dict[str, str]:
        """What makes the recorded state reusable: library version, compiler code, config."""
        return {
            "library": f"{__version__} state {STATE_FORMAT}",
            "code": hashlib.sha256(self.code().encode()).hexdigest(),
            "config": hashlib.sha256(
                json.dumps(self.config, sort_keys=True, default=str).encode()
            ).hexdigest(),
        }


class DirectCompiler(Compiler):
    """Output keys from input keys: override `output_keys` and `compile`."""

    def output_keys(self, catalog: str, layer: str, partition: str) -> Iterable[tuple[str, str]]:
        """The `(output layer, output partition)` keys an input partition contributes to."""
        raise NotImplementedError

    def compile(self, layer: str, partition: str, inputs: list[InputPartition]) -> Payload:
        """One output partition from its inputs (sorted by catalog, layer, partition): bytes,
        or for a structured layer a dict of its struct type. `None` or empty bytes: the
        partition has no content (a published one is deleted)."""
        raise NotImplementedError

    def input_keys(self, layer: str, partition: str) -> Iterable[tuple[str, str, str]]:
        """Optional, the inverse of `output_keys`: the `(catalog, layer, partition)` keys that
        may feed an output partition (more is fine: keys not published, or whose `output_keys`
        do not name this output, are skipped). With it a small change runs on the driver path,
        which reads only the inputs of the outputs it recompiles; without it (or for a change
        too large for the driver) the task runs on Spark, which scans every input."""
        raise NotImplementedError

    @property
    def invertible(self) -> bool:
        return type(self).input_keys is not DirectCompiler.input_keys


class MapGroupCompiler(Compiler):
    """Output keys from content: override `map` and `reduce`."""

    def map(self, item: InputPartition) -> Iterable[tuple[str, str, bytes]]:
        """The `(output layer, output partition, value)` pieces of one input partition."""
        raise NotImplementedError

    def reduce(self, layer: str, partition: str, values: list[bytes]) -> Payload:
        """One output partition from its pieces (ordered by the input they came from, then by
        the order `map` gave them): bytes, or a dict for a structured layer. `None` or empty
        bytes: no content."""
        raise NotImplementedError


#: A non-incremental compiler's function: input DataFrames by `(catalog, layer)` (columns
#: partition, payload) → output DataFrames by layer (columns partition, payload).
CompileFunction = Callable[[dict[tuple[str, str], "DataFrame"]], Mapping[str, "DataFrame"]]


class FunctionCompiler(Compiler):
    """A plain DataFrame function, always run in full."""

    incremental: ClassVar[bool] = False

    def __init__(
        self,
        fn: CompileFunction,
        inputs: Mapping[str, Sequence[str]],
        outputs: Sequence[str],
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name or fn.__name__, config)
        self.fn = fn
        # Per instance: the class attributes are the defaults of the other compilers.
        self.inputs = {c: list(layers) for c, layers in inputs.items()}  # type: ignore[misc]
        self.outputs = list(outputs)  # type: ignore[misc]

    def code(self) -> str:
        try:
            return inspect.getsource(self.fn)
        except (OSError, TypeError):
            return self.fn.__qualname__


def compiler(
    *, inputs: Mapping[str, Sequence[str]], outputs: Sequence[str], config: Mapping[str, Any] | None = None
) -> Callable[[CompileFunction], FunctionCompiler]:
    """Turns a DataFrame function into a non-incremental task:

    >>> @compiler(inputs={"roads": ["segments"]}, outputs=["counts"])   # doctest: +SKIP
    ... def counts(inputs): ...
    """

    def wrap(fn: CompileFunction) -> FunctionCompiler:
        return FunctionCompiler(fn, inputs, outputs, config=config)

    return wrap
