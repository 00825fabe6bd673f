"""``python -m jupyter_gpusched``: the same as the ``jupyter-gpusched`` command."""

import sys

from .cli import main

sys.exit(main())
