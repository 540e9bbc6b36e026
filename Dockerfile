# The Blitz image: the README's own install command (scripts/install.sh), then every model
# in serve_config.yaml prepared with `blitz optimize` into the image's model cache, so a
# replica starts without building anything. The same image serves on its own
# (`docker run`) and as the head and worker image of a KubeRay RayService
# (deploy/kuberay/rayservice.yaml).
#
#   docker build -t blitz:0.1.0 .                       # CPU torch, for CPU nodes
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#       -t blitz:0.1.0-gpu .                            # CUDA torch, for GPU nodes
#   docker run --rm -p 8000:8000 -p 9000:9000 --shm-size=2g \
#       --stop-timeout 150 blitz:0.1.0                 # HTTP, gRPC; a stop drains
#
# scripts/image.sh builds and runs it with podman where no image registry is reachable:
# its base is Debian bookworm made with debootstrap (BASE), and torch comes from a
# directory of wheels mounted into the build (WHEEL_DIR) instead of TORCH_INDEX.

# Any Debian-like image with Python 3.11 and its venv module (ensurepip included): the official
# python image, or a local one (Debian bookworm's own python3 is 3.11; it has no `python`
# command, and none is needed: install.sh calls python3, later steps the venv's python).
ARG BASE=python:3.11-slim
FROM ${BASE}

# Where install.sh finds torch==2.13.0: the CPU wheel index by default (PyPI's Linux wheel
# pulls several GB of CUDA packages); a CUDA index for the GPU workers' image.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# A directory of wheels that pip looks in too (its --find-links), empty by default; for a
# torch wheel already at hand, mounted into the build (`podman build --volume
# /opt/wheels:/wheels:ro --build-arg WHEEL_DIR=/wheels --build-arg TORCH_INDEX=`): the
# mount is not part of the image.
ARG WHEEL_DIR=

# wget: KubeRay's default health probes; procps: `ray stop` uses ps
RUN apt-get update \
 && apt-get install -y --no-install-recommends wget procps \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md serve_config.yaml ./
COPY scripts ./scripts
COPY blitz ./blitz
COPY deployments ./deployments
COPY loadtest ./loadtest
RUN PIP_EXTRA_INDEX_URL="$TORCH_INDEX" PIP_FIND_LINKS="$WHEEL_DIR" bash scripts/install.sh \
 && rm -rf /root/.cache/pip

# Ray's processes and Serve's replicas inherit this environment. KubeRay starts Ray from a
# login shell, whose /etc/profile resets PATH: profile.d puts the venv back.
ENV PATH=/app/.venv/bin:$PATH \
    BLITZ_CACHE_DIR=/app/model-cache \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false
RUN echo 'export PATH=/app/.venv/bin:$PATH' > /etc/profile.d/blitz-venv.sh

# What listens where: in a container the HTTP proxy must listen beyond loopback for `-p
# 8000:8000`, so the image's serve_config.yaml says 0.0.0.0 (on purpose: the container's
# own network namespace; gRPC listens where HTTP does, for `-p 9000:9000`). Ray's own
# ports (GCS, raylet, dashboard agent, metrics) stay on the container's 127.0.0.1
# (scripts/ray_up.py) and are not exposed. Publish on the host's loopback only with
# `-p 127.0.0.1:8000:8000`, or put the port behind a firewall or a load balancer.
# API keys are off unless given: `-e BLITZ_API_KEYS=key1,key2` (auth.api_keys_env) turns
# them on for every route; `auth: {required: true}` under the config's `args` makes a
# start without any key fail instead of serving openly (deploy/kuberay/rayservice.yaml
# does both). Off, the ingress logs a WARNING that every route is public.
RUN sed -i 's/^  host: 127.0.0.1$/  host: 0.0.0.0/' serve_config.yaml

# Not root: everything below runs as `blitz` (uid and gid 10001, fixed so that a volume's
# or a pod's securityContext can name it). /app and the venv stay root's and read-only to
# it; what it writes is its own: the model cache (ONNX builds for another CPU target are
# made there on first load), its home (~/.ray/auth_token, mode 600) and /tmp (Ray's temp
# dir /tmp/ray, HAProxy's /tmp/blitz-haproxy-10001).
RUN groupadd --gid 10001 blitz \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/blitz --shell /bin/bash \
      blitz \
 && install -d -o blitz -g blitz -m 0755 /app/model-cache
USER 10001:10001
ENV HOME=/home/blitz

# Bake every configured model into $BLITZ_CACHE_DIR, as that user: the files are its own
# without a chown (which would copy the whole cache into another layer). ONNX builds are
# keyed by CPU target: a node whose CPU differs from the build machine's builds its own
# copy on first load.
RUN for model in $(blitz models --config serve_config.yaml --json \
        | python -c 'import json, sys; print(*(m["id"] for m in json.load(sys.stdin)))'); do \
      blitz optimize "$model" --config serve_config.yaml --no-speed; \
    done

EXPOSE 8000 9000
# scripts/serve.sh, as on a host (its install.sh skipped: done above), from WORKDIR /app:
# Serve's fast request path (scripts/fast-path.env.sh; HAProxy through
# scripts/haproxy-loopback), then `exec python scripts/lifecycle.py run serve_config.yaml`,
# the container's main process: it starts Ray's head with no driver, deploys (the config's
# `auto` sizes follow the cores and GPUs the container's Ray sees) and waits. On SIGTERM
# (`docker stop`) it drains (the applications deleted: requests in flight finish, new
# ones are refused), shuts Serve down, stops Ray and exits 0: about 10 s, longer while a
# long request runs (the drain waits at most BLITZ_DRAIN_S, 60 s; the whole stop at most
# about 135 s). Give the stop that long: `docker run --stop-timeout 150` or `docker stop
# -t 150` (the default 10 s may end it with SIGKILL, status 137, mid-drain).
# BLITZ_CONSOLE_LOGS=1 keeps `serve run` as the driver, the replicas' logs on the console
# (`docker logs`), with the same drain.
ENV BLITZ_SKIP_INSTALL=1
STOPSIGNAL SIGTERM
CMD ["bash", "scripts/serve.sh"]
