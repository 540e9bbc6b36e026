"""A multipart/form-data upload read as it arrives (``POST /v1/files``): the file part's
bytes handed on chunk by chunk, never held whole; the form's other fields (``purpose``,
``expires_after[seconds]``) kept, each at most ``MAX_FIELD_BYTES``.

python-multipart's parser is a state machine over the bytes, linear in the body; its
header counts and sizes are bounded. A form with no file part, two of them, or a field
over its size is refused (400 naming it).
"""

from __future__ import annotations

from typing import Any

from python_multipart import MultipartParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import parse_options_header

from blitz.errors import InvalidValue

MAX_FIELD_BYTES = 4096
MAX_FIELDS = 16


class FormStream:
    """Feed it the body's chunks (``feed``): each returns the file part's bytes found in
    that chunk; ``fields`` and ``filename`` are known once ``close`` returns."""

    def __init__(self, content_type: str | None, file_field: str = "file"):
        kind, options = parse_options_header(content_type or "")
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise InvalidValue("send the file as multipart/form-data (a `file` part and a "
                               "`purpose` field)", param="file")
        self.file_field = file_field
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.files = 0
        self._out: list[bytes] = []
        self._header_name = b""
        self._headers: dict[bytes, bytes] = {}
        self._name = ""
        self._is_file = False
        self._value: list[bytes] = []
        self._held = 0
        self.parser = MultipartParser(boundary, {
            "on_part_begin": self._begin, "on_part_data": self._data,
            "on_part_end": self._end, "on_header_field": self._field,
            "on_header_value": self._header_value, "on_header_end": self._header_end,
            "on_headers_finished": self._headers_done})

    def feed(self, chunk: bytes) -> list[bytes]:
        try:
            self.parser.write(chunk)
        except FormParserError as exc:  # a malformed form: the client's to fix (400)
            raise InvalidValue(f"the form is not valid multipart/form-data ({exc})",
                               param="file") from None
        out, self._out = self._out, []
        return out

    def close(self) -> None:
        try:
            self.parser.finalize()
        except FormParserError as exc:
            raise InvalidValue(f"the form is not valid multipart/form-data ({exc})",
                               param="file") from None
        if self.files == 0:
            raise InvalidValue(f"the form has no `{self.file_field}` part: send the file "
                               f"as the `{self.file_field}` field", param=self.file_field)

    # --- the parser's callbacks --------------------------------------------------------

    def _begin(self) -> None:
        self._headers, self._value, self._held = {}, [], 0

    def _field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        name = self._header_name.lower()
        self._headers[name] = self._headers.get(name, b"") + data[start:end]

    def _header_end(self) -> None:
        self._header_name = b""

    def _headers_done(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        self._is_file = self._name == self.file_field
        if self._is_file:
            self.files += 1
            if self.files > 1:
                raise InvalidValue(f"the form has more than one `{self.file_field}` part: "
                                   "upload one file per request", param=self.file_field)
            self.filename = (filename or b"upload.jsonl").decode("utf-8", "replace")
        elif len(self.fields) >= MAX_FIELDS:
            raise InvalidValue(f"the form has more than {MAX_FIELDS} fields", param="form")

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._is_file:
            self._out.append(data[start:end])
            return
        self._held += end - start
        if self._held > MAX_FIELD_BYTES:
            raise InvalidValue(f"form field {self._name[:64]!r} is over {MAX_FIELD_BYTES} "
                               "bytes", param=self._name[:64] or "form")
        self._value.append(data[start:end])

    def _end(self) -> None:
        if not self._is_file and self._name:
            self.fields[self._name] = b"".join(self._value).decode("utf-8", "replace")


def field_int(fields: dict[str, Any], name: str) -> int | None:
    """A form field as an integer, or None when absent; 400 naming it when not one."""
    value = fields.get(name)
    if value is None or value == "":
        return None
    try:
        return int(str(value).strip())
    except ValueError as exc:
        raise InvalidValue(f"{name} must be an integer", param=name) from exc
