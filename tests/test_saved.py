"""Saved results (companion._saved): the format's values, refusals, and atomic writes.

Every learner's result round-trips in tests/test_learner_contract.py
(``check_result_pickles_copies_and_saves``); this file checks the encoding of each kind of value.
"""

from __future__ import annotations

import copy
import json
import math
import pickle

import numpy as np
import pytest
from safetensors.numpy import save_file

import companion
from companion import _saved
from companion.errors import InvalidInputError
from companion.recovery import Recovery


def _rec(**diagnostics):
    return Recovery(W=np.arange(4.0).reshape(2, 2), v=np.array([1.0, -2.0]), n_queries=7, message="m",
                    diagnostics=diagnostics)


def test_every_kind_of_value_round_trips(tmp_path):
    inner = _rec(x=1)
    rec = _rec(nan=float("nan"), inf=float("inf"), ninf=-float("inf"), big=1e308, tiny=5e-324,
               ints=np.arange(3, dtype=np.int32), flags=np.array([True, False]), f32=np.float32(0.1),
               i64=np.int64(-5), empty=np.zeros((0, 3)), tup=(1, "a", None), lst=[1.5, [2, 3]],
               intkeys={1: "one", 2: np.ones(2)}, nested={"deep": {"a": np.eye(2)}}, inner=inner,
               cplx=1 + 2j, carr=np.array([1 + 1j, 2 - 1j]), text="W[:d, :], v", flag=True)
    path = rec.save(tmp_path / "r.safetensors")
    back = companion.load(path)
    d = back.diagnostics
    assert math.isnan(d["nan"]) and d["inf"] == math.inf and d["ninf"] == -math.inf
    assert d["big"] == 1e308 and d["tiny"] == 5e-324
    assert d["ints"].dtype == np.int32 and d["ints"].tolist() == [0, 1, 2]
    assert d["flags"].dtype == bool and d["f32"] == np.float32(0.1) and type(d["f32"]) is np.float32
    assert type(d["i64"]) is np.int64 and d["empty"].shape == (0, 3)
    assert d["tup"] == (1, "a", None) and d["lst"] == [1.5, [2, 3]]
    assert d["intkeys"][1] == "one" and np.array_equal(d["intkeys"][2], np.ones(2))
    assert np.array_equal(d["nested"]["deep"]["a"], np.eye(2))
    assert isinstance(d["inner"], Recovery) and d["inner"].diagnostics["x"] == 1
    assert d["cplx"] == 1 + 2j and np.array_equal(d["carr"], np.array([1 + 1j, 2 - 1j]))
    assert d["text"] == "W[:d, :], v" and d["flag"] is True
    assert back.n_queries == 7 and back.message == "m" and np.array_equal(back.W, rec.W)


def test_pickle_and_deepcopy_keep_a_read_only_diagnostics():
    """Fails before the fix: TypeError: cannot pickle 'mappingproxy' object."""
    rec = _rec(a=np.ones(2), sub=_rec(b=1).diagnostics)
    for again in (pickle.loads(pickle.dumps(rec)), copy.deepcopy(rec)):
        assert np.array_equal(again.diagnostics["a"], np.ones(2)) and again.diagnostics["sub"] == {"b": 1}
        with pytest.raises(TypeError):
            again.diagnostics["a"] = 0


def test_the_file_is_safetensors_with_a_documented_json_header(tmp_path):
    path = _rec(a=np.ones(3)).save(tmp_path / "r.safetensors", parameters={"learner": "x", "d": 2})
    header = _saved.read_header(path)
    assert header["format"] == _saved.FORMAT == "companion.recovery/1"
    assert header["class"] == "companion.recovery:Recovery"
    assert header["fields"]["W"] == {"array": "W"}
    assert header["fields"]["diagnostics"] == {"dict": [["a", {"array": "diagnostics.a"}]]}
    prov = header["provenance"]
    assert set(prov) == {"library_version", "commit", "versions", "created", "parameters"}
    assert prov["parameters"] == {"learner": "x", "d": 2} and prov["library_version"] == companion.__version__


def test_refusals(tmp_path):
    with pytest.raises(InvalidInputError, match="cannot save 'diagnostics.f'"):
        _rec(f=lambda: 0).save(tmp_path / "a.safetensors")
    with pytest.raises(InvalidInputError, match="parameters must be JSON"):
        _rec().save(tmp_path / "b.safetensors", parameters={"x": object()})
    plain = tmp_path / "plain.safetensors"
    save_file({"x": np.ones(2)}, str(plain))
    with pytest.raises(InvalidInputError, match="holds no companion result"):
        companion.load(plain)
    other = tmp_path / "other.safetensors"
    header = {"format": _saved.FORMAT, "class": "os:system", "fields": {}, "provenance": {}}
    save_file({"x": np.ones(1)}, str(other), metadata={"companion": json.dumps(header)})
    with pytest.raises(InvalidInputError, match="only companion's result classes"):
        companion.load(other)
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(InvalidInputError, match="not a safetensors file"):
        companion.load(tmp_path / "junk.safetensors")
    with pytest.raises(FileNotFoundError):
        companion.load(tmp_path / "missing.safetensors")


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path):
    path = _rec(a=1).save(tmp_path / "r.safetensors")
    before = path.read_bytes()
    with pytest.raises(InvalidInputError):
        _rec(f=object()).save(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["r.safetensors"]
