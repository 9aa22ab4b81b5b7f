"""Checkpoints: the tiny LLaDA2 checkpoint writer, the hash manifest, download and verification."""
