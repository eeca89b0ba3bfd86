"""Every notebook in a real browser, started the way the README says: headless Debian chromium
(playwright) drives JupyterLab on localhost.

The test makes a learner's checkout: a fresh git repository holding this tree's files, set up with
the README's own commands (its `git config` step, then `jupyter lab` with the README's arguments,
in the checkout's root, plus a port and a token). Then, for every notebook in turn, it

- opens it, runs all cells and waits for the last one;
- asserts that every cell ran, that no cell shows an error, and that every image on the page
  (markdown figures from ../figures/, plots, widget images) loaded: natural width > 0;
- in 07 and 08 moves a widget and asserts that the widget's output changed;
- saves it, as a learner would.

Afterwards every notebook must have been saved, `git status --porcelain` in the checkout must
be empty (JupyterLab saves the study notebooks without outputs, .jupyter/jupyter_server_config.py)
and the checkout's notebook tests must pass with the saved files. Finally 08 is reopened: it
shows no output (so no widget without its model).
Screenshots of every notebook go to ROPELIB_BROWSER_SCREENSHOTS (a folder) if set;
ROPELIB_BROWSER_NOTEBOOKS=07,08 limits the run to those notebooks (the reopen check needs 08).
"""
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import conftest
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
# ROPELIB_BROWSER_NOTEBOOKS=07,08 runs only those (while working on them); CI runs every one
# (conftest reads the same variable: nbmake leaves to this test the notebooks it runs)
ONLY = conftest.browser_notebooks() or []
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
RUN_TIMEOUT_MS = 300_000    # one notebook, all cells, CPU interpreter

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readme_setup():
    """(git config commands, environment for jupyter lab, jupyter lab arguments) of the README's
    pip set-up command; `$PWD` in an environment value stands for the checkout's root."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [b.strip() for b in re.findall(r"```bash\n(.*?)```", readme, re.S)]
    setup = next(b for b in blocks if b.startswith("python3 -m venv"))
    steps = [s.strip() for s in setup.split("&&")]
    git_steps = [s.split() for s in steps if s.startswith("git config")]
    lab = next(s for s in steps if re.match(r"^(\w+=\S+\s+)*jupyter lab\b", s)).split()
    env = dict(w.split("=", 1) for w in lab[:lab.index("jupyter")])
    return git_steps, env, lab[lab.index("jupyter") + 2:]


def _git(cwd, *args, **kw):
    env = dict(os.environ, GIT_AUTHOR_NAME="learner", GIT_AUTHOR_EMAIL="learner@example.com",
               GIT_COMMITTER_NAME="learner", GIT_COMMITTER_EMAIL="learner@example.com")
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          check=True, **kw)


@pytest.fixture
def checkout(tmp_path):
    """A learner's clone: this tree's files (tracked, and new ones git would track) in a fresh
    repository, configured by the README's git step."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    dest = tmp_path / "ropelib"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "clone")
    git_steps, _, _ = readme_setup()
    assert git_steps, "the README's set-up has no git step (the notebook output filter)"
    for step in git_steps:
        _git(dest, *step[1:])
    assert _git(dest, "status", "--porcelain").stdout == ""
    return dest


@pytest.fixture
def lab(checkout, tmp_path):
    """JupyterLab started in the checkout's root with the README's arguments: (url, token)."""
    pytest.importorskip("jupyterlab")
    _, readme_env, readme_args = readme_setup()
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", "lab", *readme_args, "--no-browser",
           "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
           "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    # a scratch home for JupyterLab's own settings and workspaces: none of the user's, none left
    env = dict(os.environ, **{k: v.replace("$PWD", str(checkout)) for k, v in readme_env.items()})
    env.update(JUPYTER_PLATFORM_DIRS="1",
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "lab-settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "lab-workspaces"))
    # every cell rendered, not only those in view (JupyterLab 4 renders a long notebook's cells
    # as they scroll in): an error in a cell out of view must be found by ERRORS_JS
    tracker = tmp_path / "lab-settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True, exist_ok=True)
    (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}\n')
    log_path = tmp_path / "lab.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=checkout, stdout=log, stderr=subprocess.STDOUT, env=env)
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
                    pytest.fail("JupyterLab did not start:\n" + log_path.read_text()[-3000:])
                time.sleep(0.5)
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _lab_log(tmp_path) -> str:
    """What the JupyterLab server of the `lab` fixture has logged so far."""
    path = tmp_path / "lab.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _kernel_deaths(tmp_path, from_line: int) -> list[str]:
    """The lab's log lines, from line from_line on, that say a kernel died or was restarted."""
    lines = _lab_log(tmp_path).splitlines()[from_line:]
    return [ln.strip()[-200:] for ln in lines
            if re.search(r"restarting kernel|kernel.*(died|dead)|KernelRestarter", ln, re.I)]


def _api(url, token, path, method="GET"):
    req = urllib.request.Request(f"{url}{path}?token={token}", method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body else None


def _shut_down_kernels(url, token):
    for k in _api(url, token, "/api/kernels"):
        _api(url, token, f"/api/kernels/{k['id']}", method="DELETE")


# --- what the page shows ----------------------------------------------------------------------

PROMPTS_JS = """() => [...document.querySelectorAll(
    '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt')]
    .map(e => e.textContent.trim())"""
IMAGES_JS = """async () => {
    const imgs = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) img')];
    const out = [];
    for (const img of imgs) {
        img.scrollIntoView();
        if (!img.complete) {
            await new Promise(r => { img.onload = img.onerror = r; setTimeout(r, 10000); });
        }
        out.push({src: (img.getAttribute('src') || '').slice(0, 80), width: img.naturalWidth});
    }
    return out;
}"""
# An error: a traceback or an exception's line in an error or stderr output (a cell that
# prints an exception's message on purpose, as notebook 08 does, writes it to stdout), or a
# widget that failed to show.
ERRORS_JS = """() => { const STDERR = '[data-mime-type="application/vnd.jupyter.stderr"]';
  return [...document.querySelectorAll(
    '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output')]
    .filter(e => ((e.matches(STDERR) || e.querySelector(STDERR) !== null)
                  && /Traceback|^\\w*Error\\b/m.test(e.innerText))
                 || /Error displaying widget/.test(e.innerText))
    .map(e => e.innerText); }"""


IDLE = (".jp-NotebookPanel:not(.lm-mod-hidden) "
        ".jp-Notebook-ExecutionIndicator[data-status='idle']")


def _accept_dialogs(page) -> bool:
    """JupyterLab may ask which kernel to start (the notebook names python3): take its choice."""
    dialog = page.locator(".jp-Dialog .jp-mod-accept")
    if dialog.count():
        dialog.first.click()
        page.wait_for_timeout(500)
        return True
    return False


def _open(page, url, token, name):
    page.goto(f"{url}/lab/tree/notebooks/{name}?reset&token={token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    deadline = time.time() + 90
    while time.time() < deadline:
        _accept_dialogs(page)
        if page.locator(IDLE).count():
            page.wait_for_timeout(1500)       # a kernel dialog can still come up: look again
            if not _accept_dialogs(page) and page.locator(IDLE).count():
                return
        page.wait_for_timeout(500)
    raise AssertionError(f"{name}: the kernel did not become idle within 90 s")


def _run_all(page, name):
    started = ("() => (" + PROMPTS_JS + ")().some(t => t === '[*]:' || /^\\[\\d+\\]:$/.test(t))")
    # a menu click can land before the notebook is ready, or wait behind a dialog or an open
    # menu on a loaded machine: close what is open and try again, three times in all
    for attempt in range(3):
        _accept_dialogs(page)
        try:
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click(timeout=30_000)
            page.locator(".lm-Menu-itemLabel",
                         has_text=re.compile(r"^Run All Cells$")).first.click(timeout=30_000)
            page.wait_for_function(started, timeout=60_000, polling=500)
            break
        except Exception:
            page.keyboard.press("Escape")
            if attempt == 2:
                raise
    # done: nothing queued or running ([*]), and the kernel idle
    page.wait_for_function(
        f"() => {{ const p = ({PROMPTS_JS})(); return p.length > 0 && !p.some(t => t === '[*]:') "
        "&& document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) "
        ".jp-Notebook-ExecutionIndicator[data-status=\"idle\"]') !== null; }",
        timeout=RUN_TIMEOUT_MS, polling=1000)
    page.wait_for_timeout(1500)   # outputs that arrive with the last idle message
    prompts = page.evaluate(PROMPTS_JS)
    not_run = [i for i, t in enumerate(prompts) if not re.fullmatch(r"\[\d+\]:", t)]
    return prompts, not_run


def _save(page):
    page.keyboard.press("Control+s")
    page.wait_for_function(
        "() => !document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)')"
        "?.classList.contains('jp-mod-dirty') && "
        "!document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty')",
        timeout=30_000)


def _wait_text(locator, test, what: str, timeout_s: float = 120.0) -> str:
    """Poll a locator's text until test(text) holds. Widgets replace their HTML on every update,
    so a handle to the old element would never see the new text: the locator finds it anew."""
    deadline = time.time() + timeout_s
    text = ""
    while time.time() < deadline:
        try:
            text = locator.inner_text(timeout=5_000)
        except Exception:  # noqa: BLE001 -- between the old element and the new one
            text = ""
        if test(text):
            return text
        time.sleep(0.5)
    raise AssertionError(f"{what}: after {timeout_s:.0f} s the text reads {text[:300]!r}")


def _move_dashboard(page):
    """07: raise batch one notch and press run; the results table must follow."""
    dash = page.locator(".jp-OutputArea-output").filter(
        has=page.locator("button", has_text="export CSV + PNG")).last
    table = dash.locator("table.ropelib-rows").first
    before = table.inner_text()
    slider = dash.locator(".widget-hslider").filter(
        has=page.locator("label", has_text=re.compile(r"^batch$"))).first
    slider.scroll_into_view_if_needed()
    readout = slider.locator(".widget-readout")
    old = readout.text_content().strip()
    handle = slider.locator(".noUi-handle").first
    handle.click()
    handle.press("ArrowRight")
    new = _wait_text(readout, lambda t: t.strip() not in ("", old), "the batch slider's readout").strip()
    assert int(new) > int(old), (old, new)
    dash.locator("button", has_text=re.compile(r"^\s*run\s*$")).first.click()
    # every row of the new table has the new batch size in its batch column
    after = _wait_text(table, lambda t: t != before and f"\t{new}\t" in t,
                       "the dashboard's table after run")
    return before, after, (old, new)


def _move_toggles(page):
    """08: all causes fixed with allclose's defaults, then "the reported failure": the panel's
    summary must turn from passing to failing."""
    # the panel's own summary: in the output that holds the panel's buttons
    out = page.locator(".jp-OutputArea-output").filter(
        has=page.locator("button", has_text="the reported failure")).last
    summary = out.locator(".ropelib-summary").first
    summary.scroll_into_view_if_needed()

    def press(label):
        button = out.locator("button", has_text=re.compile(rf"^\s*{label}\s*$")).first
        button.scroll_into_view_if_needed()
        old = summary.inner_text()
        button.click()
        return old

    def wait_for(verdict, stage):
        # the allclose verdict reads "True (0 of N elements differ)" or "False (k of N ...)"
        return _wait_text(summary, lambda t: re.search(rf"{verdict} \(\d+ of \d+", t), stage)

    press("all causes fixed")
    press("allclose defaults")
    wait_for("True", "all causes fixed, allclose defaults")
    before = press("the reported failure")
    after = wait_for("False", "the reported failure")
    return before, after, ("the reported failure",)


WIDGET_MOVES = {"07-te-vs-triton-live.ipynb": _move_dashboard,
                "08-debugging-allclose.ipynb": _move_toggles}


def test_every_notebook_runs_shows_its_figures_and_saves_clean(lab, checkout, chromium_executable,
                                                               tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    url, token = lab
    shots = Path(os.environ.get("ROPELIB_BROWSER_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    problems, report, report_names, retried = [], [], [], []
    started = time.time()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_executable, headless=True,
                                    args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            for name in NOTEBOOKS:
                if ONLY and not any(name.startswith(n.strip()) for n in ONLY):
                    continue
                t0 = time.time()
                try:
                    log_start = _lab_log(tmp_path).count("\n")
                    _open(page, url, token, name)
                    t_open = time.time()
                    prompts, not_run = _run_all(page, name)
                    t_run = time.time()
                    errors = page.evaluate(ERRORS_JS)
                    died = _kernel_deaths(tmp_path, log_start)
                    if not_run and not errors and died:
                        # The kernel process died under the run (the lab's log says so) while no
                        # cell reported an error: a notebook that kills its kernel itself dies
                        # again, so run it once more and let that run decide.
                        retried.append(f"{name}: the kernel died ({died[-1]}); ran it again")
                        _save(page)
                        _shut_down_kernels(url, token)
                        _open(page, url, token, name)
                        prompts, not_run = _run_all(page, name)
                        errors = page.evaluate(ERRORS_JS)
                    if not_run and not errors:
                        not_run_why = (f" (the lab's log: {' | '.join(died[-3:])})" if died else
                                       " (no cell showed an error; the lab's log shows no "
                                       "kernel restart)")
                    else:
                        not_run_why = ""
                    images = page.evaluate(IMAGES_JS)
                    broken = [i["src"] for i in images if i["width"] == 0]
                    if errors:
                        problems.append(f"{name}: a cell shows an error:\n{errors[0][-1500:]}")
                    if not_run:
                        problems.append(f"{name}: code cells {not_run} did not run{not_run_why}")
                    if broken:
                        problems.append(f"{name}: images that did not load: {broken}")
                    moved = ""
                    if name in WIDGET_MOVES:
                        before, after, *rest = WIDGET_MOVES[name](page)
                        if before == after:
                            problems.append(f"{name}: moving a widget did not change its output")
                        moved = f", widget output changed {rest[0] if rest else ''}".rstrip()
                    _save(page)
                    page.screenshot(path=str(shots / f"{Path(name).stem}.png"))
                    report_names.append(name)
                    report.append(f"{name}: {len(prompts)} code cells, {len(images)} images, "
                                  f"{time.time() - t0:.0f} s (open {t_open - t0:.0f}, run all "
                                  f"{t_run - t_open:.0f}, checks and save "
                                  f"{time.time() - t_run:.0f}){moved}")
                except sync_api.Error as e:
                    page.screenshot(path=str(shots / f"{Path(name).stem}-failed.png"),
                                    full_page=True)
                    problems.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0]}")
                finally:
                    _shut_down_kernels(url, token)

            # a reopened notebook: saved without outputs, it shows no stale widget (no output at
            # all, so no widget view without its model). That such a notebook runs and shows its
            # panel again is the run above: every notebook of the checkout starts without outputs
            # (running 08 a second time here cost two minutes of CI and checked nothing more)
            name = "08-debugging-allclose.ipynb"
            if not ONLY or any(name.startswith(n.strip()) for n in ONLY):
                _open(page, url, token, name)
                assert page.locator(".jp-Cell").count() > 0, f"{name} reopened with no cells"
                assert page.locator(".jp-OutputArea-output").count() == 0, \
                    f"{name} reopened with outputs: it was saved with them"
                _shut_down_kernels(url, token)
        finally:
            browser.close()
    print("\n".join(report + retried))
    assert not problems, "\n".join(problems)

    # the learner's checkout is as it was: outputs stay on disk, git sees none of them
    status = _git(checkout, "status", "--porcelain").stdout
    assert status == "", f"running and saving the notebooks changed the checkout:\n{status}"
    # ... and every notebook was saved (so the check above is not vacuous)
    for name in report_names:
        saved_at = (checkout / "notebooks" / name).stat().st_mtime
        assert saved_at > started, f"{name} was not saved"
    # and the notebook tests of the README's test command pass on the saved files
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_notebooks_sync.py"], cwd=checkout, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
