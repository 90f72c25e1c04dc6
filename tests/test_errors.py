"""One exception tree: every exception class of the package derives from the bases in session_core.errors, is defined
in the errors home of the layer that raises it, is drawn (with that layer's mark) in session_core.errors' docstring,
and is a stdlib error that pickles with its fields."""

from __future__ import annotations

import ast
import builtins
import errno
import importlib
import pickle
import re
from pathlib import Path

import pytest

from prefect_gliner2.runtime.errors import is_transient
from prefect_gliner2.session_core import errors
from prefect_gliner2.session_core.errors import PrefectGliner2Error, SessionCoreError, TransientError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("session_core", "training", "runtime", "tasks", "flows", "model_registry", "deployments")
#: Where exception classes may be defined: the file of each layer that raises them, and the mark the drawn tree
#: gives the classes defined there (none for session_core/errors.py itself).
ERROR_HOMES = {
    "session_core/errors.py": None,
    "runtime/errors.py": "runtime",
    "model_registry/store.py": "registry",
    "flows/sweep.py": "flows",
}
BUILTIN_ERRORS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}
#: The command line's own errors (bad arguments, a local server that did not start, a SIGTERM outside a flow run):
#: caught in its main() and printed, they never leave the CLI.
CLI_PRIVATE = ("flows/cli", ("UsageError", "LocalServerError", "Terminated"))


def _exception_classes() -> list[tuple[str, str]]:
    """(file, class name) of every class in the package whose bases make it an exception (found with ast)."""
    classes: list[tuple[str, str, list[str]]] = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
                    classes.append((str(path.relative_to(ROOT)), node.name, bases))
    known = set(BUILTIN_ERRORS)
    while True:  # a class is an exception when one of its bases is (our own bases found in earlier rounds)
        found = {name for _, name, bases in classes if known.intersection(bases)}
        if found <= known:
            break
        known |= found
    return [(file, name) for file, name, bases in classes if known.intersection(bases)]


def _drawn_tree() -> dict[str, tuple[str | None, str | None, str | None]]:
    """The module docstring's tree: class name -> (drawn parent, stdlib base named in parentheses, layer mark)."""
    assert errors.__doc__ is not None
    drawn: dict[str, tuple[str | None, str | None, str | None]] = {}
    parents: list[str] = []
    for line in errors.__doc__.splitlines():
        match = re.match(r"^    ((?:[│ ]   )*(?:[├└]── )?)([A-Z]\w+)(?: \((\w+)\))?", line)
        if not match:
            continue
        depth = len(match.group(1)) // 4
        name, stdlib = match.group(2), match.group(3)
        mark = re.search(r"\[(\w+)\]\s*$", line)
        assert name not in drawn, f"{name} is drawn twice"
        assert depth <= len(parents), f"{name} is indented below no parent"
        del parents[depth:]
        drawn[name] = (parents[-1] if parents else None, stdlib, mark.group(1) if mark else None)
        parents.append(name)
    return drawn


def _module_of(home: str) -> object:
    return importlib.import_module("prefect_gliner2." + home[: -len(".py")].replace("/", "."))


def _defined_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in an errors home, by name."""
    classes: dict[str, type[BaseException]] = {}
    for home in ERROR_HOMES:
        module = _module_of(home)
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                assert name not in classes, f"{name} is defined twice"
                classes[name] = value
    return classes


def _instance(cls: type[BaseException]) -> BaseException:
    if issubclass(cls, OSError):
        return cls(errno.ENOSPC, f"{cls.__name__}: no space left")  # type: ignore[call-arg]
    if cls.__name__ == "WorkerError":
        return cls("KeyError in session worker pid 1: 'x'", "Traceback ...", remote_type="KeyError")
    return cls(f"{cls.__name__} happened")


def test_every_exception_class_of_the_package_is_in_an_errors_home() -> None:
    found = _exception_classes()
    elsewhere = [
        (file, name)
        for file, name in found
        if file not in ERROR_HOMES and not (file.startswith(CLI_PRIVATE[0]) and name in CLI_PRIVATE[1])
    ]
    assert elsewhere == [], f"exception classes outside {sorted(ERROR_HOMES)}: {elsewhere}; define them there"
    in_homes = sorted(name for file, name in found if file in ERROR_HOMES)
    assert in_homes == sorted(_defined_classes()) and len(in_homes) >= 24


def test_the_drawn_tree_is_the_class_tree() -> None:
    drawn, defined = _drawn_tree(), _defined_classes()
    assert sorted(drawn) == sorted(defined), "the docstring draws exactly the classes the errors homes define"
    for name, (parent, stdlib, mark) in drawn.items():
        cls = defined[name]
        home = next(h for h in ERROR_HOMES if _module_of(h).__name__ == cls.__module__)
        assert mark == ERROR_HOMES[home], f"{name} is defined in {home} but drawn with the mark [{mark}]"
        ours = [base for base in cls.__bases__ if issubclass(base, PrefectGliner2Error)]
        if parent is None:
            assert cls is PrefectGliner2Error
            continue
        assert ours == [defined[parent]], f"{name} is drawn under {parent} but derives from {ours}"
        if stdlib is not None:
            assert getattr(builtins, stdlib) in cls.__bases__, f"{name} is drawn as a {stdlib}"


def test_each_error_is_a_stdlib_error_and_deterministic_or_transient() -> None:
    stdlib = tuple(
        value
        for name, value in vars(builtins).items()
        if name in BUILTIN_ERRORS and value not in (BaseException, Exception)
    )
    for name, cls in _defined_classes().items():
        assert issubclass(cls, PrefectGliner2Error), name
        if cls in (PrefectGliner2Error, SessionCoreError):
            continue  # the two bases: every concrete class below them names a stdlib error
        assert issubclass(cls, stdlib), f"{name} is not also a stdlib error (ValueError, RuntimeError, OSError...)"
        assert issubclass(cls, SessionCoreError) != issubclass(cls, TransientError), name
        assert is_transient(_instance(cls)) == issubclass(cls, TransientError), name


@pytest.mark.parametrize("name", sorted(_defined_classes()))
def test_each_error_pickles_with_its_fields(name: str) -> None:
    original = _instance(_defined_classes()[name])
    original.__dict__["note"] = "extra state"  # an attribute set after construction crosses too
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is type(original) and str(copy) == str(original) and copy.args == original.args
    assert copy.__dict__ == original.__dict__


def test_the_public_api_exports_errors_from_the_tree() -> None:
    import prefect_gliner2
    import prefect_gliner2.session_core as session_core
    import prefect_gliner2.training as training
    from prefect_gliner2 import model_registry

    defined = _defined_classes()
    assert model_registry.RegistryError is defined["RegistryError"]
    for package in (prefect_gliner2, session_core, training):
        exported = [name for name in package.__all__ if name.endswith(("Error", "Died"))]
        assert "PrefectGliner2Error" in exported and "SessionCoreError" in exported
        for name in exported:
            assert getattr(package, name) is defined[name], (package.__name__, name)


def test_every_home_of_a_deterministic_error_is_rebuilt_across_the_worker_pipe() -> None:
    """A SessionCoreError raised in the session worker reaches the client as itself (never retried) only when its
    module is one the protocol rebuilds from; otherwise it would arrive as a (transient) WorkerError."""
    from prefect_gliner2.runtime.protocol import REMOTE_ERROR_MODULES

    homes = {cls.__module__ for cls in _defined_classes().values() if issubclass(cls, SessionCoreError)}
    assert homes <= set(REMOTE_ERROR_MODULES), homes - set(REMOTE_ERROR_MODULES)
