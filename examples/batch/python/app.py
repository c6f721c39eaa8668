"""A batch handler for Hopper (consumer.batch): one POST carries many
messages, and the answer settles each one on its own. Standard library only.

    PORT=8080 python3 app.py
"""
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def handle(entry):
    """Processes one message. Its status settles it as if it had come
    alone: 2xx acks it, 422 (a 4xx) dead-letters it, a 5xx retries it."""
    order = entry.get("data")  # absent when the body is not JSON (then data_base64)
    if not isinstance(order, dict) or not isinstance(order.get("qty"), int) or order["qty"] <= 0:
        return {"id": entry["id"], "status": 422, "error": "qty must be a positive integer"}
    return {"id": entry["id"], "status": 200}


class Batch(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: Hopper reuses its connections

    def do_POST(self):
        batch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps({"results": [handle(e) for e in batch["entries"]]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8080"))), Batch)
print("listening on 127.0.0.1:%d" % server.server_address[1], flush=True)
server.serve_forever()
