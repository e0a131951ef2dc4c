"""The documents cite code that exists: every dotted `streamfed.…` name imports and resolves, every repository
path exists, every `tests/test_x.py::test_name` is a test of that file, and the bare names that can be
resolved reliably are defined in the code (`ClassName.attribute`, `CamelCaseName`, `snake_name(` and
`test_name`). Section references (`docs/algorithms.md §4.11`, a page's own `§7.2`) point at a heading.

Only backticked spans are read (fenced code blocks are skipped), plus the targets of relative links.
`test_the_check_can_fail` shows on a fake page that each kind of citation is checked.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import math
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "streamfed"
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "edge" / "README.md",
        ROOT / "broker_config" / "README.md"]

_FENCE = re.compile(r"^\s*```.*?^\s*```[^\n]*$", re.M | re.S)
_SPAN = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_DOTTED = re.compile(r"(?<![\w./-])streamfed(?:\.[A-Za-z_]\w*)+")
_TEST_REF = re.compile(r"(?<![\w/.-])(tests/[\w/]+\.py)((?:::\w+)+)")
_CLASS_ATTR = re.compile(r"(?<![\w.])([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)\.([A-Za-z_]\w*)")
_CAMEL = re.compile(r"_?(?=\w*[a-z])(?=[A-Z]\w*[A-Z])[A-Z][A-Za-z0-9]{3,}")  # `RFFBank`, `SeqTracker`
_CALL = re.compile(r"([a-z][a-z0-9]+_[a-z0-9_]*)\(")  # `fit_hyperparameters(`, not the math of `z_p(x)`
_TEST_NAME = re.compile(r"(test_\w+)(?:\[[^\]]*\])?")
# a path token: no placeholder (`<fleet>`, `…`, `+`, `#`, `$share`, `%u`, `{x}`) and no URL
_PLACEHOLDER = re.compile(r"[<>…+#*{}$%|]|://")
_FILE_SUFFIXES = {"md", "py", "toml", "json", "csv", "gz", "yml", "yaml", "sh", "conf", "png", "txt", "state",
                  "service", "acl", "pem", "crt", "key", "html", "cfg", "ini"}


def code_spans(text: str) -> Iterator[str]:
    """The backticked spans of a markdown text, outside fenced code blocks."""
    for m in _SPAN.finditer(_FENCE.sub("", text)):
        yield m.group(1).strip()


def link_targets(text: str) -> Iterator[str]:
    """Relative link targets (`[x](path#anchor)` → `path`), outside fenced code blocks."""
    for m in _LINK.finditer(_FENCE.sub("", text)):
        target = m.group(1).split("#", 1)[0]
        if target and "://" not in target and not target.startswith("mailto:"):
            yield target


# --- what the code defines -------------------------------------------------------------------------------

def _python_files() -> list[Path]:
    return sorted([*PKG.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
                   *(ROOT / "examples").rglob("*.py"), *(ROOT / "edge").rglob("*.py"),
                   *(ROOT / "broker_config").rglob("*.py")])


@functools.cache
def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in _python_files()}


@functools.cache
def classes() -> dict[str, tuple[str, ...]]:
    """Class name → the modules of `streamfed` that define it."""
    found: dict[str, list[str]] = {}
    for path, tree in _trees().items():
        if PKG not in path.parents:
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(module)
    return {k: tuple(v) for k, v in found.items()}


@functools.cache
def identifiers() -> frozenset[str]:
    """Every name the Python code of the repository defines, imports or reads (not comments or strings)."""
    names: set[str] = set()
    for tree in _trees().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[-1])
                names.add(node.name.split(".")[-1])
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
    return frozenset(names)


@functools.cache
def defined_in(path: Path) -> frozenset[str]:
    """The names of the functions and classes a test file defines (at any depth)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return frozenset(n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef
                                                                       | ast.ClassDef))


@functools.cache
def every_test_name() -> frozenset[str]:
    return frozenset().union(*(defined_in(p) for p in sorted((ROOT / "tests").rglob("test_*.py"))))


@functools.cache
def config_words() -> frozenset[str]:
    """The words of the repository's configuration (alert names in Prometheus rules, systemd directives)."""
    words: set[str] = set()
    for folder in (ROOT / "broker_config", ROOT / "edge", ROOT / "scripts"):
        for p in folder.rglob("*"):
            if p.is_file() and p.suffix in (".yml", ".yaml", ".service", ".conf", ".toml", ".json", ".sh", ".acl"):
                words.update(re.findall(r"\w+", p.read_text(encoding="utf-8", errors="replace")))
    return frozenset(words)


def _third_party(name: str) -> bool:
    """A name Python, numpy or math defines (`default_rng(`, `triu_indices(`): not the project's to check."""
    return hasattr(builtins, name) or hasattr(math, name) or hasattr(np, name) or hasattr(np.random, name)


def has_attribute(cls: type, name: str) -> bool:
    """`cls.name` exists: a class attribute or method, a pydantic or dataclass field, an annotation, or an
    attribute an `__init__` or another method of the class or a base assigns to `self`, or a member the
    docstring of a plug-in protocol declares "Optional: `name…`" (`Aggregation.rebase`)."""
    if hasattr(cls, name):
        return True
    for k in cls.__mro__:
        if re.search(rf"Optional: `{name}\b", k.__doc__ or ""):  # an optional member of a plug-in protocol
            return True
        if name in getattr(k, "model_fields", {}) or name in getattr(k, "__dataclass_fields__", {}) \
                or name in getattr(k, "__annotations__", {}) or name in getattr(k, "__slots__", ()):
            return True
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(k)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr == name:
                return True
    return False


def resolve_dotted(name: str) -> str | None:
    """None when `streamfed.a.b.C.d` resolves (the longest importable module, then attributes), else why not."""
    parts = name.split(".")
    module, i = None, len(parts)
    while i > 0:
        try:
            module = importlib.import_module(".".join(parts[:i]))
            break
        except ModuleNotFoundError as e:
            if e.name is not None and not ".".join(parts[:i]).startswith(e.name):
                return None  # the module exists but needs an optional dependency (torch): not ours to judge here
            i -= 1
    if module is None:
        return f"no module {parts[0]}"
    obj: object = module
    for j in range(i, len(parts)):
        attr = parts[j]
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif inspect.ismodule(obj):
            return f"{'.'.join(parts[:j])} has no {attr}"
        elif isinstance(obj, type) and has_attribute(obj, attr) and j == len(parts) - 1:
            return None
        else:
            return f"{'.'.join(parts[:j])} has no attribute {attr}"
    return None


def resolve_class_attribute(cls_name: str, attr: str) -> str | None:
    """None when some `streamfed` class of that name has that attribute; also when no class has the name and
    the code names it nowhere (a third party's class, e.g. `PacketTypes.CONNECT`, is the code's business)."""
    modules = classes().get(cls_name)
    if not modules:
        return None if cls_name in identifiers() else f"no class {cls_name} in streamfed"
    found = [c for c in (_find_class(m, cls_name) for m in modules) if c is not None]
    if not found or any(has_attribute(c, attr) for c in found):
        return None
    return f"{cls_name} ({', '.join(modules)}) has no attribute {attr}"


def _find_class(module: str, cls_name: str) -> type | None:
    try:
        mod = importlib.import_module(module)
    except ImportError:  # an optional dependency (torch) missing: the class cannot be looked at
        return None
    cls = getattr(mod, cls_name, None)
    if isinstance(cls, type):
        return cls
    for value in vars(mod).values():  # a nested class: one level down
        if isinstance(value, type) and isinstance(getattr(value, cls_name, None), type):
            return getattr(value, cls_name)
    return None


# --- paths -------------------------------------------------------------------------------------------------

def _dirs(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")} if folder.is_dir() \
        else set()


def resolve_path(token: str, doc: Path) -> str | None:
    """None when a path token exists (or cannot be resolved reliably: its first folder is none of the
    repository's, of `streamfed/`, of `streamfed/algorithms/` or of the page's own folder), else why not.
    Relative to the page's folder, the repository, `streamfed/` (the docs write `fleet/agent.py`) or
    `streamfed/algorithms/` (`urk/robust_proposals.py`): it exists if it exists in any of those that has its first
    folder."""
    token = token.rstrip(".:,;")
    if token.startswith(("/", "~", ".")) or _PLACEHOLDER.search(token) or token.startswith("streamfed/v1"):
        return None
    first = token.split("/", 1)[0]
    bases = [b for b in (doc.parent, ROOT, PKG, PKG / "algorithms") if first in _dirs(b)]
    if not bases:
        return None
    if any((b / token).exists() for b in bases):
        return None
    return f"no file {token}"


def path_tokens(span: str) -> Iterator[str]:
    for token in re.split(r"[\s,;()\[\]'\"=`]+", span):
        token = token.split("::", 1)[0]
        if "/" in token:
            yield token


# --- one page ----------------------------------------------------------------------------------------------

def problems(doc: Path, text: str | None = None) -> list[str]:
    """What `doc` cites that the code does not have: one line per citation."""
    text = doc.read_text(encoding="utf-8") if text is None else text
    out: list[str] = []
    seen: set[tuple[str, str]] = set()

    def report(what: str, why: str | None) -> None:
        if why is not None and (what, why) not in seen:
            seen.add((what, why))
            out.append(f"{doc.name}: `{what}`: {why}")

    for target in link_targets(text):
        if not _PLACEHOLDER.search(target) and not (doc.parent / target).exists():
            report(target, "link to a file that does not exist")
    for span in code_spans(text):
        for m in _DOTTED.finditer(span):
            report(m.group(0), resolve_dotted(m.group(0)))
        for m in _TEST_REF.finditer(span):
            path = ROOT / m.group(1)
            if not path.is_file():
                report(m.group(0), f"no file {m.group(1)}")
                continue
            for name in m.group(2).split("::")[1:]:
                if name not in defined_in(path):
                    report(m.group(0), f"{m.group(1)} defines no {name}")
        for token in path_tokens(span):
            report(token, resolve_path(token, doc))
        for m in _CLASS_ATTR.finditer(span):
            if m.group(2) not in _FILE_SUFFIXES:
                report(m.group(0), resolve_class_attribute(m.group(1), m.group(2)))
        if _CAMEL.fullmatch(span) and span not in identifiers() and span not in config_words():
            report(span, "the code defines no such name")
        m = _CALL.match(span)
        if m and m.group(1) not in identifiers() and not _third_party(m.group(1)):
            report(m.group(0), "the code defines no such function")
        m = _TEST_NAME.fullmatch(span)
        if m and m.group(1) not in every_test_name():
            report(span, "no test of that name in tests/")
    return out


_PAGES = list(DOCS)


@pytest.mark.parametrize("doc", _PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_name_a_page_cites_exists(doc: Path) -> None:
    found = problems(doc)
    assert not found, "\n".join(found)


def test_the_check_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "fake.md"
    page.write_text(
        "Real: `streamfed.wire.message.encode`, `streamfed.fleet.config.FleetConfig.update_kind`, "
        "`tests/test_docs.py::test_the_check_can_fail`, `streamfed/wire/topics.py`, `fleet/agent.py`, "
        "`FleetConfig.standardise`, `SeqTracker`, `share_allowance(h, T, cap, floor)`, `default_rng([seed, c])`, "
        "`test_the_check_can_fail`, `streamfed/v1/<fleet>/updates/<client>`, `min(1, τ/‖row‖)`.\n\n"
        "Gone: `streamfed.fleet.protocol.encode`, `streamfed.wire.message.no_such_thing`, "
        "`tests/test_docs.py::test_not_there`, `streamfed/privacy/learner.py`, `evaluation/loadtest.py`, "
        "`FleetConfig.fedbnr_bias`, `NoSuchClassAnywhere`, `build_algorithm(cfg)`, `test_never_written`, "
        "[a link](nowhere.md).\n\n```python\nfrom streamfed.not_checked_in_fences import x\n```\n")
    found = problems(page)
    assert len(found) == 10, "\n".join(found)
    for cited in ("streamfed.fleet.protocol.encode", "streamfed.wire.message.no_such_thing",
                  "tests/test_docs.py::test_not_there", "streamfed/privacy/learner.py", "evaluation/loadtest.py",
                  "FleetConfig.fedbnr_bias", "NoSuchClassAnywhere", "build_algorithm(", "test_never_written",
                  "nowhere.md"):
        assert any(f"`{cited}`" in line for line in found), (cited, found)


# --- anchors ------------------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation and symbols dropped (`§`, `` ` ``, `–`), spaces to
    hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} (.+)$", _FENCE.sub("", text), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def anchor_problems(doc: Path, text: str) -> list[str]:
    out = []
    for m in re.finditer(r"\]\(([^)\s#]*)#([^)\s]+)\)", _FENCE.sub("", text)):
        target = doc if not m.group(1) else doc.parent / m.group(1)
        if "://" in m.group(1) or not target.is_file():
            continue
        if m.group(2) not in anchors(target.read_text(encoding="utf-8")):
            out.append(f"{doc.name}: #{m.group(2)}: no such heading in {target.name}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_to_a_heading_find_it(doc: Path) -> None:
    found = anchor_problems(doc, doc.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def test_the_anchor_check_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "fake.md"
    page.write_text("## §1 Conventions — `x`\n\n[ok](#1-conventions--x) [gone](#2-nothing)\n")
    assert anchor_problems(page, page.read_text()) == ["fake.md: #2-nothing: no such heading in fake.md"]


# --- section references --------------------------------------------------------------------------------------

_HEADING = re.compile(r"^#{2,4}\s+(?:§)?(\d+(?:\.\d+)*)\.?\s+(.*)$", re.M)
_NUM = r"§\s?\d+(?:\.\d+)*"
_CITED = re.compile(rf"(?<![\w/])(?:docs/)?(\w+)\.md[\"”`)]*,?\s+(?:({_NUM}(?:(?:,|;| and| or)\s+{_NUM})*)"
                    r"|§ ([A-Z][\w -]*\w))")
_OWN = re.compile(r"(?<![\w.§])§(\d+(?:\.\d+)*)")


@functools.cache
def headings(page: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """A page's numbered headings (`3`, `3.1`) and all its heading titles."""
    text = (ROOT / "docs" / f"{page}.md").read_text(encoding="utf-8")
    numbers = frozenset(m.group(1) for m in _HEADING.finditer(text))
    titles = tuple(line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#"))
    return numbers, titles


def _about_a_paper(text: str, at: int) -> bool:
    """`§` at `at` numbers a paper's or the thesis's section (`the paper's §4.2`, `thesis §3.1`)."""
    return re.search(r"(paper|paper's|thesis|thesis's|ALGORITHMS\.md|ALGORITHMS)\W{0,3}$", text[max(0, at - 24):at]) \
        is not None


def section_problems(path: Path, text: str) -> list[str]:
    out = []
    name = path.relative_to(ROOT) if ROOT in path.parents else path.name
    text = _FENCE.sub("", text)
    cited_elsewhere = set()
    for m in _CITED.finditer(text):
        page, number, title = m.groups()
        if not (ROOT / "docs" / f"{page}.md").is_file():
            continue
        numbers, titles = headings(page)
        for n in re.finditer(r"§\s?(\d+(?:\.\d+)*)", number or ""):
            cited_elsewhere.add(m.start(2) + n.start(1))
            if n.group(1) not in numbers:
                out.append(f"{name}: {m.group(0)!r}: no §{n.group(1)} there")
        title = " ".join((title or "").split()[:2])  # `§ Lost state)`, `§ Bounded influence;`: two words
        if title and not any(title.lower() in t.lower() for t in titles):
            out.append(f"{name}: {m.group(0)!r}: no such heading")
    if path.parent == ROOT / "docs" and path.stem in ("algorithms", "reliability"):
        numbers, _ = headings(path.stem)
        for m in _OWN.finditer(text):
            if m.start(1) not in cited_elsewhere and m.group(1) not in numbers \
                    and not _about_a_paper(text, m.start()):
                line = text[text.rfind("\n", 0, m.start()) + 1:text.find("\n", m.start())]
                out.append(f"{name}: §{m.group(1)} ({line.strip()[:60]}…): no such section")
    return out


def _citing_files() -> list[Path]:
    # not benchmarks/ nor docs/benchmarks.md: another change regenerates them
    files = [*PKG.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "examples").rglob("*.py"),
             *(ROOT / "edge").rglob("*"), *(ROOT / "broker_config").rglob("*.md"), ROOT / "README.md",
             *(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks.md")]
    return sorted(p for p in files if p.is_file() and p.suffix in (".py", ".md") and p != Path(__file__))


def test_section_references_point_at_headings() -> None:
    found = [line for p in _citing_files() for line in section_problems(p, p.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def test_the_section_check_can_fail(tmp_path: Path) -> None:
    text = ("docs/algorithms.md §99.1 and docs/reliability.md § No Such Heading; docs/algorithms.md §1, §2.1, "
            "[`docs/reliability.md`](docs/reliability.md) §7 and docs/reliability.md § Lost state are fine, "
            "docs/algorithms.md §3.9, §98 is not")
    found = section_problems(tmp_path / "fake.md", text)
    assert len(found) == 3 and "§99.1" in found[0] and "No Such Heading" in found[1] and "§98" in found[2], found
