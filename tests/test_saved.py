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


# --- an adversarial tester's findings (session 44): corrupted files, paths, permissions --------------


def _learned_and_saved(tmp_path, name="r.safetensors"):
    from companion.attention import random_single_head
    from companion.exact import learn_single_head
    from companion.oracles import ValueQueryOracle

    rec = learn_single_head(ValueQueryOracle(random_single_head(3, seed=0)))
    return rec, rec.save(tmp_path / name)


def test_a_flipped_bit_in_the_arrays_is_refused_by_the_checksum(tmp_path):
    rec, path = _learned_and_saved(tmp_path)
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x10  # the last bytes are array data
    path.write_bytes(bytes(raw))
    with pytest.raises(InvalidInputError, match="do not match the checksum"):
        companion.load(path)


@pytest.mark.parametrize(
    "meta, match", [("[1, 2]", "has format"), ('"text"', "has format"), ("{not json", "metadata is not JSON")]
)
def test_malformed_metadata_is_an_invalid_input_error(tmp_path, meta, match):
    path = tmp_path / "m.safetensors"
    save_file({"W": np.eye(2)}, str(path), metadata={"companion": meta})
    with pytest.raises(InvalidInputError, match=match):
        companion.load(path)


def test_a_header_missing_its_fields_or_a_tensor_is_an_invalid_input_error(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"W": np.eye(2)}, str(path), metadata={"companion": json.dumps({"format": _saved.FORMAT})})
    with pytest.raises(InvalidInputError, match="lacks or mistypes class, fields, provenance"):
        companion.load(path)
    header = {"format": _saved.FORMAT, "class": "companion.recovery:Recovery", "provenance": {},
              "fields": {"W": {"array": "missing"}}}
    save_file({"W": np.eye(2)}, str(path), metadata={"companion": json.dumps(header)})
    with pytest.raises(InvalidInputError, match="corrupted or not a result of this format"):
        companion.load(path)


def test_a_replaced_file_keeps_its_permissions_and_a_symlink_stays_a_link(tmp_path):
    import os

    rec, path = _learned_and_saved(tmp_path)
    os.chmod(path, 0o600)
    rec.save(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    link = tmp_path / "link.safetensors"
    link.symlink_to(path)
    rec.save(link)
    assert link.is_symlink() and np.array_equal(companion.load(link).W, rec.W)


def test_save_refuses_a_folder_and_names_the_user_path_when_it_cannot_write(tmp_path):
    rec, path = _learned_and_saved(tmp_path)
    for folder in (str(tmp_path) + "/", "", tmp_path):
        with pytest.raises(InvalidInputError, match="is a folder; give a file path"):
            rec.save(folder)
    with pytest.raises(OSError, match=r"cannot save to '.*r\.safetensors/x\.st'"):
        rec.save(path / "x.st")  # a path through a file
    long = tmp_path / ("x" * 240 + ".st")  # a legal name whose temporary name must not be longer
    assert rec.save(long) == long and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["r.safetensors", long.name]
    )


def test_numpy_scalars_in_parameters_are_saved_as_numbers(tmp_path):
    """A reader passed parameters={"d": np.int64(5)} and got "int64 is not JSON serializable"; other objects are still
    refused."""
    import numpy as np

    from companion import exact, load
    from companion.attention import random_single_head
    from companion.errors import InvalidInputError
    from companion.oracles import ValueQueryOracle

    rec = exact.learn_single_head(ValueQueryOracle(random_single_head(3, seed=0)))
    path = rec.save(tmp_path / "r.safetensors", parameters={"d": np.int64(3), "tau": np.float32(0.5)})
    params = load(path).provenance["parameters"]
    assert params["d"] == 3 and type(params["d"]) is int and params["tau"] == 0.5
    with pytest.raises(InvalidInputError, match="parameters must be JSON"):
        rec.save(tmp_path / "s.safetensors", parameters={"x": object()})
