"""`vllm serve`'s flags for the HTTP layer: HTTPS (--ssl-keyfile, --ssl-certfile, --ssl-ca-certs, --ssl-cert-reqs),
checked before the port is bound and handed to uvicorn.Config as its own options; the access log; a proxy's
path prefix (--root-path) and X-Request-Id headers, which the app serves (http_middleware)."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

CERT_REQS = {int(ssl.CERT_NONE): "none", int(ssl.CERT_OPTIONAL): "optional", int(ssl.CERT_REQUIRED): "required"}


def add_http_flags(serve: argparse.ArgumentParser) -> None:
    """vLLM's HTTPS flags (uvicorn's ssl options)."""
    add = serve.add_argument
    add("--ssl-certfile", default=None, metavar="FILE",
        help="serve HTTPS with this PEM certificate (chain), its key in --ssl-keyfile or in this file "
        "(default: plain HTTP)")
    add("--ssl-keyfile", default=None, metavar="FILE", help="with --ssl-certfile: the certificate's PEM private key")
    add("--ssl-ca-certs", default=None, metavar="FILE",
        help="with --ssl-certfile: the CA certificates client certificates are checked against (--ssl-cert-reqs)")
    add("--ssl-cert-reqs", type=int, default=int(ssl.CERT_NONE), metavar="N",
        help="Python's ssl.VerifyMode for client certificates: 0 none asked, 1 checked when sent, 2 required "
        "(with --ssl-ca-certs) (default: %(default)s)")
    add("--root-path", default="", metavar="PREFIX",
        help="behind a proxy that routes PREFIX (e.g. /api) to this server: routes answer under PREFIX as well "
        "as without it (default: none)")
    add("--enable-request-id-headers", action="store_true",
        help="every response carries X-Request-Id: the request's own, else a fresh one")
    add("--disable-uvicorn-access-log", action="store_true",
        help="no line per request in uvicorn's log (at --log-level info and below)")
    add("--disable-fastapi-docs", action="store_true",
        help="accepted for vLLM's command lines: jaxinfer never serves /docs, /redoc or /openapi.json")


def root_path(args: argparse.Namespace) -> str:
    """--root-path, checked: "" or a path that starts with / and does not end with one."""
    value = args.root_path
    if value and (not value.startswith("/") or value.endswith("/") or any(c in value for c in "?#% ")):
        raise ValueError(f"--root-path {value!r} is not a path prefix: give one like '/api' (a leading /, no "
                         "trailing /, no query or spaces)")
    return value


def uvicorn_options(args: argparse.Namespace) -> dict:
    """uvicorn.Config's options from the flags (HTTPS, the access log), checked as ssl_options checks them."""
    return dict(access_log=not args.disable_uvicorn_access_log, **ssl_options(args))


def ssl_options(args: argparse.Namespace) -> dict:
    """uvicorn.Config's ssl_* options from the flags ({} for plain HTTP), after loading them into a context as
    uvicorn will, so a missing file, a key that does not match or a bad mode is a ValueError naming the flag."""
    given = {flag for flag in ("--ssl-keyfile", "--ssl-ca-certs") if getattr(args, _dest(flag)) is not None}
    if args.ssl_cert_reqs != ssl.CERT_NONE:
        given.add("--ssl-cert-reqs")
    if args.ssl_certfile is None:
        if given:
            raise ValueError(f"{', '.join(sorted(given))} go with --ssl-certfile FILE (HTTPS's certificate)")
        return {}
    if args.ssl_cert_reqs not in CERT_REQS:
        raise ValueError(f"--ssl-cert-reqs {args.ssl_cert_reqs} is not an ssl.VerifyMode; accepted: "
                         + ", ".join(f"{value} ({name})" for value, name in CERT_REQS.items()))
    if args.ssl_cert_reqs != ssl.CERT_NONE and args.ssl_ca_certs is None:
        raise ValueError(f"--ssl-cert-reqs {args.ssl_cert_reqs} checks client certificates: give --ssl-ca-certs FILE, "
                         "the CAs they are checked against")
    for flag in ("--ssl-certfile", "--ssl-keyfile", "--ssl-ca-certs"):
        path = getattr(args, _dest(flag))
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{flag} {path}: no such file")
    _load_context(args)
    return dict(ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile, ssl_ca_certs=args.ssl_ca_certs,
                ssl_cert_reqs=args.ssl_cert_reqs)


def _load_context(args: argparse.Namespace) -> None:
    """The server's SSL context built once and dropped: uvicorn builds its own when it starts."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    except (ssl.SSLError, ValueError) as error:
        raise ValueError(f"--ssl-certfile {args.ssl_certfile} / --ssl-keyfile {args.ssl_keyfile}: the certificate "
                         f"and its key do not load ({error})") from None
    if args.ssl_ca_certs is not None:
        try:
            context.load_verify_locations(args.ssl_ca_certs)
        except ssl.SSLError as error:
            raise ValueError(f"--ssl-ca-certs {args.ssl_ca_certs}: no PEM CA certificates in it ({error})") from None


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")
