"""MUVERA fixed-dimensional encodings and MaxSim (blitz/multivector/muvera.py).

The encodings are checked against a plain, loop-by-loop transcription of Google's
reference (github.com/google/graph-mining, sketching/point_cloud/fixed_dimensional_encoding.cc:
``GenerateQueryFixedDimensionalEncoding``, ``GenerateDocumentFixedDimensionalEncoding``,
``AMSProjectionMatrixFromSeed``, ``SimHashPartitionIndex``, ``DistanceToSimHashPartition``,
``ApplyCountSketchToVector``) that draws its random numbers the way the module documents
(numpy's ``default_rng(seed + repetition)``, then ``default_rng(seed + r_reps)`` for the
final Count-Sketch) instead of the reference's ``std::mt19937``.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from blitz.multivector import muvera
from blitz.multivector.muvera import MuveraParams, encode_document, encode_query, maxsim

# --- the reference, transcribed loop by loop ---------------------------------------------


def _ref_append_to_gray_code(gray_code: int, bit: bool) -> int:
    return (gray_code << 1) + (int(bit) ^ (gray_code & 1))


def _ref_gray_code_to_binary(num: int) -> int:
    return num ^ (num >> 1)


def _ref_partition_index(sketch_row: np.ndarray) -> int:
    index = 0
    for value in sketch_row:
        index = _ref_append_to_gray_code(index, bool(value > 0))
    return index


def _ref_distance_to_partition(sketch_row: np.ndarray, index: int) -> int:
    distance = 0
    binary = _ref_gray_code_to_binary(index)
    for i in range(len(sketch_row) - 1, -1, -1):
        cur_bit = 1 if sketch_row[i] > 0 else 0
        distance += int(cur_bit != (binary & 1))
        binary >>= 1
    return distance


def _ref_matrices(seed: int, dimension: int, k_sim: int, dim_proj: int):
    """One repetition's SimHash and projection matrices (drawn as the module documents)."""
    rng = np.random.default_rng(seed)
    simhash = rng.standard_normal((dimension, k_sim))
    if dim_proj == dimension:  # the reference's DEFAULT_IDENTITY
        return simhash, np.eye(dimension)
    columns = rng.integers(0, dim_proj, size=dimension)
    signs = rng.integers(0, 2, size=dimension)
    projection = np.zeros((dimension, dim_proj))
    for i in range(dimension):
        projection[i, columns[i]] = 2.0 * signs[i] - 1.0
    return simhash, projection


def _ref_count_sketch(vector: np.ndarray, final_dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, final_dim, size=len(vector))
    signs = rng.integers(0, 2, size=len(vector))
    out = np.zeros(final_dim)
    for i in range(len(vector)):
        out[indices[i]] += (2.0 * signs[i] - 1.0) * vector[i]
    return out


def _ref_fde(points: np.ndarray, params: MuveraParams, document: bool) -> np.ndarray:
    num_points, dimension = points.shape
    k_sim, width = params.k_sim, params.dim_proj
    num_partitions = 2**k_sim
    out = np.zeros(params.r_reps * num_partitions * width)
    for rep in range(params.r_reps):
        simhash, projection = _ref_matrices(params.seed + rep, dimension, k_sim, width)
        sketch = [[float(np.dot(points[p], simhash[:, j])) for j in range(k_sim)]
                  for p in range(num_points)]
        projected = [[float(np.dot(points[p], projection[:, c])) for c in range(width)]
                     for p in range(num_points)]
        sizes = [0] * num_partitions
        for p in range(num_points):
            partition = _ref_partition_index(np.array(sketch[p])) if k_sim > 0 else 0
            base = rep * num_partitions * width + partition * width
            for c in range(width):
                out[base + c] += projected[p][c]
            sizes[partition] += 1
        if not document:
            continue
        for partition in range(num_partitions):
            base = rep * num_partitions * width + partition * width
            if sizes[partition] == 0 and k_sim > 0:
                if params.fill_empty_partitions and num_points > 0:
                    nearest, best = -1, None
                    for p in range(num_points):
                        dist = _ref_distance_to_partition(np.array(sketch[p]), partition)
                        if best is None or dist < best:
                            nearest, best = p, dist
                    for c in range(width):
                        out[base + c] = projected[nearest][c]
                continue
            if sizes[partition]:
                for c in range(width):
                    out[base + c] /= sizes[partition]
    if params.final_dim is not None:
        return _ref_count_sketch(out, params.final_dim, params.seed + params.r_reps)
    return out


# --- agreement with the reference --------------------------------------------------------

CASES = [  # (num_points, dimension, params)
    (7, 12, MuveraParams(k_sim=3, dim_proj=4, r_reps=3, seed=0)),
    (2, 16, MuveraParams(k_sim=4, dim_proj=8, r_reps=2, seed=5)),  # mostly empty partitions
    (1, 8, MuveraParams(k_sim=2, dim_proj=3, r_reps=4, seed=11)),
    (25, 10, MuveraParams(k_sim=1, dim_proj=10, r_reps=2, seed=3)),  # identity projection
    (9, 6, MuveraParams(k_sim=0, dim_proj=5, r_reps=3, seed=9)),  # one partition
    (30, 32, MuveraParams(k_sim=5, dim_proj=6, r_reps=2, seed=1)),
    (13, 16, MuveraParams(k_sim=3, dim_proj=4, r_reps=3, seed=2, final_dim=40)),
    (6, 16, MuveraParams(k_sim=4, dim_proj=16, r_reps=2, seed=8, final_dim=7)),
]


@pytest.mark.parametrize("fill", [True, False])
@pytest.mark.parametrize(("num_points", "dimension", "params"), CASES)
def test_encodings_match_the_reference(num_points, dimension, params, fill):
    params = MuveraParams(k_sim=params.k_sim, dim_proj=params.dim_proj, r_reps=params.r_reps,
                          fill_empty_partitions=fill, final_dim=params.final_dim,
                          seed=params.seed)
    rng = np.random.default_rng(num_points * 1000 + dimension)
    points = rng.standard_normal((num_points, dimension)).astype(np.float32)
    query, document = encode_query(points, params), encode_document(points, params)
    assert query.dtype == document.dtype == np.float32
    assert query.shape == document.shape == (params.output_dim(dimension),)
    assert np.allclose(query, _ref_fde(points, params, document=False), rtol=1e-5, atol=1e-5)
    assert np.allclose(document, _ref_fde(points, params, document=True), rtol=1e-5, atol=1e-5)


def test_filling_empty_partitions_changes_only_empty_blocks_of_documents():
    params = MuveraParams(k_sim=4, dim_proj=8, r_reps=3, seed=4)
    bare = MuveraParams(k_sim=4, dim_proj=8, r_reps=3, seed=4, fill_empty_partitions=False)
    points = np.random.default_rng(0).standard_normal((3, 16))
    filled, unfilled = encode_document(points, params), encode_document(points, bare)
    blocks_filled, blocks_unfilled = filled.reshape(-1, 8), unfilled.reshape(-1, 8)
    empty = ~blocks_unfilled.any(axis=1)
    assert empty.sum() >= 3 * (16 - 3)  # at most 3 points per repetition: the rest is empty
    assert blocks_filled[empty].any(axis=1).all()
    assert np.array_equal(blocks_filled[~empty], blocks_unfilled[~empty])
    # a query ignores the flag
    assert np.array_equal(encode_query(points, params), encode_query(points, bare))


def test_one_partition_and_identity_give_sum_and_mean():
    params = MuveraParams(k_sim=0, dim_proj=5, r_reps=1)
    points = np.random.default_rng(1).standard_normal((4, 5))
    assert np.allclose(encode_query(points, params), points.sum(axis=0), atol=1e-6)
    assert np.allclose(encode_document(points, params), points.mean(axis=0), atol=1e-6)


def test_no_vectors_encode_to_zeros():
    params = MuveraParams(dim_proj=4, final_dim=10)
    for encode in (encode_query, encode_document):
        out = encode(np.zeros((0, 8), np.float32), params)
        assert out.shape == (10,) and not out.any()


# --- the point of it: <fde(q), fde(d)> tracks MaxSim -------------------------------------


def _normalized(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _clustered_clouds(seed: int, dimension: int = 64, n_topics: int = 12, n_docs: int = 30):
    """A query on 3 topics and documents on 1-4 random topics each: unit vectors near the
    topics' centres, so documents overlap the query by different amounts."""
    rng = np.random.default_rng(seed)
    topics = _normalized(rng.standard_normal((n_topics, dimension)))

    def cloud(size: int, topic_ids: np.ndarray) -> np.ndarray:
        centres = topics[rng.choice(topic_ids, size=size)]
        return _normalized(centres + 0.1 * rng.standard_normal((size, dimension)))

    query = cloud(8, rng.choice(n_topics, size=3, replace=False))
    docs = [cloud(int(rng.integers(20, 60)),
                  rng.choice(n_topics, size=int(rng.integers(1, 5)), replace=False))
            for _ in range(n_docs)]
    return query, docs


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ranks_a, ranks_b = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ranks_a, ranks_b)[0, 1])


@pytest.mark.parametrize("seed", [42, 7, 1234])
def test_fde_dot_products_rank_documents_like_maxsim(seed):
    query, docs = _clustered_clouds(0)
    params = MuveraParams(k_sim=4, dim_proj=16, r_reps=20, seed=seed)
    exact = maxsim(query, docs)
    fde_query = encode_query(query, params)
    approx = np.array([fde_query @ encode_document(doc, params) for doc in docs])
    assert _spearman(exact, approx) > 0.8
    # shortlist then rerank: the FDE's top 10 holds MaxSim's top 5
    assert set(np.argsort(exact)[-5:]) <= set(np.argsort(approx)[-10:])


# --- determinism, sizes, validation ------------------------------------------------------


def test_same_params_give_the_same_encodings_across_calls_and_cache_clears():
    params = MuveraParams(dim_proj=8, final_dim=64)
    points = np.random.default_rng(2).standard_normal((10, 32)).astype(np.float32)
    first = encode_document(points, params), encode_query(points, params)
    muvera._matrices.cache_clear()
    second = encode_document(points, params), encode_query(points, params)
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    other = MuveraParams(dim_proj=8, final_dim=64, seed=43)
    assert not np.array_equal(encode_document(points, other), first[0])


def test_same_params_give_the_same_encodings_in_another_process():
    script = ("import numpy as np\n"
              "from blitz.multivector.muvera import MuveraParams, encode_document\n"
              "x = np.arange(120, dtype=np.float32).reshape(10, 12) % 7 - 3\n"
              "p = MuveraParams(k_sim=3, dim_proj=4, r_reps=5, final_dim=50, seed=9)\n"
              "print(encode_document(x, p).tobytes().hex())\n")
    x = np.arange(120, dtype=np.float32).reshape(10, 12) % 7 - 3
    params = MuveraParams(k_sim=3, dim_proj=4, r_reps=5, final_dim=50, seed=9)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == encode_document(x, params).tobytes().hex()


def test_random_matrices_are_cached_read_only_and_bounded():
    assert muvera._matrices.cache_info().maxsize == 16
    matrices = muvera._matrices(3, 4, 2, 10, 0, 8)
    assert matrices is muvera._matrices(3, 4, 2, 10, 0, 8)
    with pytest.raises(ValueError):
        matrices.simhash[0, 0] = 1.0


@pytest.mark.parametrize(("params", "dimension", "expected"), [
    (MuveraParams(), 128, 20 * 16 * 16),
    (MuveraParams(k_sim=0, dim_proj=3, r_reps=1), 3, 3),
    (MuveraParams(k_sim=5, dim_proj=8, r_reps=10, final_dim=1000), 64, 1000),
])
def test_output_dim(params, dimension, expected):
    assert params.output_dim(dimension) == expected
    points = np.ones((3, dimension), np.float32)
    shapes = {encode_query(points, params).shape, encode_document(points, params).shape}
    assert shapes == {(expected,)}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"k_sim": -1}, "k_sim"), ({"k_sim": 11}, "k_sim"), ({"k_sim": 2.0}, "k_sim"),
    ({"k_sim": True}, "k_sim"), ({"dim_proj": 0}, "dim_proj"), ({"r_reps": 0}, "r_reps"),
    ({"r_reps": 65}, "r_reps"), ({"final_dim": 0}, "final_dim"), ({"seed": -1}, "seed"),
    ({"fill_empty_partitions": 1}, "fill_empty_partitions"),
])
def test_out_of_range_params_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MuveraParams(**kwargs)


def test_dim_proj_above_the_input_dimension_is_refused():
    params = MuveraParams(dim_proj=16)
    params.check(16)
    with pytest.raises(ValueError, match="dim_proj .* input dimension \\(8\\), got 16"):
        params.check(8)
    with pytest.raises(ValueError, match="dim_proj"):
        params.output_dim(8)
    with pytest.raises(ValueError, match="dim_proj"):
        encode_document(np.ones((2, 8)), params)


@pytest.mark.parametrize("shape", [(8,), (2, 0), (2, 3, 16)])
def test_vectors_must_be_a_matrix(shape):
    with pytest.raises(ValueError, match="2-D"):
        encode_query(np.ones(shape), MuveraParams(dim_proj=1))


# --- maxsim ------------------------------------------------------------------------------


def _loop_maxsim(query: np.ndarray, docs: list[np.ndarray]) -> np.ndarray:
    scores = []
    for doc in docs:
        total = 0.0
        for q in query:
            total += max((float(q @ v) for v in doc), default=0.0) if len(doc) else 0.0
        scores.append(total)
    return np.array(scores)


def test_maxsim_matches_a_double_loop():
    rng = np.random.default_rng(3)
    query = rng.standard_normal((5, 16)).astype(np.float32)
    docs = [rng.standard_normal((n, 16)).astype(np.float32) for n in (1, 7, 3, 40, 2)]
    scores = maxsim(query, docs)
    assert scores.shape == (5,) and scores.dtype == np.float32
    assert np.allclose(scores, _loop_maxsim(query, docs), rtol=1e-5, atol=1e-5)


def test_maxsim_empty_documents_score_zero():
    rng = np.random.default_rng(4)
    query = rng.standard_normal((3, 8))
    docs = [np.zeros((0, 8)), rng.standard_normal((4, 8)), np.zeros((0, 8)),
            rng.standard_normal((1, 8))]
    scores = maxsim(query, docs)
    assert scores[0] == scores[2] == 0.0
    assert np.allclose(scores, _loop_maxsim(query, docs))
    assert maxsim(query, []).shape == (0,)
    assert not maxsim(query, [np.zeros((0, 8))] * 2).any()
    assert not maxsim(np.zeros((0, 8)), docs).any()


def test_maxsim_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="query"):
        maxsim(np.ones(8), [np.ones((2, 8))])
    with pytest.raises(ValueError, match="document 1"):
        maxsim(np.ones((2, 8)), [np.ones((2, 8)), np.ones((2, 4))])
