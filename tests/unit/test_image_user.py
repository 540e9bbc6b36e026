"""The image runs as a non-root user (issue 54, item 7): a fixed uid whose writable places
are the model cache, its home and /tmp; the model bake runs as that user (its files its
own, no chown layer); the RayService's pods run as the same uid; and the Dockerfile says
what listens where and how API keys are turned on. Nothing is built here (no Docker
daemon): scripts/image.sh builds and runs it with podman where that is installed."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
UID = 10001


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's (INSTRUCTION, arguments), continuation lines joined, comments out."""
    text = re.sub(r"^\s*#.*\n", "", (ROOT / "Dockerfile").read_text(), flags=re.M)
    text = text.replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in text.splitlines() if line.strip()]


def test_the_image_ends_as_a_fixed_non_root_user():
    steps = instructions()
    users = [args for name, args in steps if name == "USER"]
    assert users, "no USER: the image would run as root"
    user = users[-1].strip()
    assert user.split(":")[0] == str(UID) and user.split(":")[1] == str(UID)  # numeric:
    # Kubernetes' runAsNonRoot can check it
    (made,) = [args for name, args in steps if name == "RUN" and "useradd" in args]
    assert f"--uid {UID}" in made and f"--gid {UID}" in made
    assert "install -d -o blitz -g blitz" in made and "/app/model-cache" in made
    cache = next(args for name, args in steps if name == "ENV" and "BLITZ_CACHE_DIR" in args)
    assert "BLITZ_CACHE_DIR=/app/model-cache" in cache


def test_root_steps_come_before_the_user_and_the_bake_after_it():
    steps = instructions()
    names = [name for name, _ in steps]
    switched = max(i for i, name in enumerate(names) if name == "USER")
    root_only = [i for i, (name, args) in enumerate(steps) if name == "RUN" and (
        "apt-get" in args or "install.sh" in args or "/etc/profile.d" in args
        or "serve_config.yaml" in args and "sed -i" in args or "useradd" in args)]
    assert root_only and max(root_only) < switched
    bake = next(i for i, (name, args) in enumerate(steps)
                if name == "RUN" and "blitz optimize" in args)
    assert bake > switched  # the cache is the user's own, without a chown layer
    home = [args for name, args in steps[switched:] if name == "ENV" and "HOME=" in args]
    assert home and "HOME=/home/blitz" in home[0]  # ~/.ray/auth_token goes there
    assert names[-1] == "CMD"


def test_the_dockerfile_says_what_listens_where_and_how_keys_are_turned_on():
    text = (ROOT / "Dockerfile").read_text()
    assert "0.0.0.0" in text and "on purpose" in text
    assert "-p 127.0.0.1:8000:8000" in text
    assert "BLITZ_API_KEYS" in text and "required: true" in text
    docs = (ROOT / "docs" / "operations.md").read_text()
    image = docs[docs.index("## On Kubernetes"):docs.index("### The image, built and run")]
    assert f"uid {UID}" in image and "BLITZ_API_KEYS" in image and "0.0.0.0" in image


def test_the_rayservice_pods_run_as_the_images_user():
    manifest = yaml.safe_load((ROOT / "deploy/kuberay/rayservice.yaml").read_text())
    cluster = manifest["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        context = group["template"]["spec"]["securityContext"]
        assert context["runAsNonRoot"] is True
        assert context["runAsUser"] == context["runAsGroup"] == UID
