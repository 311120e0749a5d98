# One image for the stack's producer, workers and dashboard (see docker-compose.yml).
FROM python:3.12-slim

WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy PATH=/app/.venv/bin:$PATH

# The locked runtime dependencies (no dev group, no extras), then the package itself.
RUN pip install "uv>=0.5" && useradd --system --uid 10001 kclasync
COPY pyproject.toml uv.lock README.md ./
COPY kclasync ./kclasync
RUN uv sync --locked --no-dev --no-editable && rm -rf /root/.cache
COPY deploy/worker.py deploy/producer.py ./deploy/

USER kclasync
EXPOSE 9100 8765
CMD ["python", "deploy/worker.py"]
