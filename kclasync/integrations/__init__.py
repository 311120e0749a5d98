"""Running consumers inside web services: ASGI (FastAPI, Starlette) and aiohttp."""
