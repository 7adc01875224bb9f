"""The faults scenario's webhook: a local HTTP server that stores every POST it receives
(headers and body) as one JSON line in a file, and answers 200.

    python3 webhook_sink.py PORT OUTFILE
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Sink(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps({"path": self.path, "headers": dict(self.headers.items()),
                                "body": body.decode("utf-8", "replace")}) + "\n")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, fmt, *args):  # the requests are in OUTFILE; keep the journal to one line each
        sys.stderr.write("webhook sink: " + (fmt % args) + "\n")


HTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
