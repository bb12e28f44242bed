# Image for every hami-dra component (kubelet plugin, controller, webhook): one entry point,
# the subcommand picks the component. Built by hack/e2e-kind.sh; the Helm chart runs it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY dra_driver ./dra_driver
RUN pip install . && rm -rf /src

WORKDIR /
# The kubelet plugin runs as root (it writes into the kubelet's plugin and CDI host directories);
# the chart runs the controller and the webhook as UID 65532 with a read-only root filesystem.
ENTRYPOINT ["hami-dra"]
CMD ["--help"]
