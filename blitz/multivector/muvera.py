"""MUVERA fixed-dimensional encodings (FDEs) of multi-vector outputs, and exact MaxSim scores.

A late-interaction model (ColBERT-style) gives one vector per token, and scores a query
against a document by MaxSim (Chamfer similarity): the sum, over the query's vectors, of
each one's largest dot product with the document's vectors. MUVERA (Dhulipala et al.,
"MUVERA: Multi-Vector Retrieval via Fixed Dimensional Encodings", 2024) turns each
point cloud into one vector of fixed size such that ``<encode_query(q), encode_document(d)>``
approximates ``maxsim(q, [d])``, so a single-vector index can shortlist candidates that
exact MaxSim then reranks.

This follows Google's reference, ``sketching/point_cloud/fixed_dimensional_encoding.cc``
in github.com/google/graph-mining, with ``projection_type = AMS_SKETCH`` (or
``DEFAULT_IDENTITY`` when ``dim_proj`` equals the input dimension). For each of
``r_reps`` repetitions:

1. SimHash: ``k_sim`` Gaussian hyperplanes give each vector ``k_sim`` sign bits, and the
   bits, read as a Gray code (the reference's ``AppendToGrayCode``), its partition, one
   of ``2**k_sim``;
2. projection: each vector goes down to ``dim_proj`` coordinates by the reference's AMS
   sketch, a ``dimension x dim_proj`` matrix with one random ``±1`` per row (input
   coordinate ``i`` lands, signed, in one random output coordinate; no scaling);
3. aggregation, per partition: a query SUMS its projected vectors; a document AVERAGES
   them and, with ``fill_empty_partitions``, fills an empty partition with the projected
   vector whose sign bits are nearest the partition's by Hamming distance (the first
   such vector on ties).

The repetitions' ``2**k_sim * dim_proj`` blocks are concatenated (repetition-major, then
partition, then coordinate: the reference's layout), and with ``final_dim`` the whole is
Count-Sketched down to ``final_dim`` coordinates (the reference's
``ApplyCountSketchToVector``).

Seeding (numpy, not the reference's ``std::mt19937``, so the numbers differ from the C++
but the scheme is the reference's ``seed + repetition_num``): repetition ``i`` draws from
``np.random.default_rng(seed + i)``, first the ``dimension x k_sim`` SimHash matrix
(``standard_normal``), then the AMS sketch's ``dimension`` output coordinates
(``integers(0, dim_proj)``) and ``dimension`` signs (``integers(0, 2)``, 0 for ``-1``);
the final Count-Sketch draws its coordinates then its signs from
``np.random.default_rng(seed + r_reps)``, a seed no repetition uses. The same parameters
thus give the same matrices in every process and call, and queries and documents
encoded with the same parameters share them (``fill_empty_partitions`` changes no
matrix). They are cached per parameters and input dimension (:func:`functools.lru_cache`,
16 entries).

Cost: encoding ``n`` vectors of dimension ``d`` is two matrix products,
``O(n * r_reps * (k_sim + dim_proj) * d)``, plus ``O(n * r_reps * dim_proj)`` to
aggregate and, for documents with empty partitions to fill, ``O(n * r_reps * 2**k_sim)``
Hamming distances; memory is ``O(n * r_reps * (k_sim + dim_proj))`` plus the output.
:func:`maxsim` costs ``O(n_query * n_doc_vectors * d)``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_K_SIM = 10
MAX_R_REPS = 64
# set bits of every k_sim-bit code (numpy >= 1.26 has no np.bitwise_count)
_POPCOUNT = np.array([bin(code).count("1") for code in range(1 << MAX_K_SIM)], dtype=np.int64)


@dataclass(frozen=True)
class MuveraParams:
    """How to encode: shared by a query's and its documents' encodings.

    ``k_sim`` SimHash hyperplanes (``2**k_sim`` partitions per repetition); ``dim_proj``
    coordinates per partition (AMS sketch; identity when equal to the input dimension);
    ``r_reps`` repetitions; ``fill_empty_partitions`` (documents only; queries ignore it);
    ``final_dim``, an optional final Count-Sketch size; ``seed`` for every random draw.
    Invalid values raise :class:`ValueError` at construction; ``dim_proj`` is checked
    against the input dimension by :meth:`check` and by the encoders.
    """

    k_sim: int = 4
    dim_proj: int = 16
    r_reps: int = 20
    fill_empty_partitions: bool = True
    final_dim: int | None = None
    seed: int = 42

    def __post_init__(self) -> None:
        self.check()

    def check(self, dimension: int | None = None) -> None:
        """Raise :class:`ValueError` naming the first out-of-range value.

        With ``dimension`` (the input vectors' size), also checks that it is positive and
        that ``dim_proj`` does not exceed it.
        """
        _check_int("k_sim", self.k_sim, 0, MAX_K_SIM)
        _check_int("r_reps", self.r_reps, 1, MAX_R_REPS)
        _check_int("dim_proj", self.dim_proj, 1, None)
        if self.final_dim is not None:
            _check_int("final_dim", self.final_dim, 1, None)
        _check_int("seed", self.seed, 0, None)
        if not isinstance(self.fill_empty_partitions, bool):
            raise ValueError(
                f"fill_empty_partitions must be a bool, got {self.fill_empty_partitions!r}")
        if dimension is not None:
            _check_int("dimension", dimension, 1, None)
            if self.dim_proj > dimension:
                raise ValueError(f"dim_proj must be between 1 and the input dimension "
                                 f"({dimension}), got {self.dim_proj}")

    @property
    def num_partitions(self) -> int:
        """Partitions per repetition: ``2**k_sim``."""
        return 1 << self.k_sim

    def output_dim(self, dimension: int) -> int:
        """Size of the encodings of ``dimension``-sized vectors.

        ``final_dim`` when set, else ``r_reps * 2**k_sim * dim_proj``.
        """
        self.check(dimension)
        if self.final_dim is not None:
            return self.final_dim
        return self.r_reps * self.num_partitions * self.dim_proj


def _check_int(name: str, value: object, low: int, high: int | None) -> None:
    """Raise :class:`ValueError` unless ``value`` is an int in ``[low, high]``."""
    bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
    if (not isinstance(value, int | np.integer) or isinstance(value, bool)
            or value < low or (high is not None and value > high)):
        raise ValueError(f"{name} must be an integer {bounds}, got {value!r}")


@dataclass(frozen=True)
class _Matrices:
    """One parameter set's random draws, all repetitions side by side (read-only)."""

    simhash: np.ndarray  # (dimension, r_reps * k_sim), repetition-major columns
    projection: np.ndarray  # (dimension, r_reps * dim_proj), repetition-major columns
    # the final Count-Sketch, if any: (r_reps * 2**k_sim * dim_proj,) coordinates in
    # [0, final_dim), as many ±1.0 signs, and final_dim
    final: tuple[np.ndarray, np.ndarray, int] | None


def _signs(rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` independent ±1.0 values (a draw of 0 gives -1)."""
    return rng.integers(0, 2, size=size).astype(np.float64) * 2.0 - 1.0


def _ams_matrix(rng: np.random.Generator, dimension: int, dim_proj: int) -> np.ndarray:
    """The reference's AMS sketch: each row one ±1 in a random column, else zeros."""
    columns = rng.integers(0, dim_proj, size=dimension)
    out = np.zeros((dimension, dim_proj))
    out[np.arange(dimension), columns] = _signs(rng, dimension)
    return out


@functools.lru_cache(maxsize=16)
def _matrices(k_sim: int, dim_proj: int, r_reps: int, final_dim: int | None, seed: int,
              dimension: int) -> _Matrices:
    """Draw (once per argument set) the SimHash, projection and final-sketch matrices."""
    simhash, projection = [], []
    for repetition in range(r_reps):
        rng = np.random.default_rng(seed + repetition)
        simhash.append(rng.standard_normal((dimension, k_sim)))
        projection.append(np.eye(dimension) if dim_proj == dimension
                          else _ams_matrix(rng, dimension, dim_proj))
    arrays = [np.concatenate(simhash, axis=1), np.concatenate(projection, axis=1)]
    final = None
    if final_dim is not None:
        size = r_reps * (1 << k_sim) * dim_proj
        rng = np.random.default_rng(seed + r_reps)
        final = (rng.integers(0, final_dim, size=size), _signs(rng, size), final_dim)
        arrays += final[:2]
    for array in arrays:
        array.setflags(write=False)
    return _Matrices(arrays[0], arrays[1], final)


def _points(vectors: np.ndarray, params: MuveraParams) -> np.ndarray:
    """``vectors`` as a float64 ``(n, d)`` array, after checking it and ``params``."""
    points = np.asarray(vectors, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] == 0:
        raise ValueError(f"vectors must be a 2-D (n, d) array with d >= 1, "
                         f"got shape {points.shape}")
    params.check(points.shape[1])
    return points


def _sketch_bits(points: np.ndarray, matrices: _Matrices, params: MuveraParams) -> np.ndarray:
    """Each vector's SimHash sign bits per repetition: ``(n, r_reps, k_sim)`` bools."""
    return (points @ matrices.simhash).reshape(len(points), params.r_reps, params.k_sim) > 0


def _bit_weights(k_sim: int) -> np.ndarray:
    """``2**(k_sim-1), ..., 2, 1``: the first bit is the most significant."""
    return np.left_shift(1, np.arange(k_sim - 1, -1, -1, dtype=np.int64))


def _partition_index(bits: np.ndarray) -> np.ndarray:
    """Partition of each ``(..., k_sim)`` bit row, as the reference's Gray-code append.

    Appending bit ``b`` to ``g`` gives ``(g << 1) + (b ^ (g & 1))``, so bit ``j`` of the
    bits (most significant first) becomes the XOR of bits ``0..j``.
    """
    prefix_xor = np.bitwise_xor.accumulate(bits, axis=-1) if bits.shape[-1] else bits
    return prefix_xor.astype(np.int64) @ _bit_weights(bits.shape[-1])


def _hamming_to_partitions(bits: np.ndarray, partitions: np.ndarray) -> np.ndarray:
    """``(n, len(partitions))`` Hamming distances between ``(n, k_sim)`` sign bits and
    the bits of partitions (the reference's ``DistanceToSimHashPartition``)."""
    codes = bits.astype(np.int64) @ _bit_weights(bits.shape[-1])
    partition_bits = partitions ^ (partitions >> 1)  # inverse of _partition_index
    return _POPCOUNT[codes[:, None] ^ partition_bits[None, :]]


def _encode(vectors: np.ndarray, params: MuveraParams, *, document: bool) -> np.ndarray:
    """The FDE of one point cloud: SUM per partition for queries, AVERAGE for documents."""
    points = _points(vectors, params)
    matrices = _matrices(params.k_sim, params.dim_proj, params.r_reps, params.final_dim,
                         params.seed, points.shape[1])
    n, reps, parts, width = len(points), params.r_reps, params.num_partitions, params.dim_proj
    bits = _sketch_bits(points, matrices, params)  # (n, reps, k_sim)
    projected = (points @ matrices.projection).reshape(n, reps, width)
    slots = _partition_index(bits) + np.arange(reps) * parts  # (n, reps) into reps * parts
    blocks = np.zeros((reps * parts, width))
    np.add.at(blocks, slots.ravel(), projected.reshape(n * reps, width))
    if document:
        counts = np.bincount(slots.ravel(), minlength=reps * parts)
        filled = counts > 0
        blocks[filled] /= counts[filled, None]
        if params.fill_empty_partitions and params.k_sim > 0 and n > 0:
            _fill_empty(blocks, ~filled, bits, projected, params)
    fde: np.ndarray = blocks.ravel()
    if matrices.final is not None:
        index, sign, final_dim = matrices.final
        fde = np.bincount(index, weights=sign * fde, minlength=final_dim)
    return fde.astype(np.float32)


def _fill_empty(blocks: np.ndarray, empty: np.ndarray, bits: np.ndarray,
                projected: np.ndarray, params: MuveraParams) -> None:
    """Write, into each empty partition's block, the projected vector nearest it.

    Nearest by Hamming distance between the vector's and the partition's sign bits, the
    first vector on ties (the reference's strict ``<`` scan).
    """
    parts = params.num_partitions
    for repetition in range(params.r_reps):
        missing = np.flatnonzero(empty[repetition * parts:(repetition + 1) * parts])
        if missing.size:
            distances = _hamming_to_partitions(bits[:, repetition], missing)
            nearest = np.argmin(distances, axis=0)
            blocks[repetition * parts + missing] = projected[nearest, repetition]


def encode_query(vectors: np.ndarray, params: MuveraParams) -> np.ndarray:
    """The query FDE of ``vectors`` ``(n, d)``: per partition, the SUM of its vectors.

    Returns a float32 vector of ``params.output_dim(d)``; all zeros for ``n == 0``.
    ``fill_empty_partitions`` is ignored (the reference rejects it for queries).
    """
    return _encode(vectors, params, document=False)


def encode_document(vectors: np.ndarray, params: MuveraParams) -> np.ndarray:
    """The document FDE of ``vectors`` ``(n, d)``: per partition, the AVERAGE of its
    vectors; empty partitions filled (``fill_empty_partitions``) or left zero.

    Returns a float32 vector of ``params.output_dim(d)``; all zeros for ``n == 0``.
    """
    return _encode(vectors, params, document=True)


def maxsim(query: np.ndarray, documents: Sequence[np.ndarray]) -> np.ndarray:
    """ColBERT late-interaction scores of ``query`` ``(nq, d)`` against each document.

    A document ``(nd_i, d)`` scores the sum, over the query's vectors, of the largest dot
    product with its vectors; one with no vectors scores 0.0. Computed as one matrix
    product against all documents' vectors and a segment max
    (:func:`numpy.maximum.reduceat`). Returns ``(len(documents),)``, in the inputs'
    floating dtype (at least float32).
    """
    q = np.asarray(query)
    if q.ndim != 2:
        raise ValueError(f"query must be a 2-D (nq, d) array, got shape {q.shape}")
    docs = [np.asarray(doc) for doc in documents]
    for i, doc in enumerate(docs):
        if doc.ndim != 2 or (len(doc) and doc.shape[1] != q.shape[1]):
            raise ValueError(f"document {i} must be a 2-D (n, {q.shape[1]}) array, "
                             f"got shape {doc.shape}")
    nonempty = [i for i, doc in enumerate(docs) if len(doc)]
    stacked = (np.concatenate([docs[i] for i in nonempty]) if nonempty
               else np.zeros((0, q.shape[1]), dtype=q.dtype))
    dtype = np.result_type(q.dtype, stacked.dtype, np.float32)
    scores = np.zeros(len(docs), dtype=dtype)
    if not nonempty or len(q) == 0:
        return scores
    similarities = q.astype(dtype, copy=False) @ stacked.astype(dtype, copy=False).T
    starts = np.cumsum([0] + [len(docs[i]) for i in nonempty[:-1]])
    scores[nonempty] = np.maximum.reduceat(similarities, starts, axis=1).sum(axis=0)
    return scores
