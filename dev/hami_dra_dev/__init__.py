"""hami-dra's development rooms: what a clone runs, never what a cluster runs.

``sandbox`` (an in-memory Kubernetes API server and node simulator, for tests and the demo),
``cluster`` (a real local Kubernetes from upstream binaries, for the real-cluster tests and
benchmarks), ``demo`` (``make demo``) and ``pidfile`` (their ``up``/``down``). They are a package of
their own (``dev/pyproject.toml``, installed by ``make venv``) so that the product (``dra_driver``:
the wheel, ``pip install .``, the image) holds no API-server implementation and no test harness;
``tests/install/test_dev_split.py`` keeps it so. This package imports ``dra_driver``, never the
other way round: ``hami-dra sandbox|cluster|demo`` are found by name (``dra_driver/cli.py``).
"""
