"""Mutation testing with hand-made mutants: does the fast suite catch the bugs a developer could write?

Each mutant is one small, realistic change to the library (a constant halved, a threshold loosened,
a normaliser squared, one query dropped from a count). For each, the script copies the repository
once to a temporary folder, applies the mutant there (the working tree is never touched), runs the
fast tests of the mutated module (``pytest -x -m "not slow"``, the same tests ``make test-fast``
runs, restricted to the relevant files for speed) with a timeout, and records whether a test failed
(killed), none did (survived), or it timed out (counted as killed, listed apart). A mutant whose
original text is no longer in the file (the library moved on) is reported as "n/a" and left out of
the rate.

Run: ``make mutants`` (or ``python benchmarks/mutants.py [--only ID ...] [--timeout S]
[--out FILE] [--file F.toml | --generated] [--shuffle SEED]``; ``make mutants MUTANTS="..."`` passes
the options). Prints a table and writes it, with the kill rate, to ``benchmarks/mutants.md`` (or
``--out``) after every mutant, so a run stopped early keeps what it measured.

Three sources of mutants (one per run):

* the built-in list ``MUTANTS`` below (the default);
* ``--file FILE.toml``: a file of mutants, for a held-out set written by someone who has not seen
  the tests. Each mutant is one ``[[mutant]]`` table::

      [[mutant]]
      id = "h23-ffn-merge-tol"          # unique, shown in the table
      module = "ffn/bias_free"          # src/companion/<module>.py; "numerics/rgn" for a subpackage
      what = "neuron merge tolerance 1e-6 -> 1e-5"
      old = "_merge_neurons(U, c, quality, tol=1e-6)"   # must occur exactly once in the module
      new = "_merge_neurons(U, c, quality, tol=1e-5)"
      # line = 646                      # optional: ``old`` is then looked for on this line only
                                        # (it must occur there exactly once)

  TOML literal strings (``'...'``, ``'''...'''`` for several lines) keep code verbatim. ``module``
  must be a key of ``TESTS`` (the tests run for it); ``--file`` refuses the file otherwise.
* ``--generated``: one mutant ``x10`` and one ``/10`` for every constant of the threshold inventory
  (``inventory()``: float defaults of every signature, upper-case module constants, and threshold
  literals in function bodies of the learner modules; its rules and exclusions are in
  ``inventory``'s docstring). ``--inventory`` prints the inventory, counted per module, and exits.

Every run puts ``tests/test_thresholds.py`` (each threshold just inside and just outside) first.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]

# Tests run for a mutant of each module: its own test file, the verification tests, its doctests,
# and for a learner's module the contract suite (tests/test_learner_contract.py, every learner).
CONTRACT = "tests/test_learner_contract.py"
TESTS = {
    "exact": ["tests/test_exact.py", "tests/test_verify.py", "src/companion/exact.py"],
    "lowrank": ["tests/test_lowrank.py", "tests/test_verify.py", "src/companion/lowrank.py"],
    "oracles": ["tests/test_oracles.py", "tests/test_verify.py", "src/companion/oracles.py"],
    "recovery": ["tests/test_verify.py", "tests/test_exact.py", "src/companion/recovery.py"],
    "book/results": ["tests/test_results.py", "tests/test_verify.py", "src/companion/book/results.py"],
    "book/cli": ["tests/test_cli.py", "tests/test_verify.py", "src/companion/book/cli.py"],
    "robust": ["tests/test_robust.py", "tests/test_verify.py", "src/companion/robust.py"],
    "_learner": ["tests/test_verify.py", "tests/test_exact.py", "src/companion/_learner.py"],
    "numerics/rational": ["tests/test_multihead.py", "tests/test_verify.py", "src/companion/numerics/rational.py"],
    # companion.ffn is a package: a mutant names the module file it changes.
    "ffn/bias_free": ["tests/test_pinned_ffn.py", "tests/test_ffn.py", "tests/test_verify.py",
                      "src/companion/ffn/bias_free.py"],
    "ffn/_kinks": ["tests/test_pinned_ffn.py", "tests/test_ffn.py", "tests/test_verify.py",
                   "src/companion/ffn/_kinks.py"],
    "ffn/deep": ["tests/test_relu_network.py", "tests/test_verify.py", "src/companion/ffn/deep.py"],
    "transformer": ["tests/test_transformer.py", "tests/test_verify.py",
                    "src/companion/transformer.py"],
    # The shared numerics below the learners: the tests of both learners that use them.
    # _redraw_small also builds Theorem 4.1's Gaussian probes (exact.probe_matrix): test_exact.py too.
    "numerics/rop": ["tests/test_robust.py", "tests/test_lowrank.py", "tests/test_verify.py",
                     "tests/test_exact.py", "src/companion/numerics/rop.py"],
    "numerics/rgn": ["tests/test_rgn.py", "tests/test_lowrank.py", "tests/test_robust.py", "tests/test_verify.py",
                     "src/companion/numerics/rgn.py"],
    "membership": ["tests/test_membership.py", "src/companion/membership.py"],
}
# companion.multihead is a package (issue 34): each of its modules runs the multihead tests, its pinned
# constants (tests/test_pinned_multihead.py), the stage tests and the served float32 oracles
# (tests/test_served.py: the canonical learners' rounding rule).
MULTIHEAD = tuple(f"multihead/{m}" for m in ("_common", "_identifiability", "_detection", "_orthogonal", "_canonical",
                                              "_route", "_pairstart", "_moments", "_counts", "_diagnostics"))
for _module in MULTIHEAD:
    TESTS[_module] = ["tests/test_pinned_multihead.py", "tests/test_multihead.py", "tests/test_multihead_stages.py",
                      "tests/test_verify.py", f"src/companion/{_module}.py", "tests/test_served.py"]
TESTS["multihead/_rowstart"] = list(TESTS["numerics/rational"])  # the counts route's row start: the same tests
# companion.pretrained is a package too (issue 34): each module runs the pretrained tests.
PRETRAINED = ("pretrained/_weights", "pretrained/_bert", "pretrained/_learn", "pretrained/_fetch")
for _module in PRETRAINED:
    TESTS[_module] = ["tests/test_pinned_pretrained.py", "tests/test_pretrained.py", f"src/companion/{_module}.py"]
THRESHOLDS = "tests/test_thresholds.py"
for _module, _tests in TESTS.items():
    # A module's pinned formulas and thresholds (tests/test_pinned_<module>.py, "/" -> "_"), when
    # it has them, run second: they are the fastest to fail on a changed constant or formula.
    _pinned = f"tests/test_pinned_{_module.replace('/', '_')}.py"
    if (ROOT / _pinned).exists():
        _tests.insert(0, _pinned)
    _tests.insert(0, THRESHOLDS)
for _module in ("exact", "lowrank", "robust", "_learner", *MULTIHEAD, "ffn/bias_free", "ffn/_kinks", "ffn/deep",
                "transformer", "numerics/rop",
                "numerics/rgn", *PRETRAINED, "membership"):
    TESTS[_module].append(CONTRACT)

# Modules split into a package of the same name (issue 34: ``lowrank/``, ``robust/``, ``transformer/``,
# ``multihead/``) or into private siblings (``oracles`` -> ``_precision``): a mutant of the old module
# is looked for in every file of the package (or the module and its siblings), and "lowrank/_learn"
# names one file of a package (the inventory's line-based mutants) with the package's tests.
SPLIT_SIBLINGS = {"oracles": ("_precision",)}


def module_sources(module: str, root: Path = ROOT) -> list[Path]:
    """The files that hold what was ``src/companion/<module>.py``: itself (and its split-off
    siblings), or every file of the package ``src/companion/<module>/``."""
    base = root / "src" / "companion"
    if (base / f"{module}.py").exists():
        return [base / f"{module}.py"] + [base / f"{s}.py" for s in SPLIT_SIBLINGS.get(module, ())
                                           if (base / f"{s}.py").exists()]
    return sorted((base / module).glob("*.py"))


def tests_for(module: str) -> list[str]:
    """The tests run for a mutant of ``module`` (a key of ``TESTS``, one file of a split package,
    e.g. ``"lowrank/_learn"``, or a split-off sibling such as ``"_precision"``)."""
    if module in TESTS:
        return TESTS[module]
    top = module.split("/")[0]
    if top in TESTS:
        return TESTS[top]
    for owner, siblings in SPLIT_SIBLINGS.items():
        if module in siblings:
            return TESTS[owner]
    raise KeyError(module)


def _doctest_paths(tests: list[str]) -> list[str]:
    """A module's doctests as pytest paths: the package folder for a module that became one, and
    its split-off siblings."""
    out = []
    for t in tests:
        path = ROOT / t
        if t.startswith("src/companion/") and t.endswith(".py") and not path.exists() and path.with_suffix("").is_dir():
            out.append(t[:-3])
            continue
        out.append(t)
        name = Path(t).stem
        if t.startswith("src/companion/") and name in SPLIT_SIBLINGS:
            out += [f"src/companion/{s}.py" for s in SPLIT_SIBLINGS[name]]
    return out


for _module in TESTS:
    TESTS[_module] = _doctest_paths(TESTS[_module])


# (id, module, what the mutant does, original text, mutated text)
MUTANTS = [
    ("exact-saturation", "exact", "saturation band 1e-3 -> 1e-2",
     "SATURATION = 1e-3", "SATURATION = 1e-2"),
    ("exact-blind-shrink", "exact", "blind shrink 1/64 -> 1/4",
     "_BLIND_SHRINK = 1 / 64", "_BLIND_SHRINK = 1 / 4"),
    ("exact-probe-half", "exact", "basis probe rule |v_l| < |v_p|/2 -> /4",
     "small = np.abs(v) < 0.5 * np.abs(v[p])", "small = np.abs(v) < 0.25 * np.abs(v[p])"),
    ("exact-budget-verify", "exact", "budget reserved without the verification queries",
     'reserve(oracle, d + d * d + verify, "learn_single_head")',
     'reserve(oracle, d + d * d, "learn_single_head")'),
    ("exact-scale-square", "exact", "logit divided by c instead of c^2",
     "L = T / C**2", "L = T / C"),
    ("exact-verify-scale", "exact", "verification output scale: max -> sum",
     "lambda x: np.max(np.abs(x @ v)), n,", "lambda x: np.sum(np.abs(x @ v)), n,"),
    ("lowrank-nuclear-default", "lowrank", "nuclear default 5 r(2d-r) -> 3 r(2d-r)",
     'DEFAULT_OVERSAMPLING = {"nuclear": 5.0', 'DEFAULT_OVERSAMPLING = {"nuclear": 3.0'),
    ("lowrank-noise-floor", "lowrank", "sketch noise floor 1e-12 -> 1e-6",
     "_NOISE_FLOOR = 1e-12", "_NOISE_FLOOR = 1e-6"),
    ("lowrank-rgn-threshold", "lowrank", "RGN failure threshold 1e-8 -> 1e-6",
     'if sinfo["residual"] > max(1e3 * tol, 1e-8):', 'if sinfo["residual"] > max(1e3 * tol, 1e-6):'),
    ("lowrank-dof-check", "lowrank", "too-few check m < dof -> m < dof // 2",
     "        if m < dof:\n            k = min(d, r + 1)", "        if m < dof // 2:\n            k = min(d, r + 1)"),
    ("lowrank-spectral-scale", "numerics/rgn", "spectral start normaliser d^2/m -> d/m",
     "np.linalg.svd((d * d / m) * (A.T @ (t[:, None] * B)))",
     "np.linalg.svd((d / m) * (A.T @ (t[:, None] * B)))"),
    ("lowrank-sketch-planned", "lowrank", "sketch's planned count drops the d length-1 queries",
     "planned = d + (min(d, r + oversample)", "planned = (min(d, r + oversample)"),
    ("lowrank-rank-check", "lowrank", "sketch rank check off by one",
     "if k > rank and _numerical_rank(s, rank_tol) > rank:",
     "if k > rank and _numerical_rank(s, rank_tol) > rank + 1:"),
    ("oracles-anti-tau", "oracles", "antisymmetrised tau 2 tau -> tau",
     "return 2.0 * float(getattr(self.oracle, \"tau\", 0.0))",
     "return 1.0 * float(getattr(self.oracle, \"tau\", 0.0))"),
    ("oracles-round-tau", "oracles", "rounding tau 0.5 * 10^(1-k) -> 10^(1-k)",
     "tau = 0.5 * 10.0 ** (1 - self.digits)", "tau = 10.0 ** (1 - self.digits)"),
    ("oracles-float16-tau", "oracles", "float16 tau 2^-12 -> 2^-11",
     'FORMAT_TAU = {"float16": 2.0**-12', 'FORMAT_TAU = {"float16": 2.0**-11'),
    ("oracles-budget-off-by-one", "oracles", "budget check lets one query too many through",
     "        if n > self.remaining:\n            raise BudgetExceededError(\n                MESSAGES[\"budget\"]",
     "        if n > self.remaining + 1:\n            raise BudgetExceededError(\n                MESSAGES[\"budget\"]"),
    ("oracles-anti-remaining", "oracles", "antisymmetrised remaining: // 2 dropped",
     "return left if left == np.inf else left // 2", "return left if left == np.inf else left"),
    ("oracles-worst-sign", "oracles", "worst noise on length 1 pushes away from 0",
     "s = -np.sign(y)", "s = np.sign(y)"),
    ("oracles-round-digits", "oracles", "significant digits off by one",
     "scale = 10.0 ** (digits - 1 - exponent)", "scale = 10.0 ** (digits - exponent)"),
    ("recovery-normaliser", "recovery", "relative error divided by the squared norm",
     "out[name] = err / nrm if nrm > 0 else err", "out[name] = err / nrm**2 if nrm > 0 else err"),
    ("results-dirty", "book/results", "-dirty marker dropped",
     'return out + ("-dirty" if dirty else "")', "return out"),
    ("cli-int-to-float", "book/cli", "int not converted to float for a float parameter",
     "            value = float(value)\n        out[name] = value", "            value = value\n        out[name] = value"),
    ("learner-count", "_learner", "verification queries left out of n_queries",
     "n_queries=int(oracle.n_queries) - int(start),",
     "n_queries=int(oracle.n_queries) - int(start) - int(info.get(\"n_verify_queries\", 0)),"),
    ("learner-default-verify", "_learner", "default verification 32 -> 16 queries",
     "DEFAULT_VERIFY = 32", "DEFAULT_VERIFY = 16"),
    ("learner-rtol-loosened", "_learner", "verification accepts 10 rtol",
     "    if not worst <= rtol:", "    if not worst <= 10 * rtol:"),
    ("learner-noisy-tau", "_learner", "v certificate forgets to subtract tau",
     "- x @ v))) - tau", "- x @ v)))"),
    ("learner-noisy-allowance", "_learner", "allowance relative to ||W|| even above W_max",
     "nW, nv = min(float(np.linalg.norm(W)), float(W_max)),", "nW, nv = float(np.linalg.norm(W)),"),
    ("robust-b", "robust", "probe scale b = 1/W_max -> 1/(2 W_max)",
     "a, b = 0.5, 1.0 / W_max", "a, b = 0.5, 0.5 / W_max"),
    ("robust-tau-clip", "robust", "clip level sigma(-1/2) -> sigma(-1/4)",
     "TAU_CLIP = float(expit(-0.5))", "TAU_CLIP = float(expit(-0.25))"),
    ("robust-constant-80", "robust", "Theorem 6.2's constant 80 -> 40",
     "THEOREM_6_2_CONSTANT = 80.0", "THEOREM_6_2_CONSTANT = 40.0"),
    ("robust-margin", "robust", "margin check mu - tau -> mu - 2 tau",
     "small = (np.abs(v_hat) < mu - tau) | (v_hat == 0)",
     "small = (np.abs(v_hat) < mu - 2 * tau) | (v_hat == 0)"),
    ("robust-window-slack", "robust", "window slack 1.01 tau -> 3 tau",
     "slack = 1.01 * tau * (1.0 + (1.0 + a) / b)", "slack = 3 * tau * (1.0 + (1.0 + a) / b)"),
    ("robust-lstsq-count", "robust", "lstsq pivot count drops the -1",
     "return R * (d + d * d) + R * (int(np.ceil(np.sqrt(d))) - 1) * d",
     "return R * (d + d * d) + R * int(np.ceil(np.sqrt(d))) * d"),
    ("robust-rop-bound-c", "numerics/rop", "ROP bound divided by c instead of c^2",
     "return delta_logit / c**2, d_alpha", "return delta_logit / c, d_alpha"),
    ("robust-noisy-oversampling", "robust", "noisy ROP default 3 r(2d-r) -> 2 r(2d-r)",
     "NOISY_OVERSAMPLING = 3.0", "NOISY_OVERSAMPLING = 2.0"),
    ("robust-posterior", "robust", "posterior bound forgets the sqrt(d)",
     "np.sqrt(d * np.sum(v_hat**-2.0))", "np.sqrt(np.sum(v_hat**-2.0))"),
    ("multihead-band", "multihead/_common", "re-measurement band 0.05 -> 0.01",
     "BAND = 0.05", "BAND = 0.01"),
    ("multihead-verify-rtol", "multihead/_orthogonal", "orthogonal-heads verify_rtol 1e-5 -> 1e-1",
     "verify=DEFAULT_VERIFY, verify_rtol=1e-5,", "verify=DEFAULT_VERIFY, verify_rtol=1e-1,"),
    ("multihead-tol", "multihead/_orthogonal", "Hessian eigenvalue threshold tol 1e-6 -> 1e-2",
     "def learn_orthogonal_heads(oracle, *, step=1e-3, tol=1e-6,",
     "def learn_orthogonal_heads(oracle, *, step=1e-3, tol=1e-2,"),
    ("multihead-verify-scale", "multihead/_common", "verify_model floor 1e-12 -> 1",
     "lambda x: max(1e-12, float(np.max(np.abs(x @ vs.T).sum(axis=1)))), n,",
     "lambda x: max(1.0, float(np.max(np.abs(x @ vs.T).sum(axis=1)))), n,"),
    ("ffn-signs-rtol", "ffn/bias_free", "sign residual tolerance 1e-7 -> 1e-3",
     'def resolve_signs(U, c, b, *, method="auto", time_limit=10.0, rtol=1e-7):',
     'def resolve_signs(U, c, b, *, method="auto", time_limit=10.0, rtol=1e-3):'),
    ("ffn-verify-rtol", "ffn/bias_free", "FFN check 1e-9 -> 1e-3",
     "verify=64, verify_rtol=1e-9, seed=0):", "verify=64, verify_rtol=1e-3, seed=0):"),
    ("transformer-zero-tol", "transformer", "A w_o = 0 test 1e-10 -> 1e-1",
     "zero_tol=1e-10,", "zero_tol=1e-1,"),
    ("transformer-verify-count", "transformer", "FFN checks left out of n_verify_queries",
     '    checked["n_verify_queries"] += int(ffn.diagnostics["n_verify_queries"])\n', ""),
    # Held out: written after the tests above, without writing a test for them.
    ("exact-gaussian-floor", "exact", "Gaussian probe floor 0.1 -> 0.01",
     "floor = 0.1 * np.linalg.norm(v) / np.sqrt(d)", "floor = 0.01 * np.linalg.norm(v) / np.sqrt(d)"),
    ("exact-max-rounds", "exact", "re-measurement rounds 40 -> 4",
     "_MAX_ROUNDS = 40 ", "_MAX_ROUNDS = 4 "),
    ("lowrank-retract", "numerics/rgn", "retraction drops the X step",
     "np.concatenate([V * s + X, V], axis=1)", "np.concatenate([V * s, V], axis=1)"),
    ("lowrank-oversample", "lowrank", "sketch oversample default 1 -> 0",
     'n_measurements=None, oversample=1,', 'n_measurements=None, oversample=0,'),
    ("lowrank-rgn-stall", "numerics/rgn", "RGN stall rule 2-fold -> 1.1-fold progress",
     "rel > 0.5 * history[-6]", "rel > 0.9 * history[-6]"),
    ("oracles-uniform-range", "oracles", "uniform noise in [-1/2, 3/2) instead of [-1, 1)",
     "/ float(2**53) * 2.0 - 1.0", "/ float(2**53) * 2.0 - 0.5"),
    ("robust-eps-v", "robust", "guaranteed eps_v sqrt(d) tau -> d tau",
     "eps_v = np.where(ok, np.sqrt(d) * tau, np.inf)", "eps_v = np.where(ok, d * tau, np.inf)"),
    ("robust-best-scale-cap", "robust", "best_scale cap (1 - a)/||u|| -> 1/||u||",
     "b_max = (1.0 - a) / probe_norm if b_max is None", "b_max = 1.0 / probe_norm if b_max is None"),
    ("robust-rop-scales", "numerics/rop", "ROP scale sqrt(x / (W ||a|| ||b||)) -> x / sqrt(...)",
     "np.sqrt(logit_max / (W_max * na * nb))", "logit_max / np.sqrt(W_max * na * nb)"),
    ("multihead-richardson", "multihead/_orthogonal", "Richardson weights (4, -1)/3 -> (2, -1)",
     "q = (4 * D1 - D2) / 3 * 2", "q = (2 * D1 - D2) * 2"),
    ("multihead-canonical-atol", "multihead/_identifiability", "canonical_form atol 1e-9 -> 1e-3",
     "def canonical_form(model, *, atol=1e-9)", "def canonical_form(model, *, atol=1e-3)"),
    ("transformer-v-mismatch", "transformer", "v_mismatch: max -> mean",
     '"v_mismatch": float(np.max(np.abs(head.v - b))),', '"v_mismatch": float(np.mean(np.abs(head.v - b))),'),
    ("learner-no-length-1", "_learner", "verification queries never of length 1",
     "lengths = rng.integers(1, max_len + 1, size=n)", "lengths = rng.integers(2, max_len + 1, size=n)"),
    # Held out, issue 22: written after tests/test_learner_contract.py, the fit-ratio and nuclear-size
    # tests, without writing a test for any of them first (thresholds of ffn, robust, multihead first).
    ("h22-ffn-merge-tol", "ffn/bias_free", "neuron merge tolerance 1e-6 -> 1e-5",
     "_merge_neurons(U, c, quality, tol=1e-6)", "_merge_neurons(U, c, quality, tol=1e-5)"),
    ("h22-ffn-canonical-tol", "ffn/bias_free", "learn_ffn canonical_form tol 1e-12 -> 1e-11",
     "canonical_form(A_hat, w_hat, tol=1e-12)", "canonical_form(A_hat, w_hat, tol=1e-11)"),
    ("h22-ffn-accept-10x", "ffn/bias_free", "plane accepted at 10 verify_rtol",
     "if rel <= verify_rtol:", "if rel <= 10 * verify_rtol:"),
    ("h22-robust-verify-rtol", "robust", "learn_robust verify_rtol 0.1 -> 1.0",
     "def learn_robust(oracle, *, W_max, mu, verify=DEFAULT_VERIFY, verify_rtol=0.1, seed=0):",
     "def learn_robust(oracle, *, W_max, mu, verify=DEFAULT_VERIFY, verify_rtol=1.0, seed=0):"),
    ("h22-robust-noisy-clip", "robust", "noisy ROP clip window sigma(-x) -> sigma(-x/2)",
     "    lo = float(expit(-logit_max))\n    n_clipped", "    lo = float(expit(-logit_max / 2))\n    n_clipped"),
    ("h22-robust-fit-slack", "robust", "fit-ratio slack 1 + 1e-6 -> 1 + 1e-5",
     "FIT_SLACK = 1.0 + 1e-6", "FIT_SLACK = 1.0 + 1e-5"),
    ("h22-robust-fit-unweighted", "robust", "fit ratio without the weights in the residual",
     "ratio = float(np.sum(w * res**2) / max(", "ratio = float(np.sum(res**2) / max("),
    ("h22-multihead-detect-rtol", "multihead/_detection", "detect_multi_head rtol 1e-6 -> 1e-5",
     "def detect_multi_head(oracle, *, verify=64, rtol=1e-6, seed=0)",
     "def detect_multi_head(oracle, *, verify=64, rtol=1e-5, seed=0)"),
    ("h22-multihead-canonical-tol", "multihead/_canonical", "learn_canonical fit tol 1e-9 -> 1e-8",
     "row_retries=2, tol=1e-9, verify=64, verify_rtol=1e-6,", "row_retries=2, tol=1e-8, verify=64, verify_rtol=1e-6,"),
    ("h22-multihead-canonical-rtol", "multihead/_canonical", "learn_canonical verify_rtol 1e-6 -> 1e-5",
     "row_retries=2, tol=1e-9, verify=64, verify_rtol=1e-6,", "row_retries=2, tol=1e-9, verify=64, verify_rtol=1e-5,"),
    ("h22-multihead-redraw-cond", "multihead/_common", "row redraw accepts cond < 100 d",
     "if np.linalg.cond(Pn) < 10 * d:", "if np.linalg.cond(Pn) < 100 * d:"),
    ("h22-membership-slack", "membership", "label verification slack 2 -> 20",
     "verify_slack=2.0, seed=0):", "verify_slack=20.0, seed=0):"),
    ("h22-learner-noisy-floor", "_learner", "noisy allowance rounding floor 1e-9 -> 1e-8 of the norm",
     "+ 1e-9 * nW + 1e-12", "+ 1e-8 * nW + 1e-12"),
    ("h22-rop-small-av", "numerics/rop", "redraw threshold |a^T v| 1e-3 -> 1e-2",
     "_SMALL_AV = 1e-3 ", "_SMALL_AV = 1e-2 "),
    ("h22-lowrank-bytes", "lowrank", "nuclear bytes per entry 128 -> 12",
     "NUCLEAR_BYTES_PER_ENTRY = 128", "NUCLEAR_BYTES_PER_ENTRY = 12"),
    ("h22-lowrank-rank-tol", "lowrank", "sketch rank_tol 1e-8 -> 1e-7",
     'rank_tol=1e-8, scale="auto", solver_eps=1e-9', 'rank_tol=1e-7, scale="auto", solver_eps=1e-9'),
    ("h22-exact-verify-rtol", "exact", "learn_single_head verify_rtol 1e-6 -> 1e-5",
     'scale="auto", verify=DEFAULT_VERIFY, verify_rtol=1e-6,', 'scale="auto", verify=DEFAULT_VERIFY, verify_rtol=1e-5,'),
    ("h22-homogeneous-verify-rtol", "pretrained/_learn", "learn_homogeneous_head verify_rtol 1e-6 -> 1e-5",
     "scale=1.0, verify=DEFAULT_VERIFY, verify_rtol=1e-6,", "scale=1.0, verify=DEFAULT_VERIFY, verify_rtol=1e-5,"),
    ("h22-transformer-verify-rtol", "transformer", "learn_one_layer verify_rtol 1e-6 -> 1e-5",
     "verify=DEFAULT_VERIFY, verify_rtol=1e-6, seed=0, **ffn_options):",
     "verify=DEFAULT_VERIFY, verify_rtol=1e-5, seed=0, **ffn_options):"),
    ("h22-orthogonal-step", "multihead/_orthogonal", "Hessian probe step 1e-3 -> 1e-2",
     "def learn_orthogonal_heads(oracle, *, step=1e-3", "def learn_orthogonal_heads(oracle, *, step=1e-2"),
]


class Mutant(NamedTuple):
    """One mutant: replace ``old`` by ``new`` in ``src/companion/<module>.py`` (on ``line`` if given)."""

    id: str
    module: str
    what: str
    old: str
    new: str
    line: int | None = None
    col: int | None = None


# The learner modules whose thresholds the inventory covers (issue 22 item 4).
INVENTORY_MODULES = ("exact", "ffn/bias_free", "ffn/_kinks", "ffn/deep", "transformer", "lowrank", "robust", "membership", *MULTIHEAD,
                     *PRETRAINED, "_learner", "numerics/rgn", "numerics/rop", "oracles")
# Functions left out: the rational route (its own engineer, issue 21) and its helpers (the pair start's
# stages were closures of learn_canonical_rational before issue 34).
SKIP_FUNCTIONS = {"multihead/_counts": {"learn_canonical_rational", "check_options", "choose_start"},
                  "multihead/_pairstart": {"fit_start_rows", "make_design", "ask_row_pairs", "pair_fits",
                                           "check_visible", "choose_terms", "label_rows", "label_row", "start_rows",
                                           "start_row", "batch_starts", "_joint_fit", "_repaired_fit",
                                           "_shared_amplitude_fit", "finish_row", "learn_row", "fit_rows",
                                           "link_rows", "learn_pairs"},
                  "multihead/_route": {"ask_pairs", "rational_plan", "follow_up_count"},
                  "multihead/_diagnostics": {"counts_conditioning"}}
# Module constants that are not thresholds: facts of a model file or of IEEE formats (bit widths),
# seeds, paths, the rational route's; and memory-block sizes, which change no result (the tests
# assert that chunked and one-pass products agree), only speed.
SKIP_CONSTANTS = {"pretrained/_weights": {"N_LAYERS", "N_HEADS", "D_MODEL", "D_HEAD", "DATA_FILE"},
                  "oracles": {"PERTURB_SEED", "FORMATS"}, "multihead/_pairstart": {"START_TOL"},
                  "numerics/rgn": {"_CHUNK_BYTES", "_CG_CHUNK_BYTES"}, "numerics/rop": {"_DRAW_CHUNK_BYTES"}}
# Parameters that are not numeric thresholds: wall-clock limits of a solver (a tenfold change only
# moves when a MILP gives up, which no fast test can time honestly), seeds.
SKIP_PARAMETERS = {"seed", "time_limit", "milp_time_limit"}
# Body literals that are arithmetic, not thresholds (halves, doubles, unit, zero).
STRUCTURAL = {0.0, 1.0, 2.0, 0.5, -1.0}


def _literal(node) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value != 0


def _tenfold(text: str, value, up: bool) -> str:
    """``text`` (a literal or an expression) times 10 (``up``) or divided by 10 (an int: floor-divided)."""
    if isinstance(value, float) and "e" in text.lower():  # 1e-6 -> 1e-5: keep the notation
        mant, exp = text.lower().split("e")
        return f"{mant}e{int(exp) + (1 if up else -1)}"
    if isinstance(value, float):
        return repr(value * 10 if up else value / 10)
    if isinstance(value, int):
        return str(value * 10 if up else value // 10)
    return f"({text}) * 10" if up else f"({text}) / 10"


def _const_leaves(node):
    """The sub-expressions of a module constant's value that are its tunable numbers."""
    if isinstance(node, ast.Dict):
        for v in node.values:
            yield from _const_leaves(v)
    elif isinstance(node, ast.Tuple):
        for v in node.elts:
            yield from _const_leaves(v)
    elif isinstance(node, ast.Call):
        for v in node.args:
            yield from _const_leaves(v)
    elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Constant)
          and node.left.value == 1):
        yield from _const_leaves(node.right)  # a slack 1 + eps: the eps is the constant
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _literal(node.operand):
        yield node.operand
    elif _literal(node) or isinstance(node, ast.BinOp):
        yield node


def _segment(lines: list[bytes], node) -> str:
    """The source text of ``node`` (``ast`` offsets count UTF-8 bytes); ``ast.get_source_segment``
    re-splits the whole file on every call."""
    if node.lineno == node.end_lineno:
        return lines[node.lineno - 1][node.col_offset:node.end_col_offset].decode()
    parts = [lines[node.lineno - 1][node.col_offset:], *lines[node.lineno:node.end_lineno - 1],
             lines[node.end_lineno - 1][:node.end_col_offset]]
    return b"".join(parts).decode()


def inventory(root: Path = ROOT):
    """Every tolerance and threshold constant of the learner modules, as ``(module, kind, name, node_text,
    value, line, col)``.

    Rules (the same for every module of ``INVENTORY_MODULES``):

    * ``default``: every non-zero float default of a function or method signature (public or private),
      and every arithmetic default (``rtol=1024 * _EPS``, as a whole), except seeds and wall-clock
      limits (``SKIP_PARAMETERS``). Integer defaults are counts and
      budgets (``verify=64``, ``max_iter=50``), not tolerances, and are left out.
    * ``module``: every upper-case module-level constant with a numeric value; a dict's or tuple's
      entries one by one, a call's arguments (``expit(-0.5)``: the -0.5), the ``eps`` of ``1 + eps``,
      any other arithmetic (``1 / 64``, ``2.0**-12``) as a whole. Facts of a model file and seeds are
      left out (``SKIP_CONSTANTS``).
    * ``body``: every float literal in a function body other than the structural 0, 1, 2, 1/2, -1,
      and every integer literal other than 0, 1, 2 that is an operand of arithmetic inside a comparison
      (``cond < 10 * d``; not ``X.ndim == 3``, a shape).

    The rational route (``SKIP_FUNCTIONS``) belongs to issue 21's engineer and is left out.
    """
    out = []
    files = [(m, f) for m in INVENTORY_MODULES for f in module_sources(m, root)]
    for top, path in files:
        rel = path.relative_to(root / "src" / "companion").with_suffix("").as_posix()
        module = top if rel == top else rel  # "lowrank/_learn", "_precision": one file each
        src = path.read_text()
        tree = ast.parse(src)
        lines = [ln.encode() for ln in src.splitlines(keepends=True)]
        skip_f = SKIP_FUNCTIONS.get(top, set())
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                if name.lstrip("_").isupper() and name not in SKIP_CONSTANTS.get(top, set()):
                    for leaf in _const_leaves(node.value):
                        if any(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in ast.walk(leaf)):
                            continue  # a path, not a number
                        out.append((module, "module", name, _segment(lines, leaf),
                                    leaf.value if isinstance(leaf, ast.Constant) else None,
                                    leaf.lineno, leaf.col_offset))
        skipped_lines = set()
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name in skip_f:
                skipped_lines.update(range(f.lineno, f.end_lineno + 1))
        seen = set()
        for f in ast.walk(tree):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) or f.lineno in skipped_lines:
                continue
            a = f.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults))
            pairs += [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            defaults = set()
            for arg, d in pairs:
                defaults.add(id(d))
                if arg.arg in SKIP_PARAMETERS:
                    continue
                if _literal(d) and isinstance(d.value, float):
                    out.append((module, "default", f"{f.name}({arg.arg}=)", _segment(lines, d),
                                d.value, d.lineno, d.col_offset))
                elif isinstance(d, ast.BinOp):  # rtol=1024 * _EPS: the expression as a whole
                    out.append((module, "default", f"{f.name}({arg.arg}=)", _segment(lines, d),
                                None, d.lineno, d.col_offset))
            in_compare = set()  # integer operands of arithmetic inside a comparison (10 * atol)
            for c in ast.walk(f):
                if isinstance(c, ast.Compare):
                    for b in ast.walk(c):
                        if isinstance(b, ast.BinOp):
                            in_compare.update((id(b.left), id(b.right)))
            for c in ast.walk(f):
                if id(c) in defaults or not _literal(c) or (c.lineno, c.col_offset) in seen:
                    continue
                if c.lineno in skipped_lines:
                    continue
                if isinstance(c.value, float) and c.value in STRUCTURAL:
                    continue
                if isinstance(c.value, int) and (c.value in (1, 2) or id(c) not in in_compare):
                    continue
                seen.add((c.lineno, c.col_offset))
                out.append((module, "body", f"{f.name}:{c.lineno}", _segment(lines, c),
                            c.value, c.lineno, c.col_offset))
    # A nested function is walked from its parent too: keep one entry per position.
    unique = {}
    for row in out:
        unique.setdefault((row[0], row[5], row[6]), row)
    def rank(module):  # the inventory module it came from: itself, its package, or its sibling's owner
        if module in INVENTORY_MODULES:
            return INVENTORY_MODULES.index(module)
        owner = next((o for o, sib in SPLIT_SIBLINGS.items() if module in sib), module.rsplit("/", 1)[0])
        return INVENTORY_MODULES.index(owner)

    return sorted(unique.values(), key=lambda r: (rank(r[0]), r[0], r[5], r[6]))


def generated_mutants(root: Path = ROOT) -> list[Mutant]:
    """One ``x10`` and one ``/10`` mutant per inventory constant, located by line and column."""
    muts = []
    for module, kind, name, text, value, line, col in inventory(root):
        slug = module.replace("numerics/", "")
        for up in (True, False):
            new = _tenfold(text, value, up)
            tag = "x10" if up else "div10"
            muts.append(Mutant(f"g-{slug}-{line}-{col}-{tag}", module,
                               f"{kind} {name} {text} -> {new}", text, new, line, col))
    return muts


def load_file(path: Path) -> list[Mutant]:
    """The mutants of a TOML file (format in the module docstring); refuses unknown modules and ids twice."""
    data = tomllib.loads(Path(path).read_text())
    muts = []
    for i, entry in enumerate(data.get("mutant", [])):
        missing = {"id", "module", "what", "old", "new"} - set(entry)
        if missing:
            raise SystemExit(f"error: {path}: mutant #{i + 1} lacks {sorted(missing)}")
        try:
            tests_for(entry["module"])
        except KeyError:
            raise SystemExit(f"error: {path}: mutant {entry['id']!r} has module={entry['module']!r}; "
                             f"known modules: {sorted(TESTS)}") from None
        muts.append(Mutant(entry["id"], entry["module"], entry["what"], entry["old"], entry["new"],
                           entry.get("line")))
    ids = [m.id for m in muts]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"error: {path}: mutant ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    if not muts:
        raise SystemExit(f"error: {path} holds no [[mutant]] table")
    return muts


def apply_mutant(text: str, m: Mutant) -> str | None:
    """``text`` with the mutant applied, or None if its original text is not where it should be."""
    if m.line is None:
        return text.replace(m.old, m.new) if text.count(m.old) == 1 else None
    lines = text.splitlines(keepends=True)
    if not 1 <= m.line <= len(lines):
        return None
    ln = lines[m.line - 1]
    if m.col is not None:  # a byte offset, as ast gives it
        raw, old = ln.encode(), m.old.encode()
        if raw[m.col:m.col + len(old)] != old:
            return None
        lines[m.line - 1] = (raw[:m.col] + m.new.encode() + raw[m.col + len(old):]).decode()
    else:
        if ln.count(m.old) != 1:
            return None
        lines[m.line - 1] = ln.replace(m.old, m.new)
    return "".join(lines)


def _copy_repo(dest: Path) -> None:
    ignore = shutil.ignore_patterns(".venv", ".git", "_build", "__pycache__", ".pytest_cache",
                                    "*.egg-info", ".jupyter_cache")
    shutil.copytree(ROOT, dest, ignore=ignore, dirs_exist_ok=True)


def run_mutant(copy: Path, mutant: Mutant, timeout: float) -> tuple[str, float, str]:
    module = mutant.module
    files = module_sources(module, copy)
    if mutant.line is None:  # the file of the module (or of its package) that holds ``old``
        counts = [f.read_text().count(mutant.old) for f in files]
        path = files[counts.index(1)] if sum(counts) == 1 else files[0]
    else:
        path = files[0]
    text = path.read_text()
    mutated = apply_mutant(text, mutant)
    if mutated is None:
        found = sum(f.read_text().count(mutant.old) for f in files)
        where = f"on line {mutant.line}" if mutant.line else f"{found} times"
        return "n/a", 0.0, f"original text not found exactly once ({where})"
    path.write_text(mutated)
    env = dict(os.environ, PYTHONPATH=str(copy / "src"), PYTHONDONTWRITEBYTECODE="1",
               COMPANION_RESULTS_DIR=str(copy / "_results"))
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-m", "not slow", "-p", "no:cacheprovider",
           *tests_for(module)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        status = "survived" if proc.returncode == 0 else "killed"
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        detail = lines[0][:110] if lines else proc.stdout.strip().splitlines()[-1][:110]
    except subprocess.TimeoutExpired:
        status, detail = "timeout", f"no result within {timeout:g} s"
    finally:
        path.write_text(text)
    return status, time.perf_counter() - start, detail


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutant ids to run (default: all)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "mutants.md"))
    parser.add_argument("--file", help="a TOML file of mutants (format in the module docstring)")
    parser.add_argument("--generated", action="store_true",
                        help="one x10 and one /10 mutant per constant of the threshold inventory")
    parser.add_argument("--inventory", action="store_true", help="print the threshold inventory and exit")
    parser.add_argument("--shuffle", type=int, metavar="SEED",
                        help="run the mutants in a random order (this seed), so that a run stopped early "
                             "is a random sample of them")
    args = parser.parse_args(argv)
    if args.inventory:
        rows = inventory()
        for r in rows:
            print(f"{r[0]:13s} {r[1]:8s} {r[2]:45s} {r[3]:>14s}  line {r[5]}")
        counts = {}
        for r in rows:
            counts.setdefault(r[0], {"default": 0, "module": 0, "body": 0})[r[1]] += 1
        print(f"\n{'module':13s} default module body total")
        for mod, c in counts.items():
            print(f"{mod:13s} {c['default']:7d} {c['module']:6d} {c['body']:4d} {sum(c.values()):5d}")
        print(f"{'all':13s} {sum(c['default'] for c in counts.values()):7d} "
              f"{sum(c['module'] for c in counts.values()):6d} {sum(c['body'] for c in counts.values()):4d} "
              f"{len(rows):5d}")
        return 0
    if args.file:
        pool = load_file(Path(args.file))
    elif args.generated:
        pool = generated_mutants()
    else:
        pool = [Mutant(*m) for m in MUTANTS]
    chosen = [m for m in pool if not args.only or m.id in args.only]
    if args.shuffle is not None:
        order = random.Random(args.shuffle).sample(range(len(chosen)), len(chosen))
        chosen = [chosen[i] for i in order]
    rows = []
    with tempfile.TemporaryDirectory(prefix="companion-mutants-") as tmp:
        copy = Path(tmp)
        _copy_repo(copy)
        check = subprocess.run([sys.executable, "-c", "import companion; print(companion.__file__)"],
                               cwd=copy, env=dict(os.environ, PYTHONPATH=str(copy / "src")),
                               capture_output=True, text=True)
        if not check.stdout.strip().startswith(str(copy)):
            print(f"error: the copy's library is not the one imported ({check.stdout.strip()})")
            return 2
        for m in chosen:
            status, seconds, detail = run_mutant(copy, m, args.timeout)
            rows.append((m.id, m.what, status, seconds, detail))
            print(f"{status:8s} {seconds:6.1f} s  {m.id:28s} {m.what[:60]:60s} {detail}", flush=True)
            _write_table(rows, len(chosen), args.out)  # after every mutant: a run stopped early keeps its rows
    rate, killed, counted = _write_table(rows, len(chosen), args.out)
    print(f"\n{killed} of {counted} mutants killed ({100 * rate:.0f} %); table in {args.out}")
    return 0


def _write_table(rows, n_chosen, out) -> tuple[float, int, int]:
    """Write the table of ``rows`` (of ``n_chosen`` mutants) to ``out``; return (rate, killed, counted)."""
    counted = [r for r in rows if r[2] != "n/a"]
    killed = sum(r[2] in ("killed", "timeout") for r in counted)
    rate = killed / len(counted) if counted else float("nan")
    lines = ["# Hand-made mutants and the fast suite", "",
             f"Generated by `make mutants` (`benchmarks/mutants.py`). {killed} of {len(counted)} "
             f"mutants killed: **{100 * rate:.0f} %** (timeouts count as killed; n/a mutants, whose "
             "original text is gone, are left out)."
             + (f" Partial: {len(rows)} of {n_chosen} mutants run." if len(rows) < n_chosen else ""), "",
             "| mutant | change | result | seconds | first failing test |", "|---|---|---|---|---|"]
    lines += [f"| `{i}` | {w} | {s} | {t:.0f} | {d.replace('|', '/')} |" for i, w, s, t, d in rows]
    Path(out).write_text("\n".join(lines) + "\n")
    return rate, killed, len(counted)


if __name__ == "__main__":
    sys.exit(main())
