# sluicegate: the AMQP 1.0 server, its metrics endpoint and the `sluicegate` CLI.
# python-qpid-proton has no binary wheel here, so the build stage compiles it (C compiler,
# OpenSSL headers for TLS support); the runtime stage gets only the installed packages.
FROM python:3.11-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY session session
COPY writer writer
COPY queues queues
COPY spark spark
COPY wire wire
COPY clients clients
COPY transport transport
COPY cli cli
# sluicegate/ links the folders above into the one namespace (symlinks are copied as links).
COPY sluicegate sluicegate
RUN python -m venv /opt/sluicegate && /opt/sluicegate/bin/pip install --no-cache-dir .

FROM python:3.11-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --create-home --home-dir /var/lib/sluicegate sluicegate
COPY --from=build /opt/sluicegate /opt/sluicegate
ENV PATH=/opt/sluicegate/bin:$PATH \
    SLUICEGATE_LISTEN=0.0.0.0:5672 \
    SLUICEGATE_METRICS_LISTEN=0.0.0.0:15692 \
    SLUICEGATE_DATA_DIR=/var/lib/sluicegate/data
USER sluicegate
WORKDIR /var/lib/sluicegate
VOLUME /var/lib/sluicegate/data
# 5672 amqp://, 5671 amqps:// (when a certificate is configured), 15692 Prometheus.
EXPOSE 5672 5671 15692
STOPSIGNAL SIGTERM
ENTRYPOINT ["sluicegate"]
CMD ["serve"]
