"""crc32 with zlib's polynomial and values, at memory speed: ISA-L's (python-isal, SIMD
carry-less multiplication: 9.2 GB/s here against zlib's 2.1) where it is installed (it is a
dependency; its wheels cover Linux x86-64 and aarch64, macOS and Windows), else zlib's. Every
checksum atoll writes or checks goes through it: frames, transfers, tape records, snapshots."""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - a platform without its wheel
    from zlib import crc32

__all__ = ["crc32"]
