"""Where one checkout's scrape goes, in-process: collect (every collector and the flight
tail), then client_python's text and OpenMetrics encoders and gzip over what it collected
(the text encoder is the checkout's own where it had one). Run by bench_scrape_stack.py with
PYTHONPATH naming the checkout's exporter/:

    python3 bench/bench_scrape_split.py CHECKOUT SCRAPES DAEMON-FLAGS...
"""

from __future__ import annotations

import argparse
import gc
import gzip
import sys
import time
from collections.abc import Callable, Iterable
from itertools import pairwise

from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import CollectorRegistry

from bench_scrape import percentile
from rankscope.daemon import cli


class Collected:
    def __init__(self, families: list[object]) -> None:
        self.families = families

    def collect(self) -> Iterable[object]:
        return iter(self.families)


def text_encoder() -> Callable[[CollectorRegistry], bytes]:
    try:  # the hand-written encoder of the code before client_python's exposition
        from rankscope.daemon.exposition import generate_text  # type: ignore[import-not-found]
    except ImportError:
        return generate_latest
    return generate_text  # type: ignore[no-any-return]


def main(argv: list[str]) -> None:
    checkout, scrapes, flags = argv[0], int(argv[1]), argv[2:]
    parser = argparse.ArgumentParser()
    cli.configure_parser(parser, "serve")
    daemon = cli.build(parser.parse_args([*flags, "--log.level=error"]))
    daemon.sources.start()
    time.sleep(3)  # the first card sample and flight tail
    gc.freeze()  # as the daemon does before it serves
    encode_text = text_encoder()
    names = ("collect", "text", "openmetrics", "gzip-1", "gzip-6")
    steps: dict[str, list[float]] = {name: [] for name in names}
    try:
        for _ in range(scrapes):
            start = time.perf_counter()
            registry = CollectorRegistry(auto_describe=False)
            registry.register(Collected(list(daemon.collectors.collect())))  # type: ignore[arg-type]
            times = [time.perf_counter()]
            body = encode_text(registry)
            times.append(time.perf_counter())
            generate_openmetrics(registry)
            times.append(time.perf_counter())
            for level in (1, 6):
                gzip.compress(body, compresslevel=level)
                times.append(time.perf_counter())
            for step, (t0, t1) in zip(steps.values(), pairwise([start, *times]), strict=True):
                step.append(t1 - t0)
    finally:
        daemon.sources.stop()
    split = "  ".join(f"{name} {percentile(v, 0.5) * 1e3:5.1f}" for name, v in steps.items())
    print(f"{checkout}: p50 ms  {split}  ({len(body)} bytes)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
