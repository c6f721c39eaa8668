"""Check Hopper's Hopper-Signature header in a Python app.

    python3 verify.py KEY_FILE SIGNATURE < body     exit 0: genuine (prints the delivery id), 1: refused
"""
import hashlib
import hmac
import sys
import time

# seconds: a signature older or newer than this is refused. A request played again within it
# carries the id of the first: refuse it by remembering, for the window, the ids processed.
WINDOW = 300


def verify(key, signature, body, now=None):
    """The delivery id when signature ("t=<unix seconds>,id=<id>,v1=<hex>,v2=<hex>") has v2 =
    key's HMAC-SHA256 of "<t>.<id>.<body>" and t is within WINDOW of now, else None. v1 (over
    "<t>.<body>" only) is not checked: it does not cover the id."""
    fields = dict(p.split("=", 1) for p in signature.split(",") if "=" in p)
    t, msg_id, v2 = fields.get("t", ""), fields.get("id"), fields.get("v2", "")
    if not t.isdigit() or abs((time.time() if now is None else now) - int(t)) > WINDOW:
        return None
    if msg_id is None or not v2:
        return None
    want = hmac.new(key, f"{t}.{msg_id}.".encode() + body, hashlib.sha256).hexdigest()
    return msg_id if hmac.compare_digest(want, v2) else None


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        key = f.read().rstrip(b"\r\n")  # Hopper drops the file's trailing newline too
    delivery_id = verify(key, sys.argv[2], sys.stdin.buffer.read())
    if delivery_id is None:
        sys.exit("refused: bad signature or outside the %d s window" % WINDOW)
    print(delivery_id)
