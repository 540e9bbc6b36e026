"""The image benchmark (loadtest.images_bench) on a tiny random CLIP and a few small
JPEGs: the report's shape, and the same vectors from sentence-transformers and Blitz. No
timing is asserted."""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image

from loadtest import images_bench
from loadtest.clip_model import DONE, build_clip


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    return build_clip(tmp_path_factory.mktemp("clip") / "tiny", "tiny")


def test_synthetic_jpegs_are_fixed_jpegs_of_the_size_asked():
    first = images_bench.synthetic_jpegs(3, (64, 48), seed=1)
    assert first == images_bench.synthetic_jpegs(3, (64, 48), seed=1)
    assert len(set(first)) == 3
    for data in first:
        image = Image.open(io.BytesIO(data))
        assert image.format == "JPEG" and image.size == (64, 48)


def test_the_model_is_built_once(tiny_clip):
    assert (tiny_clip / DONE).exists()
    stamp = (tiny_clip / "model.safetensors").stat().st_mtime_ns
    assert build_clip(tiny_clip, "tiny") == tiny_clip
    assert (tiny_clip / "model.safetensors").stat().st_mtime_ns == stamp


def test_the_report_has_every_leg_every_round_and_the_vectors_agree(tiny_clip):
    images = images_bench.synthetic_jpegs(3, (64, 48))
    doc = images_bench.run_bench(tiny_clip, images, rounds=2, batch=2, threads=1)
    assert [list(r) for r in doc["rounds"]] == [list(images_bench.LEGS)] * 2
    assert all(v > 0 for r in doc["rounds"] for v in r.values())
    assert set(doc["ratios"]) == {"blitz/st", "blitz-pool/st"}
    assert all(len(v) == 2 for v in doc["ratios"].values())
    assert doc["images"] == 3 and doc["batch"] == 2 and doc["threads"] == 1
    assert len(doc["others_busy_pct"]) == 2
    assert doc["dimension"] == 24
    assert all(cos > 0.999 for cos in doc["cosine_min"].values()), doc["cosine_min"]
    table = images_bench.markdown(doc)
    assert "| round | st images/s | blitz images/s | blitz-pool images/s |" in table
    assert "| median |" in table


def test_the_command_line_writes_its_report(tiny_clip, tmp_path, capsys):
    out = tmp_path / "images.json"
    assert images_bench.main(["--size", "tiny", "--model-dir", str(tiny_clip), "--images",
                              "2", "--image-size", "40x30", "--batch", "2", "--rounds", "1",
                              "--legs", "st,blitz", "--threads", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert list(doc["rounds"][0]) == ["st", "blitz"] and list(doc["ratios"]) == ["blitz/st"]
    assert doc["image_size"] == [40, 30] and doc["model"]["size"] == "tiny"
    assert "blitz/st" in capsys.readouterr().out


def test_an_unknown_leg_is_refused(tiny_clip):
    with pytest.raises(ValueError, match="legs"):
        images_bench.run_bench(tiny_clip, [], legs=["onnx"])
