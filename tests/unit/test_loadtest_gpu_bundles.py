"""loadtest.gpu_bundles.strip_wheel: a wheel rewritten without some folders keeps the rest
byte for byte and a RECORD that lists exactly what it holds (pip installs by it)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile

import pytest

from loadtest.gpu_bundles import strip_wheel

FILES = {"pkg/__init__.py": b"x = 1\n", "pkg/jars/big.jar": b"J" * 1000,
         "pkg/sub/mod.py": b"y = 2\n", "pkg/subway.py": b"z = 3\n"}
RECORD = "pkg-1.0.dist-info/RECORD"


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(tmp_path):
    path = tmp_path / "pkg-1.0-py3-none-any.whl"
    rows = [[name, _hash(data), str(len(data))] for name, data in FILES.items()]
    rows.append([RECORD, "", ""])
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in FILES.items():
            z.writestr(name, data)
        z.writestr(RECORD, buf.getvalue())
    return path


def test_dropped_folders_leave_the_wheel_and_its_record(tmp_path):
    wheel = _wheel(tmp_path)
    strip_wheel(wheel, ("pkg/jars/", "pkg/sub/"), ())
    with zipfile.ZipFile(wheel) as z:
        assert sorted(z.namelist()) == sorted(["pkg/__init__.py", RECORD, "pkg/subway.py"])
        assert z.read("pkg/subway.py") == FILES["pkg/subway.py"]  # a prefix is a folder
        listed = [row[0] for row in csv.reader(io.StringIO(z.read(RECORD).decode())) if row]
    assert sorted(listed) == sorted(["pkg/__init__.py", RECORD, "pkg/subway.py"])


def test_a_file_to_strip_that_is_not_there_fails(tmp_path):
    with pytest.raises(SystemExit, match="nothing to strip"):
        strip_wheel(_wheel(tmp_path), (), ("pkg/not_here.so",))


def test_only_folders_it_built_are_emptied(tmp_path):
    from loadtest.gpu_bundles import MARKER, fresh

    theirs = tmp_path / "a"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("someone's")
    with pytest.raises(SystemExit, match="not built by"):
        fresh(theirs)
    assert (theirs / "notes.txt").read_text() == "someone's"

    ours = tmp_path / "b"
    fresh(ours)
    (ours / "old.whl").write_text("x")
    fresh(ours)  # rebuilt: emptied, marked again
    assert sorted(p.name for p in ours.iterdir()) == [MARKER]
