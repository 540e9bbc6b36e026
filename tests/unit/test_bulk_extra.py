"""`blitz embed` without the bulk extra: a usage error that names the extra to install.

The serving install leaves Ray Data (and with it pandas) out, so the command must say
what is missing rather than fail with a bare ImportError from inside Ray."""

from __future__ import annotations

import sys

import pytest

from deployments.bulk_requirements import require_ray_data
from deployments.cli import main


@pytest.fixture
def no_ray_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray.data", None)  # import ray.data -> ImportError


def test_require_ray_data_names_the_extra(no_ray_data: None) -> None:
    with pytest.raises(RuntimeError, match=r"install\.sh bulk.*\.\[bulk\]"):
        require_ray_data()


def test_embed_command_is_a_usage_error(no_ray_data: None, tmp_path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(SystemExit) as exit_:
        main(["embed", str(tmp_path / "in.jsonl"), str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert "bulk extra" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
