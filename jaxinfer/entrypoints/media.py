"""Images named by URL in chat messages (OpenAI's `image_url` content parts), read as vLLM reads them:
`data:` URLs decoded, http(s) URLs fetched with a timeout and a size limit, `file://` URLs only
under the directory `allowed_local_media_path` allows (vLLM's `--allowed-local-media-path`; none
by default, so a request cannot read the server's files)."""

from __future__ import annotations

import base64
import binascii
import io
import urllib.request
from pathlib import Path
from typing import Any

FETCH_TIMEOUT_S = 10.0
MAX_IMAGE_BYTES = 20 * 2**20


def image_bytes(url: str, field: str, allowed_local_media_path: Path | None) -> bytes:
    """The bytes an image URL names; ValueError naming the field when it cannot or may not be read."""
    if not isinstance(url, str):
        raise ValueError(f"{field} must be a URL string, got {type(url).__name__}")
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if not header.endswith(";base64"):
            raise ValueError(f"{field}: a data URL must be base64 (data:image/png;base64,...)")
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise ValueError(f"{field}: the data URL's base64 payload does not decode") from None
    if url.startswith(("http://", "https://")):
        return _fetch(url, field)
    if url.startswith("file://"):
        return _local_file(Path(url[len("file://"):]), field, allowed_local_media_path)
    raise ValueError(f"{field}: accepted URLs are data:, http(s):// and (with --allowed-local-media-path) file://; "
                     f"got {url[:40]!r}")


def _fetch(url: str, field: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310 (scheme checked)
            data = response.read(MAX_IMAGE_BYTES + 1)
    except OSError as error:
        raise ValueError(f"{field}: fetching {url[:80]} failed ({error})") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"{field}: the image at {url[:80]} is over {MAX_IMAGE_BYTES} bytes")
    return data


def _local_file(path: Path, field: str, allowed: Path | None) -> bytes:
    if allowed is None:
        raise ValueError(f"{field}: file:// URLs are refused unless the server allows a directory "
                         "(--allowed-local-media-path, LLM(allowed_local_media_path=...))")
    resolved, root = path.resolve(), allowed.resolve()
    if not resolved.is_relative_to(root):
        raise ValueError(f"{field}: {path} is outside the allowed local media path {root}")
    if resolved.stat().st_size > MAX_IMAGE_BYTES:
        raise ValueError(f"{field}: {path} is over {MAX_IMAGE_BYTES} bytes")
    return resolved.read_bytes()


def load_image(url: str, field: str, allowed_local_media_path: Path | None = None) -> Any:
    """The PIL image an `image_url` names (RGB); ValueError naming the field when it is not one."""
    from PIL import Image, UnidentifiedImageError

    data = image_bytes(url, field, allowed_local_media_path)
    try:
        return Image.open(io.BytesIO(data)).convert("RGB")
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{field}: not a readable image ({error})") from None
