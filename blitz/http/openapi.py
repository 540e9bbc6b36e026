"""The API's own description: an OpenAPI 3.1 document (``GET /openapi.json``) and a page
that shows it (``GET /docs``), both built once from the route table
(``blitz.http.routes.table``: per route a summary, the request model, the reply's formats
and what the reply is) and the error bodies (``blitz.errors``). The page is
self-contained HTML (nothing fetched): a server without internet access shows it whole.

``OPERATIONS`` is that table by (method, path). A route with no entry fails the build
(``document`` raises), so no route goes undocumented.
"""

from __future__ import annotations

import html
import inspect
import re
from collections.abc import Sequence
from typing import Any

from pydantic import AliasChoices, BaseModel
from pydantic.json_schema import models_json_schema

from blitz.http.routes.table import JSON, MSGPACK, ROUTES, RouteSpec

REF = "#/components/schemas/{model}"
OPERATIONS: dict[tuple[str, str], RouteSpec] = {(r.method, r.path): r for r in ROUTES}
_NULLABLE = {"type": ["string", "null"]}
_ERRORS = {  # the error bodies (blitz.errors.BlitzError.to_shape), one per API's shape
    "Error": {"type": "object", "required": ["error"], "description": "OpenAI's (the default)",
              "properties": {"error": {"type": "object", "required": ["message", "type"],
                                       "properties": {"message": {"type": "string"},
                                                      "type": {"type": "string"},
                                                      "param": _NULLABLE, "code": _NULLABLE}}}},
    "TeiError": {"type": "object", "required": ["error", "error_type"],
                 "description": "Hugging Face TEI's, for a request in TEI's dialect",
                 "properties": {"error": {"type": "string"}, "error_type": {"type": "string"},
                                "param": _NULLABLE, "code": _NULLABLE}},
    "CohereError": {"type": "object", "required": ["message"], "description": "Cohere's",
                    "properties": {"id": _NULLABLE, "message": {"type": "string"}}},
    "VoyageError": {"type": "object", "required": ["detail"], "description": "Voyage's",
                    "properties": {"detail": {"type": "string"}, "param": _NULLABLE,
                                   "code": _NULLABLE}},
}
_ERROR_SCHEMA = {"anyOf": [{"$ref": REF.format(model=name)} for name in _ERRORS]}
_STATUSES = {"400": "The body cannot be decoded", "401": "No valid API key",
             "404": "Unknown model", "408": "The body did not arrive in time",
             "413": "Over a limit (the message names it)", "422": "A bad value (param names "
             "the field)", "424": "The model failed to load", "507": "The model does not fit "
             "in its pool's memory (the message names the sizes)", "503": "Overloaded or not "
             "ready: retry after Retry-After seconds"}


def _schemas(models: Sequence[type[BaseModel]]) -> tuple[dict[str, Any], dict[str, str]]:
    """Every model's validation schema, by name, with refs into ``components.schemas``;
    and each model's ref."""
    refs, top = models_json_schema([(m, "validation") for m in models], by_alias=True,
                                   ref_template=REF)
    schemas = top.get("$defs", {})
    names = {m: refs[(m, "validation")]["$ref"].rsplit("/", 1)[1] for m in models}
    for model, name in names.items():
        _alias_choices(model, schemas[name])
    return schemas, {m.__name__: REF.format(model=names[m]) for m in models}


def _alias_choices(model: type[BaseModel], schema: dict[str, Any]) -> None:
    """Every name a field takes (``AliasChoices``: TEI's ``inputs`` beside ``texts``) as a
    property; a required field needs any one of them."""
    properties, required = schema.get("properties", {}), schema.get("required", [])
    for field_name, field in model.model_fields.items():
        choices = field.validation_alias
        if not isinstance(choices, AliasChoices):
            continue
        names = [c for c in choices.choices if isinstance(c, str)]
        if field_name not in names:
            names.append(field_name)
        shown = next(n for n in names if n in properties)
        for other in names:
            if other != shown:
                properties[other] = {**properties[shown], "description":
                                     f"another name for {shown}"}
        if shown in required:
            required.remove(shown)
            schema.setdefault("allOf", []).append(
                {"anyOf": [{"required": [n]} for n in names]})
    if "required" in schema and not required:
        del schema["required"]


_UPLOAD_SCHEMA = {
    "type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary",
                 "description": "JSON lines: {custom_id, method: POST, url, body} each"},
        "purpose": {"type": "string", "enum": ["batch"]},
        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
        "expires_after[seconds]": {"type": "integer", "description": "kept this long (at "
                                   "least an hour, at most batches.retention_s)"}}}


def _operation(method: str, path: str, op: RouteSpec, endpoint: Any,
               refs: dict[str, str]) -> dict[str, Any]:
    doc = inspect.getdoc(endpoint) or ""
    out: dict[str, Any] = {
        "summary": op.summary, "operationId": f"{method.lower()}_{path.strip('/') or 'root'}"
        .replace("/", "_").replace(".", "_"),
        "responses": {"200": {"description": op.reply,
                              "content": {media: {} for media in op.formats}}}}
    if doc:
        out["description"] = doc
    if op.public:
        out["security"] = []
    parameters = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in re.findall(r"{(\w+)}", path)]
    if parameters:
        out["parameters"] = parameters
    if op.upload:
        out["requestBody"] = {"required": True, "content": {"multipart/form-data": {
            "schema": _UPLOAD_SCHEMA}}}
    if op.body is not None:
        schema = {"$ref": refs[op.body.__name__]}
        out["requestBody"] = {"required": True, "content": {
            JSON: {"schema": schema}, MSGPACK: {"schema": schema}}}
    error = {"content": {JSON: {"schema": _ERROR_SCHEMA}}}
    for code, why in _STATUSES.items():
        if op.body is None and code in ("400", "408", "413", "422"):
            continue
        if op.public and code == "401":
            continue
        out["responses"][code] = {"description": why, **error}
    return out


def document(routes: Sequence[Any], title: str = "Blitz",
             version: str = "1") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (Starlette ``Route``\\ s). Raises
    ``LookupError`` for a route (method and path) that ``OPERATIONS`` has no entry for."""
    missing = [f"{m} {r.path}" for r in routes for m in sorted(r.methods or ())
               if m != "HEAD" and (m, r.path) not in OPERATIONS]
    if missing:
        raise LookupError(f"routes with no entry in blitz.http.routes.table.ROUTES: "
                          f"{', '.join(missing)}; declare them there")
    bodies = list(dict.fromkeys(op.body for op in OPERATIONS.values() if op.body))
    schemas, refs = _schemas(bodies)
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        for method in sorted(route.methods or ()):
            if method != "HEAD":
                paths.setdefault(route.path, {})[method.lower()] = _operation(
                    method, route.path, OPERATIONS[(method, route.path)], route.endpoint, refs)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": (
            "Embeddings, reranking, classification and tokenization, in Blitz's API and its "
            "peers' (Hugging Face TEI, Infinity, Cohere, OpenAI). Bodies are JSON or msgpack "
            "(Content-Type); the reply's format is what Accept names, else the body's.")},
        "paths": paths,
        "components": {"schemas": {**schemas, **_ERRORS}, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "An API key, when auth.api_keys is set"}}},
        "security": [{"bearer": []}],
    }


def _schema_html(schema: dict[str, Any], schemas: dict[str, Any], depth: int = 0) -> str:
    """A schema as a nested list of its properties (a ``$ref`` followed, once deep)."""
    ref = schema.get("$ref")
    if ref:
        schema = schemas.get(ref.rsplit("/", 1)[1], {})
    if depth > 2 or "properties" not in schema:
        return f"<code>{html.escape(_type_of(schema))}</code>"
    required = set(schema.get("required", []))
    for group in schema.get("allOf", []):  # a field of several names (_alias_choices)
        for choice in group.get("anyOf", []):
            required.update(choice.get("required", []))
    items = []
    for name, prop in schema["properties"].items():
        need = " <b>required</b>" if name in required else ""
        about = prop.get("description", "")
        nested = _schema_html(prop, schemas, depth + 1) if "$ref" in prop else \
            f"<code>{html.escape(_type_of(prop))}</code>"
        items.append(f"<li><code>{html.escape(name)}</code>{need}: {nested}"
                     f"{' — ' + html.escape(about) if about else ''}</li>")
    return f"<ul>{''.join(items)}</ul>"


def _type_of(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    if "enum" in schema:
        return " | ".join(repr(v) for v in schema["enum"])
    if "const" in schema:
        return repr(schema["const"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(_type_of(s) for s in schema[key])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"[{_type_of(schema.get('items', {}))}]"
    return " | ".join(kind) if isinstance(kind, list) else str(kind)


def docs_page(doc: dict[str, Any]) -> str:
    """``doc`` (``document``'s) as one self-contained HTML page: per route its method,
    summary, request schema and reply."""
    e, schemas = html.escape, doc["components"]["schemas"]
    parts = [f"<h1>{e(doc['info']['title'])} API</h1><p>{e(doc['info']['description'])}</p>"
             "<p>The machine-readable document: <a href=\"openapi.json\">openapi.json</a>."
             "</p>"]
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            key = "no key needed" if op.get("security") == [] else "needs an API key"
            parts.append(f"<section><h2><span class=\"m\">{e(method.upper())}</span> "
                         f"<code>{e(path)}</code></h2><p><b>{e(op['summary'])}</b> "
                         f"({key})</p>")
            if "description" in op:
                parts.append(f"<pre>{e(op['description'])}</pre>")
            body = op.get("requestBody")
            if body and JSON in body["content"]:
                parts.append("<h3>Request (JSON or msgpack)</h3>" + _schema_html(
                    body["content"][JSON]["schema"], schemas))
            elif body:  # an upload
                parts.append("<h3>Request (multipart/form-data)</h3>" + _schema_html(
                    body["content"]["multipart/form-data"]["schema"], schemas))
            ok = op["responses"]["200"]
            kinds = ", ".join(ok["content"])
            parts.append(f"<h3>Reply ({e(kinds)})</h3><p>{e(ok['description'])}</p>"
                         "</section>")
    style = ("body{font-family:sans-serif;max-width:60em;margin:auto;padding:1em}"
             "section{border-top:1px solid #ccc}.m{color:#06c}pre{white-space:pre-wrap}")
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
            f"{e(doc['info']['title'])} API</title><style>{style}</style></head><body>"
            f"{''.join(parts)}</body></html>")
