"""Check Hopper's Hopper-Signature header in a Python app.

    python3 verify.py KEY_FILE SIGNATURE < body     exit 0: genuine, 1: refused
"""
import hashlib
import hmac
import sys
import time

WINDOW = 300  # seconds: a signature older or newer than this is refused (a replay)


def verify(key, signature, body, now=None):
    """True when signature ("t=<unix seconds>,v1=<hex>") is key's HMAC-SHA256
    of "<t>.<body>" and t is within WINDOW of now."""
    fields = dict(p.split("=", 1) for p in signature.split(",") if "=" in p)
    t, v1 = fields.get("t", ""), fields.get("v1", "")
    if not t.isdigit() or abs((time.time() if now is None else now) - int(t)) > WINDOW:
        return False
    want = hmac.new(key, t.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, v1)


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        key = f.read().rstrip(b"\r\n")  # Hopper drops the file's trailing newline too
    if not verify(key, sys.argv[2], sys.stdin.buffer.read()):
        sys.exit("refused: bad signature or outside the %d s window" % WINDOW)
