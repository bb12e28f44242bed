"""``python -m hack.release``: what `make release` runs (see main.py)."""

from hack.release.main import main

raise SystemExit(main())
