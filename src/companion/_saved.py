"""Saved results: a :class:`~companion.recovery.Recovery` written to and read from one safetensors file.

The format (this book's; no pickle, so that loading a file runs no code from it):

* one `safetensors <https://huggingface.co/docs/safetensors>`_ file, whose tensors are every NumPy
  array of the result (its fields and the arrays anywhere in ``diagnostics``), each under a key such
  as ``"W"`` or ``"diagnostics.probes"``, in its own dtype;
* the file's metadata ``{"companion": <JSON>}``, a JSON object with ``format`` (``FORMAT``),
  ``class`` (the result's class, ``"companion.recovery:Recovery"``), ``fields`` (the result's fields,
  encoded as below), and ``provenance``: ``library_version``, ``commit`` (the git commit of the
  library's checkout, ``-dirty`` when ``src`` has uncommitted changes; None outside a checkout),
  ``versions`` (python, numpy, safetensors), ``created`` (UTC, ISO 8601) and ``parameters``
  (whatever the caller passed, e.g. the learner's name and options); and, since 2026-12-05,
  ``checksum``, the SHA-256 of the arrays (names, dtypes, shapes, bytes), which a load checks.

A value is encoded as itself when it is a JSON string, int, bool or None, or a finite float; a list
as a JSON list; anything else as a one-key object: ``{"array": key}`` (a tensor; ``{"scalar": key}``
for a NumPy scalar, a 0-d tensor), ``{"float": "nan" | "inf" | "-inf"}``, ``{"tuple": [...]}``,
``{"dict": [[key, value], ...]}`` (keys encoded too), ``{"complex": [re, im]}`` and
``{"recovery": {"class": ..., "fields": {...}}}`` for a result nested in another's diagnostics.
Reading allows only result classes of the ``companion`` package.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import json
import math
import os
import platform
import subprocess
from dataclasses import fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from ._atomic import write_atomic
from .errors import InvalidInputError

__all__ = ["FORMAT", "save", "load", "plain_state"]

#: The format's name and version, checked on reading.
FORMAT = "companion.recovery/1"
_KIND_KEYS = ("array", "scalar", "float", "tuple", "dict", "complex", "recovery")


def plain_state(value):
    """``value`` with every read-only mapping (``MappingProxyType``) replaced by a dict, recursively."""
    if isinstance(value, (MappingProxyType, dict)):
        return {k: plain_state(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_state(v) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(plain_state(v) for v in value)
    return value


def _class_name(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


class _Encoder:
    def __init__(self):
        self.tensors: dict[str, np.ndarray] = {}

    def _key(self, path: str) -> str:
        key, k = path, 1
        while key in self.tensors:
            key, k = f"{path}#{k}", k + 1
        return key

    def encode(self, value, path: str):
        if value is None or isinstance(value, (str, bool)):
            return value
        if isinstance(value, np.ndarray):
            if value.dtype == object or value.dtype.kind not in "biuf":
                if value.dtype.kind == "c":
                    return {
                        "complex_array": [
                            self.encode(value.real, path + ".real"),
                            self.encode(value.imag, path + ".imag"),
                        ]
                    }
                return {"tuple": [self.encode(v, f"{path}.{i}") for i, v in enumerate(value.tolist())]}
            key = self._key(path)
            self.tensors[key] = np.ascontiguousarray(value)
            return {"array": key}
        if isinstance(value, np.generic):
            if isinstance(value, np.complexfloating):
                return {"complex": [float(value.real), float(value.imag)]}
            key = self._key(path)
            self.tensors[key] = np.ascontiguousarray(np.asarray(value).reshape(1))
            return {"scalar": key}
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value) if math.isfinite(value) else {"float": repr(float(value))}
        if isinstance(value, complex):
            return {"complex": [value.real, value.imag]}
        if isinstance(value, list):
            return [self.encode(v, f"{path}.{i}") for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"tuple": [self.encode(v, f"{path}.{i}") for i, v in enumerate(value)]}
        if isinstance(value, Mapping):
            return {"dict": [[self.encode(k, f"{path}.key"), self.encode(v, f"{path}.{k}")] for k, v in value.items()]}
        if _is_result(type(value)):
            return {"recovery": {"class": _class_name(value), "fields": self.fields(value, path)}}
        raise InvalidInputError(
            f"cannot save {path!r}: a value of type {type(value).__name__} is neither an array, a number, "
            "a string, a list, tuple or dict of them, nor a Recovery."
        )

    def fields(self, rec, path: str) -> dict:
        prefix = f"{path}." if path else ""
        return {f.name: self.encode(getattr(rec, f.name), prefix + f.name) for f in fields(rec)}


def _decode(value, tensors):
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise InvalidInputError(f"not a saved result: the encoded value {str(value)[:80]!r} has several keys.")
    ((kind, body),) = value.items()
    if kind == "array":
        return tensors[body]
    if kind == "scalar":
        return tensors[body].reshape(())[()]
    if kind == "float":
        return float(body)
    if kind == "tuple":
        return tuple(_decode(v, tensors) for v in body)
    if kind == "dict":
        return {_decode(k, tensors): _decode(v, tensors) for k, v in body}
    if kind == "complex":
        return complex(*body)
    if kind == "complex_array":
        return _decode(body[0], tensors) + 1j * _decode(body[1], tensors)
    if kind == "recovery":
        return _build(body["class"], body["fields"], tensors)
    raise InvalidInputError(f"not a saved result: unknown encoded kind {kind!r}.")


def _is_result(cls) -> bool:
    """``cls`` is :class:`companion.recovery.Recovery` or a subclass (read off its MRO: this module
    sits below ``recovery`` in the import graph and cannot import it)."""
    return isinstance(cls, type) and any(
        c.__module__ == "companion.recovery" and c.__qualname__ == "Recovery" for c in cls.__mro__
    )


def _result_class(name: str):
    module, _, qualname = str(name).partition(":")
    if not (module == "companion" or module.startswith("companion.")) or not qualname.isidentifier():
        raise InvalidInputError(f"refusing to load class {name!r}: only companion's result classes are read.")
    cls = getattr(importlib.import_module(module), qualname, None)
    if not _is_result(cls):
        raise InvalidInputError(f"{name!r} is not a result class of companion (a Recovery).")
    return cls


def _build(class_name, encoded_fields, tensors):
    cls = _result_class(class_name)
    values = {name: _decode(v, tensors) for name, v in encoded_fields.items()}
    names = {f.name for f in fields(cls)}
    if set(values) != names:
        raise InvalidInputError(
            f"the saved fields {sorted(values)} do not match {class_name}'s {sorted(names)}; "
            "the file was written by another version of the library."
        )
    return cls(**values)


def _commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        top = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--", "."], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return top + ("-dirty" if dirty else "") if top else None


def _provenance(parameters) -> dict:
    from importlib import metadata

    import safetensors

    try:
        version = metadata.version("companion")
    except metadata.PackageNotFoundError:
        version = None
    return {
        "library_version": version,
        "commit": _commit(),
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "safetensors": safetensors.__version__,
        },
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "parameters": parameters,
    }


def _numpy_scalar(value):
    """A NumPy scalar (``np.int64(5)``, ``np.float32(0.5)``) as the Python number it holds, for ``parameters``: a
    reader passing ``d=np.int64(5)`` got "int64 is not JSON serializable"."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def save(rec, path, *, parameters: Mapping[str, Any] | None = None) -> Path:
    """Write ``rec`` to ``path`` (safetensors plus JSON metadata; the module docstring has the format).

    The file is written atomically: to a temporary file in the same folder, then renamed over
    ``path``, so that a reader never sees a half-written file. A file it replaces keeps its
    permissions, and a symbolic link keeps pointing where it did (the file it points to is
    replaced). A save killed mid-write (``kill -9``) leaves the earlier file whole and, beside it,
    its temporary ``.<name>.<random>.tmp``, which nothing removes.

    Raises
    ------
    InvalidInputError
        If a diagnostic is of a type the format does not hold, ``parameters`` is not JSON, or
        ``path`` is a folder.
    OSError
        If the file cannot be written (a read-only folder, a path through a file): the same
        error class, its message naming ``path``.
    """
    from safetensors.numpy import save as to_bytes

    folder = str(path).endswith(("/", os.sep))  # "runs/": a folder, which Path() would make a file name
    path = Path(path)
    if folder or path.is_dir() or not path.name:
        raise InvalidInputError(
            f"path={str(path)!r} is a folder; give a file path, e.g. {str(path / 'result.safetensors')!r}."
        )
    enc = _Encoder()
    header = {"format": FORMAT, "class": _class_name(rec), "fields": enc.fields(rec, "")}
    header["checksum"] = _checksum(enc.tensors)
    try:
        provenance = json.dumps(_provenance(dict(parameters or {})), allow_nan=False, default=_numpy_scalar)
        header["provenance"] = json.loads(provenance)
        meta = json.dumps(header, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"parameters must be JSON (strings, finite numbers, lists, dicts): {exc}") from None
    data = to_bytes(enc.tensors, metadata={"companion": meta})
    target = Path(os.path.realpath(path))  # through a symbolic link: replace the file it points to
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # a file replaced keeps its permissions
        mode = target.stat().st_mode & 0o7777 if target.exists() else None
        write_atomic(target, data, mode=mode)
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot save to {str(path)!r}: {exc.strerror}") from exc
    return path


def _checksum(tensors) -> str:
    """SHA-256 of the arrays (names, dtypes, shapes and bytes, in name order): a load finds a changed
    bit (an adversarial tester flipped single bits of saved files; 29 of 600 loaded with other values)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def read_header(path) -> dict:
    """The JSON header of a saved result (``format``, ``class``, ``fields``, ``provenance``, and
    ``checksum`` in files written since 2026-12-05)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise InvalidInputError(f"{path} is not a safetensors file: {exc}") from None
    if "companion" not in meta:
        raise InvalidInputError(f"{path} is a safetensors file but holds no companion result (no metadata).")
    try:
        header = json.loads(meta["companion"])
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{path} is corrupted: its companion metadata is not JSON ({exc}).") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise InvalidInputError(f"{path} has format {got!r}; this library reads {FORMAT!r}.")
    kinds = {"class": str, "fields": dict, "provenance": dict}
    bad = [k for k, kind in kinds.items() if not isinstance(header.get(k), kind)]
    if bad:
        raise InvalidInputError(f"{path} is corrupted: its header lacks or mistypes {', '.join(bad)}.")
    return header


def load(path):
    """Read a result written by :meth:`Recovery.save <companion.recovery.Recovery.save>`.

    Parameters
    ----------
    path : str or path-like
        The file.

    Returns
    -------
    Recovery
        Of the class it was saved from, every field and diagnostic equal to the saved ones (arrays
        bit for bit, in their dtype), with ``provenance`` as an attribute (a dict: library version,
        commit, versions, time, parameters).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    InvalidInputError
        If the file is not a saved result of this format, names a class outside ``companion``, or
        is corrupted (a header that does not parse, or arrays that do not match the checksum saved
        with them; files written before the checksum, 2026-12-05, are read without it).

    Examples
    --------
    >>> import tempfile, pathlib, numpy as np
    >>> import companion
    >>> from companion.attention import random_single_head
    >>> from companion.exact import learn_single_head
    >>> from companion.oracles import ValueQueryOracle
    >>> rec = learn_single_head(ValueQueryOracle(random_single_head(3, seed=0)))
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "head.safetensors"
    >>> _ = rec.save(path, parameters={"learner": "learn_single_head"})
    >>> back = companion.load(path)
    >>> np.array_equal(back.W, rec.W), back.n_queries, back.provenance["parameters"]
    (True, 44, {'learner': 'learn_single_head'})
    """
    from safetensors.numpy import load_file

    header = read_header(path)
    tensors = load_file(str(path))
    if "checksum" in header and header["checksum"] != _checksum(tensors):
        raise InvalidInputError(f"{path} is corrupted: its arrays do not match the checksum saved with them.")
    try:
        rec = _build(header["class"], header["fields"], tensors)
    except InvalidInputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, ImportError) as exc:
        raise InvalidInputError(
            f"{path} is corrupted or not a result of this format: {type(exc).__name__}: {exc}"
        ) from None
    object.__setattr__(rec, "provenance", header["provenance"])
    return rec
