"""``python -m cxlkv``: see :mod:`cxlkv.cli`."""

import sys

from .cli import main

sys.exit(main())
