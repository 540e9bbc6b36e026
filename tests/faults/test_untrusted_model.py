"""Fault: a model folder that carries code, served as an operator would configure it.

all-MiniLM-L6-v2's files plus a module of the folder's own in modules.json, as a model
entry with ``cpu_backend: torch``: its request answers 424 naming what was refused, the
module's import-time code never runs in the replica, and the replica goes on serving its
other models. The same folder with ``trust_remote_code: true`` loads (its code runs).
"""

from __future__ import annotations

import httpx

from tests.faults.conftest import small_app
from tests.tiny_models import CODE_CARRYING_TYPE, build_code_carrying_model, minilm_dir

APP = "fault-untrusted"


def test_a_model_folder_that_carries_code_is_refused_unless_trusted(deploy, tmp_path):
    refused, trusted = tmp_path / "refused-ran", tmp_path / "trusted-ran"
    models = [
        {"id": "fake", "source": "fake:8"},
        {"id": "evil", "cpu_backend": "torch",
         "source": str(build_code_carrying_model(minilm_dir(), tmp_path / "evil", refused))},
        {"id": "evil-trusted", "cpu_backend": "torch", "trust_remote_code": True,
         "source": str(build_code_carrying_model(minilm_dir(), tmp_path / "evil-t", trusted))},
    ]
    url = deploy(APP, small_app(models))
    with httpx.Client(base_url=url, timeout=120) as http:
        r = http.post("/embed", json={"texts": ["x"], "model": "evil"},
                      headers={"accept": "application/json"})
        assert r.status_code == 424, r.text
        message = r.json()["error"]["message"]
        assert CODE_CARRYING_TYPE in message and "trust_remote_code" in message
        assert str(tmp_path) not in message  # what was refused, not where
        assert not refused.exists(), "the folder's code ran in the replica"
        assert http.post("/embed", json={"texts": ["x"], "model": "fake"}).status_code == 200
        r = http.post("/embed", json={"texts": ["x"], "model": "evil-trusted"},
                      headers={"accept": "application/json"})
        assert r.status_code == 200, r.text
        assert trusted.exists()  # trusted: its code is the operator's choice
