"""The deployment files stay in step with serve_config.yaml and the README.

deploy/kuberay/rayservice.yaml carries serve_config.yaml's applications as its
serveConfigV2, and the Dockerfile runs the README's install command and prepares every
configured model. Neither is built or applied here (no Docker daemon, no Kubernetes):
these tests guard against drift, not against a broken cluster.
"""

from __future__ import annotations

import copy
import importlib.metadata
import re
from pathlib import Path

import yaml

from blitz.settings.config import BlitzSettings

ROOT = Path(__file__).resolve().parents[2]


def serve_config() -> dict:
    return yaml.safe_load((ROOT / "serve_config.yaml").read_text())


def rayservice() -> dict:
    return yaml.safe_load((ROOT / "deploy/kuberay/rayservice.yaml").read_text())


def test_rayservice_serves_serve_config_applications_with_the_gpu_pool_bound():
    manifest = rayservice()
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayService")
    served = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    expected = copy.deepcopy(serve_config()["applications"])
    for app in expected:  # the GPU group starts at zero pods: `auto` would never bind it
        app["args"] = {"gpu": "on", **app["args"]}
        app["args"]["auth"] = {"required": True}  # it listens on 0.0.0.0: keys on
        del app["args"]["ingress"]  # 4-CPU pods: the ingress keeps its default CPU claim
    assert served["applications"] == expected
    for app in served["applications"]:
        BlitzSettings.from_args(app["args"])  # valid settings, not just valid YAML
    assert served["http_options"]["host"] == "0.0.0.0"
    assert (served["http_options"]["request_timeout_s"]
            == serve_config()["http_options"]["request_timeout_s"])


def test_every_shipped_config_turns_on_the_fast_request_path():
    """`serve run serve_config.yaml`, `serve deploy` of it, the image (its CMD) and the
    RayService all start Serve's controller with the fast path's variables, which it passes
    on to HAProxy, the proxies and the replicas (deployments.app warns where they are
    missing); the HAProxy wrapper is named relative to the checkout, the image's WORKDIR."""
    served = yaml.safe_load(rayservice()["spec"]["serveConfigV2"])
    for config in (serve_config(), served):
        env = config["controller_options"]["runtime_env"]["env_vars"]
        assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
        assert env["RAY_SERVE_HAPROXY_BINARY_PATH"] == "scripts/haproxy-loopback"
        assert (ROOT / env["RAY_SERVE_HAPROXY_BINARY_PATH"]).is_file()
        # a silent client is cut, and a replica that never answers too, past
        # Serve's own request timeout
        assert int(env["RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S"]) <= 60
        assert (int(env["RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"])
                > config["http_options"]["request_timeout_s"])
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "WORKDIR /app" in dockerfile and "COPY scripts ./scripts" in dockerfile
    assert 'CMD ["bash", "scripts/serve.sh"]' in dockerfile


def test_rayservice_pods_read_api_keys_from_a_secret():
    cluster = rayservice()["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        (container,) = group["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["BLITZ_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "blitz-api-keys"


def test_rayservice_cluster_matches_the_installed_ray_and_has_a_gpu_group_from_zero():
    cluster = rayservice()["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == importlib.metadata.version("ray")
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    gpu = groups["gpu"]
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1 and gpu["minReplicas"] == 0
    settings = BlitzSettings.from_args(serve_config()["applications"][0]["args"])
    assert gpu["maxReplicas"] >= settings.gpu_pool.max_replicas
    assert groups["cpu"]["minReplicas"] >= 1  # the CPU pool's min_replicas needs a node
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert 8000 in {p["containerPort"] for p in head["ports"]}


def test_dockerfile_runs_the_readme_install_and_bakes_every_configured_model():
    dockerfile = (ROOT / "Dockerfile").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/install.sh" in dockerfile and "bash scripts/install.sh" in readme
    assert re.search(r"blitz models --config serve_config\.yaml --json", dockerfile)
    assert re.search(r'blitz optimize "\$model" --config serve_config\.yaml', dockerfile)
    # it serves as scripts/serve.sh does (its install.sh skipped: done in the build), and
    # SIGTERM reaches lifecycle.py, serve.sh's exec'd main process, which drains first
    assert 'CMD ["bash", "scripts/serve.sh"]' in dockerfile
    assert "ENV BLITZ_SKIP_INSTALL=1" in dockerfile and "STOPSIGNAL SIGTERM" in dockerfile
    serve_sh = (ROOT / "scripts" / "serve.sh").read_text()
    assert 'BLITZ_SKIP_INSTALL:-0}" != "1"' in serve_sh
    assert re.search(r"^exec \S*python scripts/lifecycle\.py run ", serve_sh, flags=re.M)
    # the image opens the proxy beyond loopback by editing this exact line
    edit = re.search(r"sed -i 's/(.+?)/(.+?)/' serve_config\.yaml", dockerfile)
    assert edit is not None
    pattern, replacement = edit.groups()
    edited = re.sub(pattern, replacement,
                    (ROOT / "serve_config.yaml").read_text(), flags=re.M)
    assert yaml.safe_load(edited)["http_options"]["host"] == "0.0.0.0"


def test_every_shipped_config_serves_the_grpc_api_where_http_listens():
    """TEI's gRPC services on port 9000 in serve_config.yaml and the RayService alike: each
    servicer function imports and registers its service, the callback that binds gRPC
    where HTTP listens is set, and a gRPC message is held to an HTTP body's limit."""
    from blitz.grpc_api import rpc_table
    from blitz.settings.config import Limits
    from deployments import bind_addresses

    served = yaml.safe_load(rayservice()["spec"]["serveConfigV2"])
    for config in (serve_config(), served):
        grpc = config["grpc_options"]
        assert grpc["port"] == 9000
        assert grpc["request_timeout_s"] == config["http_options"]["request_timeout_s"]
        assert tuple(grpc["grpc_servicer_functions"]) == rpc_table.SERVICER_FUNCTIONS
        env = config["controller_options"]["runtime_env"]["env_vars"]
        module, _, name = env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"].partition(":")
        assert module == bind_addresses.__name__ and callable(getattr(bind_addresses, name))
        assert int(env["RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"]) == Limits().max_body_bytes
    assert "EXPOSE 8000 9000" in (ROOT / "Dockerfile").read_text()
