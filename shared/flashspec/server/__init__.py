"""``flashspec serve``: an OpenAI-compatible HTTP layer (FastAPI, uvicorn, SSE, prometheus_client)
over ``flashspec.serving.Service``. Needs the ``serve`` extra: pip install 'flashspec[serve]'."""
