"""Throughput, memory and retry-lateness benchmark for retrylib (run by hand; bench/README.md)."""
