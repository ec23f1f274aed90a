# One image for every sessionstream process: processor, sink, worker, and the one-shot
# `db migrate` / `topics create`. Built by docker-compose.yml (`docker compose build`).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
# dependencies first, so code changes do not reinstall them
COPY pyproject.toml README.md ./
RUN mkdir -p sessionstream && touch sessionstream/__init__.py \
    && pip install . && pip uninstall -y sessionstream
COPY sessionstream ./sessionstream
RUN pip install --no-deps . && useradd --system --uid 10001 sessionstream
USER sessionstream
ENTRYPOINT ["sessionstream"]
CMD ["--help"]
