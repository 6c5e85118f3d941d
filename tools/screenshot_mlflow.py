"""The MLflow UI on a search's answer, as a person opens it: screenshots in headless Chromium, and a check.

    python tools/screenshot_mlflow.py --store sqlite:///mlflow.db --experiment digits --out docs/mlflow

Starts `mlflow ui` on the store (127.0.0.1, a free port), opens the address the search prints at its end (the
experiment's runs table: `tune_as.tracking.schema.ui_line`) and the parent run of the experiment's latest
search, writes `<out>_runs.png` and `<out>_parent.png`, and checks the rendered pages: the runs table lists
the parent run, and the parent run's page shows the answer (the winner tag and a verdict tag of every compared
loss). Exit 1 when a check fails, 2 when Chromium or the store is missing. Needs a Chromium
(`apt-get install chromium`); not a test: CI has no browser.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from mlflow.tracking import MlflowClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tune_as.tracking import schema  # noqa: E402

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def chromium(browser: str, url: str, *args: str) -> str:
    """Chromium headless on `url`, with time for the page's scripts to fetch and render the runs."""
    with tempfile.TemporaryDirectory() as profile:
        run = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                              f"--user-data-dir={profile}", "--window-size=1600,1000",
                              "--virtual-time-budget=20000", *args, url],
                             capture_output=True, text=True, timeout=180)
    if run.returncode != 0:
        raise SystemExit(f"error: {browser} exited {run.returncode}: {run.stderr[-400:]}")
    return run.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="sqlite:///mlflow.db", help="the MLflow store the search wrote")
    parser.add_argument("--experiment", default="digits")
    parser.add_argument("--out", type=Path, default=Path("docs/mlflow"), help="prefix of the two PNG files")
    args = parser.parse_args(argv)
    browser = next((b for b in CHROMIUM if shutil.which(b)), None)
    if browser is None:
        print(f"error: expected a Chromium on the PATH ({', '.join(CHROMIUM)}), found none", file=sys.stderr)
        return 2
    client = MlflowClient(args.store)
    experiment = client.get_experiment_by_name(args.experiment)
    if experiment is None:
        print(f"error: expected experiment {args.experiment!r} in {args.store}, found none", file=sys.stderr)
        return 2
    parents = client.search_runs([experiment.experiment_id], f"tags.`{schema.ROLE}` = '{schema.ROLE_SEARCH}'",
                                 order_by=["attributes.start_time DESC"], max_results=1)
    if not parents:
        print(f"error: expected a search's parent run in {args.experiment!r}, found none", file=sys.stderr)
        return 2
    parent = parents[0]
    verdicts = sorted(k for k in parent.data.tags if k.startswith(schema.ANSWER_TAG_PREFIX + "verdict."))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", args.store,
                               "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:  # the server answers /health once it serves
            try:
                urllib.request.urlopen(f"{base}/health", timeout=5)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    print(f"error: `mlflow ui` on {args.store} did not start", file=sys.stderr)
                    return 2
                time.sleep(0.5)
        runs_url = schema.ui_line(base, experiment.experiment_id).removeprefix("MLflow UI: ")
        parent_url = runs_url.replace("?", f"/runs/{parent.info.run_id}?")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        chromium(browser, runs_url, f"--screenshot={args.out}_runs.png")
        chromium(browser, parent_url, f"--screenshot={args.out}_parent.png")
        runs_dom, parent_dom = (chromium(browser, runs_url, "--dump-dom"),
                                chromium(browser, parent_url, "--dump-dom"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    name = parent.info.run_name or parent.info.run_id
    checks = {f"the runs table lists the parent run {name!r}": name in runs_dom,
              "the parent run's page shows the winner tag": "tune_as.winner" in parent_dom,
              f"the parent run's page shows the {len(verdicts)} verdict tags":
                  all(v in parent_dom for v in verdicts)}
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    print(f"wrote {args.out}_runs.png and {args.out}_parent.png")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
