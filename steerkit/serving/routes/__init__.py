"""The HTTP endpoints of ``steerkit serve``, one module (one FastAPI ``APIRouter``) each.

=====================  ==================================  ==================================================
module                 endpoint                            handler
=====================  ==================================  ==================================================
``completions.py``     ``POST /v1/completions``            plain prompts
``chat.py``            ``POST /v1/chat/completions``       messages through the chat template
``models.py``          ``GET /v1/models``                  the model and its steering
``health.py``          ``GET /health``                     ok / draining / engine stopped
``metrics.py``         ``GET /metrics``                    Prometheus
``playground.py``      ``GET /``                           the playground page
=====================  ==================================  ==================================================

``state.py`` holds what the handlers share (:class:`~.state.Server`: engine, settings, metrics, model name), put on
``app.state.server`` by :func:`~.state.attach` and handed to a handler by the ``ServerDep`` dependency;
``common.py`` the checks and the answering both completion routes use.

:data:`ROUTERS` lists the routers :func:`steerkit.serving.app.create_app` includes, in this order (the OpenAPI
schema's): a new endpoint is a new module here plus one line in that list. One router can be tested alone::

    app = FastAPI(lifespan=state.lifespan)
    state.attach(app, state.Server(engine, ServerSettings(), ServerMetrics(), engine.model_name))
    app.include_router(models.router)
"""

from __future__ import annotations

from . import chat, completions, health, metrics, models, playground

ROUTERS = (
    completions.router,
    chat.router,
    models.router,
    health.router,
    metrics.router,
    playground.router,
)


def paths(routers=ROUTERS) -> frozenset[str]:
    """Every path the routers serve (what the accounting middleware counts by name; anything else is "other")."""
    return frozenset(route.path for router in routers for route in router.routes)
