"""A citable release of the book: one archive with its checksums and its Zenodo metadata.

``make release`` (``python -m companion.book.release``) writes ``release/companion-<version>.tar.gz``
holding, under ``companion-<version>/``:

- ``html/``: the built book (``_build/html``, from ``make book``);
- ``companion.pdf``: the whole book as one PDF (``_build/latex/companion.pdf``, from ``make pdf``);
- ``data/results/``: every published number with its parameters, seed, library hash and commit;
- ``book/chapters/``: the executed notebooks those numbers describe;
- ``CITATION.cff`` and ``.zenodo.json`` (the Zenodo record, derived from ``CITATION.cff`` by
  :func:`zenodo_metadata`);
- ``SHA256SUMS``: the SHA-256 of every other file of the archive, in ``sha256sum -c`` format.

Next to the archive, ``companion-<version>.tar.gz.sha256`` checks the archive itself. The archive
is reproducible: entries sorted, owner 0, modification time that of the release commit
(``SOURCE_DATE_EPOCH`` if set), gzip without a time stamp.

Zenodo (https://zenodo.org) mints a DOI for a GitHub release through its GitHub integration,
which reads ``.zenodo.json`` at the repository's root; the README says how. After minting, add
the DOI to ``CITATION.cff`` (``doi:``) and ``companion cite`` names it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

from ..errors import ParameterError

__all__ = ["zenodo_metadata", "release_info", "write_release", "main"]

#: SPDX identifiers as Zenodo spells them (lower case)
_LICENSES = {"MIT": "mit", "BSD-3-Clause": "bsd-3-clause", "Apache-2.0": "apache-2.0", "CC-BY-4.0": "cc-by-4.0"}


def _read_cff(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ParameterError(f"cannot read {path}: {exc.strerror}; the release is described by CITATION.cff") from None
    for key in ("title", "version", "authors", "license"):
        if not data or key not in data:
            raise ParameterError(f"{path} has no {key!r}: a release needs title, version, authors and license")
    return data


def _person(author: dict) -> dict:
    if "family-names" in author:
        name = f"{author['family-names']}, {author.get('given-names', '')}".rstrip(", ")
    else:
        name = author["name"]
    out = {"name": name}
    if author.get("affiliation"):
        out["affiliation"] = author["affiliation"]
    if author.get("orcid"):
        out["orcid"] = str(author["orcid"]).rsplit("/", 1)[-1]
    return out


def zenodo_metadata(citation="CITATION.cff") -> dict:
    """The Zenodo deposition metadata (``.zenodo.json``) of the companion, from ``CITATION.cff``.

    Title, version, publication date, license, creators and keywords are copied; the paper of
    ``preferred-citation`` becomes a related identifier (this software ``isSupplementTo`` it).

    Raises
    ------
    ParameterError
        If ``citation`` cannot be read or lacks title, version, authors or license.

    Examples
    --------
    >>> meta = zenodo_metadata(Path(__file__).parents[3] / "CITATION.cff")
    >>> meta["upload_type"], meta["related_identifiers"][0]["identifier"]
    ('software', 'arXiv:2601.16873')
    """
    cff = _read_cff(Path(citation))
    meta = {
        "title": cff["title"],
        "version": str(cff["version"]),
        "upload_type": "software",
        "description": cff.get("abstract") or cff.get("message") or cff["title"],
        "creators": [_person(a) for a in cff["authors"]],
        "license": _LICENSES.get(cff["license"], str(cff["license"]).lower()),
        "access_right": "open",
    }
    if cff.get("date-released"):
        meta["publication_date"] = str(cff["date-released"])
    if cff.get("keywords"):
        meta["keywords"] = list(cff["keywords"])
    paper = cff.get("preferred-citation") or {}
    related = []
    for ident in paper.get("identifiers", []):
        value = str(ident.get("value", ""))
        if value.lower().startswith("arxiv:"):
            related.append(
                {
                    "identifier": value,
                    "relation": "isSupplementTo",
                    "scheme": "arxiv",
                    "resource_type": "publication-conferencepaper",
                }
            )
        elif ident.get("type") == "doi":
            related.append(
                {
                    "identifier": value,
                    "relation": "isSupplementTo",
                    "scheme": "doi",
                    "resource_type": "publication-conferencepaper",
                }
            )
    if paper.get("doi"):
        related.append(
            {
                "identifier": str(paper["doi"]),
                "relation": "isSupplementTo",
                "scheme": "doi",
                "resource_type": "publication-conferencepaper",
            }
        )
    if related:
        meta["related_identifiers"] = related
    return meta


def release_info(root=None) -> dict:
    """``{"version": ..., "doi": ... or None}`` of the companion's release, from ``CITATION.cff``.

    Returns ``{}`` when the repository (or its ``CITATION.cff``) cannot be found.
    """
    from .results import repo_root

    root = Path(root) if root is not None else repo_root()
    if root is None or not (root / "CITATION.cff").is_file():
        return {}
    cff = _read_cff(root / "CITATION.cff")
    return {"version": str(cff["version"]), "doi": cff.get("doi")}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _source_date(root: Path) -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    proc = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"], capture_output=True, text=True)
    return int(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else 0


def _members(root: Path, build: Path) -> list[tuple[str, Path]]:
    """(path in the archive, file on disk) of every file of the release, sorted; checks each part."""
    html, pdf = build / "html", build / "latex" / "companion.pdf"
    missing = [
        (what, where, how)
        for what, where, how in [
            ("the built HTML", html / "index.html", "make book"),
            ("the PDF", pdf, "make pdf"),
            ("the published numbers", root / "data" / "results", "make execute NB=..."),
        ]
        if not where.exists()
    ]
    if missing:
        raise ParameterError("the release needs " + "; ".join(f"{w} ({p} is missing: run {h})" for w, p, h in missing))
    files = [
        (f"html/{p.relative_to(html).as_posix()}", p)
        for p in html.rglob("*")
        if p.is_file() and ".doctrees" not in p.parts and p.name != ".buildinfo"
    ]
    files.append(("companion.pdf", pdf))
    files += [(f"data/results/{p.name}", p) for p in (root / "data" / "results").glob("*.json")]
    files += [(f"book/chapters/{p.name}", p) for p in (root / "book" / "chapters").glob("[0-9][0-9]_*.ipynb")]
    files.append(("CITATION.cff", root / "CITATION.cff"))
    return sorted(files)


def write_release(root=None, *, build=None, out=None) -> Path:
    """Write the release archive and its checksum file; returns the archive's path.

    Parameters
    ----------
    root : path-like, optional
        The repository (default: found from the current folder).
    build : path-like, optional
        The build folder holding ``html/`` and ``latex/companion.pdf`` (default ``root/_build``).
    out : path-like, optional
        Folder of the archive (default ``root/release``).

    Raises
    ------
    ParameterError
        If the HTML, the PDF or ``data/results`` is missing (the message names the command that
        makes it), or if the committed ``.zenodo.json`` is not the one ``CITATION.cff`` gives.
    """
    from .results import repo_root

    root = Path(root) if root is not None else repo_root()
    if root is None:
        raise ParameterError("cannot find the repository (a folder with _toc.yml); run from inside it")
    build = Path(build) if build is not None else root / "_build"
    out = Path(out) if out is not None else root / "release"
    meta = zenodo_metadata(root / "CITATION.cff")
    zenodo = json.dumps(meta, indent=2, ensure_ascii=False) + "\n"
    committed = root / ".zenodo.json"
    if not committed.is_file() or json.loads(committed.read_text(encoding="utf-8")) != meta:
        raise ParameterError(
            f"{committed} is missing or not derived from CITATION.cff: run "
            "'python -m companion.book.release --zenodo' and commit it"
        )
    name = f"companion-{meta['version']}"
    entries = [(arc, path.read_bytes()) for arc, path in _members(root, build)]
    entries.append((".zenodo.json", zenodo.encode()))
    entries.sort()
    sums = "".join(f"{_sha256(data)}  {arc}\n" for arc, data in entries)
    entries.append(("SHA256SUMS", sums.encode()))
    mtime = _source_date(root)
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"{name}.tar.gz"
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, filename="") as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for arc, data in entries:
            info = tarfile.TarInfo(f"{name}/{arc}")
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    tmp = archive.with_suffix(".gz.tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, archive)  # atomic: no half-written archive
    (out / f"{archive.name}.sha256").write_text(f"{_sha256(buffer.getvalue())}  {archive.name}\n")
    return archive


def main(argv=None) -> int:
    """``python -m companion.book.release [--zenodo]``: write the archive, or (``--zenodo``) ``.zenodo.json``."""
    import argparse
    import sys

    from .results import repo_root

    parser = argparse.ArgumentParser(prog="python -m companion.book.release", description=__doc__.split("\n\n")[0])
    parser.add_argument("--zenodo", action="store_true", help="(re)write .zenodo.json from CITATION.cff and stop")
    args = parser.parse_args(argv)
    try:
        root = repo_root()
        if root is None:
            raise ParameterError("cannot find the repository (a folder with _toc.yml); run from inside it")
        if args.zenodo:
            text = json.dumps(zenodo_metadata(root / "CITATION.cff"), indent=2, ensure_ascii=False) + "\n"
            (root / ".zenodo.json").write_text(text, encoding="utf-8")
            print(f"wrote {root / '.zenodo.json'}")
            return 0
        archive = write_release(root)
    except ParameterError as exc:
        print(f"release: error: {exc}", file=sys.stderr)
        return 2
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    print(f"release: {archive} ({len(names)} files, {archive.stat().st_size / 1e6:.1f} MB)")
    print(f"checksums: {archive}.sha256 and {names[0].split('/')[0]}/SHA256SUMS inside")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
