# QForge: one image for every role (api, worker, monitor); the command picks the role.
#
# Stage 1 builds the wheel from the source (the same wheel `pip install qforge` gets);
# stage 2 installs it, so the image runs exactly what users install, not a checkout.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Everything pyproject.toml builds from (tests/test_compose.py checks this list).
COPY pyproject.toml README.md LICENSE ./
COPY app ./app
COPY migrations ./migrations
COPY web ./web
COPY tools ./tools
RUN pip install build && python -m build --wheel --outdir /dist .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LC_ALL=C.UTF-8
COPY --from=build /dist/*.whl /tmp/
RUN pip install /tmp/qforge-*.whl && rm /tmp/qforge-*.whl

# A numeric user, so orchestrators that require a non-root UID can check it.
RUN useradd --system --uid 10001 --home-dir /var/lib/qforge --create-home qforge
WORKDIR /var/lib/qforge
USER 10001

EXPOSE 8090
CMD ["qforge", "api", "--host", "0.0.0.0", "--port", "8090"]
