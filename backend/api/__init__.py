"""HTTP and WebSocket API (FastAPI)."""
