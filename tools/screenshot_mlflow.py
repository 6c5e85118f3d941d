"""The MLflow UI on a search's answer, as a person opens it: screenshots in headless Chromium, and a check.

    python tools/screenshot_mlflow.py --store sqlite:///mlflow.db --experiment digits --out docs/mlflow

Starts `mlflow ui` on the store (127.0.0.1, a free port) and opens, with Playwright driving a Chromium,
what the experiment's latest search links to: the address it prints at its end (its runs in the saved view
`tune_as.tracking.views` made: `<out>_runs.png`), a confirmed search's confirmation runs grouped by loss
(`<out>_by_loss.png`), and its parent run, its Description expanded (`<out>_parent.png`). Then it checks
the rendered pages: the runs table shows the best run's name, its validation and test metric in percent and
its setting; the grouped view shows each compared loss; the parent run's page shows the answer (its table,
the winner tag and every loss's verdict tag). The browser is as after a person's two clicks of a first visit
(docs/search.md): MLflow 3.17's Assistant panel closed, its "Model training" layout chosen. Exit 1 when a
check fails, 2 when Chromium, Playwright or the store is missing.

Needs `pip install playwright` and a Chromium (`apt-get install chromium`: no browser download); not a test:
CI has no browser.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tune_as.tracking import schema  # noqa: E402

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
# MLflow's own local-storage keys, as after the two clicks docs/search.md asks of a person once: its Assistant
# panel closed, its "Model training" layout chosen (else an experiment's pages have the GenAI sidebar)
ONCE = ("localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
        "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');"
        "localStorage.setItem('mlflow.workflowType_v1', JSON.stringify('machine_learning'));")
LOAD_S = 60  # the longest a page may take to show what it is waited for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def shown(value: float) -> str:
    """A metric as the runs table prints it (JavaScript's shortest form: 98, 93.21)."""
    return repr(value).removesuffix(".0")


def latest_search(client: MlflowClient, experiment_id: str) -> Run | None:
    found = client.search_runs([experiment_id], f"tags.`{schema.ROLE}` = '{schema.ROLE_SEARCH}'",
                               order_by=["attributes.start_time DESC"], max_results=1)
    return found[0] if found else None


def expected(client: MlflowClient, parent: Run) -> dict[str, Any]:
    """What the pages must show, read from the store: the search's best run by validation (name, metrics in
    percent, setting) and the losses its confirmation runs compare."""
    search = parent.data.tags[schema.SEARCH]
    metric = parent.data.tags[schema.METRIC].removeprefix("val_")
    val, test = (f"{p}{metric}{schema.PERCENT_SUFFIX}" for p in ("best_val_", "test_"))
    (best,) = client.search_runs([parent.info.experiment_id], f"tags.`{schema.SEARCH}` = '{search}'",
                                 order_by=[f"metrics.`{val}` DESC"], max_results=1)
    confirmed = client.search_runs([parent.info.experiment_id], f"tags.`{schema.SEARCH}` = '{search}' and "
                                   f"tags.`{schema.ROLE}` = '{schema.ROLE_CONFIRMATION}'", max_results=5000)
    return {"search": search, "columns": [val, test, schema.SETTING], "best": best.info.run_name,
            "values": [shown(best.data.metrics[val]), shown(best.data.metrics[test]),
                       best.data.tags[schema.SETTING]],
            "losses": sorted({r.data.tags[schema.LOSS] for r in confirmed}),
            "verdicts": sorted(k for k in parent.data.tags
                               if k.startswith(schema.ANSWER_TAG_PREFIX + "verdict."))}


def serve(store: str) -> tuple[subprocess.Popen[bytes], str]:
    """`mlflow ui` on the store, once it answers /health."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store,
                               "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=5)
            return server, base
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.terminate()
                raise SystemExit(f"error: `mlflow ui` on {store} did not start") from None
            time.sleep(0.5)


def pages(browser: str, base: str, experiment_id: str, parent: Run, want: dict[str, Any],
          out: Path) -> tuple[dict[str, bool], list[str]]:
    """Open the search's pages, write the screenshots, and say which checks passed and what was written."""
    from playwright.sync_api import sync_playwright

    runs_url = f"{base}/{schema.ui_page(experiment_id, schema.view_key(want['search']))}"
    grouped_url = f"{base}/{schema.ui_page(experiment_id, schema.view_key(want['search'], grouped=True))}"
    parent_url = f"{base}/#/experiments/{experiment_id}/runs/{parent.info.run_id}"
    checks: dict[str, bool] = {}
    written: list[str] = []

    def screenshot(page: Any, name: str) -> str:
        page.wait_for_timeout(2000)  # the grid settles its column widths
        written.append(f"{out}_{name}.png")
        page.screenshot(path=written[-1])
        return str(page.inner_text("body"))

    with sync_playwright() as playwright:
        chrome = playwright.chromium.launch(executable_path=browser, args=["--no-sandbox"])
        context = chrome.new_context(viewport={"width": 1600, "height": 1000})
        context.add_init_script(ONCE)
        page = context.new_page()

        page.goto(runs_url)
        page.get_by_text(want["best"], exact=True).first.wait_for(timeout=LOAD_S * 1000)
        text = screenshot(page, "runs")
        checks["the printed address opens the runs table in the search's view"] = \
            "/runs?viewStateShareKey=" in page.url
        checks[f"the runs table has columns {', '.join(want['columns'])}"] = \
            all(c in text for c in want["columns"])
        checks[f"its best run {want['best']} shows {' | '.join(want['values'])}"] = \
            want["best"] in text and all(v in text for v in want["values"])

        if want["losses"]:
            page.goto(grouped_url)
            page.get_by_text(f"Group: {want['losses'][0]}").first.wait_for(timeout=LOAD_S * 1000)
            text = screenshot(page, "by_loss")
            checks[f"the grouped view has a group for each of {len(want['losses'])} losses, with means"] = \
                all(f"Group: {loss}" in text for loss in want["losses"]) and "(average)" in text

        page.goto(parent_url)
        page.get_by_text("Show more").first.click(timeout=LOAD_S * 1000)  # the Description: the answer
        text = screenshot(page, "parent")
        checks["the parent run's page shows the answer's table"] = "selected setting" in text
        checks["the parent run's page shows the winner tag"] = "tune_as.winner" in text
        checks[f"the parent run's page shows the {len(want['verdicts'])} verdict tags"] = \
            all(v in text for v in want["verdicts"])
        chrome.close()
    return checks, written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="sqlite:///mlflow.db", help="the MLflow store the search wrote")
    parser.add_argument("--experiment", default="digits")
    parser.add_argument("--out", type=Path, default=Path("docs/mlflow"), help="prefix of the PNG files")
    args = parser.parse_args(argv)
    browser = next((path for b in CHROMIUM if (path := shutil.which(b))), None)
    if browser is None:
        print(f"error: expected a Chromium on the PATH ({', '.join(CHROMIUM)}), found none", file=sys.stderr)
        return 2
    try:
        import playwright  # noqa: F401
    except ImportError:
        print("error: expected the playwright package (pip install playwright), found none", file=sys.stderr)
        return 2
    client = MlflowClient(args.store)
    experiment = client.get_experiment_by_name(args.experiment)
    parent = latest_search(client, experiment.experiment_id) if experiment is not None else None
    if experiment is None or parent is None:
        print(f"error: expected a search's parent run in experiment {args.experiment!r} of {args.store}, "
              "found none", file=sys.stderr)
        return 2
    want = expected(client, parent)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    server, base = serve(args.store)
    try:
        checks, written = pages(browser, base, experiment.experiment_id, parent, want, args.out)
    finally:
        server.terminate()
        server.wait(timeout=30)
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    print(f"wrote {', '.join(written)}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
