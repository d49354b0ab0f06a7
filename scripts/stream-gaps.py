#!/usr/bin/env python3
"""Time to first token and the gaps between streamed tokens, as a client sees them.

    scripts/stream-gaps.py PORT STREAMS [REQUESTS_PER_STREAM]

STREAMS keep-alive connections each stream REQUESTS_PER_STREAM chat completions (200 tokens)
from 127.0.0.1:PORT, one after another, and the gaps between consecutive content events are
summarised. Run it against an engine and against gateways in front of the same engines: what a
gateway adds shows in the first token, in the tail of the gaps, and in the share of events that
arrive together (gaps under 1 ms), which is a relay batching events. Standard library only.
"""

import http.client
import json
import sys
import threading
import time

BODY = json.dumps(
    {
        "model": "m",
        "messages": [{"role": "user", "content": "tell me a story"}],
        "max_tokens": 200,
        "stream": True,
    }
)


def stream(conn, gaps, first_tokens, failures, lock):
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", BODY, {"content-type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        response.read()
        with lock:
            failures.append(response.status)
        return
    last, mine = None, []
    while line := response.readline():
        if line.startswith(b"data: [DONE]"):
            break
        if not line.startswith(b"data: ") or b'"content"' not in line:
            continue
        now = time.perf_counter()
        if last is None:
            with lock:
                first_tokens.append(now - start)
        else:
            mine.append(now - last)
        last = now
    response.read()
    with lock:
        gaps.extend(mine)


def main():
    port, streams = int(sys.argv[1]), int(sys.argv[2])
    per_stream = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    gaps, first_tokens, failures, lock = [], [], [], threading.Lock()

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for _ in range(per_stream):
            stream(conn, gaps, first_tokens, failures, lock)
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not gaps:
        sys.exit(f"no events arrived ({len(failures)} requests failed: {failures[:3]})")
    gaps.sort()
    first_tokens.sort()

    def ms(values, q):
        return values[int(q * (len(values) - 1))] * 1000

    together = sum(g < 0.001 for g in gaps) / len(gaps) * 100
    print(
        f"streams {streams}, events {len(gaps)}, failed {len(failures)}: "
        f"gap p50 {ms(gaps, 0.5):.2f} ms, p90 {ms(gaps, 0.9):.2f}, p99 {ms(gaps, 0.99):.2f}; "
        f"under 1 ms {together:.1f}%; first token p50 {ms(first_tokens, 0.5):.1f} ms"
    )


if __name__ == "__main__":
    main()
