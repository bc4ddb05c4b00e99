"""Engine-order harness for the UMBP vLLM connector (see README.md)."""
