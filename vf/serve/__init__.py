"""`vf-serve`: the embedded engine behind an OpenAI-compatible HTTP API.

    vf.serve.http   a small asyncio HTTP/1.1 server (keep-alive, chunked SSE streaming)
    vf.serve.app    ServeApp: the OpenAI routes, vLLM token-id extensions, weight loading
    run_server(engine, host, port, ...)  serve until interrupted (see commands/serve.py)
"""

from __future__ import annotations

import asyncio


async def start_server(engine, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
                       api_key: str | None = None, max_queue: int = 256, weights_roots=(), **http_limits):
    """Start serving on the running loop; returns (asyncio.Server, ServeApp).

    `http_limits`: `max_body`, `idle_timeout`, `request_timeout`, `max_connections` (vf.serve.http)."""
    from vf.serve.app import ServeApp
    from vf.serve.http import serve

    app = ServeApp(engine, served_model_name or getattr(engine, "model_name", "local"), api_key=api_key,
                   max_queue=max_queue, weights_roots=weights_roots)
    server = await serve(app, host, port, **http_limits)
    return server, app


def run_server(engine, host: str = "127.0.0.1", port: int = 8000, on_ready=None, **kw) -> None:
    """Blocking: serve until Ctrl-C / SIGTERM, then close the engine."""
    import signal

    async def main():
        server, app = await start_server(engine, host, port, **kw)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        if on_ready is not None:
            on_ready(server, app)
        try:
            await stop.wait()
        finally:
            server.close()
            await engine.close()

    asyncio.run(main())
