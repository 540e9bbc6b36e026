"""One bulk embedding job's settings (``blitz embed``, ``deployments.bulk.embed_dataset``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from blitz.settings.images import checked_prefixes


class BulkSettings(BaseModel):
    """One bulk embedding job (``blitz embed``, ``deployments.bulk.embed_dataset``)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="model id; default: the registry's default")
    text_column: str = Field("text", description="column holding the texts")
    image_column: str | None = Field(
        None, description="with a dual-encoder model: the column of CSV, Parquet or JSONL "
        "inputs holding image paths, relative to the table's folder and below it (http(s) "
        "URLs with allow_urls); the images are embedded instead of texts")
    allow_urls: list[str] = Field(
        default_factory=list, description="with --image-column or an image list: http(s) "
        "URL prefixes (scheme://host[:port]/path/) image paths may name, fetched under the "
        "server's URL checks (normalized path, private addresses refused unless "
        "images.url_allow_private lists them, images.max_bytes, images.fetch_timeout_s); "
        "empty: only paths relative to the table's folder, on its own store, are read")
    images_per_unit: int = Field(
        1000, ge=1, description="image files per unit, on average, when INPUT is a folder or "
        "glob of images: a unit ends before each file whose path hashes to a boundary, so "
        "an added or changed image changes one unit")
    id_column: str = Field("id", description="column copied to the output as the row's id; "
                           "when the input has no such column, the row's position in its file")
    dtype: Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"] = Field(
        "float32", description="output dtype, as the native API's `dtype`")
    dimensions: int | None = Field(None, ge=1, description="Matryoshka truncation, as the "
                                   "native API's `dimensions`")
    prompt_name: str | None = Field(None, description="one of the model's `prompts`")
    normalize: bool | None = Field(None, description="default: the model's own")
    errors: str | None = Field(None, description="errors file (JSONL: id, reason, file); "
                               "default: OUTPUT/errors.jsonl")
    batch_size: int = Field(256, ge=1, description="texts per map_batches call (each is "
                            "length-sorted into token-budget micro-batches)")
    actors: int | None = Field(None, ge=1, description="encoder actors; default: one per GPU "
                               "when the cluster has GPUs, else one per CPU, at most `max_actors`")
    max_actors: int = Field(16, ge=1, description="cap on the default number of actors")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: cuda when the cluster has GPUs, else cpu")
    torch_threads: int = Field(1, ge=1, description="intra-op threads per CPU actor")
    max_row_bytes: int = Field(4 << 20, ge=1, description="a JSON line, or a CSV or Parquet "
                               "text, longer than this is refused (errors.jsonl)")
    force: bool = Field(False, description="redo units that an earlier run wrote with other "
                        "options or from another version of the input (they are refused "
                        "otherwise)")

    @field_validator("allow_urls")
    @classmethod
    def _prefixes(cls, value: list[str]) -> list[str]:
        return checked_prefixes(value, "--allow-urls")
