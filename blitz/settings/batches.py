"""The batch API's settings (``batches:``): OpenAI's Files and Batches on the server
(``blitz.batches``; docs/batches.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from blitz.settings.deployment_options import merge_options
from blitz.settings.pool_settings import _Settings

BATCH_RUNNER_DEPLOYMENT: dict[str, Any] = {
    "num_replicas": 1,  # one runner per app: it owns the batches' state
    "max_surge_percent": 0,  # replaced in place on a redeploy: never two at once
    "ray_actor_options": {"num_cpus": 0},  # it reads, writes and waits; the pools compute
}


class BatchSettings(_Settings):
    """Batch jobs the way OpenAI's users script them: input files uploaded, a batch of
    requests run at priority low beside the interactive ones, output files downloaded."""

    enabled: bool = Field(True, description="serve /v1/files and /v1/batches and bind the "
                          "batch runner (a replica that runs batches and resumes them after "
                          "a restart)")
    storage: str | None = Field(
        None, description="where files and batches are kept: a local folder, or an object "
        "store prefix (s3://bucket/blitz-batches) that every node reaches, for clusters. "
        "Default: `batches/<app name>` in cache_dir")
    engine: Literal["auto", "ray_data", "threads"] = Field(
        "auto", description="what runs a batch's pieces: ray_data (a Ray Data job whose "
        "actors, spread over the cluster's nodes, send them to the ingresses; needs the bulk "
        "extra), threads (the runner's own threads), auto (ray_data when Ray Data is "
        "installed)")
    max_file_bytes: int = Field(200 * 1024 * 1024, ge=1024, description="bytes in one "
                                "uploaded file (OpenAI's limit: 200 MB)")
    max_stored_bytes_per_key: int = Field(
        10 * 1024 * 1024 * 1024, ge=1024, description="bytes of files one API key may keep "
        "(uploads and batch outputs); an upload past it is refused")
    max_running_batches_per_key: int = Field(
        4, ge=1, description="batches of one API key not yet ended; another is refused "
        "(429) until one ends")
    max_requests_per_batch: int = Field(200_000, ge=1, description="lines in one batch's "
                                        "input file")
    retention_s: float = Field(30 * 24 * 3600.0, gt=0, description="files (uploads and "
                               "outputs) and ended batches are deleted this long after they "
                               "were made (a file's own expires_after may ask for less)")
    completion_windows: list[str] = Field(
        default_factory=lambda: ["24h"], description="the completion windows a batch may "
        "ask for (`<hours>h`); a batch not done by its end expires, its done lines kept")
    chunk_lines: int = Field(128, ge=1, le=10_000, description="lines of a batch run and "
                             "written as one piece: what a restart or a cancel redoes or "
                             "loses at most")
    concurrency: int = Field(4, ge=1, le=256, description="pieces of one batch in flight "
                             "at once (Ray Data's actors over the cluster)")
    line_concurrency: int = Field(32, ge=1, le=1024, description="lines of one piece sent "
                                  "at once, at priority low: batches fill the pools' "
                                  "batches without crowding interactive requests' queues")
    line_retries: int = Field(6, ge=0, le=50, description="a line answered 429 or 503 "
                              "(a full queue, a restarting pool) is sent again this many "
                              "times, waiting longer each time, before its error is kept")
    poll_s: float = Field(1.0, gt=0, le=60, description="how often the runner looks for new, "
                          "cancelled and expired batches")
    upload_timeout_s: float = Field(600.0, gt=0, description="an upload's body must arrive "
                                    "within this (the client cannot lift it)")
    deployment: dict[str, Any] = Field(
        default_factory=lambda: dict(BATCH_RUNNER_DEPLOYMENT),
        description="the batch runner's Ray Serve deployment options, merged over its "
        "defaults")

    @field_validator("deployment", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any) -> Any:
        return merge_options(BATCH_RUNNER_DEPLOYMENT, value) if isinstance(value, dict) else value

    def storage_uri(self, cache_root: str, app: str) -> str:
        """Where files and batches are kept: ``storage``, else ``<cache_dir>/batches/<app>``
        (two apps on one machine never share one)."""
        return self.storage or f"{cache_root.rstrip('/')}/batches/{app}"
