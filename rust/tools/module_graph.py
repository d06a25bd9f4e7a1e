"""The core's module graph: which top-level modules of `rust/oxlake/src` use which.

Reads every `crate::` path outside comment lines and test modules, and every call of a method that
a module adds to `Table` (an `impl Table` block outside `table/`), and fails when a module uses
one listed after it in `LAYERS` (the order `lib.rs` documents), which also rules out cycles, or
when the top-level modules form a cycle anyway (a cycle inside one module is fine). `make lint`
runs it; `--dot` prints the graph.

    python rust/tools/module_graph.py [--dot] [SRC]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# Lowest first: a module may use only those before it. A new module takes its place here.
LAYERS = [
    "error", "failpoints", "config", "schema", "format", "storage", "keys", "timeline",
    "table", "log", "read", "commit", "metadata", "write", "services",
]  # fmt: skip
# The crate root re-exports and documents; nothing uses it.
ROOT = "lib"

COMMENT_LINE = re.compile(r"^\s*//.*$", re.M)
TESTS = re.compile(r"#\[cfg\(test\)\]\s*(?:pub\s+)?mod\s+\w+\s*\{.*", re.S)
PATH = re.compile(r"\bcrate::(\{|\w+)")
IMPL_TABLE = re.compile(r"^impl Table \{", re.M)
METHOD = re.compile(r"^    (?:pub(?:\([\w:]+\))? )?(?:async )?fn (\w+)", re.M)
CALL = re.compile(r"\.(\w+)\(")
ANY_FN = re.compile(r"\bfn (\w+)")


def module_of(src: Path, file: Path) -> str:
    """`commit/conflicts.rs` and `commit.rs` belong to `commit`; `lib.rs` to the crate root."""
    first = file.relative_to(src).parts[0]
    return first.removesuffix(".rs")


def group_heads(text: str, start: int) -> list[str]:
    """The first segment of each path in the `{...}` group opening at `start`."""
    depth, item, heads = 0, "", []
    for ch in text[start:]:
        if ch == "{":
            depth += 1
            if depth == 1:
                continue
        elif ch == "}":
            depth -= 1
            if depth == 0:
                break
        if depth == 1 and ch == ",":
            heads.append(item)
            item = ""
        elif depth >= 1:
            item += ch
    heads.append(item)
    names = [re.match(r"\s*(\w+)", h) for h in heads]
    return [m.group(1) for m in names if m and m.group(1) != "self"]


def sources(src: Path) -> list[tuple[Path, str, str]]:
    """(relative path, module, code without comment lines and test modules) of every file."""
    out = []
    for file in sorted(src.rglob("*.rs")):
        rel = file.relative_to(src)
        if rel.name != "test_support.rs":
            out.append((rel, module_of(src, file), TESTS.sub("", COMMENT_LINE.sub("", file.read_text()))))
    return out


def table_methods(files: list[tuple[Path, str, str]]) -> dict[str, str]:
    """Methods that modules other than `table` add to `Table` (`impl Table` blocks), by name:
    calling one depends on that module as much as a `crate::` path does."""
    methods: dict[str, str] = {}
    for _, here, text in files:
        if here == "table":
            continue
        for m in IMPL_TABLE.finditer(text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            methods.update((name, here) for name in METHOD.findall(text[m.end() : i]))
    # A name also defined by another type (`write`, `execute`) cannot be told apart by its call.
    defined: dict[str, int] = {}
    for _, _, text in files:
        for name in ANY_FN.findall(text):
            defined[name] = defined.get(name, 0) + 1
    return {name: owner for name, owner in methods.items() if defined.get(name, 0) == 1}


def edges(src: Path) -> dict[str, dict[str, set[str]]]:
    """module -> used module -> the files that use it."""
    graph: dict[str, dict[str, set[str]]] = {}
    files = sources(src)
    methods = table_methods(files)
    for rel, here, text in files:
        graph.setdefault(here, {})
        for call in CALL.finditer(text):
            owner = methods.get(call.group(1))
            if owner and owner != here:
                graph[here].setdefault(owner, set()).add(f"{rel} (.{call.group(1)})")
        for m in PATH.finditer(text):
            used = group_heads(text, m.start(1)) if m.group(1) == "{" else [m.group(1)]
            for name in used:
                known = (src / name).is_dir() or (src / f"{name}.rs").exists()
                if known and name != here:
                    graph[here].setdefault(name, set()).add(str(rel))
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layering(graph: dict[str, dict[str, set[str]]]) -> list[str]:
    """Every use of a module listed after the user in `LAYERS`, and every module not listed."""
    out = []
    for a in sorted(graph):
        if a == ROOT:
            continue
        if a not in LAYERS:
            out.append(f"module {a} is not in LAYERS (rust/tools/module_graph.py): give it its place")
            continue
        for b in sorted(graph[a]):
            if b == ROOT or (b in LAYERS and LAYERS.index(b) > LAYERS.index(a)):
                out.append(f"{a} uses {b}, a layer above it: {', '.join(sorted(graph[a][b]))}")
    return out


def main(argv: list[str]) -> int:
    dot = "--dot" in argv
    args = [a for a in argv if a != "--dot"]
    src = Path(args[0]) if args else Path(__file__).resolve().parents[1] / "oxlake" / "src"
    graph = edges(src)
    if dot:
        print("digraph oxlake {")
        for a in sorted(graph):
            for b in sorted(graph[a]):
                print(f'  "{a}" -> "{b}";')
        print("}")
    bad = cycles(graph)
    upward = layering(graph)
    for line in upward:
        print(line, file=sys.stderr)
    for component in bad:
        print(f"module cycle: {' <-> '.join(component)}", file=sys.stderr)
        for a in component:
            for b in sorted(set(graph[a]) & set(component)):
                print(f"  {a} -> {b}: {', '.join(sorted(graph[a][b]))}", file=sys.stderr)
    return 1 if bad or upward else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
