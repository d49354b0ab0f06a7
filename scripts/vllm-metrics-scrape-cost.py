#!/usr/bin/env python3
"""What one scrape of a vLLM engine's /metrics costs its API process.

vLLM serves /metrics from its API server process with prometheus_client (one process: the
default registry; several API servers: multiprocess mode, which costs more). This builds the
families vLLM's PrometheusStatLogger registers (vllm/v1/metrics/loggers.py at 005a810b: the
scheduler gauges, the token and cache counters, request_success by finish reason, and the
fourteen histograms with vLLM's own buckets, max_model_len 131072) beside prometheus_client's
default process, platform and GC collectors, fills every series, and times generate_latest,
which is what a scrape runs. Left out: prometheus_fastapi_instrumentator's HTTP families, which
vLLM also serves, so the figure is a floor.

Usage: python3 scripts/vllm-metrics-scrape-cost.py [--engines N] [--scrapes N]
Needs prometheus_client (pip install prometheus_client).
"""

import argparse
import time

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, generate_latest

LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
           60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
        7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0]
PREFILL_TOKEN = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
ITERATION = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
N_PARAM = [1, 2, 5, 10, 20]
FINISH_REASONS = ["stop", "length", "abort", "error"]


def one_two_five(limit):
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to limit."""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > limit:
                return out
            out.append(value)
        exponent += 1


def build(engines):
    labels = ["model_name", "engine"]
    tokens = one_two_five(131072)
    gauges = ["vllm:num_requests_running", "vllm:num_requests_waiting",
              "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"]
    counters = ["vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
                "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits",
                "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"]
    histograms = [
        ("vllm:request_prompt_tokens", tokens), ("vllm:request_generation_tokens", tokens),
        ("vllm:iteration_tokens_total", ITERATION),
        ("vllm:request_max_num_generation_tokens", tokens), ("vllm:request_params_n", N_PARAM),
        ("vllm:request_params_max_tokens", tokens), ("vllm:time_to_first_token_seconds", TTFT),
        ("vllm:time_per_output_token_seconds", TPOT),
        ("vllm:time_per_prefill_token_request_seconds", PREFILL_TOKEN),
        ("vllm:e2e_request_latency_seconds", LATENCY),
        ("vllm:request_queue_time_seconds", LATENCY),
        ("vllm:request_inference_time_seconds", LATENCY),
        ("vllm:request_prefill_time_seconds", LATENCY),
        ("vllm:request_decode_time_seconds", LATENCY),
    ]
    for name in gauges:
        g = Gauge(name, name, labels)
        for e in range(engines):
            g.labels("llama-3.1-8b", str(e)).set(3)
    for name in counters:
        c = Counter(name, name, labels)
        for e in range(engines):
            c.labels("llama-3.1-8b", str(e)).inc(12345)
    success = Counter("vllm:request_success", "successes", labels + ["finished_reason"])
    for e in range(engines):
        for reason in FINISH_REASONS:
            success.labels("llama-3.1-8b", str(e), reason).inc(7)
    for name, buckets in histograms:
        h = Histogram(name, name, labels, buckets=buckets)
        for e in range(engines):
            for b in buckets:
                h.labels("llama-3.1-8b", str(e)).observe(b)
    info = Gauge("vllm:cache_config_info", "cache config",
                 ["block_size", "cache_dtype", "gpu_memory_utilization", "num_gpu_blocks",
                  "enable_prefix_caching", "engine"])
    for e in range(engines):
        info.labels("16", "auto", "0.9", "27000", "True", str(e)).set(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=1, help="data-parallel engines served")
    parser.add_argument("--scrapes", type=int, default=2000)
    args = parser.parse_args()
    build(args.engines)
    body = generate_latest(REGISTRY)
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    for _ in range(50):
        generate_latest(REGISTRY)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(args.scrapes):
        generate_latest(REGISTRY)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(f"engines {args.engines}: {len(body)} bytes, {samples} samples; "
          f"{cpu / args.scrapes * 1e3:.2f} ms CPU ({wall / args.scrapes * 1e3:.2f} ms wall) "
          f"per scrape over {args.scrapes}")


if __name__ == "__main__":
    main()
