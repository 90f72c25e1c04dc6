"""The documentation's commands and Python snippets run as tests (Sybil): README.md, docs/**/*.md, deployments/.

Sybil parses each page. A ``python`` block runs in the page's one namespace; a ``bash`` block runs in
``bash -euo pipefail``; a block whose info string names a file (```` ```yaml title="config.yaml" ````) is written to
that file; all in order, in a fresh working directory per page, against the suite's Prefect server. A block that
cannot run here follows ``<!-- skip: next "why" -->`` (a GPU, a cloud bucket, a long run, a server or worker of its
own), or ``"tested in tests/test_x.py::test_y"`` when a test elsewhere runs the same call. Sybil runs more than
Python (pytest-markdown-docs runs Python fences only), which is why it was chosen: the commands are most of the docs.

The checks after the snippets hold every page to those rules without running anything: every fence names a
language, and only ``python`` and ``bash`` fences hold code; every skip says why; every test a skip names exists;
every ``prefect-gliner2`` command, run or skipped, parses with the real CLI parser; every ``make`` target,
``python -m`` module and repository script a command names exists.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sybil import Document, Example, Region, Sybil
from sybil.evaluators.skip import Skipper
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "deployments" / "README.md"]
BIN = Path(sys.executable).parent  # the venv's console scripts: prefect-gliner2, prefect
CODE = {"python", "bash"}  # fences that hold code: each runs, or follows a skip that says why
OTHER = {"text", "json", "yaml"}  # outputs, records, files
TITLED = re.compile(r'(?P<language>\w+) title="(?P<title>[^"]+)"$\n', re.MULTILINE)
SKIP = re.compile(r"^[ \t]*<!--\s*skip:\s*(?P<action>\w+)(?P<reason>[^\n]*?)\s*-->", re.MULTILINE)
TESTED_IN = re.compile(r"tested in (?P<file>tests/[\w/]+\.py)(?:::(?P<test>\w+))?")
SAME_AS = re.compile(r"the same (commands?|code) as (?P<page>[\w/.-]+\.md), where (it runs|they run)")
FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$", re.MULTILINE)

_CONTEXT: dict[str, str] = {}  # the Prefect API URL the bash blocks use, set by the test before each block


class FileBlockParser:
    """A fenced block titled with a file name: the file's content, written to the working directory when reached."""

    def __init__(self) -> None:
        self.lexer = RawFencedCodeBlockLexer(info_pattern=TITLED, mapping={"title": "title", "source": "source"})

    def __call__(self, document: Document) -> Iterator[Region]:
        for region in self.lexer(document):
            region.parsed = (region.lexemes["title"], region.lexemes["source"])
            region.evaluator = write_file
            yield region


def write_file(example: Example) -> None:
    name, text = example.parsed
    path = Path.cwd() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(text), encoding="utf-8")


def run_bash(example: Example) -> str | None:
    """Run the block in bash in the page's working directory; a non-zero exit fails with the block's output."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", PREFECT_API_URL=_CONTEXT["api_url"])
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", str(example.parsed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        return f"exit status {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    return None


SYBIL = Sybil(
    parsers=[SkipParser(), PythonCodeBlockParser(), CodeBlockParser("bash", evaluator=run_bash), FileBlockParser()]
)


@dataclass
class Step:
    """One test: a code block, with the skip directives before it."""

    page: str
    line: int
    examples: list[Example] = field(default_factory=list)


def _steps() -> list[Step]:
    steps: list[Step] = []
    for path in PAGES:
        page = str(path.relative_to(ROOT))
        pending: list[Example] = []
        for example in SYBIL.parse(path):
            pending.append(example)
            if not isinstance(example.region.evaluator, Skipper):
                steps.append(Step(page, example.line, pending))
                pending = []
        assert not pending, f"{page}: a skip directive with no block after it"
    return steps


STEPS = _steps()


@pytest.fixture(scope="module")
def workdirs() -> dict[str, Path]:
    """Each page's working directory, made when its first block runs."""
    return {}


@pytest.mark.parametrize("step", STEPS, ids=[f"{s.page}:{s.line}" for s in STEPS])
def test_snippet(
    step: Step, workdirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> None:
    """Each block of a page, in order, in the page's working directory (its namespace is the page's)."""
    if step.page not in workdirs:
        workdirs[step.page] = tmp_path_factory.mktemp(re.sub(r"\W", "-", step.page))
    *skips, block = step.examples
    cwd = os.getcwd()
    os.chdir(workdirs[step.page])
    try:
        for skip in skips:
            skip.evaluate()
        if not skips and block.region.evaluator is not write_file:  # code that runs: the suite's Prefect server
            _CONTEXT["api_url"] = request.getfixturevalue("prefect_server")
        block.evaluate()
    finally:
        os.chdir(cwd)


# ---- the rules every page keeps, checked without running anything ----------------------------------------------


def _blocks(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, info string, text) of every fenced block of a page."""
    text = path.read_text(encoding="utf-8")
    opening: re.Match[str] | None = None
    for match in FENCE.finditer(text):
        if opening is None:
            opening = match
        elif match["fence"][0] == opening["fence"][0] and len(match["fence"]) >= len(opening["fence"]):
            if not match["info"].strip():
                body = text[opening.end() + 1 : match.start()]
                yield text.count("\n", 0, opening.start()) + 1, opening["info"].strip(), body
                opening = None
    assert opening is None, f"{path}: an unclosed fence"


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_every_fence_names_a_language_and_only_python_and_bash_hold_code() -> None:
    wrong = [
        f"{_where(path, line)}: ```{info}"
        for path in PAGES
        for line, info, _ in _blocks(path)
        if info.split(" ", 1)[0] not in CODE | OTHER or (" " in info and not TITLED.match(info + "\n"))
    ]
    assert not wrong, "fences must be python or bash (run), text/json/yaml, or a titled file:\n" + "\n".join(wrong)


def test_every_skip_says_why_and_names_real_tests() -> None:
    """A skip names why; a test it names exists; a block skipped as "the same command as PAGE" is run there."""
    problems = []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        blocks = list(_blocks(path))
        for match in SKIP.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            where = _where(path, line)
            reason = match["reason"].strip()
            if match["action"] != "next" or not re.fullmatch(r'"[^"]{10,}"', reason):
                problems.append(f'{where}: use <!-- skip: next "why it cannot run here" -->, not {match[0]}')
            for tested in TESTED_IN.finditer(reason):
                test_file = ROOT / tested["file"]
                if not test_file.is_file():
                    problems.append(f"{where}: no {tested['file']}")
                elif tested["test"] and f"def {tested['test']}(" not in test_file.read_text(encoding="utf-8"):
                    problems.append(f"{where}: no test {tested['test']} in {tested['file']}")
            same = SAME_AS.search(reason)
            if same:
                info, skipped = next((info, body) for start, info, body in blocks if start > line)
                if info == "python":  # the same code: the whole block runs there
                    if skipped not in _run_blocks(ROOT / same["page"], "python"):
                        problems.append(f"{where}: {same['page']} runs no python block equal to this one")
                    continue
                ran = {tuple(c) for body in _run_blocks(ROOT / same["page"], "bash") for c in _commands(body)}
                missing = [shlex.join(c) for c in _commands(skipped) if tuple(c) not in ran]
                problems += [f"{where}: {same['page']} runs no {command}" for command in missing]
    assert not problems, "\n".join(problems)


def _run_blocks(path: Path, language: str) -> list[str]:
    """The text of a page's blocks in `language` that run (no skip before them)."""
    text = path.read_text(encoding="utf-8")
    starts = [line for line, _, _ in _blocks(path)]
    skips = [text.count("\n", 0, match.start()) + 1 for match in SKIP.finditer(text)]
    skipped = {min((start for start in starts if start > skip), default=0) for skip in skips}
    return [body for line, info, body in _blocks(path) if info == language and line not in skipped]


def _commands(script: str) -> Iterator[list[str]]:
    """The simple commands of a bash block: continuations joined, comments dropped, split at ; && || | and lines."""
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        command: list[str] = []
        for token in lexer:
            if set(token) <= set(";&|"):
                if command:
                    yield command
                command = []
            else:
                command.append(token)
        if command:
            yield command


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))


def test_every_documented_command_exists_and_parses() -> None:
    """Run or skipped, a command's program, subcommand and flags are real: a renamed flag fails here."""
    from prefect_gliner2.flows.cli import _parser

    parser = _parser()
    targets = _make_targets()
    problems = []
    for path in PAGES:
        for line, info, body in _blocks(path):
            if info != "bash":
                continue
            for argv in _commands(body):
                while argv and re.fullmatch(r"\w+=.*", argv[0]):  # VAR=value command
                    argv = argv[1:]
                if not argv:
                    continue
                program, where = Path(argv[0]).name, _where(path, line)
                if program == "prefect-gliner2":
                    try:
                        parser.parse_args(argv[1:])
                    except SystemExit:
                        problems.append(f"{where}: {shlex.join(argv)} does not parse")
                elif program == "make" and not set(argv[1:]) <= targets:  # make TARGET...
                    problems.append(f"{where}: {shlex.join(argv)}: no such Makefile target")
                elif program in {"python", "python3"} and argv[1:2] == ["-m"]:
                    if importlib.util.find_spec(argv[2]) is None:
                        problems.append(f"{where}: no module {argv[2]}")
                for arg in argv[1:]:
                    if re.fullmatch(r"(bench|tests|deployments|docs)/[\w/.-]+\.(py|sh|yaml)", arg):
                        if not (ROOT / arg).is_file():
                            problems.append(f"{where}: no file {arg}")
    assert not problems, "\n".join(problems)


REPO_PATH = re.compile(
    r"`((?:prefect_gliner2|session_core|training|runtime|tasks|flows|model_registry|deployments|bench|tests|docs)"
    r"/[\w/.-]*)`"
)


def test_every_repository_path_a_page_names_exists() -> None:
    """A module, script or test a page names in backticks is in the repository: a move leaves no stale path."""
    missing = []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        for match in REPO_PATH.finditer(text):
            name = match[1].split("::")[0]
            if not (ROOT / name).exists():
                missing.append(f"{_where(path, text.count(chr(10), 0, match.start()) + 1)}: no {name}")
    assert not missing, "\n".join(missing)
