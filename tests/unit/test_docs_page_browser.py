"""``GET /docs`` in a real headless browser (Debian's Chromium, which ``scripts/install.sh
dev`` installs where apt-get runs as root): served by uvicorn on 127.0.0.1 (no Ray), the
page renders every documented route, and its screenshot is a real picture."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from PIL import Image

from blitz.settings.config import BlitzSettings
from tests.api_client import api_for
from tests.served import served

# what a headless Chromium needs on a closed network, as root (docs of this machine kind)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not on PATH: /docs is checked in a real browser (bash "
                    "scripts/install.sh dev installs Debian's chromium as root; else "
                    "apt-get install chromium)")
    return found


async def run_browser(browser: str, url: str, tmp_path: Path, *args: str) -> bytes:
    proc = await asyncio.create_subprocess_exec(
        browser, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    return stdout


async def test_the_docs_page_renders_every_route_in_headless_chromium(tmp_path):
    browser = chromium()
    settings = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:16"}]})
    api = api_for(settings)
    shot = tmp_path / "docs.png"
    async with served(api) as base:
        dom = (await run_browser(browser, f"{base}/docs", tmp_path, "--dump-dom")).decode()
        await run_browser(browser, f"{base}/docs", tmp_path, f"--screenshot={shot}",
                          "--window-size=1280,1600")
    for route in api.routes:
        assert f"{route.path}<" in dom or f"{route.path} " in dom, route.path
    with Image.open(shot) as image:
        assert image.size == (1280, 1600)
        colours = image.convert("L").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 8  # text on a page, not a blank frame
