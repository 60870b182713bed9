"""The public API of ``companion.pretrained``, pinned when the module became a package (issue 34)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import companion.pretrained as pretrained

#: ``sorted(companion.pretrained.__all__)`` on main before the split (commit 71fb1a4).
PINNED = sorted([
    "N_LAYERS", "N_HEADS", "D_MODEL", "D_HEAD", "DATA_FILE", "PACKAGE", "PACKAGE_VERSION", "SAFETENSORS_SHA256",
    "CONTENT_SHA256", "BertHead", "FactorScoredHead", "load_weights", "load_bert_head", "default_readout",
    "load_head", "homogeneous", "bert_attention_vector", "bert_attention_output", "BertAttentionTarget",
    "REFERENCE_FILE", "load_reference", "learn_homogeneous_head", "homogeneous_errors", "layer_counts_probe",
    "content_sha256", "fetch", "main",
])


def test_all_is_the_pinned_list_and_every_name_imports():
    assert sorted(pretrained.__all__) == PINNED and len(PINNED) == 27
    for name in PINNED:
        namespace: dict = {}
        exec(f"from companion.pretrained import {name}", namespace)
        assert namespace[name] is getattr(pretrained, name)
        if callable(namespace[name]):
            assert namespace[name].__module__ == "companion.pretrained", name


def test_the_data_files_are_found_from_the_package():
    assert pretrained.DATA_FILE.name == "minilm_l6_heads.npz" and pretrained.DATA_FILE.exists()
    assert pretrained.REFERENCE_FILE.parent == pretrained.DATA_FILE.parent


def test_the_deprecated_name_still_warns_and_forwards():
    with pytest.warns(DeprecationWarning, match="use companion.pretrained.FactorScoredHead"):
        assert pretrained.FactoredHead is pretrained.FactorScoredHead
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        pretrained.nothing


def test_python_minus_m_runs_the_fetch_command_line():
    out = subprocess.run([sys.executable, "-m", "companion.pretrained", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "fetch" in out.stdout
