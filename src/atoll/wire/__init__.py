"""atoll's wire protocol over gRPC: protobuf messages (atoll.proto, package atoll.v1), chunked
fragment transfer with a crc32 per fragment, the shared-secret check and TLS credentials.

Generated modules: atoll_pb2, atoll_pb2_grpc (regenerate with scripts/gen_proto.sh).
Helpers: chunks.py (split and reassemble payloads), auth.py (secret, metadata, interceptor, TLS).
"""

# 2: pull schedule (LearnerSettings.schedule); 3: inline update payloads, the Pulls stream
PROTOCOL = 3
