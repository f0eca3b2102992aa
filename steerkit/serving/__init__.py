"""``steerkit serve``: continuous-batching steered generation behind an OpenAI-compatible HTTP API.

- ``engine.py`` (with ``requests.py`` and the row bookkeeping beside it): one decode loop serving every request;
  rows join and leave the running batch between steps.
- ``app.py``: ``create_app(engine, settings=...)``, the FastAPI app (reusable, e.g. by a Ray Serve deployment);
  ``completions.py`` turns one OpenAI request into rows and their events into JSON or server-sent events;
  ``protocol.py`` the request bodies; ``errors_http.py`` every failure as an OpenAI error body;
  ``metrics.py`` the Prometheus metrics (the engine's observer); ``static/index.html`` the playground.

Nothing here is imported by ``import steerkit``; the HTTP modules need the ``serve`` extra
(``pip install 'steerkit-rad[serve]'``). See docs/serving.md.
"""
