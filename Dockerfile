# One image for every Phalanx service: `phalanx run <service>` picks which one.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY libs ./libs
COPY services ./services
COPY examples ./examples
RUN pip install --no-cache-dir -e .
ENTRYPOINT ["phalanx"]
