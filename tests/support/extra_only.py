"""Run code in an interpreter that sees only what ``pip install 'prefect-gliner2[EXTRA]'`` installs, as in a user's
environment: no package that only the test extra adds (the full ``mlflow`` package's pandas, SQLAlchemy, Flask...).

``site_view(extra, folder)`` links into `folder` the site-packages entries of the distributions that install pulls in
(the closure of the project's requirements with the extra, read from the installed distributions' metadata, markers
evaluated); ``command(folder, module, *args)`` is the command line that runs ``module.main(args)`` in an interpreter
started without the virtual environment's site-packages (``python -S``) and with only `folder` added as a site
directory (its ``.pth`` files processed: the project's editable install). A namespace folder shared with excluded
distributions (``google/``) is linked whole.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import site
import sys
from pathlib import Path

PROJECT = "prefect-gliner2"


def _name(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def installed_closure(project: str, extras: set[str]) -> set[str]:
    """The normalised names of the distributions `project[extras]` pulls in (itself included)."""
    from packaging.requirements import Requirement

    dists: set[str] = set()
    visited: set[tuple[str, frozenset[str]]] = set()
    todo = [(project, frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        if (_name(name), wanted) in visited:
            continue
        visited.add((_name(name), wanted))
        dists.add(_name(name))
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        environments = [{"extra": ""}] + [{"extra": extra} for extra in wanted]
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return dists


def site_view(extra: str, folder: Path) -> set[str]:
    """Link the site-packages entries of what ``PROJECT[extra]`` installs into `folder`; returns the distributions."""
    allowed = installed_closure(PROJECT, {extra})
    folder.mkdir(parents=True, exist_ok=True)
    for dist in importlib.metadata.distributions():
        if _name(dist.metadata["Name"]) not in allowed:
            continue
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(file)).parts[0] for file in dist.files or [] if not str(file).startswith("..")}
        tops.add(Path(str(dist._path)).name)  # type: ignore[attr-defined]  # the dist-info folder
        if _name(dist.metadata["Name"]) == _name(PROJECT):  # the editable install's path hook
            tops |= {entry.name for entry in base.glob("__editable__*prefect_gliner2*")}
        for top in tops:
            link = folder / top
            if (base / top).exists() and not link.exists():
                link.symlink_to(base / top)
    return allowed


def command(folder: Path, module: str, *args: str) -> list[str]:
    """Run ``module.main(args)`` with only `folder` (and the standard library, and PYTHONPATH) importable."""
    return [sys.executable, "-S", "-m", "support.extra_only", str(folder), module, *args]


if __name__ == "__main__":
    site.addsitedir(sys.argv[1])
    importlib.import_module(sys.argv[2]).main(sys.argv[3:])
