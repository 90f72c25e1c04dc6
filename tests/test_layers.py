"""The package layers and their import rules, read from the source of every module (no module is imported).

Every import counts: at the top of a module, inside a function (lazy), under ``if TYPE_CHECKING:``, and a module
named in a string (``importlib.import_module("prefect_gliner2....")``, a lazy-export table). From them:

- layers point down only: session_core < training < model_registry < runtime < tasks < flows < deployments (the
  top-level ``prefect_gliner2`` package, the curated API, may name any of them lazily);
- ``session_core`` (the planning layer) imports no torch, transformers, gliner2, safetensors, peft, tokenizers or
  prefect at all, and numpy/scipy (promotion statistics) and spaCy (reading a DocBin) only inside functions;
- ``session_core``, ``training``, ``runtime`` and ``model_registry`` import no prefect;
- no two modules import each other, directly or through others (no cycles, lazy and TYPE_CHECKING imports included);
- gliner2 beyond its public API (``gliner2`` and ``gliner2.training``, the names they export) is touched only in
  ``training/engine/``.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "prefect_gliner2"
#: Bottom to top; a module may import its own layer and the ones before it.
LAYERS = ("session_core", "training", "model_registry", "runtime", "tasks", "flows", "deployments")
PLANNING_FORBIDDEN = ("torch", "transformers", "gliner2", "safetensors", "peft", "tokenizers", "prefect")
PLANNING_LAZY_ONLY = ("numpy", "scipy", "spacy")
PREFECT_FREE = ("session_core", "training", "runtime", "model_registry")
ENGINE = f"{NAMESPACE}.training.engine"
#: The one downward exception: session_core's package keeps the session names that moved to the training layer
#: reachable (with a DeprecationWarning) for code written before the split (``MOVED_TO_TRAINING``).
ALLOWED_UPWARD = {(f"{NAMESPACE}.session_core", f"{NAMESPACE}.training")}


@dataclass(frozen=True)
class Import:
    target: str  # a dotted module name (or module.attribute, resolved against the known modules)
    lazy: bool  # inside a function or class body, or under `if TYPE_CHECKING:`
    names: tuple[str, ...]  # the names of a `from target import ...`
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] == NAMESPACE:
        parts.pop(0)
    return ".".join([NAMESPACE, *parts])


def _modules() -> dict[str, Path]:
    found = {_module_name(ROOT / NAMESPACE / "__init__.py"): ROOT / NAMESPACE / "__init__.py"}
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> list[Import]:
    return _IMPORTS.setdefault(path, list(_walk_imports(path)))


_IMPORTS: dict[Path, list[Import]] = {}


def _walk_imports(path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        lazy = id(node) not in top
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, lazy, (), node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield Import(node.module, lazy, tuple(a.name for a in node.names), node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            dotted = text.replace(".", "").isidentifier()
            if text.startswith((f"{NAMESPACE}.", "gliner2.")) and " " not in text and dotted:
                yield Import(text, True, (), node.lineno)  # a module named in a string: a lazy import


def _resolve(target: str) -> str | None:
    """The module of ours `target` names (a module, or a module's attribute), None for a third-party one."""
    while target:
        if target in MODULES:
            return target
        target = target.rpartition(".")[0]
    return None


def _edges() -> dict[str, set[str]]:
    """module -> the modules of ours it imports; `from package import submodule` counts as the submodule."""
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for imp in _imports(path):
            targets = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in MODULES] or [imp.target]
            for target in targets:
                resolved = _resolve(target)
                if resolved is not None and resolved != name:
                    graph[name].add(resolved)
    return graph


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_package_folder_is_a_known_layer() -> None:
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {NAMESPACE, "tests", "bench", "docs", "build"}
    assert folders == set(LAYERS), "a new top-level package needs its place in LAYERS"
    assert len(MODULES) > 100


def test_layers_point_down_only() -> None:
    wrong = []
    for module, targets in _edges().items():
        here = _layer(module)
        if here is None:
            continue  # the top-level API package
        for target in targets:
            there = _layer(target)
            if there is None:
                wrong.append((module, target))
            elif LAYERS.index(there) > LAYERS.index(here) and (module, target) not in ALLOWED_UPWARD:
                wrong.append((module, target))
    assert wrong == [], f"imports that point up a layer: {sorted(wrong)}"


def test_the_planning_layer_imports_no_heavy_module_and_no_prefect() -> None:
    wrong = []
    for module, path in MODULES.items():
        if _layer(module) != "session_core":
            continue
        for imp in _imports(path):
            root = imp.target.split(".")[0]
            if root in PLANNING_FORBIDDEN or (root in PLANNING_LAZY_ONLY and not imp.lazy):
                wrong.append(f"{path.relative_to(ROOT)}:{imp.line} {imp.target}")
    assert wrong == [], f"session_core must stay torch-free: {wrong}"


def test_the_layers_below_the_flows_import_no_prefect() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{imp.line} {imp.target}"
        for module, path in MODULES.items()
        if _layer(module) in PREFECT_FREE
        for imp in _imports(path)
        if imp.target.split(".")[0] == "prefect"
    ]
    assert wrong == [], wrong


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    graph = _edges()
    for module, target in ALLOWED_UPWARD:  # the compatibility names resolve on attribute access, after both load
        graph[module].discard(target)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The rule above can fail: a lazy import back from the plan to the manifest would be a cycle."""
    graph = _edges()
    graph[f"{NAMESPACE}.session_core.manifest"].add(f"{NAMESPACE}.session_core.plan")
    cycles = _cycles(graph)
    assert any({f"{NAMESPACE}.session_core.manifest", f"{NAMESPACE}.session_core.plan"} <= set(c) for c in cycles)


def _gliner2_public() -> dict[str, set[str]]:
    """The public names of gliner2's two public packages: their ``__all__`` and their documented lazy names."""
    spec = importlib.util.find_spec("gliner2")  # found, not imported
    assert spec is not None and spec.origin is not None
    public: dict[str, set[str]] = {}
    for package in ("gliner2", "gliner2.training"):
        source = Path(spec.origin).parent.joinpath(*package.split(".")[1:], "__init__.py")
        tree = ast.parse(source.read_text(encoding="utf-8"))
        names: set[str] = set()
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if isinstance(target, ast.Name) and target.id in ("__all__", "_LAZY") and node.value is not None:
                    value = ast.literal_eval(node.value)
                    names |= set(value)
        public[package] = names
    return public


def test_gliner2_internals_are_touched_only_in_the_engine_package() -> None:
    public = _gliner2_public()
    assert {"AutoExtractor", "Schema", "ExtractorConfig"} <= public["gliner2"]
    wrong = []
    for module, path in MODULES.items():
        if module == ENGINE or module.startswith(ENGINE + "."):
            continue
        for imp in _imports(path):
            if imp.target.split(".")[0] != "gliner2":
                continue
            if imp.target not in public or not set(imp.names) <= public[imp.target]:
                wrong.append(f"{path.relative_to(ROOT)}:{imp.line} {imp.target} {list(imp.names)}")
    assert wrong == [], f"gliner2 beyond its public API outside training/engine/: {wrong}"


@pytest.mark.parametrize("name", ["session_core", "training"])
def test_each_layer_package_states_its_rule(name: str) -> None:
    doc = ast.get_docstring(ast.parse((ROOT / name / "__init__.py").read_text(encoding="utf-8")))
    assert doc and "test_layers.py" in doc


#: What Prefect does beyond a documented API effect, as the names code uses to rely on it (flows/prefect_compat.py
#: draws each rule with the test that pins it).
PREFECT_RULE_NAMES = frozenset(
    {
        "FlowRunContext",
        "TaskRunContext",
        "get_run_context",
        "get_settings_context",
        "TerminationSignal",
        "EventsWorker",
        "APILogWorker",
        "drain_all",
        "empirical_policy",
        "run_count",
        "resuming",
        "AwaitingRetry",
        "event_hooks",
        "PREFECT_CLIENT_MAX_RETRIES",
        "SetStateStatus",
    }
)
PREFECT_COMPAT = f"{NAMESPACE}.flows.prefect_compat"


def _code_names(path: Path) -> Iterator[tuple[int, str]]:
    """Every identifier, attribute, imported name and keyword argument in `path`'s code (not its comments or
    docstrings), and every short string constant (a dict key such as ``{"resuming": True}``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                yield node.lineno, alias.name.rsplit(".", 1)[-1]
        elif isinstance(node, ast.keyword) and node.arg:
            yield getattr(node, "lineno", 0), node.arg
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            yield node.lineno, node.value


def test_prefect_rules_are_relied_on_only_in_the_compat_module() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for module, path in MODULES.items()
        if module != PREFECT_COMPAT
        for line, name in _code_names(path)
        if name in PREFECT_RULE_NAMES
    ]
    assert wrong == [], f"Prefect rules relied on outside flows/prefect_compat.py: {wrong}"
    found = {name for _, name in _code_names(MODULES[PREFECT_COMPAT])}
    assert PREFECT_RULE_NAMES - found <= {"TaskRunContext", "get_run_context"}, "the list names what the module uses"
