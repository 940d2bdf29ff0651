"""vLLM as a serving peer: a vLLM server's streamed answers as this engine's events (`client.py`),
and throughput across concurrency on a vLLM pair's two servers (`sweep.py`). Neither loads torch."""

from .client import ServedModel, VllmServerError, plain_url_of, served_model, stream
from .sweep import Bounds, SweepError, check_servers, check_settings, natural_prompts, stops_paying, sweep

__all__ = ["Bounds", "ServedModel", "SweepError", "VllmServerError", "check_servers", "check_settings",
           "natural_prompts", "plain_url_of", "served_model", "stops_paying", "stream", "sweep"]
