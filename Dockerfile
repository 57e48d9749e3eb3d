# One image for every Palace service; the command picks the service (python -m services.<name>).
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
RUN pip install . && useradd --uid 10001 palace
USER palace
EXPOSE 8080 9100
CMD ["python", "-m", "services.api"]
