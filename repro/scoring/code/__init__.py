"""Code benchmarks' shared parts: ``extract`` (code out of a completion) and ``sandbox`` (running it)."""
