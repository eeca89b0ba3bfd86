"""Notebook 06 in a real browser: JupyterLab on localhost, headless Debian chromium via playwright.

Runs all cells, checks that the dashboard's widgets render, moves a slider and saves a
screenshot (to ROPELIB_BROWSER_SCREENSHOT if set, else the test's tmp dir). The notebook is
served from a scratch directory (with links to ropelib/, figures/ and benchmarks/) so that
JupyterLab's autosave never writes outputs into the committed .ipynb.
"""
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "06-te-vs-triton-live.ipynb"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 serving a scratch copy of notebook 06: (url, token)."""
    pytest.importorskip("jupyterlab")
    work = tmp_path / "lab"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    for name in ("ropelib", "figures", "benchmarks"):
        (work / name).symlink_to(ROOT / name, target_is_directory=True)
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", f"--IdentityProvider.token={token}",
           "--ServerApp.open_browser=False", f"--ServerApp.root_dir={work}",
           "--ServerApp.disable_check_xsrf=False", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    env = dict(os.environ, JUPYTER_PLATFORM_DIRS="1")
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    log.flush()
                    pytest.fail("JupyterLab did not start:\n" +
                                (tmp_path / "lab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_notebook_06_runs_and_widgets_respond_in_chromium(lab, chromium_executable, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    url, token = lab
    shot = Path(os.environ.get("ROPELIB_BROWSER_SCREENSHOT", tmp_path / "06-browser.png"))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_executable, headless=True,
                                    args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(f"{url}/lab/tree/{NOTEBOOK.name}?token={token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            # JupyterLab may ask which kernel to start: take the notebook's own (python3)
            try:
                page.wait_for_selector(".jp-Dialog .jp-mod-accept", timeout=15_000)
                page.locator(".jp-Dialog .jp-mod-accept").first.click()
            except sync_api.TimeoutError:
                pass
            # the kernel must be up before "Run All Cells"
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle'], "
                                   "[data-status='idle']", timeout=90_000, state="attached")
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()

            # the last code cell prints whether the committed GPU results are there
            try:
                page.wait_for_function(
                    "() => [...document.querySelectorAll('.jp-OutputArea-output')].some("
                    "e => /not there yet|GPU results|seed_sweeps/.test(e.innerText))",
                    timeout=150_000)
            except sync_api.TimeoutError:
                page.screenshot(path=str(tmp_path / "timeout.png"), full_page=True)
                pytest.fail(f"notebook 06 did not finish in the browser; see "
                            f"{tmp_path / 'timeout.png'}")
            errors = page.locator(".jp-OutputArea-output[data-mime-type="
                                  "'application/vnd.jupyter.stderr'] >> text=Traceback")
            assert errors.count() == 0, errors.first.inner_text()
            assert page.locator("text=AssertionError").count() == 0

            # the dashboard rendered: sliders, the run button, the plot image, the table
            sliders = page.locator(".widget-hslider")
            assert sliders.count() >= 4
            assert page.locator("button", has_text="run").count() >= 1
            assert page.locator(".widget-image img, img.widget-image, "
                                ".jupyter-widget-image").count() >= 1
            assert page.locator("table.ropelib-rows td", has_text="pytorch").count() >= 1

            # move the seq_len slider with the keyboard and watch its readout
            slider = sliders.filter(has=page.locator("label", has_text="seq_len")).first
            slider.scroll_into_view_if_needed()
            readout = slider.locator(".widget-readout")
            page.wait_for_function("el => el.textContent.trim() !== ''",
                                   arg=readout.element_handle(), timeout=10_000)
            before = readout.text_content().strip()
            handle = slider.locator(".noUi-handle").first
            handle.click()
            handle.press("ArrowRight")
            page.wait_for_function(
                "([el, old]) => el.textContent.trim() !== old",
                arg=[readout.element_handle(), before], timeout=10_000)
            after = readout.text_content().strip()
            assert after != before and int(after) > int(before), (before, after)

            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=False)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
