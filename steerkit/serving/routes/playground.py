"""``GET /``: the playground page (``steerkit/serving/static/index.html``)."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()


@router.get("/", response_class=HTMLResponse)
async def playground():
    page = resources.files("steerkit.serving").joinpath("static/index.html")
    return HTMLResponse(page.read_text(encoding="utf-8"))
