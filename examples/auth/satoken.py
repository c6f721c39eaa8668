"""Checks the Kubernetes service-account token Hopper sends as its bearer
token, with Python's standard library only: an RS256 signature by a key of
the issuer's set (the JWKS at the issuer's jwks_uri), the issuer, the app's
own audience (never the API server's) and the expiry, with a minute of
leeway for clocks. An app with PyJWT at hand can use it instead; this shows
what it checks.

    python3 satoken.py JWKS_FILE ISSUER AUDIENCE TOKEN   (exit 0: accepted)
"""
import base64
import hashlib
import json
import sys
import time

# The DER prefix of a SHA-256 DigestInfo, as PKCS #1 v1.5 signs it.
SHA256_PREFIX = bytes.fromhex("3031300d060960864801650304020105000420")
LEEWAY = 60  # seconds


def b64(part):
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def verify(token, jwks, issuer, audience, now=None):
    """Returns the token's claims, or raises ValueError saying why not."""
    now = time.time() if now is None else now
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT")
    head = json.loads(b64(parts[0]))
    if head.get("alg") != "RS256":
        raise ValueError("token signed with %r, want RS256" % head.get("alg"))
    key = next((k for k in jwks["keys"] if k.get("kid") == head.get("kid") and k.get("kty") == "RSA"), None)
    if key is None:
        raise ValueError("no RSA key %r in the issuer's key set" % head.get("kid"))
    n = int.from_bytes(b64(key["n"]), "big")
    e = int.from_bytes(b64(key["e"]), "big")
    size = (n.bit_length() + 7) // 8
    sig = int.from_bytes(b64(parts[2]), "big")
    if sig >= n:
        raise ValueError("bad signature")
    em = pow(sig, e, n).to_bytes(size, "big")
    digest = hashlib.sha256((parts[0] + "." + parts[1]).encode()).digest()
    want = b"\x00\x01" + b"\xff" * (size - 3 - len(SHA256_PREFIX) - len(digest)) + b"\x00" + SHA256_PREFIX + digest
    if em != want:
        raise ValueError("bad signature")
    claims = json.loads(b64(parts[1]))
    aud = claims.get("aud")
    auds = [aud] if isinstance(aud, str) else (aud or [])
    if claims.get("iss") != issuer:
        raise ValueError("token issued by %r, want %r" % (claims.get("iss"), issuer))
    if audience not in auds:
        raise ValueError("token for %r, not for %r" % (auds, audience))
    if not isinstance(claims.get("exp"), int) or now > claims["exp"] + LEEWAY:
        raise ValueError("token expired")
    if isinstance(claims.get("nbf"), int) and now + LEEWAY < claims["nbf"]:
        raise ValueError("token not valid yet")
    return claims


if __name__ == "__main__":
    jwks_file, issuer, audience, token = sys.argv[1:5]
    with open(jwks_file) as f:
        jwks = json.load(f)
    try:
        claims = verify(token, jwks, issuer, audience)
    except ValueError as err:
        print("refused:", err)
        sys.exit(1)
    print("accepted:", claims.get("sub"))
