"""The book's machinery: what chapters, the command line and the release use, apart from the science.

- :mod:`companion.book.results`: ``publish`` / ``claim`` (glue + ``data/results/<chapter>.json``
  with provenance), ``record_parameters``;
- :mod:`companion.book.parameters`: the parameters' declared constraints;
- :mod:`companion.book.plotting`: the book's figures;
- :mod:`companion.book.sweeps`: named sweeps saved with provenance (the runner is ``companion._sweep``);
- :mod:`companion.book.prose`: the checker of the chapters' prose;
- :mod:`companion.book.nbcompare`: the reproducibility contract's comparison of outputs;
- :mod:`companion.book.release`: the citable release archive;
- :mod:`companion.book.cli`: the ``companion`` command (run, build, check, ...).

Nothing in the science (``exact``, ``lowrank``, ``multihead``, ...) imports this package
(``tests/test_architecture.py``). The old paths (``companion.results``, ...) still work: they
warn (``DeprecationWarning``) and forward here.

Importing this package registers the writer of named sweeps (:func:`companion.book.sweeps.save_rows`),
which the science's sweep helpers call for ``name=...`` (``exact.sweep``, ``lowrank.phase_transition``).
"""

from . import sweeps as _sweeps  # noqa: F401  (registers the writer of named sweeps)
