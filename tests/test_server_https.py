"""`jaxinfer serve` with vLLM's HTTP flags: HTTPS (--ssl-*: a certificate made here, a real server, the official
openai client trusting only that certificate; a client certificate required with --ssl-cert-reqs 2), and on the
same server --root-path, --enable-request-id-headers, --uvicorn-log-level, --disable-uvicorn-access-log,
--override-generation-config (max_new_tokens: the cap on every request's max_tokens), --response-role,
--return-tokens-as-token-ids and the request log flags; /api/health answers the warm-up status."""

from __future__ import annotations

import argparse
import re
import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
from live_server import start_serve, wait_ready

from jaxinfer.entrypoints.openai.http_flags import root_path, ssl_options, uvicorn_options
from jaxinfer.entrypoints.openai.launch import add_serve_parser
from jaxinfer.entrypoints.openai.request_log import RequestLog
from jaxinfer.entrypoints.openai.vllm_flags import request_log, response_role

TINY = ["--max-model-len", "32", "--max-num-seqs", "1", "--max-num-batched-tokens", "16", "--decode-steps", "1",
        "--skip-warmup"]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(certificate, key) of a self-signed certificate for 127.0.0.1, its own CA."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed: no certificate to serve HTTPS with")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-addext", "keyUsage=critical,digitalSignature,keyCertSign"],
                   check=True, capture_output=True)
    return cert, key


def _https(cert: Path, client_cert: tuple[Path, Path] | None) -> httpx.Client:
    """An HTTPS client trusting `cert` alone, presenting `client_cert` (certificate, key) when given."""
    context = ssl.create_default_context(cafile=str(cert))
    if client_cert is not None:
        context.load_cert_chain(*map(str, client_cert))
    return httpx.Client(verify=context, timeout=60)


def _client(base_url: str, http: httpx.Client) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0, http_client=http)


def test_https_with_a_required_client_certificate_behind_a_path_prefix(text_model_dir, certificate):
    cert, key = certificate
    http_flags = ["--root-path", "/api", "--enable-request-id-headers", "--uvicorn-log-level", "info",
                  "--disable-uvicorn-access-log", "--disable-fastapi-docs",
                  "--generation-config", "vllm", "--override-generation-config",
                  '{"temperature": 0, "max_new_tokens": 5}',
                  "--response-role", "bot", "--return-tokens-as-token-ids", "--enable-log-requests",
                  "--enable-log-outputs", "--max-log-len", "1"]
    process, lines, url = start_serve(["--model", str(text_model_dir), *TINY, "--ssl-certfile", str(cert),
                                       "--ssl-keyfile", str(key), "--ssl-ca-certs", str(cert),
                                       "--ssl-cert-reqs", "2", *http_flags])
    try:
        assert url.startswith("https://127.0.0.1:"), lines.text
        http = _https(cert, client_cert=certificate)
        early = http.get(url + "/api/health")  # the model is still loading (or, on a fast machine, ready)
        assert early.status_code == 200 or early.json()["status"] == "warming up", early.text
        wait_ready(process, lines)
        client = _client(url + "/api", http)  # as a proxy forwards /api/... unchanged
        assert [model.id for model in client.models.list()] == [text_model_dir.name]
        assert http.get(url + "/v1/models").status_code == 200  # as a proxy that strips /api forwards it
        assert http.get(url + "/api2/v1/models").status_code == 404
        assert http.get(url + "/api/health", headers={"X-Request-Id": "abc-1"}).headers["x-request-id"] == "abc-1"
        assert re.fullmatch("[0-9a-f]{32}", http.get(url + "/api/v1/models").headers["x-request-id"])
        assert http.get(url + "/docs").status_code == 404
        greedy = [client.completions.create(model=text_model_dir.name, prompt="a b", max_tokens=4, **given)
                  for given in ({}, {}, {"temperature": 0})]  # the override's temperature 0 where none is given
        assert greedy[0].choices[0].text == greedy[1].choices[0].text == greedy[2].choices[0].text
        capped = [client.completions.create(model=text_model_dir.name, prompt="a b", max_tokens=8,
                                            extra_body={"ignore_eos": True}),  # vLLM's cap: max_new_tokens 5
                  client.chat.completions.create(model=text_model_dir.name, messages=[{"role": "user", "content": "a"}],
                                                 extra_body={"ignore_eos": True})]  # and the default of none
        assert [reply.usage.completion_tokens for reply in capped] == [5, 5]
        scored = client.completions.create(model=text_model_dir.name, prompt="a b", max_tokens=2, logprobs=1)
        assert all(re.fullmatch(r"token_id:\d+", token) for token in scored.choices[0].logprobs.tokens)
        chat = client.chat.completions.create(model=text_model_dir.name, messages=[{"role": "user", "content": "a"}],
                                              max_tokens=1, logprobs=True, top_logprobs=1)
        assert chat.choices[0].message.role == "bot"
        assert re.fullmatch(r"token_id:\d+", chat.choices[0].logprobs.content[0].top_logprobs[0].token)
        assert "INFO:     Started server process" in lines.text  # uvicorn's info level
        assert "/v1/models HTTP/1.1" not in lines.text  # without its access log
        logged = re.search(r"jaxinfer: request (\S+): prompt_token_ids \[\d+\] \((\d+)\), params ", lines.text)
        assert logged and int(logged.group(2)) > 1, lines.text  # one id of the prompt's: --max-log-len 1
        assert re.search(rf"jaxinfer: output {re.escape(logged.group(1))}\[0\]: '.?', token_ids \[\d+\] \(4\), "
                         "finish_reason length", lines.text), lines.text
        with pytest.raises(openai.APIConnectionError):  # no client certificate: the handshake fails
            _client(url, _https(cert, client_cert=None)).models.list()
        with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP to an HTTPS port
            httpx.get(url.replace("https", "http") + "/health", timeout=10)
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0


def _parse(*argv: str) -> argparse.Namespace:
    commands = argparse.ArgumentParser(prog="jaxinfer").add_subparsers()
    add_serve_parser(commands)
    return commands.choices["serve"].parse_args(list(argv))


def test_the_http_flags_become_uvicorns_and_the_apps_options(certificate):
    cert, key = certificate
    assert ssl_options(_parse()) == {}
    assert ssl_options(_parse("--ssl-certfile", str(cert), "--ssl-keyfile", str(key))) == dict(
        ssl_certfile=str(cert), ssl_keyfile=str(key), ssl_ca_certs=None, ssl_cert_reqs=0)
    assert uvicorn_options(_parse("--disable-uvicorn-access-log")) == dict(access_log=False)
    assert _parse("--uvicorn-log-level", "trace").log_level == "trace" and _parse().log_level == "warning"
    assert root_path(_parse("--root-path", "/a/b")) == "/a/b" and root_path(_parse()) == ""
    assert response_role(_parse("--response-role", "bot")) == "bot" and response_role(_parse()) == "assistant"
    with pytest.raises(ValueError, match=re.escape("--response-role ' ' is blank; give a role name")):
        response_role(_parse("--response-role", " "))
    assert request_log(_parse("--enable-log-outputs", "--max-log-len", "8")) == RequestLog(False, True, 8)
    with pytest.raises(ValueError, match=re.escape("--max-log-len must be >= 0, got -1")):
        request_log(_parse("--max-log-len", "-1"))
    for bad in ("api", "/api/", "/a?b"):
        with pytest.raises(ValueError, match=re.escape(f"--root-path {bad!r} is not a path prefix")):
            root_path(_parse("--root-path", bad))


@pytest.mark.parametrize("argv, message", [
    (["--ssl-keyfile", "{key}"], "--ssl-keyfile go with --ssl-certfile FILE"),
    (["--ssl-ca-certs", "{cert}", "--ssl-cert-reqs", "2"], "--ssl-ca-certs, --ssl-cert-reqs go with --ssl-certfile"),
    (["--ssl-certfile", "/nonexistent.pem"], "--ssl-certfile /nonexistent.pem: no such file"),
    (["--ssl-certfile", "{cert}"], "--ssl-certfile {cert} / --ssl-keyfile None: the certificate and its key do not"),
    (["--ssl-certfile", "{key}", "--ssl-keyfile", "{key}"], "the certificate and its key do not load"),
    (["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}", "--ssl-cert-reqs", "3"],
     "--ssl-cert-reqs 3 is not an ssl.VerifyMode; accepted: 0 (none), 1 (optional), 2 (required)"),
    (["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}", "--ssl-cert-reqs", "2"], "give --ssl-ca-certs FILE"),
    (["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}", "--ssl-ca-certs", "{key}"],
     "--ssl-ca-certs {key}: no PEM CA certificates in it"),
])
def test_ssl_flags_that_cannot_be_served_are_refused_by_name(certificate, argv, message):
    names = dict(cert=certificate[0], key=certificate[1])
    with pytest.raises(ValueError, match=re.escape(message.format(**names))):
        ssl_options(_parse(*(arg.format(**names) for arg in argv)))
