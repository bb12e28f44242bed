# Image for every hami-dra component (kubelet plugin, controller, webhook): one entry point,
# the subcommand picks the component. Built by hack/e2e-kind.sh (docker) and by `make image`
# (hack/image/build.sh: podman, from a locally debootstrapped Debian base); the Helm chart runs it.
# Only the production distribution is installed: no test tools, no sandbox extra, no development
# package (dev/: sandbox, cluster harness, demo; .dockerignore keeps it out of the context).
ARG BASE=python:3.11-slim
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# pip trusts the system CA bundle (a build behind an intercepting proxy mounts its own over it).
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt

WORKDIR /src
COPY pyproject.toml README.md ./
COPY dra_driver ./dra_driver
# A virtualenv, so the same step works on python:3.11-slim and on Debian's python3 (PEP 668).
RUN python3 -m venv /opt/hami-dra && /opt/hami-dra/bin/pip install . && rm -rf /src
ENV PATH=/opt/hami-dra/bin:$PATH

WORKDIR /
# The kubelet plugin runs as root (it writes into the kubelet's plugin and CDI host directories);
# the chart runs the controller and the webhook as UID 65532 with a read-only root filesystem.
ENTRYPOINT ["hami-dra"]
CMD ["--help"]
