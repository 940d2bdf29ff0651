"""vLLM as a serving peer: a vLLM server's streamed answers as this engine's events (`client.py`),
and throughput across concurrency on a vLLM pair's two servers (`sweep.py`)."""
