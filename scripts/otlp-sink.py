#!/usr/bin/env python3
"""An OTLP/HTTP trace sink: answers every export to /v1/traces with success and keeps nothing.

    scripts/otlp-sink.py PORT

For measuring what tracing costs the gateway (`--enable-trace --otlp-traces-protocol http
--otlp-traces-endpoint 127.0.0.1:PORT`) without a collector's own work in the way; it counts
the exports and bytes it took and prints them when stopped. Standard library only.
"""

import http.server
import signal
import sys

taken = {"exports": 0, "bytes": 0}


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length", 0))
        self.rfile.read(length)
        taken["exports"] += 1
        taken["bytes"] += length
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink)

    def stop(*_):
        print(f"exports {taken['exports']}, bytes {taken['bytes']}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()


if __name__ == "__main__":
    main()
