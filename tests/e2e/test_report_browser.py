"""The report in headless Chromium (Debian's ``chromium`` driven by Playwright; `make
browser` installs both, `make test-report` runs these): the page of a tiny real run
loads with no console error and no request, its curves have the run's steps, the viewer
colours a chosen episode's tokens exactly by its loss mask, filters change the list, the
served page refreshes as the run writes, and a run's text stays text. A screenshot goes
to .cache/artifacts/ (ignored by git)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentr1.report import write_report
from agentr1.report.serve import make_server
from tests.e2e.test_report import STEPS, tiny_run
from tests.unit.test_report import INJECTION, write_run

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / ".cache" / "artifacts"
MASK_ON, MASK_OFF = "rgba(46, 160, 67, 0.35)", "rgba(140, 140, 140, 0.15)"


def chromium() -> str | None:
    """Debian's chromium (or $CHROMIUM): Playwright's own browser download is not used."""
    for exe in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if exe and Path(exe).is_file():
            return exe
    return None


@pytest.fixture(scope="module")
def exe() -> str:
    """The Chromium to drive; skips (before any run is built) where it or Playwright is
    missing."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed: `make browser` installs it (and chromium)")
    found = chromium()
    if found is None:
        pytest.skip("headless Chromium not found: `make browser` installs Debian's chromium")
    return found


@pytest.fixture(scope="module")
def tiny(exe: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tiny real run and its report.html."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTR1_CACHE", str(tmp_path_factory.getbasetemp() / "agentr1-cache"))
        run_dir, _ = tiny_run(tmp_path_factory.mktemp("browser"))
    yield run_dir


@pytest.fixture(scope="module")
def browser(exe: str, tiny: Path) -> Iterator[Any]:
    """Chromium, started after the tiny run: Playwright's sync API keeps an asyncio loop
    running, in which the rollout's own loop could not run."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A page with everything it logged and requested."""

    def __init__(self, browser: Any, url: str) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.console: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(url)
        self.page.wait_for_selector("body[data-ready='1']")

    def select(self, selector: str, value: str) -> None:
        self.page.select_option(selector, value)

    def rows(self) -> list[list[str]]:
        return self.page.eval_on_selector_all(
            "#episode-list tr.ep", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"
        )

    def close(self) -> None:
        self.context.close()


@pytest.fixture()
def page(browser: Any, tiny: Path) -> Iterator[Page]:
    p = Page(browser, (tiny / "report.html").resolve().as_uri())
    yield p
    p.close()


def test_the_report_loads_with_no_console_error_and_no_request(page: Page, tiny: Path) -> None:
    assert page.console == []
    assert page.requests == [(tiny / "report.html").resolve().as_uri()]


def test_the_curves_have_the_runs_steps(page: Page) -> None:
    pg = page.page
    reward = pg.locator("svg.chart[data-panel='reward'] path.series[data-key='reward']")
    assert reward.count() == 1 and reward.get_attribute("data-n") == str(STEPS)
    assert reward.get_attribute("d").count(",") == STEPS  # one vertex a step
    dots = pg.locator("svg.chart[data-panel='reward'] circle.pt[data-key='reward']")
    assert dots.count() == STEPS
    for panel in ("metrics", "kl", "entropy", "clip", "tools", "stops", "times"):
        paths = pg.locator(f"svg.chart[data-panel='{panel}'] path.series")
        assert paths.count() >= 1, panel
        assert {paths.nth(i).get_attribute("data-n") for i in range(paths.count())} == {str(STEPS)}
    evals = pg.locator("svg.chart[data-panel='eval'] path.series")
    assert {evals.nth(i).get_attribute("data-n") for i in range(evals.count())} == {"3"}
    pg.locator("svg.chart[data-panel='reward']").hover()  # the hover shows the values
    assert pg.locator("#tip").is_visible() and "step" in pg.inner_text("#tip")
    pg.click(".panel[data-panel='reward'] .legend .key[data-key='reward']")  # toggle off
    assert reward.count() == 0
    pg.click(".panel[data-panel='reward'] .legend .key[data-key='reward']")
    assert reward.count() == 1
    table = pg.locator("table.evals[data-split='test']")
    assert [c.strip() for c in table.locator("tr").first.all_inner_texts()[0].split("\t")][:4] == [
        "test",
        "before",
        "step 2",
        "after",
    ]


def trajectory(run_dir: Path, step: int, sample: int) -> dict[str, Any]:
    for line in (run_dir / "trajectories.jsonl").read_text().splitlines():
        r = json.loads(line)
        if (r["label"], r["step"], r["group"], r["sample_index"]) == ("rl", step, 0, sample):
            return r
    raise AssertionError(f"no episode of step {step}, sample {sample}")


def test_the_viewer_colours_a_chosen_episodes_tokens_by_its_loss_mask(
    page: Page, tiny: Path
) -> None:
    pg = page.page
    page.select("#f-step", "rl|1")
    pg.click("#episode-list tr.ep[data-key='rl|1|train|0|1']")
    want = trajectory(tiny, 1, 1)
    toks = pg.locator("#conversation .tok")
    got = toks.evaluate_all(
        "ts => ts.map(t => [t.dataset.i, t.dataset.mask, getComputedStyle(t).backgroundColor])"
    )
    assert [int(i) for i, _, _ in got] == list(range(len(want["token_ids"])))
    colour_mask = [{MASK_ON: 1, MASK_OFF: 0}[bg] for _, _, bg in got]
    assert colour_mask == want["loss_mask"]
    assert "".join(toks.all_text_contents()).replace("\u21b5", "") == want["text"]
    # the group side by side: both samples, the chosen one marked
    members = pg.locator("#group .member")
    assert members.count() == 2 and pg.locator("#group .member.sel").count() == 1
    # the advantage layer: sample 1 lost (reward 0) -> every trained token red, others bare
    page.select("#layer", "advantage")
    bgs = toks.evaluate_all("ts => ts.map(t => getComputedStyle(t).backgroundColor)")
    for bg, m in zip(bgs, want["loss_mask"], strict=True):
        assert bg.startswith("rgba(214, 39, 40") if m else bg == "rgba(0, 0, 0, 0)"
    trained = next(i for i, m in enumerate(want["loss_mask"]) if m and want["pieces"][i].strip())
    toks.nth(trained).hover()
    tip = pg.inner_text("#tip")
    ratio = want["layers"]["ratio"][trained]
    assert f"token {trained}" in tip and "advantage: -" in tip and f"{ratio:.3g}"[:4] in tip
    for layer in ("logprob", "ratio", "kl"):  # every layer the run logged can be chosen
        page.select("#layer", layer)
        assert pg.locator("#conversation .tok").count() == len(want["token_ids"])
    assert page.console == []


def test_filters_change_what_is_listed(page: Page, tiny: Path) -> None:
    pg = page.page
    assert {r[0] for r in page.rows()} == {f"step {STEPS - 1}"}  # at first: the newest step
    page.select("#f-step", "all")
    everything = page.rows()
    n_eval = 3 * 2 * 4  # evaluations x splits x eval.log_trajectories (eval.max_tasks=4)
    assert len(everything) == 2 * STEPS + n_eval
    page.select("#f-split", "test")
    assert {r[1] for r in page.rows()} == {"test"} and len(page.rows()) == n_eval // 2
    page.select("#f-split", "train")
    pg.fill("#f-rmin", "0.5")
    assert [(r[3], r[4]) for r in page.rows()] == [("0", "1")] * STEPS  # the rewarded samples
    pg.fill("#f-rmin", "")
    page.select("#f-errors", "with")
    assert all(int(r[7]) > 0 for r in page.rows())
    page.select("#f-errors", "any")
    reasons = {r[5] for r in everything}
    for reason in reasons:
        page.select("#f-stop", reason)
        assert {r[5] for r in page.rows()} == {reason}
    assert pg.inner_text("#episode-count").endswith(f"of {len(everything)} episodes")


def test_a_screenshot(page: Page) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    out = ARTIFACTS / "report_browser.png"
    page.page.screenshot(path=str(out), full_page=True)
    assert out.stat().st_size > 20_000


def test_a_runs_text_is_shown_as_text(browser: Any, tmp_path: Path) -> None:
    """A tool result holding ``</script><script>alert(1)</script><img onerror>`` runs
    nothing and is shown as it is."""
    d = write_run(tmp_path / "run", content=INJECTION)
    p = Page(browser, write_report([d]).resolve().as_uri())
    try:
        p.select("#f-step", "all")
        assert p.dialogs == [] and p.console == []
        assert p.page.locator("img").count() == 0
        assert INJECTION in p.page.inner_text("#conversation .toolcall")
    finally:
        p.close()


def test_the_served_page_refreshes_as_the_run_writes(browser: Any, tmp_path: Path) -> None:
    d = write_run(tmp_path / "run")
    server = make_server([d], port=0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    p = Page(browser, origin + "/")
    try:
        path = "svg.chart[data-panel='reward'] path.series[data-key='reward']"
        assert p.page.get_attribute(path, "data-n") == "3"
        with open(d / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"phase": "rl", "step": 3.0, "reward": 0.9}) + "\n")
        p.page.wait_for_selector(f"{path}[data-n='4']", timeout=30_000)  # polled every 3 s
        assert p.console == []
        assert all(u.startswith(origin + "/") for u in p.requests)
        assert {u[len(origin) :].split("?")[0] for u in p.requests} == {
            "/",
            "/version.json",
            "/data.json",
        }
    finally:
        p.close()
        server.shutdown()
        server.server_close()
