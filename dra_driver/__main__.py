"""``python -m dra_driver``: the same entry point as the ``hami-dra`` console script."""

import sys

from dra_driver.cli import main

sys.exit(main())
