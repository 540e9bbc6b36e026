"""Image paths in ``blitz embed``'s tables and lists (issue 54, M7; ``blitz.bulk.images
.resolve``): by default only relative paths below the table's folder, on its own store;
absolute paths, ``..`` out of the folder, other protocols and stores, and URLs are each a
refused row with its reason, and nothing is read for them. ``--allow-urls PREFIX...``
fetches URLs under the prefixes with the server's checks (``blitz.images.fetch``)."""

from __future__ import annotations

import http.server
import io
import threading

import pyarrow as pa
import pytest
from pydantic import ValidationError

from blitz.bulk.images import read_image_table, resolve
from blitz.cli import _parser
from blitz.settings.bulk import BulkSettings
from blitz.settings.images import ImageSettings
from deployments.cli import add_embed_command

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64  # read, never decoded here


@pytest.mark.parametrize("path,folder,want", [
    ("a.png", "/data/t", "/data/t/a.png"),
    ("a/../b.png", "/data/t", "/data/t/b.png"),
    ("./x/c.png", "s3://bucket/t", "s3://bucket/t/x/c.png"),
    ("x/c.png", "t", "t/x/c.png"),
    ("x/c.png", "", "x/c.png"),
])
def test_relative_paths_below_the_folder_are_read_on_its_store(path, folder, want):
    assert resolve(path, folder) == (want, None)


@pytest.mark.parametrize("path,folder,why", [
    ("/etc/passwd", "/data/t", "an absolute path"),
    ("/other/c.png", "s3://bucket/t", "an absolute path"),
    ("~/secret.png", "/data/t", "an absolute path"),
    ("../../etc/passwd", "/data/t", "'..' leads out"),
    ("a/../../t2/x.png", "/data/t", "'..' leads out"),
    ("../other-bucket/c.png", "s3://bucket", "'..' leads out"),
    ("..", "/data/t", "'..' leads out"),
    ("../x.png", "", "'..' leads out"),
    ("file:///etc/shadow", "/data/t", "another protocol"),
    ("file:/etc/shadow", "/data/t", "another protocol"),
    ("s3://other-bucket/c.png", "s3://bucket/t", "another protocol"),
    ("gs://b/c.png", "s3://bucket/t", "another protocol"),
    ("simplecache::s3://b/c.png", "s3://bucket/t", "another protocol"),
    ("http://169.254.169.254/latest/meta-data/", "/data/t", "--allow-urls"),
    ("HTTPS://[::1]:8265/api/jobs/", "s3://bucket/t", "--allow-urls"),
])
def test_other_paths_are_refused_with_their_reason(path, folder, why):
    source, reason = resolve(path, folder)
    assert source == path and reason is not None and why in reason, reason


class Served(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self):  # noqa: N802 - the handler's name
        Served.seen.append(self.path)
        self.send_response(200)
        self.send_header("content-length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *_):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Served)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def read_table(tmp_path, paths: list[str], url_limits: ImageSettings | None = None
               ) -> tuple[list[str], list[bytes]]:
    csv = "path\n" + "".join(f"{p}\n" for p in paths)
    [rows] = list(read_image_table(
        io.BytesIO(csv.encode()), "csv", 0, str(tmp_path / "t" / "table.csv"),
        image_column="path", id_column="id", batch_rows=64, max_row_bytes=1 << 16,
        max_image_bytes=1 << 20, url_limits=url_limits))
    assert isinstance(rows, pa.Table)
    return rows.column("_refused").to_pylist(), rows.column("_image").to_pylist()


def test_a_table_s_hostile_paths_are_refused_rows_and_nothing_is_read(tmp_path, server):
    (tmp_path / "t" / "img").mkdir(parents=True)
    (tmp_path / "t" / "img" / "a.png").write_bytes(PNG)
    (tmp_path / "secret.png").write_bytes(PNG)  # beside the table's folder
    Served.seen.clear()
    refused, images = read_table(tmp_path, [
        "img/a.png", "../secret.png", str(tmp_path / "secret.png"),
        f"file://{tmp_path / 'secret.png'}", f"http://{server}/a.png"])
    assert refused[0] == "" and images[0] == PNG
    assert all(refused[1:]) and images[1:] == [b""] * 4
    assert "'..'" in refused[1] and "absolute" in refused[2]
    assert "another protocol" in refused[3] and "--allow-urls" in refused[4]
    assert Served.seen == []


def test_urls_are_fetched_under_allow_urls_with_the_server_s_checks(tmp_path, server):
    (tmp_path / "t").mkdir()
    Served.seen.clear()
    options = BulkSettings(allow_urls=[f"http://{server}/ok/"])
    limits = ImageSettings.model_validate({"url_allow": options.allow_urls})
    refused, images = read_table(tmp_path, [
        f"http://{server}/ok/a.png", f"http://{server}/other/a.png",
        f"http://{server}/ok/../other/a.png", f"http://{server}/ok/%2e%2e/other/a.png",
        f"http://localhost:{server.partition(':')[2]}/ok/a.png"], limits)
    assert refused[0] == "" and images[0] == PNG  # an address literal is listed by itself
    assert "under --allow-urls" in refused[1]
    assert "'..'" in refused[2] and "%2e" in refused[3]
    assert "not under --allow-urls" in refused[4]
    assert Served.seen == ["/ok/a.png"]

    port = server.partition(":")[2]  # a name that resolves to a loopback address
    by_name = ImageSettings(url_allow=[f"http://localhost:{port}/ok/"])
    refused, _ = read_table(tmp_path, [f"http://localhost:{port}/ok/a.png"], by_name)
    assert "loopback" in refused[0] and "images.url_allow_private" in refused[0]
    assert Served.seen == ["/ok/a.png"]


def test_the_allow_urls_flag_takes_prefixes_that_end_in_a_slash(tmp_path):
    args = _parser(extend=add_embed_command).parse_args(
        ["embed", "in", "out", "--allow-urls", "https://img.example.com/a/",
         "http://cdn.example.com/"])
    assert args.allow_urls == ["https://img.example.com/a/", "http://cdn.example.com/"]
    assert _parser(extend=add_embed_command).parse_args(["embed", "in", "out"]).allow_urls == []
    with pytest.raises(ValidationError, match="must end in '/'"):
        BulkSettings(allow_urls=["https://img.example.com/a"])
    with pytest.raises(ValidationError, match="http"):
        BulkSettings(allow_urls=["file:///etc/"])


def test_the_job_hands_its_readers_the_url_checks_only_with_allow_urls():
    from blitz.bulk.plan import job_payloads
    from blitz.bulk.units import Unit
    from blitz.settings.registry import ModelSpec

    units = [Unit(index=0, file="/in/t.csv", url="/in/t.csv", kind="csv",
                  directory="/out/t", fingerprint={"size": 1, "version": "e"})]
    spec = ModelSpec(id="m", source="fake:4")
    config = ImageSettings(max_bytes=1234, url_allow=["https://server.example.com/"],
                           url_allow_private=["img.internal"])
    plain = job_payloads(units, spec, BulkSettings(image_column="path"), "cpu", "/c",
                         images=True, limits=config)
    assert plain["read_kwargs"]["images"]["url_limits"] is None  # not the server's list
    options = BulkSettings(image_column="path", allow_urls=["https://img.example.com/a/"])
    got = job_payloads(units, spec, options, "cpu", "/c", images=True, limits=config)
    limits = got["read_kwargs"]["images"]["url_limits"]
    assert limits.url_allow == ["https://img.example.com/a/"]
    assert (limits.max_bytes, limits.url_allow_private) == (1234, ["img.internal"])
