"""Tests in one process: the syncer service over gRPC on loopback, threads, sockets."""
