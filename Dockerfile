# QForge: one image for every role (api, worker, monitor); the command picks the role.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    LC_ALL=C.UTF-8

WORKDIR /opt/qforge
COPY pyproject.toml README.md ./
COPY app ./app
COPY migrations ./migrations
COPY web ./web
# Editable: migrations/ and web/ are found next to the app package, as in a checkout.
RUN pip install --no-cache-dir -e .

RUN useradd --system --home /opt/qforge qforge
USER qforge

EXPOSE 8090
CMD ["qforge", "api", "--host", "0.0.0.0", "--port", "8090"]
