"""Project files agree with each other: dependencies, table of contents, chapter conventions."""

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book" / "chapters").glob("*.ipynb"))


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_lists_the_same_packages_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted |= set(extra)
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {p for p in pip if not p.startswith("-e")}
    assert listed == wanted, (f"only in environment.yml: {sorted(listed - wanted)}; "
                              f"only in pyproject.toml: {sorted(wanted - listed)}")


def test_jupyter_book_pinned_to_version_1():
    book = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["book"]
    assert "jupyter-book>=1.0.4.post1,<2" in book


def test_every_chapter_is_in_the_toc_and_every_toc_file_exists():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    for f in files:
        assert any((ROOT / f).with_suffix(s).is_file() for s in (".md", ".ipynb")), f
    for nb in CHAPTERS:
        assert f"book/chapters/{nb.stem}" in files, f"{nb.name} is not in _toc.yml"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_conventions(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    markdown = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    sources = "\n".join("".join(c["source"]) for c in code)
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    assert re.search(r"^seed\s*=", "".join(tagged[0]["source"]), re.M), "the parameters cell sets seed"
    assert re.search(rf'record_parameters\(\s*"{path.stem}"', sources), "record_parameters(stem, ...)"
    assert "Re-run this chapter" in markdown and f"companion run {path.stem}" in markdown
    assert f"papermill book/chapters/{path.stem}.ipynb" in markdown
    assert nb["metadata"].get("companion", {}).get("test_parameters"), "metadata companion.test_parameters"
    assert all(c.get("outputs") is not None for c in code)
    assert any(c.get("outputs") for c in code), "committed without outputs"
    counts = [c["execution_count"] for c in code if c.get("execution_count") is not None]
    assert counts == list(range(1, len(code) + 1)), "executed top to bottom, every cell once"
    assert not any(o.get("output_type") == "error" for c in code for o in c.get("outputs", []))
    text = json.dumps(nb)
    assert str(ROOT) not in text and "/root/" not in text, "a machine path in the outputs"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_glue_key_in_the_prose_is_published(path):
    nb = json.loads(path.read_text())
    markdown = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    used = set(re.findall(r"\{glue(?::\w+)?\}`([^`]+)`", markdown))
    glued = set()
    for c in nb["cells"]:
        for o in c.get("outputs", []):
            key = o.get("metadata", {}).get("scrapbook", {}).get("name")
            if key:
                glued.add(key)
    assert used <= glued, f"cited but never glued: {sorted(used - glued)}"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_papermill_sees_every_parameter(path):
    """papermill's parser silently drops a line it cannot read (e.g. an '=' inside a comment)."""
    from companion.book.cli import chapter_parameters

    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    assigned = re.findall(r"^(\w+)\s*=", "".join(cell["source"]), re.M)
    assert list(chapter_parameters(path.stem)) == assigned
