"""What one visitor may ask of a shared server: the HTTP guard before any handler (`http_guard.py`),
how often it may call the queue (`request_rate.py`), the queue's per-visitor bounds
(`queue_bounds.py`), the request's bounds and flags (`limits.py`), who is calling (`callers.py`),
who is still reading (`readers.py`), and the trace files kept private to a session (`traces.py`)."""
