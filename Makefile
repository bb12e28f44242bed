# hami-dra developer entry points. Every target creates/refreshes the local virtualenv first,
# so `make demo` and `make test` work on a fresh clone with nothing installed by hand.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

KUBERNETES_VERSION ?=
export KUBERNETES_VERSION

.PHONY: venv tools demo demo-cluster image release mutation test test-lowest test-cluster chaos cluster-build lint typecheck bench bench-cluster bench-scale gpu-check clean

venv: $(STAMP)

# The product (dra_driver, with its test tools) and the development package (dev/: hami_dra_dev, the
# sandbox, the local cluster harness and the demo), both editable; the wheel and the image hold
# only the product.
$(STAMP): pyproject.toml dev/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' -e ./dev
	touch $(STAMP)

demo: $(STAMP)
	bash hack/install.d/openssl.sh
	$(VENV)/bin/hami-dra demo

lint: $(STAMP)
	$(PY) -m ruff check dra_driver dev tests hack
	$(PY) -m ruff format --check dra_driver dev tests hack
	$(PY) -m mypy dra_driver dev/hami_dra_dev
	$(PY) -m mypy --strict hack/gpu_check.py
	$(PY) -m mypy --strict --explicit-package-bases hack/release

tools:
	bash hack/install-test-tools.sh

# On a machine with real NVIDIA GPUs (no network needed, no venv required): NVML discovery, the
# slices, nvidia-smi cross-check, health watcher, claim CDI specs, and with a HAMi-core libvgpu.so
# its memory and cores limits (two processes, a PID namespace, a podman container where one runs).
gpu-check:
	bash hack/gpu-check.sh $(GPU_CHECK_ARGS)

# The upstream Kubernetes components, etcd, containerd, CNI plugins, crictl and the NVIDIA Container
# Toolkit (nvidia-ctk, for the CDI spec tests), built from their Go modules into
# ~/.cache/hami-dra/<component>/v<version>/ (once; a warm run takes a second).
cluster-build: $(STAMP)
	$(VENV)/bin/hami-dra cluster build

test: lint tools cluster-build image
	$(PY) -m pytest -q -m "not bench" -p no:cacheprovider --durations=40
	$(MAKE) test-lowest

# The fast suite (no real cluster, no benchmarks, no production-install test) against the lowest
# versions pyproject.toml allows for every direct dependency: the declared lower bounds are true.
LOWEST := .venv-lowest
test-lowest: $(STAMP)
	$(VENV)/bin/uv venv -q --allow-existing --python $(PY) $(LOWEST)
	$(VENV)/bin/uv pip install -q --python $(LOWEST)/bin/python --resolution lowest-direct -e '.[dev]' -e ./dev
	$(LOWEST)/bin/python -m pytest -q -m "not bench and not cluster" -p no:cacheprovider --ignore=tests/install

# Only the real-cluster suite, on any pinned version: make test-cluster KUBERNETES_VERSION=1.34.4
test-cluster: $(STAMP) tools cluster-build image
	$(PY) -m pytest -q -m cluster -p no:cacheprovider tests/cluster

# The fault suite on the real cluster, longer than the bounded run in `make test`: every fault kind
# HAMI_DRA_CHAOS_ROUNDS times (default 5); prints the table (also in build/fault-report.txt).
# HAMI_DRA_CHAOS_KINDS=mid-gang,mid-preemption runs only the kinds whose names hold those words.
chaos: $(STAMP) tools cluster-build
	HAMI_DRA_CHAOS_ROUNDS=$${HAMI_DRA_CHAOS_ROUNDS:-5} $(PY) -m pytest -q -m cluster -p no:cacheprovider tests/cluster/test_faults.py

# The seed's lab on the real local cluster (the same steps `make demo` runs on the sandbox).
demo-cluster: $(STAMP) tools cluster-build
	$(VENV)/bin/hami-dra cluster lab --up

# Figures, not assertions: engine placements/s, NodePrepareResources latency, controller claims/s,
# sandbox API latencies.
bench: $(STAMP) tools
	$(PY) hack/bench_engine.py
	$(PY) hack/bench_mig.py
	$(PY) hack/bench_simulate.py
	$(PY) hack/bench_prepare.py --callers 1
	$(PY) hack/bench_prepare.py --callers 8
	$(PY) hack/bench_controller.py --nodes 100 --pods 800 --policy binpack
	$(PY) hack/bench_controller.py --nodes 100 --pods 800 --policy mutex,binpack
	$(PY) -m pytest -q -m bench -p no:cacheprovider tests/sandbox/test_bench.py -s

# Figures on the real control plane, side by side with kube-scheduler's own DRA allocator (issue 35):
# the pending storm (in-process controller), then one real cluster with 100 simulated nodes: claims
# from ResourceClaimTemplates (kube-controller-manager's resourceclaim controller in the path), one
# warm-up round dropped and 5 measured rounds of kube-scheduler and ours alternating (a burst of
# 1,000 pods and a steady state of 600 pods at 10/s each), requests per pod by client from the API
# server's audit log, CPU per pod per component; placement quality; prepare latency against
# dra-example-driver. About 1.5 hours on 2 cores: run it on a quiet machine. The report (raw JSON,
# with the commit and the machine) goes to docs/bench/cluster.json, and docs/performance.md's tables
# are generated from it (hack/perf_tables.py); commit both. A run smaller than the defaults writes
# docs/bench/cluster-validation.json. Extra arguments: BENCH_CLUSTER_ARGS, e.g. "--paths
# kube-scheduler,binpack,mutex-binpack --large-nodes 500" or "--only rounds". Not part of `make test`.
BENCH_CLUSTER_ARGS ?=
bench-cluster: $(STAMP) tools cluster-build
	bash hack/cluster/build.sh dra-example-driver
	$(PY) hack/bench_storm.py
	$(PY) hack/bench_cluster.py $(BENCH_CLUSTER_ARGS)
	$(PY) hack/perf_tables.py

# The controller at scale (issue 35): 5,000 nodes x 8 GPUs, 50,000 pods (4,000 ours) served as JSON
# by an in-memory API: initial sync, RSS, decision p99, /metrics scrape time, CPU while foreign pods
# churn. About 5 minutes and 2.5 GiB of memory; report in docs/bench/scale.json, tables regenerated.
BENCH_SCALE_ARGS ?=
bench-scale: $(STAMP)
	$(PY) hack/bench_scale.py $(BENCH_SCALE_ARGS)
	$(PY) hack/perf_tables.py

# The driver's image without Docker: a debootstrapped Debian base, podman build of the Dockerfile,
# an OCI archive in ~/.cache/hami-dra/image/, imported into a running `hami-dra cluster up`.
image:
	bash hack/install.d/podman.sh
	bash hack/image/build.sh

# Versioned release artifacts in dist/<version>/ (hack/release/main.py): the image as an OCI archive,
# the chart (its image.repository stamped <REGISTRY>/hami-dra), the wheel and sdist, the version's
# CHANGELOG section and SHA256SUMS; then pushes <REGISTRY>/hami-dra:<version> and the chart to
# oci://<REGISTRY>/charts. VERSION defaults to pyproject.toml's and must match Chart.yaml, the package
# and CHANGELOG.md (checked first, before the image is built). Log in with `podman login` and
# `helm registry login`; CA_FILE=<ca.crt> for a private CA, PLAIN_HTTP=1 without TLS, PUSH=0 to only
# build. A tag v<version> runs it in CI (.github/workflows/release.yml).
VERSION  ?=
REGISTRY ?= ghcr.io/hami-dra
PUSH     ?= 1
CA_FILE  ?=
PLAIN_HTTP ?= 0
RELEASE_ARGS = --registry $(REGISTRY) $(if $(VERSION),--version $(VERSION)) $(if $(filter 0,$(PUSH)),--no-push) \
	$(if $(CA_FILE),--ca-file $(CA_FILE)) $(if $(filter 1,$(PLAIN_HTTP)),--plain-http)
release: $(STAMP)
	$(PY) -m hack.release --check $(RELEASE_ARGS)
	bash hack/install.d/helm.sh
	bash hack/install.d/podman.sh
	bash hack/image/build.sh
	$(PY) -m hack.release $(RELEASE_ARGS)

# Mutation testing of the engine, the node's checkpoint and prepare path, the controller's pieces
# and the resource views (config: [tool.mutmut] in pyproject.toml: covered lines only, log
# statements left alone, unit tiers only); prints the kill rate per module. Not part of `make test`.
mutation: $(STAMP) tools
	rm -rf mutants
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/mutmut run --max-children 2 > /dev/null || true
	$(PY) hack/mutation_report.py

clean:
	rm -rf $(VENV) $(LOWEST) mutants .pytest_cache .mypy_cache .ruff_cache build *.egg-info dev/*.egg-info
