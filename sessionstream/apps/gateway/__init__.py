"""`sessionstream gateway`: the HTTP front door (REST + Server-Sent Events) and the web
console. `app.create_app` builds the ASGI app; `server.run_gateway` serves it with uvicorn.
See docs/http.md."""

__all__: list[str] = []
