# gpupool — one image for every service. The command picks the service:
#   docker run gpupool python -m services.<name>.main    (inventory, quota, queue, placement, reclamation,
#                                                         accounting, gateway, agent)
# Configuration is entirely environment variables (GPUPOOL_<SERVICE>_*, see services/<name>/README.md).
# In containers set GPUPOOL_<SERVICE>_HTTP_HOST=0.0.0.0: services bind /metrics, /healthz, /readyz to 127.0.0.1 by
# default.

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, so editing code does not reinstall them: install the project's declared dependencies from
# pyproject.toml alone (a stub package), then the real sources. Only what a service runs: the `local`, `sim`, `test`
# and `dev` extras (embedded servers, plots, test tools) stay out of the image.
COPY pyproject.toml README.md ./
RUN mkdir -p libs services \
 && touch libs/__init__.py services/__init__.py \
 && pip install . \
 && pip uninstall -y gpupool \
 && rm -rf libs services build *.egg-info

COPY libs ./libs
COPY services ./services
RUN pip install --no-deps . \
 && rm -rf build *.egg-info

# Run as an unprivileged user. (The real NVML agent still reads the GPUs: the NVIDIA container runtime injects the
# driver library and device nodes readable by any user.)
RUN groupadd --system --gid 10001 gpupool \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin gpupool
USER 10001:10001

# Documentation only; each service's HTTP port is set by its environment (compose uses 8080 and 9101-9107).
EXPOSE 8080 9100

# Default: the API gateway. Override the command for any other service.
CMD ["python", "-m", "services.gateway.main"]
