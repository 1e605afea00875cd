#!/usr/bin/env bash
# Wheels for the GPU machine's Python 3.12 of the packages the server and the test suite need and
# its image lacks (the device README lists what it has), at the versions installed here, where the
# suite passes. They land in .whl/ (git-ignored); a device call carries it (carry [".whl"]) and
# scripts/gpu_session.sh installs them into /tmp/site before its steps.
#
#   bash scripts/gpu_wheels.sh     # ~12 MiB, from the package registry
set -eu
cd "$(dirname "$0")/.."
packages=(
    fastapi starlette uvicorn pydantic pydantic-core annotated-types typing-inspection opentelemetry-api
    openai httpx2 httpcore2 truststore jiter sniffio
    llguidance jsonschema jsonschema-specifications referencing rpds-py plotly
    peft accelerate psutil
)
pins=$(python3 - "${packages[@]}" <<'EOF'
import importlib.metadata as metadata
import sys

missing = []
for name in sys.argv[1:]:
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit(f"not installed here, so no tested version to carry: {' '.join(missing)} "
             '(pip install -e ".[test]" first)')
EOF
)
platforms=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
    manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
done
rm -rf .whl
# shellcheck disable=SC2086  # one argument per pinned package
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform any -d .whl $pins
ls .whl | wc -l | xargs echo "wheels in .whl:"
du -sh .whl
