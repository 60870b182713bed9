"""make release (companion.book.release): the archive, its checksums and the Zenodo metadata."""

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from companion.book import release
from companion.errors import ParameterError

ROOT = Path(__file__).resolve().parents[1]


def test_committed_zenodo_json_is_derived_from_citation_cff():
    """Zenodo's GitHub integration reads .zenodo.json: it must say what CITATION.cff says."""
    meta = release.zenodo_metadata(ROOT / "CITATION.cff")
    assert json.loads((ROOT / ".zenodo.json").read_text()) == meta, \
        "run 'python -m companion.book.release --zenodo' after editing CITATION.cff"
    import yaml

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert meta["version"] == str(cff["version"]) and meta["title"] == cff["title"]
    assert meta["license"] == "mit" and meta["upload_type"] == "software"
    assert {"identifier": "arXiv:2601.16873", "relation": "isSupplementTo", "scheme": "arxiv",
            "resource_type": "publication-conferencepaper"} in meta["related_identifiers"]


def test_citation_without_a_version_is_refused(tmp_path):
    (tmp_path / "CITATION.cff").write_text("title: x\nauthors: [{name: a}]\nlicense: MIT\n")
    with pytest.raises(ParameterError, match="has no 'version'"):
        release.zenodo_metadata(tmp_path / "CITATION.cff")


def _fake_build(tmp_path):
    build = tmp_path / "_build"
    (build / "html" / "_static").mkdir(parents=True)
    (build / "html" / "index.html").write_text("<html>book</html>")
    (build / "html" / "_static" / "a.css").write_text("p {}")
    (build / "html" / ".buildinfo").write_text("not released")
    (build / "latex").mkdir()
    (build / "latex" / "companion.pdf").write_bytes(b"%PDF-1.5 fake")
    return build


def test_release_archive_holds_every_part_with_checksums(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    build = _fake_build(tmp_path)
    archive = release.write_release(ROOT, build=build, out=tmp_path / "out")
    version = json.loads((ROOT / ".zenodo.json").read_text())["version"]
    assert archive.name == f"companion-{version}.tar.gz"
    with tarfile.open(archive) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}
        assert {m.mtime for m in tar.getmembers()} == {1700000000}
    chapters = sorted(p.name for p in (ROOT / "book" / "chapters").glob("[0-9][0-9]_*.ipynb"))
    results = sorted(p.name for p in (ROOT / "data" / "results").glob("*.json"))
    assert {"html/index.html", "html/_static/a.css", "companion.pdf", "CITATION.cff", ".zenodo.json",
            "SHA256SUMS"} <= set(files)
    assert "html/.buildinfo" not in files
    assert sorted(n.split("/")[-1] for n in files if n.startswith("book/chapters/")) == chapters
    assert sorted(n.split("/")[-1] for n in files if n.startswith("data/results/")) == results
    assert files["book/chapters/" + chapters[0]] == (ROOT / "book" / "chapters" / chapters[0]).read_bytes()
    sums = dict(reversed(line.split("  ", 1)) for line in files["SHA256SUMS"].decode().splitlines())
    assert set(sums) == set(files) - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256(files[name]).hexdigest() == digest, name
    outer = (tmp_path / "out" / f"{archive.name}.sha256").read_text().split()
    assert outer == [hashlib.sha256(archive.read_bytes()).hexdigest(), archive.name]
    again = release.write_release(ROOT, build=build, out=tmp_path / "again")
    assert again.read_bytes() == archive.read_bytes(), "the archive is not reproducible"


def test_release_without_the_pdf_names_make_pdf_and_writes_nothing(tmp_path):
    build = _fake_build(tmp_path)
    (build / "latex" / "companion.pdf").unlink()
    with pytest.raises(ParameterError, match=r"the PDF \(.*companion.pdf is missing: run make pdf\)"):
        release.write_release(ROOT, build=build, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_release_info_names_the_version_and_doi(tmp_path):
    (tmp_path / "CITATION.cff").write_text("title: t\nversion: 1.2.0\nauthors: [{name: a}]\nlicense: MIT\n"
                                           "doi: 10.5281/zenodo.123\n")
    assert release.release_info(tmp_path) == {"version": "1.2.0", "doi": "10.5281/zenodo.123"}
    assert release.release_info(ROOT)["version"] == json.loads((ROOT / ".zenodo.json").read_text())["version"]


def test_cite_names_the_release_and_its_doi(monkeypatch):
    from companion.book import cli

    version = json.loads((ROOT / ".zenodo.json").read_text())["version"]
    line = cli.cite("02", "sweep_worst_W", results_file=ROOT / "data" / "results" / "02_exact_learning.json")
    data = json.loads((ROOT / "data" / "results" / "02_exact_learning.json").read_text())
    if data["versions"]["companion"] == version:
        assert f"companion {version} (release {version}), library" in line
    monkeypatch.setattr(release, "release_info", lambda root=None: {"version": "1.0.0", "doi": "10.5281/zenodo.9"})
    assert cli._release_note("1.0.0") == " (release 1.0.0, doi:10.5281/zenodo.9)"
    assert cli._release_note("1.1.0.dev0") == " (not a release; the last release is 1.0.0, doi:10.5281/zenodo.9)"
