"""The backends table (loadtest.backends)."""

from __future__ import annotations

from loadtest import backends


def test_backends_table():
    result = {"batches": [1, 32], "model": "m", "cpu": "c", "threads": {"torch": 2},
              "int8_target": "avx2",
              "throughput_texts_per_s": {"torch": {"1": 10.0, "32": 100.0},
                                         "onnx-int8": {"1": 20.0, "32": 300.0}},
              "speedup_vs_torch_fp32": {"torch": {"1": 1.0, "32": 1.0},
                                        "onnx-int8": {"1": 2.0, "32": 3.0}},
              "accuracy_vs_torch_fp32": {"torch": {"min_cosine": 1.0, "mean_cosine": 1.0},
                                         "onnx-int8": {"min_cosine": 0.99,
                                                       "mean_cosine": 0.995}},
              "corpus": {"texts": 10, "tokens_min": 8, "tokens_max": 40, "tokens_mean": 20}}
    header, rule, torch_row, int8_row, _, note = backends.markdown(result).splitlines()
    assert header == "| backend | 1 text/call | 32 texts/call | min cos | mean cos |"
    assert rule == "|---|---|---|---|---|"
    assert int8_row == "| ONNX int8 (avx2) | 20/s (2.00x) | 300/s (3.00x) | 0.9900 | 0.9950 |"
    assert note.startswith("m on c; 2 threads")


def test_backends_table_names_what_auto_chose():
    result = {"batches": [1], "model": "m", "cpu": "c", "threads": {"torch": 2},
              "int8_target": "avx2", "throughput_texts_per_s": {"auto": {"1": 30.0}},
              "speedup_vs_torch_fp32": {"auto": {"1": 3.0}},
              "accuracy_vs_torch_fp32": {"auto": {"min_cosine": 0.99, "mean_cosine": 0.995}},
              "served_by": {"auto": "auto(small=onnx-int8, large=torch-bf16)"},
              "corpus": {"texts": 10, "tokens_min": 8, "tokens_max": 40, "tokens_mean": 20}}
    row = backends.markdown(result).splitlines()[2]
    assert row.startswith("| auto(small=onnx-int8, large=torch-bf16) | 30/s (3.00x) |")
