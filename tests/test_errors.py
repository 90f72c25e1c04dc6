"""One exception tree: every exception class of the package lives in session_core.errors, drawn in its docstring,
and each is a stdlib error that pickles with its fields."""

from __future__ import annotations

import ast
import builtins
import errno
import pickle
import re
from pathlib import Path

import pytest

from prefect_gliner2.runtime.errors import is_transient
from prefect_gliner2.session_core import errors
from prefect_gliner2.session_core.errors import PrefectGliner2Error, SessionCoreError, TransientError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("session_core", "runtime", "tasks", "flows", "model_registry", "deployments")
ERRORS_FILE = ROOT / "session_core" / "errors.py"
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


def _drawn_tree() -> dict[str, tuple[str | None, str | None]]:
    """The module docstring's tree: class name -> (drawn parent, stdlib base named in parentheses)."""
    assert errors.__doc__ is not None
    drawn: dict[str, tuple[str | None, str | None]] = {}
    parents: list[str] = []
    for line in errors.__doc__.splitlines():
        match = re.match(r"^    ((?:[│ ]   )*(?:[├└]── )?)([A-Z]\w+)(?: \((\w+)\))?", line)
        if not match:
            continue
        depth = len(match.group(1)) // 4
        name, stdlib = match.group(2), match.group(3)
        assert name not in drawn, f"{name} is drawn twice"
        assert depth <= len(parents), f"{name} is indented below no parent"
        del parents[depth:]
        drawn[name] = (parents[-1] if parents else None, stdlib)
        parents.append(name)
    return drawn


def _defined_classes() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__
    }


def _instance(cls: type[BaseException]) -> BaseException:
    if issubclass(cls, OSError):
        return cls(errno.ENOSPC, f"{cls.__name__}: no space left")  # type: ignore[call-arg]
    if cls is errors.WorkerError:
        return errors.WorkerError("KeyError in session worker pid 1: 'x'", "Traceback ...", remote_type="KeyError")
    return cls(f"{cls.__name__} happened")


def test_every_exception_class_of_the_package_is_in_errors_py() -> None:
    found = _exception_classes()
    elsewhere = [
        (file, name)
        for file, name in found
        if Path(file) != ERRORS_FILE.relative_to(ROOT)
        and not (file.startswith(CLI_PRIVATE[0]) and name in CLI_PRIVATE[1])
    ]
    assert elsewhere == [], f"exception classes outside session_core/errors.py: {elsewhere}; define them there"
    in_errors = sorted(name for file, name in found if Path(file) == ERRORS_FILE.relative_to(ROOT))
    assert in_errors == sorted(_defined_classes()) and len(in_errors) >= 24


def test_the_drawn_tree_is_the_class_tree() -> None:
    drawn, defined = _drawn_tree(), _defined_classes()
    assert sorted(drawn) == sorted(defined), "the docstring draws exactly the classes errors.py defines"
    for name, (parent, stdlib) in drawn.items():
        cls = defined[name]
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


def test_old_import_locations_still_name_the_same_classes() -> None:
    from prefect_gliner2 import model_registry
    from prefect_gliner2.runtime import errors as runtime_errors

    for name in runtime_errors.__all__:
        value = getattr(runtime_errors, name)
        if isinstance(value, type):
            assert value is getattr(errors, name), name
    assert model_registry.RegistryError is errors.RegistryError


def test_the_public_api_exports_errors_from_the_tree() -> None:
    import prefect_gliner2
    import prefect_gliner2.session_core as session_core

    for package in (prefect_gliner2, session_core):
        exported = [name for name in package.__all__ if name.endswith(("Error", "Died"))]
        assert "PrefectGliner2Error" in exported and "SessionCoreError" in exported
        for name in exported:
            assert getattr(package, name) is getattr(errors, name), (package.__name__, name)
