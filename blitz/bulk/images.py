"""Bulk images: image files, lists of them and tables of their paths, read into rows that
a dual encoder embeds, every bad image one refused row.

What an image job reads (a dual-encoder model; ``blitz.bulk.job.list_inputs`` finds them):

- image files (``IMAGE_SUFFIXES``) in a folder or glob, grouped into *chunks*
  (``chunk_images``): the files are taken in path order and a chunk starts at each file
  whose path hashes to a boundary (one in ``images_per_unit``), so chunks hold that many
  files on average and depend only on their own files: an image added, changed or
  removed changes the one chunk it falls in, and a rerun redoes that unit alone (with
  ``--force``, as a changed text file). A chunk is named by the file it starts at, its
  fingerprint is every member's path, size and version. Ids: paths below INPUT.
- a list (``.txt``, named as INPUT or by a glob, never found by a folder search: folders
  of images often hold captions as text files): one image path per line; the id is the
  path as written.
- tables (CSV, Parquet, JSONL) with ``image_column``: one image path per row; the id is
  the id column's, else the path.

A list or a table is one unit, as a text file is (split a long one to resume at a finer
grain); its fingerprint is its own, so an image changed behind an unchanged table is not
seen (``--force`` redoes it). Paths are relative to the list's or table's folder and stay
below it, on its own store: an absolute path, ``..`` out of the folder, another protocol
(``file://``, ``s3://`` of another bucket, ...) is a refused row; ``http(s)`` URLs are
fetched only under ``blitz embed --allow-urls PREFIX...``, with the server's URL checks
(``blitz.images.fetch``: normalized paths, private addresses refused, timeouts).

Image bytes are read on the reading workers, never more than ``max_bytes`` + 1 of a file;
a missing, unreadable or oversized file is a refused row, other I/O errors fail the job
(a rerun resumes). The encoder's actors decode each image within its ``ImageLimits``
(``blitz.images.decode``): a bad one is a refused row with the limit it broke.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from blitz.bulk.read import ID_POSITION, ID_STR, ROWS, Rows, iter_lines, read_rows
from blitz.errors import BlitzError, ClientError, InvalidValue
from blitz.settings.images import ImageSettings
from blitz.settings.kinds import kind_of

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp")
LIST_SUFFIXES = (".txt",)
IMAGE_ROWS = pa.schema([*ROWS, pa.field("_image", pa.large_binary()),
                        pa.field("_source", pa.string())])
TABLE_BYTES = 64 << 20  # a read table holds about this many image bytes at most
PIXEL_BATCH = 32  # images per call of the vision tower


def is_image(path: str) -> bool:
    return path.lower().endswith(IMAGE_SUFFIXES)


def is_list(path: str) -> bool:
    return path.lower().endswith(LIST_SUFFIXES)


def image_job(kind: str, image_column: str | None, prompt_name: str | None,
              files: list[str]) -> bool:
    """Whether the job embeds images (True) or texts; refuses what cannot be done."""
    pictures = [f for f in files if is_image(f) or is_list(f)]
    tables = [f for f in files if not (is_image(f) or is_list(f))]
    images = bool(image_column or pictures)
    if images and "embed_images" not in kind_of(kind).serves:
        raise InvalidValue(f"images need a dual-encoder model (CLIP, SigLIP); this one is a "
                           f"{kind}", param="model")
    if not image_column and pictures and tables:
        raise InvalidValue(
            f"INPUT holds image files or lists ({pictures[0]}) and tables ({tables[0]}): "
            "pass --image-column COLUMN to embed the images the tables name (image files "
            "are then read through the tables alone), or name a folder or glob that holds "
            "one kind", param="input")
    if images and prompt_name:
        raise InvalidValue("--prompt-name applies to texts; images take no prompt",
                           param="prompt_name")
    return images


# --- chunks of image files --------------------------------------------------------------

def relative(base: str, file: str) -> str:
    """``file``'s path below ``base`` (as ``blitz.bulk.units.unit_name`` takes it)."""
    return file[len(base):].lstrip("/") if base and file.startswith(base + "/") else (
        file.lstrip("/"))


def boundary(path: str, per_unit: int) -> bool:
    digest = hashlib.sha256(path.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "little") % per_unit == 0


def chunk_images(base: str, files: list[str], per_unit: int) -> list[tuple[str, list[str]]]:
    """(the path below ``base`` a chunk starts at, "" for the first chunk when its first
    file is no boundary; its files) for the sorted image ``files``."""
    chunks: list[tuple[str, list[str]]] = []
    for file in files:
        path = relative(base, file)
        if not chunks or boundary(path, per_unit):
            chunks.append((path if boundary(path, per_unit) else "", []))
        chunks[-1][1].append(file)
    return chunks


def chunk_name(start: str) -> str:
    """A chunk's unit directory: ``images-`` and the path it starts at ("/" written "__";
    ``start`` for the first), then 8 hex digits of that path (never a text unit's)."""
    digest = hashlib.sha256(b"images\0" + start.encode("utf-8", "surrogateescape"))
    return f"images-{start.replace('/', '__') or 'start'}-{digest.hexdigest()[:8]}"


def chunk_fingerprint(fingerprints: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A chunk's size (its bytes) and version (a digest of every member's path, size and
    version): what tells a rerun that an image in it was added, changed or removed."""
    digest = hashlib.sha256()
    for path, found in fingerprints:
        digest.update(f"{path}\0{found['size']}\0{found['version']}\n".encode(
            "utf-8", "surrogateescape"))
    return {"size": sum(int(f["size"]) for _, f in fingerprints),
            "version": digest.hexdigest()[:16], "images": len(fingerprints)}


# --- reading ----------------------------------------------------------------------------

class ImageRows:
    """One unit's image rows (``IMAGE_ROWS``), handed out as tables of at most
    ``batch_rows`` rows or about ``TABLE_BYTES`` of images."""

    def __init__(self, unit: int, batch_rows: int):
        self.rows = Rows(unit, batch_rows)
        self.images: list[bytes] = []
        self.sources: list[str] = []
        self.held = 0

    def add(self, row: int, line: int, kind: int, ident: Any, source: str,
            data: bytes | None, reason: str | None) -> None:
        self.rows.add(row, line, kind, ident, "", reason)
        self.images.append(data if data is not None and reason is None else b"")
        self.sources.append(source)
        self.held += len(self.images[-1])

    def __len__(self) -> int:
        return len(self.rows)

    def full(self) -> bool:
        return self.rows.full() or self.held >= TABLE_BYTES

    def take(self) -> pa.Table:
        table = self.rows.take().append_column(
            IMAGE_ROWS.field("_image"), pa.array(self.images, pa.large_binary()))
        table = table.append_column(IMAGE_ROWS.field("_source"),
                                    pa.array(self.sources, pa.string()))
        self.images, self.sources, self.held = [], [], 0
        return table


def read_image(url: str, max_bytes: int) -> tuple[bytes | None, str | None]:
    """(the file's bytes, None), or (None, why it is refused); reads at most
    ``max_bytes`` + 1 bytes. I/O errors other than a missing or unreadable file raise."""
    from blitz.sources.storage import filesystem_for

    fs, path = filesystem_for(url)
    try:
        with fs.open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        return None, "no such image file"
    except IsADirectoryError:
        return None, "a folder, not an image file"
    except (NotADirectoryError, PermissionError) as exc:
        return None, f"the image file cannot be opened ({type(exc).__name__})"
    if len(data) > max_bytes:
        return None, f"an image file over images.max_bytes ({max_bytes:,} bytes)"
    if not data:
        return None, "an empty image file"
    return data, None


def read_image_files(members: list[tuple[str, str]], unit: int, *, batch_rows: int,
                     max_image_bytes: int) -> Iterator[pa.Table]:
    """A chunk's rows: each member (url, id) with its bytes, or refused."""
    rows = ImageRows(unit, batch_rows)
    for position, (url, ident) in enumerate(members):
        data, reason = read_image(url, max_image_bytes)
        rows.rows.offset += len(data or b"")
        rows.add(position, -1, ID_STR, ident, url, data, reason)
        if rows.full():
            yield rows.take()
    if len(rows):
        yield rows.take()


SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")  # file:, s3:, c: ... (and ``::`` chains)
URL_SCHEMES = ("http://", "https://")


def resolve(path: str, folder: str, urls: ImageSettings | None = None
            ) -> tuple[str, str | None]:
    """(where an image path from a list or a table in ``folder`` (a local path or a URI) is
    read, None), or (the path, why it is refused). A relative path that stays below
    ``folder`` is read on the folder's own store; an absolute path, ``..`` leading out of
    the folder, another protocol or store are refused; an ``http(s)`` URL only with
    ``urls`` (``blitz embed --allow-urls``: fetched under ``blitz.images.fetch``'s checks)."""
    if path.lower().startswith(URL_SCHEMES):
        if urls is None:
            return path, ("an image URL is not fetched without --allow-urls PREFIX (image "
                          "paths are relative to the table's folder)")
        return path, None
    if "://" in path or "::" in path or SCHEME.match(path):
        return path, ("another protocol or store is not read: image paths are relative to "
                      "the table's folder")
    if path.startswith(("/", "\\", "~")):
        return path, "an absolute path is not read: image paths are relative to the table's folder"
    scheme, sep, where = folder.partition("://") if "://" in folder else ("", "", folder)
    base = posixpath.normpath(where) if where else ""
    joined = posixpath.normpath(posixpath.join(base, path))
    if (joined == base or not joined.startswith(base.rstrip("/") + "/")) if base else (
            joined in (".", "..") or joined.startswith("../")):
        return path, "'..' leads out of the table's folder: image paths stay below it"
    return (f"{scheme}{sep}{joined.lstrip('/')}" if sep else joined), None


def fetch_image(url: str, limits: ImageSettings) -> tuple[bytes | None, str | None]:
    """(the bytes at ``url``, None), or (None, why it is refused): ``--allow-urls``'s
    prefixes, the server's checks (``blitz.images.fetch``), ``images.max_bytes`` and
    ``images.fetch_timeout_s``."""
    from blitz.images.fetch import fetch_one

    try:
        data = fetch_one(url, limits)
    except BlitzError as exc:
        if not exc.expose:
            raise
        return None, exc.message.replace("under images.url_allow", "under --allow-urls")
    return (data, None) if data else (None, "an empty image file")


def read_list_rows(f: Any, unit: int, *, batch_rows: int,
                   max_row_bytes: int) -> Iterator[pa.Table]:
    """A list's rows (``ROWS``): each non-blank line an image path (spaces around it
    dropped), which is also its id."""
    rows = Rows(unit, batch_rows)
    position = 0
    for number, line in iter_lines(f, max_row_bytes):
        rows.offset = f.tell()
        if line is not None and not line.strip():
            continue
        try:
            path = None if line is None else line.decode("utf-8").lstrip("\ufeff").strip()
        except UnicodeDecodeError:
            rows.add(position, number, ID_STR, str(position), None, "line is not valid UTF-8")
        else:
            if path is None:
                rows.add(position, number, ID_STR, str(position), None,
                         f"line longer than {max_row_bytes} bytes")
            else:
                rows.add(position, number, ID_STR, path, path, None)
        position += 1
        if rows.full():
            yield rows.take()
    if len(rows):
        yield rows.take()


def read_image_table(f: Any, kind: str, unit: int, url: str, *, image_column: str | None,
                     id_column: str, batch_rows: int, max_row_bytes: int,
                     max_image_bytes: int, url_limits: ImageSettings | None = None
                     ) -> Iterator[pa.Table]:
    """The rows of a list (``kind`` "list") or of a table's ``image_column``, each with
    its image's bytes or refused (``resolve``: paths below the table's folder; URLs only
    under ``url_limits.url_allow``, ``blitz embed --allow-urls``)."""
    if kind == "list":
        tables = read_list_rows(f, unit, batch_rows=batch_rows, max_row_bytes=max_row_bytes)
    else:
        tables = read_rows(f, kind, unit, text_column=image_column or "", id_column=id_column,
                           batch_rows=batch_rows, max_row_bytes=max_row_bytes)
    folder = posixpath.dirname(url)
    out = ImageRows(unit, batch_rows)
    for table in tables:
        for row in table.to_pylist():
            out.rows.offset = row["_offset"]
            kind_of_id = row["_id_kind"]
            ident = row["_id_str"] if kind_of_id == ID_STR else row["_id_int"]
            reason, source, data = row["_refused"] or None, "", None
            if reason is None:
                if kind_of_id == ID_POSITION:  # no id column: the path is the id
                    kind_of_id, ident = ID_STR, row["_text"]
                source, reason = resolve(row["_text"], folder, url_limits)  # refused: as written
                if reason is None and url_limits is not None and source.lower().startswith(
                        URL_SCHEMES):
                    data, reason = fetch_image(source, url_limits)
                elif reason is None:
                    data, reason = read_image(source, max_image_bytes)
            else:  # the text reader's words, about an image path
                reason = re.sub(r"\btext\b", "image path", reason)
            out.add(row["_row"], row["_line"], kind_of_id, ident, source, data, reason)
            if out.full():
                yield out.take()
    if len(out):
        yield out.take()


# --- embedding --------------------------------------------------------------------------

def embed_image_rows(encoder: Any, rows: pa.Table, normalize: bool,
                     finish: Any) -> tuple[list[int], Any, list[str]]:
    """(rows embedded, their vectors through ``finish``, every row's refusal) for a table
    of ``IMAGE_ROWS``: each image decoded within the encoder's limits (a bad one refused
    with the limit it broke), then embedded ``PIXEL_BATCH`` at a time; an image is held
    decoded only until the model's processor has resized it."""
    import numpy as np

    from blitz.images.decode import ImageLimits, decode

    limits = getattr(encoder, "limits", None) or ImageLimits()
    refused = rows.column("_refused").to_pylist()
    images = rows.column("_image")
    good: list[int] = []
    parts: list[Any] = []
    pending: list[Any] = []

    def run() -> None:
        if pending:
            import torch

            encoded = encoder.embed_pixels(torch.cat(pending), normalize=normalize)
            parts.append(finish(encoded.values))
            pending.clear()

    for i, reason in enumerate(refused):
        if reason:
            continue
        try:
            picture = decode(images[i].as_py(), limits, param="image")
        except ClientError as exc:
            refused[i] = exc.message
            continue
        except Exception as exc:  # noqa: BLE001 - a bad file is its row's refusal, never the job's
            refused[i] = f"the image could not be decoded: {type(exc).__name__}"
            continue
        pending.append(encoder.pixels([picture]))
        good.append(i)
        if len(pending) >= PIXEL_BATCH:
            run()
    run()
    values = np.concatenate(parts) if parts else None
    return good, values, refused
