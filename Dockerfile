# The same bootstrap as the README's serve command, as an image.
# Build: docker build -t memory-service .   Run: docker run -p 8700:8700 -e MEMORY_API_KEYS=key:team memory-service
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake ninja-build g++ libgomp1 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY memory_service ./memory_service
COPY scripts ./scripts

# portable build: the image may run on another CPU than the one that built it
ENV MEMORY_CACHE_DIR=/cache MEMORY_LLAMA_BUILD=portable MEMORY_DATA_DIR=/data MEMORY_HOST=0.0.0.0 \
    HF_HUB_OFFLINE=1 ANONYMIZED_TELEMETRY=False
# --build-arg BOOTSTRAP_FLAGS=--postgres for MEMORY_DATABASE_URL (the [postgres] extra; without it the start
# installs the driver first, or says which pip install to run)
ARG BOOTSTRAP_FLAGS=""
RUN bash scripts/bootstrap.sh $BOOTSTRAP_FLAGS

VOLUME ["/data"]
EXPOSE 8700
# MEMORY_API_KEYS is required when listening beyond loopback; the service refuses to start without it.
CMD ["bash", "scripts/serve.sh"]
