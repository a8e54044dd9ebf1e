#!/usr/bin/env bash
# Regenerate src/atoll/wire/atoll_pb2.py and atoll_pb2_grpc.py from atoll.proto (needs
# grpcio-tools, a dev dependency), and make the generated import package-relative.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m grpc_tools.protoc -I src/atoll/wire \
  --python_out=src/atoll/wire --grpc_python_out=src/atoll/wire src/atoll/wire/atoll.proto
sed -i 's/^import atoll_pb2 as atoll__pb2$/from . import atoll_pb2 as atoll__pb2/' \
  src/atoll/wire/atoll_pb2_grpc.py
echo "generated src/atoll/wire/atoll_pb2.py src/atoll/wire/atoll_pb2_grpc.py"
