"""``python -m companion.pretrained fetch``: regenerate ``data/minilm_l6_heads.npz`` (see :func:`fetch`)."""

import sys

from ._fetch import main

sys.exit(main())
