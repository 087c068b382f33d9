"""Every example in README.md and docs/*.md runs (docs/ARCHITECTURE.md, "Documentation").

A page's fenced blocks run in order, in one empty folder, sharing one Python namespace, as
a reader who pastes them one after the other would: the data a page's examples read is made
by its own visible blocks (h5pack.synthetic.make_image_folder), never by hidden set-up.

- ```` ```python ```` blocks are executed;
- ```` ```sh ```` / ```` ```bash ```` / ```` ```console ```` blocks: every ``h5pack ...``
  command (one a line; ``\\`` continues a line; ``;`` and ``&&`` separate commands;
  ``#`` starts a comment) runs through the CLI in this process and must exit 0, or with
  the code a trailing ``# exit N`` comment gives;
- a block whose info string carries ``notest`` and why (```` ```sh notest network: ... ````)
  is shown, not run; the only reasons are a GPU, a cluster or the network (installs, a
  bucket's server). Any other line in a shell block that is not ``notest`` fails the test,
  so nothing is silently left out;
- no fenced block hides inside an HTML comment (``<!-- ... -->``): what runs is what shows.

Other languages (```` ```text ````, ```` ```json ````) are output shown to the reader.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from h5pack.cli.main import cli
from tests.servers import demo_bucket

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages about the code rather than its use: their blocks are sketches, not examples.
NOT_EXAMPLES = {"ARCHITECTURE.md"}
SHELLS = {"sh", "bash", "console", "shell"}
RUN = {"python", *SHELLS}

_FENCE = re.compile(
    r"^(?P<indent> {0,3})```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)
_EXIT = re.compile(r"#\s*exit\s+(\d+)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: str
    line: int  # of the opening fence, 1-based
    language: str
    run: bool
    body: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Return the fenced blocks of ``page``, in order."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        words = match["info"].split()
        language = words[0] if words else ""
        line = text.count("\n", 0, match.start()) + 1
        body = "\n".join(row[len(match["indent"]) :] for row in match["body"].splitlines())
        run = language in RUN and "notest" not in words[1:2]
        found.append(Block(page.name, line, language, run, body))
    return found


def commands(block: Block) -> list[tuple[list[str], int]]:
    """Return the commands of a shell block with the exit code each must give."""
    joined = block.body.replace("\\\n", " ")
    found = []
    for row in joined.splitlines():
        expect = _EXIT.search(row)
        code = int(expect[1]) if expect else 0
        stripped = row.strip().removeprefix("$ ")
        if not stripped or stripped.startswith("#"):
            continue
        words = shlex.split(stripped, comments=True)
        for part in _split(words):
            if part[0] != "h5pack":
                pytest.fail(
                    f"{block}: {' '.join(part)!r} is not an h5pack command; mark the block "
                    "```sh notest if it is not meant to run here"
                )
            found.append((part[1:], code))
    return found


def _split(words: list[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for word in words:
        if word in (";", "&&"):
            parts.append([])
        elif word.endswith(";"):
            parts[-1].append(word[:-1])
            parts.append([])
        else:
            parts[-1].append(word)
    return [part for part in parts if part]


def run_block(block: Block, namespace: dict[str, object]) -> None:
    """Run one block; fail naming the page and line."""
    if block.language == "python":
        code = compile(block.body, str(block), "exec")
        exec(code, namespace)  # the examples are this repository's own text
        return
    for args, code in commands(block):
        result = CliRunner().invoke(cli, args)
        if result.exit_code != code:
            detail = result.output
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                detail += f"\n{type(result.exception).__name__}: {result.exception}"
            pytest.fail(
                f"{block}: h5pack {shlex.join(args)} exited {result.exit_code}, expected "
                f"{code}:\n{detail}"
            )


def _example_pages() -> list[Path]:
    return [page for page in PAGES if page.name not in NOT_EXAMPLES]


@pytest.mark.parametrize("page", _example_pages(), ids=lambda page: page.name)
def test_page_examples_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.chdir(tmp_path)
    if "AWS_ENDPOINT_URL" in page.read_text(encoding="utf-8"):
        # A page about buckets talks to the tests' local S3 server (tests/conftest.py),
        # through the proxy that answers ranged GETs as S3 does, set as its shell would.
        server, proxy = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_proxy")
        settings = server.storage_options(proxy.endpoint)
        server.bucket("demo")  # the page's `mkdir -p s3-data/demo`
        monkeypatch.setenv("AWS_ENDPOINT_URL", settings["endpoint"])
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", settings["access_key_id"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", settings["secret_access_key"])
        monkeypatch.setenv("AWS_REGION", settings["region"])
    if "STORAGE_EMULATOR_HOST" in page.read_text(encoding="utf-8"):
        # and to the tests' GCS and Azure servers, each with the page's "demo" bucket
        gcs = request.getfixturevalue("gcs_server")
        azurite = request.getfixturevalue("azurite_server")
        demo_bucket(gcs, azurite)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string())
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in blocks(page):
        if block.run:
            run_block(block, namespace)


def test_the_runner_sees_every_kind_of_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n```python\nx = 1\n```\n"
        "```sh notest\npip install h5pack\n```\n"
        "<!--\n```sh\nh5pack info out.h5  # exit 1\n```\n-->\n"
        "```text\nout\n```\n"
        "- item\n\n  ```sh\n  h5pack info a.h5 ; h5pack verify \\\n    a.h5\n  ```\n",
        encoding="utf-8",
    )
    found = blocks(page)
    assert [(b.language, b.run, b.line) for b in found] == [
        ("python", True, 2),
        ("sh", False, 5),
        ("sh", True, 9),
        ("text", False, 13),
        ("sh", True, 18),
    ]
    assert commands(found[2]) == [(["info", "out.h5"], 1)]
    assert commands(found[4]) == [(["info", "a.h5"], 0), (["verify", "a.h5"], 0)]


def test_a_stray_shell_line_fails_by_name(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```sh\npip install h5pack\n```\n", encoding="utf-8")
    with pytest.raises(pytest.fail.Exception, match=r"page.md:1: 'pip install h5pack'"):
        commands(blocks(page)[0])


def test_readme_keeps_the_ci_test_command() -> None:
    """.ci/run calls the README's test command; they must not drift apart."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m pytest -q" in readme
    assert "python -m pytest -q" in ci.splitlines()[-1]


def test_readme_links_resolve() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", text):
            assert (page.parent / target).is_file(), f"{page.name} links to missing {target}"


# `pip install h5pack` / 'h5pack[s3]' install an unrelated audio tool (docs/decisions/0100).
_BARE = re.compile(r"(?<![\w./-])h5pack\[|pip install[^\n`#]*?(?<![\w./-])h5pack(?![\w-])")


def test_every_install_line_names_this_project() -> None:
    texts = [*PAGES, *(ROOT / "h5pack").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    texts += [*(ROOT / "notebooks").glob("*.ipynb"), ROOT / "pyproject.toml"]
    bare = [
        f"{path.relative_to(ROOT)}: {match[0]!r}"
        for path in texts
        for match in _BARE.finditer(path.read_text(encoding="utf-8"))
    ]
    assert bare == []


def test_missing_extra_messages_name_the_checkout() -> None:
    from h5pack.bench.report import PLOT_HINT
    from h5pack.core.store import missing_extra
    from h5pack.errors import install_line
    from h5pack.write.dask import INSTALL_HINT

    line = install_line("s3")
    assert line == f"pip install -e '{ROOT}[s3]'"  # this test runs from a checkout
    assert line in str(missing_extra("s3", ImportError("No module named 'boto3'")))
    assert install_line("plot") in PLOT_HINT
    assert install_line("dask") in INSTALL_HINT
    assert _BARE.search("pip install 'h5pack[s3]'")
    assert _BARE.search("pip install h5pack")
    assert not _BARE.search("pip install 'h5pack-images[s3]'")


_SCRIPT = re.compile(r"python scripts/(\w+)\.py([^\n`#]*)")


def test_every_script_command_names_a_driver_and_its_flags() -> None:
    """BENCHMARKS.md's and the docs' commands run the drivers in scripts/ as they are."""
    wrong = []
    for page in [ROOT / "BENCHMARKS.md", *PAGES]:
        for match in _SCRIPT.finditer(page.read_text(encoding="utf-8")):
            script = ROOT / "scripts" / f"{match[1]}.py"
            source = script.read_text(encoding="utf-8") if script.is_file() else ""
            flags = re.findall(r"(?<!\S)(--[\w-]+)", match[2])
            missing = [flag for flag in flags if f'"{flag}"' not in source]
            if not source or missing:
                wrong.append(f"{page.name}: {match[0].strip()} ({missing or 'no such script'})")
    assert wrong == []


_HIDDEN = re.compile(r"<!--(?:(?!-->).)*```(?:(?!-->).)*-->", re.S)
NOTEST_REASONS = ("gpu", "cluster", "network")


@pytest.mark.parametrize("page", _example_pages(), ids=lambda page: page.name)
def test_no_example_is_hidden_or_skipped_without_reason(page: Path) -> None:
    """Set-up a reader cannot see is not allowed; ``notest`` says GPU, cluster or network."""
    text = page.read_text(encoding="utf-8")
    assert not _HIDDEN.search(text), f"{page.name}: a fenced block inside <!-- -->"
    for match in _FENCE.finditer(text):
        words = match["info"].split()
        if "notest" in words:
            line = text.count("\n", 0, match.start()) + 1
            reason = " ".join(words[words.index("notest") + 1 :]).lower()
            assert reason.startswith(NOTEST_REASONS), f"{page.name}:{line}: notest without why"
